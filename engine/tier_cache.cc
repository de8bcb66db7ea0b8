// engine/tier_cache.cc: see tier_cache.h.
#include "engine/tier_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"

namespace ckv::engine {

TierCache::Handle& TierCache::Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    Release();
    cache_ = other.cache_;
    entry_ = other.entry_;
    other.cache_ = nullptr;
    other.entry_ = nullptr;
  }
  return *this;
}

void TierCache::Handle::Release() {
  if (entry_ == nullptr) return;
  cache_->Unpin(static_cast<Entry*>(entry_));
  entry_ = nullptr;
  cache_ = nullptr;
}

// An entry's level, data and memory never change while it is pinned.
TierLevel TierCache::Handle::level() const { return static_cast<Entry*>(entry_)->level; }
const std::byte* TierCache::Handle::data() const { return static_cast<Entry*>(entry_)->data; }
bool TierCache::Handle::device_pointer() const {
  absl::MutexLock lock(&cache_->mu_);
  return cache_->L(level()).memory->device_pointers();
}

TierCache::TierCache(uint64_t gpu_budget_bytes, uint64_t cpu_budget_bytes,
                     std::unique_ptr<kernels::DeviceMemory> gpu_memory,
                     std::unique_ptr<kernels::DeviceMemory> cpu_memory) {
  absl::MutexLock lock(&mu_);
  L(TierLevel::kGpu).budget = gpu_budget_bytes;
  L(TierLevel::kCpu).budget = cpu_budget_bytes;
  L(TierLevel::kGpu).memory = gpu_memory ? std::move(gpu_memory) : kernels::NewHostMemory();
  L(TierLevel::kCpu).memory = cpu_memory ? std::move(cpu_memory) : kernels::NewHostMemory();
}

TierCache::~TierCache() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, e] : entries_) L(e->level).memory->Free(e->data);
  for (auto& [p, e] : erased_) L(e->level).memory->Free(e->data);
}

void TierCache::PinLocked(Entry* e) {
  if (e->pins++ == 0) L(e->level).unpinned.erase(Rank{e->score, e->tick, e});
  e->tick = ++tick_;
}

void TierCache::Unpin(Entry* e) {
  absl::MutexLock lock(&mu_);
  if (--e->pins > 0) return;
  if (e->erased) {
    FreeLocked(e);
    erased_.erase(e);
    return;
  }
  L(e->level).unpinned.insert(Rank{e->score, e->tick, e});
}

void TierCache::FreeLocked(Entry* e) {
  Level& level = L(e->level);
  level.memory->Free(e->data);
  level.used -= e->bytes;
  level.stats.records--;
}

TierCache::Handle TierCache::Lookup(const RecordId& id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    ++misses_;
    return Handle();
  }
  Entry* e = it->second.get();
  PinLocked(e);
  L(e->level).stats.hits++;
  return Handle(this, e);
}

absl::StatusOr<TierCache::Entry*> TierCache::PlaceLocked(
    TierLevel level_id, const RecordId& id, size_t bytes, double score, uint64_t tick,
    const std::function<absl::Status(Level&, std::byte*)>& copy) {
  Level& level = L(level_id);
  if (bytes > level.budget) return nullptr;
  // Plan: the lowest-ranked unpinned records that must go for `bytes` to fit, each ranking
  // below the newcomer. Nothing changes unless the plan succeeds.
  std::vector<Entry*> victims;
  uint64_t freed = 0;
  for (auto it = level.unpinned.begin();
       level.used - freed + bytes > level.budget && it != level.unpinned.end(); ++it) {
    if (!(std::make_tuple(std::get<0>(*it), std::get<1>(*it)) < std::make_tuple(score, tick))) {
      return nullptr;
    }
    victims.push_back(std::get<2>(*it));
    freed += std::get<2>(*it)->bytes;
  }
  if (level.used - freed + bytes > level.budget) return nullptr;  // the rest is pinned
  for (Entry* v : victims) CKV_RETURN_IF_ERROR(DisplaceLocked(v));
  CKV_ASSIGN_OR_RETURN(std::byte * data, level.memory->Allocate(bytes));
  if (absl::Status s = copy(level, data); !s.ok()) {
    level.memory->Free(data);
    return s;
  }
  auto entry = std::make_unique<Entry>(Entry{id, level_id, data, bytes, score, tick});
  Entry* e = entry.get();
  entries_[id] = std::move(entry);
  by_chunk_[id.chunk].push_back(id.record);
  level.used += bytes;
  level.stats.records++;
  level.stats.admissions++;
  level.unpinned.insert(Rank{score, tick, e});
  return e;
}

absl::Status TierCache::DisplaceLocked(Entry* e) {
  Level& from = L(e->level);
  from.unpinned.erase(Rank{e->score, e->tick, e});
  // Take it out of the index first, so that placing it below can find it absent.
  std::unique_ptr<Entry> owned = std::move(entries_.at(e->id));
  entries_.erase(e->id);
  auto& records = by_chunk_[e->id.chunk];
  records.erase(std::find(records.begin(), records.end(), e->id.record));
  if (records.empty()) by_chunk_.erase(e->id.chunk);
  bool kept = false;
  if (e->level == TierLevel::kGpu) {
    auto placed = PlaceLocked(TierLevel::kCpu, e->id, e->bytes, e->score, e->tick,
                              [&](Level& to, std::byte* dst) -> absl::Status {
                                if (!to.memory->device_pointers()) {
                                  return from.memory->CopyToHost(dst, e->data, e->bytes);
                                }
                                return absl::InternalError("the CPU tier holds host memory");
                              });
    if (!placed.ok()) return placed.status();
    kept = *placed != nullptr;
  }
  (kept ? from.stats.demotions : from.stats.drops)++;
  FreeLocked(e);
  return absl::OkStatus();
}

absl::StatusOr<TierCache::Handle> TierCache::Admit(const RecordId& id,
                                                   std::span<const std::byte> bytes,
                                                   double score, TierLevel first) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it != entries_.end()) {
    PinLocked(it->second.get());
    return Handle(this, it->second.get());
  }
  const uint64_t tick = ++tick_;
  auto from_host = [&](Level& to, std::byte* dst) {
    return to.memory->CopyFromHost(dst, bytes.data(), bytes.size());
  };
  for (TierLevel level : {TierLevel::kGpu, TierLevel::kCpu}) {
    if (level < first) continue;
    CKV_ASSIGN_OR_RETURN(Entry * e, PlaceLocked(level, id, bytes.size(), score, tick, from_host));
    if (e != nullptr) {
      PinLocked(e);
      return Handle(this, e);
    }
  }
  ++refusals_;
  return Handle();
}

void TierCache::UpdateScore(const ChunkKey& chunk, double score) {
  absl::MutexLock lock(&mu_);
  auto it = by_chunk_.find(chunk);
  if (it == by_chunk_.end()) return;
  for (uint32_t record : it->second) {
    if (record >= kSummaryRecord) continue;  // summaries keep their rank
    Entry* e = entries_.at(RecordId{chunk, record}).get();
    if (e->pins == 0) L(e->level).unpinned.erase(Rank{e->score, e->tick, e});
    e->score = score;
    if (e->pins == 0) L(e->level).unpinned.insert(Rank{e->score, e->tick, e});
  }
}

void TierCache::Erase(const ChunkKey& chunk) {
  absl::MutexLock lock(&mu_);
  auto it = by_chunk_.find(chunk);
  if (it == by_chunk_.end()) return;
  for (uint32_t record : it->second) {
    auto e_it = entries_.find(RecordId{chunk, record});
    std::unique_ptr<Entry> e = std::move(e_it->second);
    entries_.erase(e_it);
    if (e->pins == 0) {
      L(e->level).unpinned.erase(Rank{e->score, e->tick, e.get()});
      FreeLocked(e.get());
    } else {
      e->erased = true;
      Entry* raw = e.get();
      erased_.emplace(raw, std::move(e));
    }
  }
  by_chunk_.erase(it);
}

TierStats TierCache::stats(TierLevel level) const {
  absl::MutexLock lock(&mu_);
  TierStats s = levels_[static_cast<size_t>(level)].stats;
  s.budget_bytes = levels_[static_cast<size_t>(level)].budget;
  s.resident_bytes = levels_[static_cast<size_t>(level)].used;
  return s;
}

uint64_t TierCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

uint64_t TierCache::refusals() const {
  absl::MutexLock lock(&mu_);
  return refusals_;
}

}  // namespace ckv::engine
