// SPDX-License-Identifier: Apache-2.0
// engine/tier_cache.cc: see tier_cache.h.
#include "engine/tier_cache.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"

namespace ckv::engine {
namespace {

// "GPU tier: record 9f3c…/7: cuda:0: cudaMalloc(2097152 bytes): ...".
template <typename Pool>
absl::Status Annotate(const absl::Status& status, const Pool& pool, const RecordId& id) {
  return absl::Status(status.code(), absl::StrCat(pool.name, ": record ", id.chunk.ToHex(), "/",
                                                  id.record, ": ", status.message()));
}

}  // namespace

struct TierManager::Slab {
  std::byte* base = nullptr;
  size_t bytes = 0;
  size_t slot_bytes = 0;
  uint32_t live = 0;  // slots holding a record
};

struct TierManager::Entry {
  RecordId id;
  size_t pool = 0;
  bool device = false;  // `data` is a device pointer
  Slab* slab = nullptr;
  std::byte* data = nullptr;
  size_t bytes = 0;
  double score = 0;
  uint64_t tick = 0;                         // last use
  uint32_t pins = 0;                         // Handles, and one while `fill` runs
  bool erased = false;                       // out of the index; freed at its last unpin
  std::shared_ptr<kernels::CopyEvent> fill;  // the copy writing `data`, until its issuer settles it
};

struct TierManager::Pool {
  using Rank = std::tuple<double, uint64_t, Entry*>;  // score, last use
  static Rank RankOf(Entry* e) { return {e->score, e->tick, e}; }
  struct SizeClass {
    std::vector<std::unique_ptr<Slab>> slabs;
    std::vector<Slot> free;
  };

  const char* name = "";
  kernels::DeviceMemory* memory = nullptr;
  kernels::DeviceMemory* dma = nullptr;  // registers these (host) slabs for its copies
  TierStats stats;
  absl::flat_hash_map<size_t, SizeClass> classes;  // by slot bytes
  std::set<Rank> unpinned;                         // displacement order, lowest first
};

TierManager::Handle& TierManager::Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    Release();
    manager_ = std::exchange(other.manager_, nullptr);
    entry_ = std::exchange(other.entry_, nullptr);
  }
  return *this;
}

void TierManager::Handle::Release() {
  if (entry_ == nullptr) return;
  absl::MutexLock lock(&manager_->mu_);
  manager_->UnpinLocked(entry_);
  entry_ = nullptr;
  manager_ = nullptr;
}

// An entry's pool, slot and size never change: they are read without the lock.
TierLevel TierManager::Handle::level() const {
  return entry_->pool == kSummaryPool ? TierLevel::kCpu : static_cast<TierLevel>(entry_->pool);
}
const std::byte* TierManager::Handle::data() const { return entry_->data; }
size_t TierManager::Handle::size() const { return entry_->bytes; }
bool TierManager::Handle::device_pointer() const { return entry_->device; }

TierManager::TierManager(uint64_t gpu_budget_bytes, uint64_t cpu_budget_bytes,
                         std::unique_ptr<kernels::DeviceMemory> gpu_memory,
                         std::unique_ptr<kernels::DeviceMemory> cpu_memory, double summary_share)
    : gpu_memory_(gpu_memory ? std::move(gpu_memory) : kernels::NewHostMemory()),
      cpu_memory_(cpu_memory ? std::move(cpu_memory) : kernels::NewHostMemory()) {
  const auto summary_bytes = static_cast<uint64_t>(static_cast<double>(cpu_budget_bytes) *
                                                   std::clamp(summary_share, 0.0, 1.0));
  const uint64_t budgets[kPools] = {gpu_budget_bytes, cpu_budget_bytes - summary_bytes,
                                    summary_bytes};
  const char* names[kPools] = {"GPU tier", "CPU tier", "summary cache"};
  // Host slabs are copied to and from by the GPU tier's device (demotions): they are registered
  // with it, so that those copies are DMA.
  kernels::DeviceMemory* dma = gpu_memory_->device_pointers() ? gpu_memory_.get() : nullptr;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < kPools; ++i) {
    pools_[i] = std::make_unique<Pool>();
    pools_[i]->name = names[i];
    pools_[i]->memory = i == 0 ? gpu_memory_.get() : cpu_memory_.get();
    pools_[i]->dma = i == 0 ? nullptr : dma;
    pools_[i]->stats.budget_bytes = budgets[i];
  }
}

TierManager::~TierManager() {
  absl::MutexLock lock(&mu_);
  for (auto& pool : pools_) {
    for (auto& [slot_bytes, size_class] : pool->classes) {
      for (auto& slab : size_class.slabs) {
        // The slab is freed right after; an unregister failure leaves nothing to undo.
        if (pool->dma != nullptr) pool->dma->UnregisterHost(slab->base).IgnoreError();
        pool->memory->Free(slab->base);
      }
    }
  }
}

TierManager::Entry* TierManager::FindLocked(const RecordId& id) {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.get();
}

void TierManager::CountLookupLocked(const RecordId& id, const Entry* found) {
  if (id.record >= kSummaryRecord) {
    TierStats& s = pools_[kSummaryPool]->stats;
    (found != nullptr ? s.hits : s.misses)++;
    return;
  }
  for (size_t pool = 0; pool < kTierLevels; ++pool) {
    if (found != nullptr && found->pool == pool) {
      pools_[pool]->stats.hits++;
      return;
    }
    pools_[pool]->stats.misses++;
  }
}

TierManager::Handle TierManager::Lookup(const RecordId& id) {
  Entry* e;
  std::shared_ptr<kernels::CopyEvent> running;
  {
    absl::MutexLock lock(&mu_);
    e = FindLocked(id);
    if (e == nullptr || e->fill == nullptr) {
      CountLookupLocked(id, e);
      if (e == nullptr) return Handle();
      PinLocked(e);
      return Handle(this, e);
    }
    PinLocked(e);
    running = e->fill;
  }
  // Another call's copy into it is still running: wait for it rather than miss.
  const absl::Status copied = running->Wait();
  absl::MutexLock lock(&mu_);
  CountLookupLocked(id, copied.ok() ? e : nullptr);
  if (copied.ok()) return Handle(this, e);
  UnpinLocked(e);  // its issuer uncaches it
  return Handle();
}

absl::StatusOr<TierManager::Handle> TierManager::Admit(const RecordId& id,
                                                       std::span<const std::byte> bytes,
                                                       double score, TierLevel first) {
  if (id.record >= kSummaryRecord) return Place(kSummaryPool, kSummaryPool, id, bytes, 0);
  return Place(static_cast<size_t>(first), static_cast<size_t>(TierLevel::kCpu), id, bytes, score);
}

TierManager::Handle TierManager::GetSummaries(const ChunkKey& id, uint32_t part) {
  if (part >= kSummaryRecord) return Handle();  // would wrap around into record indices
  return Lookup(RecordId{id, kSummaryRecord + part});
}

absl::StatusOr<TierManager::Handle> TierManager::PutSummaries(const ChunkKey& id, uint32_t part,
                                                              std::span<const std::byte> bytes) {
  if (part >= kSummaryRecord) {
    return absl::InvalidArgumentError(
        absl::StrCat("summaries of ", id.ToHex(), ": part ", part, " >= ", kSummaryRecord));
  }
  // Summaries all score 0: they rank by last use alone.
  return Place(kSummaryPool, kSummaryPool, RecordId{id, kSummaryRecord + part}, bytes, 0);
}

absl::StatusOr<TierManager::Handle> TierManager::Place(size_t first_pool, size_t last_pool,
                                                       const RecordId& id,
                                                       std::span<const std::byte> bytes,
                                                       double score) {
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("record ", id.chunk.ToHex(), "/", id.record, ": no bytes to cache"));
  }
  if (std::isnan(score)) score = 0;  // NaN would break the rank order
  Fills fills;  // copies this call issues: the record's and those of the records it demotes
  std::shared_ptr<kernels::CopyEvent> running;  // the copy of a record found cached, if running
  Entry* e = nullptr;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    e = FindLocked(id);
    if (e != nullptr) {  // cached already: no copy
      PinLocked(e);
      if (e->fill == nullptr) return Handle(this, e);
      running = e->fill;
    } else {
      const uint64_t tick = ++tick_;
      for (size_t pool = first_pool; pool <= last_pool && e == nullptr; ++pool) {
        kernels::DeviceMemory* memory = pools_[pool]->memory;
        absl::StatusOr<Entry*> placed = PlaceLocked(
            pool, id, bytes.size(), score, tick,
            [&](std::byte* dst) {
              return memory->CopyFromHostAsync(dst, bytes.data(), bytes.size());
            },
            &fills);
        // A tier that fails (a device out of memory, say) passes the record on to the next one,
        // so that it does not keep the tiers below it empty; the error counts in its stats.
        if (!placed.ok()) {
          if (status.ok()) status = placed.status();
          continue;
        }
        e = *placed;
      }
      if (e != nullptr) {
        PinLocked(e);
        status = absl::OkStatus();
      }
    }
  }
  const absl::Status copied = running != nullptr ? running->Wait() : AwaitFills(fills, e);
  if (!status.ok()) return status;
  if (e == nullptr) return Handle();
  if (copied.ok()) return Handle(this, e);
  absl::MutexLock lock(&mu_);
  const absl::Status annotated = Annotate(copied, *pools_[e->pool], id);
  UnpinLocked(e);
  return annotated;
}

absl::Status TierManager::AwaitFills(const Fills& fills, const Entry* e) {
  if (fills.empty()) return absl::OkStatus();
  std::vector<absl::Status> outcomes;
  outcomes.reserve(fills.size());
  for (const auto& [entry, event] : fills) outcomes.push_back(event->Wait());
  absl::Status own;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < fills.size(); ++i) {
    Entry* entry = fills[i].first;
    if (entry == e) own = outcomes[i];
    entry->fill.reset();
    if (!outcomes[i].ok()) {
      pools_[entry->pool]->stats.errors++;
      RemoveLocked(entry);
    }
    UnpinLocked(entry);
  }
  return own;
}

absl::StatusOr<TierManager::Entry*> TierManager::PlaceLocked(size_t pool, const RecordId& id,
                                                             size_t bytes, double score,
                                                             uint64_t tick, CopyFn copy,
                                                             Fills* fills) {
  Pool& p = *pools_[pool];
  constexpr size_t kAlign = kernels::kDeviceAlignment;
  const size_t slot_bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  absl::StatusOr<Slot> slot = MakeRoomLocked(pool, slot_bytes, score, tick, fills);
  if (!slot.ok()) {
    p.stats.errors++;
    return Annotate(slot.status(), p, id);
  }
  if (slot->data == nullptr) {
    p.stats.refusals++;
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<kernels::CopyEvent>> event = copy(slot->data);
  if (!event.ok()) {
    slot->slab->live--;
    p.classes[slot_bytes].free.push_back(*slot);
    p.stats.errors++;
    return Annotate(event.status(), p, id);
  }
  auto owned = std::make_unique<Entry>();
  Entry* e = owned.get();
  e->id = id;
  e->pool = pool;
  e->device = p.memory->device_pointers();
  e->slab = slot->slab;
  e->data = slot->data;
  e->bytes = bytes;
  e->score = score;
  e->tick = tick;
  e->pins = 1;  // the fill's, until settled
  e->fill = std::move(*event);
  fills->emplace_back(e, e->fill);
  entries_.emplace(id, std::move(owned));
  by_chunk_[id.chunk].push_back(id.record);
  p.stats.resident_bytes += bytes;
  p.stats.records++;
  p.stats.admissions++;
  return e;
}

absl::StatusOr<TierManager::Slot> TierManager::MakeRoomLocked(size_t pool, size_t slot_bytes,
                                                              double score, uint64_t tick,
                                                              Fills* fills) {
  Pool& p = *pools_[pool];
  if (slot_bytes > p.stats.budget_bytes) return Slot{};
  CKV_ASSIGN_OR_RETURN(const Slot free_slot, TakeSlotLocked(p, slot_bytes));
  if (free_slot.data != nullptr) return free_slot;
  // Plan first, so that a refusal changes nothing. Walking the unpinned records up from the
  // lowest, each ranked below the newcomer: the first of this size frees a slot (with one record
  // size, the usual case, that is the lowest record); records of other sizes help only when they
  // empty whole slabs, enough for the budget to take a new slab.
  std::vector<Entry*> victims;
  absl::flat_hash_map<const Slab*, uint32_t> left;  // live slots each slab would keep
  uint64_t room = p.stats.budget_bytes - p.stats.allocated_bytes;
  bool enough = false;
  for (auto it = p.unpinned.begin(); !enough && it != p.unpinned.end(); ++it) {
    Entry* v = std::get<2>(*it);
    if (std::tie(v->score, v->tick) >= std::tie(score, tick)) break;
    if (v->slab->slot_bytes == slot_bytes) {
      victims = {v};
      enough = true;
      break;
    }
    victims.push_back(v);
    if (--left.try_emplace(v->slab, v->slab->live).first->second == 0) {
      room += v->slab->bytes;
      enough = room >= slot_bytes;
    }
  }
  if (!enough) return Slot{};
  // Records whose slab would not empty would go for nothing.
  std::erase_if(victims, [&](const Entry* v) {
    auto l = left.find(v->slab);
    return l != left.end() && l->second > 0;
  });
  for (Entry* v : victims) DisplaceLocked(v, fills);
  return TakeSlotLocked(p, slot_bytes);
}

absl::StatusOr<TierManager::Slot> TierManager::TakeSlotLocked(Pool& p, size_t slot_bytes) {
  Pool::SizeClass& c = p.classes[slot_bytes];
  if (c.free.empty()) {
    if (p.stats.budget_bytes - p.stats.allocated_bytes < slot_bytes) {
      // Empty slabs of other sizes give their bytes back to the budget.
      for (auto& [other_bytes, other] : p.classes) {
        if (other_bytes == slot_bytes) continue;
        std::vector<const Slab*> empty;
        for (const auto& slab : other.slabs) {
          if (slab->live == 0) empty.push_back(slab.get());
        }
        for (const Slab* slab : empty) ReleaseSlabLocked(p, other_bytes, slab);
      }
    }
    const uint64_t room = p.stats.budget_bytes - p.stats.allocated_bytes;
    if (room < slot_bytes) return Slot{};
    // A slab is at most 1/16 of the budget, so that several record sizes can share a small tier.
    const uint64_t target = std::min<uint64_t>(kSlabBytes, p.stats.budget_bytes / 16);
    const uint64_t slots =
        std::min<uint64_t>(std::max<uint64_t>(1, target / slot_bytes), room / slot_bytes);
    const size_t bytes = slots * slot_bytes;
    CKV_ASSIGN_OR_RETURN(std::byte* const base, p.memory->Allocate(bytes));
    if (p.dma != nullptr) {
      if (absl::Status s = p.dma->RegisterHost(base, bytes); !s.ok()) {
        p.memory->Free(base);
        return s;
      }
    }
    c.slabs.push_back(std::make_unique<Slab>(Slab{base, bytes, slot_bytes}));
    // Pushed from the top, so that slots are handed out in address order.
    for (size_t i = slots; i-- > 0;)
      c.free.push_back(Slot{c.slabs.back().get(), base + i * slot_bytes});
    p.stats.allocated_bytes += bytes;
    CKV_DCHECK(p.stats.allocated_bytes <= p.stats.budget_bytes);  // the tier's hard cap
  }
  const Slot slot = c.free.back();
  c.free.pop_back();
  slot.slab->live++;
  return slot;
}

void TierManager::ReleaseSlabLocked(Pool& p, size_t slot_bytes, const Slab* slab) {
  Pool::SizeClass& c = p.classes[slot_bytes];
  std::erase_if(c.free, [&](const Slot& s) { return s.slab == slab; });
  // Freed right after: an unregister failure leaves nothing to undo.
  if (p.dma != nullptr) p.dma->UnregisterHost(slab->base).IgnoreError();
  p.memory->Free(slab->base);
  p.stats.allocated_bytes -= slab->bytes;
  std::erase_if(c.slabs, [&](const std::unique_ptr<Slab>& s) { return s.get() == slab; });
}

void TierManager::DisplaceLocked(Entry* v, Fills* fills) {
  Pool& from = *pools_[v->pool];
  from.unpinned.erase(Pool::RankOf(v));
  // Out of the index before it is placed below under the same id.
  const std::unique_ptr<Entry> owned = UnindexLocked(v);
  bool kept = false;
  if (v->pool == static_cast<size_t>(TierLevel::kGpu)) {
    // Its slot may be refilled by the next copy: copies on one DeviceMemory run in issue order,
    // so this one reads it first.
    absl::StatusOr<Entry*> placed = PlaceLocked(
        static_cast<size_t>(TierLevel::kCpu), v->id, v->bytes, v->score, v->tick,
        [&](std::byte* dst) { return from.memory->CopyToHostAsync(dst, v->data, v->bytes); },
        fills);
    // A failed demotion drops the record (NVMe has it); the CPU tier counts the error.
    kept = placed.ok() && *placed != nullptr;
  }
  (kept ? from.stats.demotions : from.stats.drops)++;
  FreeLocked(v);
}

std::unique_ptr<TierManager::Entry> TierManager::UnindexLocked(Entry* e) {
  auto it = entries_.find(e->id);
  std::unique_ptr<Entry> owned = std::move(it->second);
  entries_.erase(it);
  auto chunk = by_chunk_.find(e->id.chunk);
  std::vector<uint32_t>& records = chunk->second;
  records.erase(std::find(records.begin(), records.end(), e->id.record));
  if (records.empty()) by_chunk_.erase(chunk);
  return owned;
}

void TierManager::RemoveLocked(Entry* e) {
  if (e->erased) return;
  std::unique_ptr<Entry> owned = UnindexLocked(e);
  if (e->pins == 0) {
    pools_[e->pool]->unpinned.erase(Pool::RankOf(e));
    FreeLocked(e);
    return;
  }
  e->erased = true;
  erased_.emplace(e, std::move(owned));
}

void TierManager::FreeLocked(Entry* e) {
  Pool& p = *pools_[e->pool];
  // Counted in when it was placed, so the counts cover it; no one holds it any more.
  CKV_DCHECK(e->pins == 0);
  CKV_DCHECK(p.stats.resident_bytes >= e->bytes && p.stats.records > 0 && e->slab->live > 0);
  p.stats.resident_bytes -= e->bytes;
  p.stats.records--;
  e->slab->live--;
  p.classes[e->slab->slot_bytes].free.push_back(Slot{e->slab, e->data});
}

void TierManager::PinLocked(Entry* e) {
  if (e->pins++ == 0) {
    // An unpinned record is ranked for displacement exactly once.
    [[maybe_unused]] const size_t ranked = pools_[e->pool]->unpinned.erase(Pool::RankOf(e));
    CKV_DCHECK(ranked == 1);
  }
  e->tick = ++tick_;
}

void TierManager::UnpinLocked(Entry* e) {
  CKV_DCHECK(e->pins > 0);  // every unpin matches a pin: the count never goes below zero
  if (--e->pins > 0) return;
  if (e->erased) {
    FreeLocked(e);
    erased_.erase(e);
    return;
  }
  [[maybe_unused]] const bool inserted = pools_[e->pool]->unpinned.insert(Pool::RankOf(e)).second;
  CKV_DCHECK(inserted);
}

void TierManager::UpdateScore(const ChunkKey& chunk, double score) {
  if (std::isnan(score)) score = 0;
  absl::MutexLock lock(&mu_);
  auto it = by_chunk_.find(chunk);
  if (it == by_chunk_.end()) return;
  for (uint32_t record : it->second) {
    if (record >= kSummaryRecord) continue;  // summaries rank by last use
    Entry* e = entries_.find(RecordId{chunk, record})->second.get();
    Pool& p = *pools_[e->pool];
    if (e->pins == 0) p.unpinned.erase(Pool::RankOf(e));
    e->score = score;
    if (e->pins == 0) p.unpinned.insert(Pool::RankOf(e));
  }
}

void TierManager::Erase(const ChunkKey& chunk) {
  absl::MutexLock lock(&mu_);
  auto it = by_chunk_.find(chunk);
  if (it == by_chunk_.end()) return;
  const std::vector<uint32_t> records = it->second;  // RemoveLocked edits it
  for (uint32_t record : records) {
    Entry* e = entries_.find(RecordId{chunk, record})->second.get();
    pools_[e->pool]->stats.evictions++;
    RemoveLocked(e);
  }
}

TierStats TierManager::stats(TierLevel level) const {
  absl::MutexLock lock(&mu_);
  return pools_[static_cast<size_t>(level)]->stats;
}

TierStats TierManager::summary_stats() const {
  absl::MutexLock lock(&mu_);
  return pools_[kSummaryPool]->stats;
}

absl::Status TierManager::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  uint64_t resident[kPools] = {}, records[kPools] = {}, unpinned[kPools] = {};
  absl::flat_hash_map<const Slab*, uint32_t> live;
  auto check = [&](Entry* e, bool indexed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    const Pool& p = *pools_[e->pool];
    auto name = [&] {
      return absl::StrCat(p.name, " record ", e->id.chunk.ToHex(), "/", e->id.record);
    };
    resident[e->pool] += e->bytes;
    records[e->pool]++;
    live[e->slab]++;
    const std::byte* base = e->slab->base;
    if (e->bytes > e->slab->slot_bytes || e->data < base || e->data >= base + e->slab->bytes ||
        (e->data - base) % e->slab->slot_bytes != 0) {
      return absl::InternalError(absl::StrCat(name(), ": not in a slot of its slab"));
    }
    if (e->erased == indexed) {
      return absl::InternalError(
          absl::StrCat(name(), ": erased ", e->erased, ", indexed ", indexed));
    }
    if (e->pins == 0) unpinned[e->pool]++;
    if (p.unpinned.contains(Pool::RankOf(e)) != (e->pins == 0) || (e->pins == 0 && e->erased) ||
        (e->fill != nullptr && e->pins == 0)) {
      return absl::InternalError(absl::StrCat(name(), ": ", e->pins, " pins, ranked ",
                                              p.unpinned.contains(Pool::RankOf(e))));
    }
    return absl::OkStatus();
  };
  size_t by_chunk = 0;
  for (const auto& [chunk, ids] : by_chunk_) by_chunk += ids.size();
  if (by_chunk != entries_.size()) {
    return absl::InternalError(
        absl::StrCat(by_chunk, " records by chunk, ", entries_.size(), " indexed"));
  }
  for (const auto& [id, e] : entries_) {
    if (!(e->id == id)) return absl::InternalError("an entry is indexed under another id");
    CKV_RETURN_IF_ERROR(check(e.get(), true));
  }
  for (const auto& [p, e] : erased_) CKV_RETURN_IF_ERROR(check(e.get(), false));
  for (size_t i = 0; i < kPools; ++i) {
    const Pool& p = *pools_[i];
    uint64_t allocated = 0;
    for (const auto& [slot_bytes, c] : p.classes) {
      absl::flat_hash_map<const Slab*, uint64_t> free;
      for (const Slot& s : c.free) free[s.slab]++;
      for (const auto& slab : c.slabs) {
        allocated += slab->bytes;
        if (slab->live != live[slab.get()] ||
            slab->live + free[slab.get()] != slab->bytes / slot_bytes) {
          return absl::InternalError(absl::StrCat(
              p.name, ": a slab of ", slab->bytes / slot_bytes, " slots counts ", slab->live,
              " live (", live[slab.get()], " found), ", free[slab.get()], " free"));
        }
      }
    }
    const TierStats& s = p.stats;
    if (allocated != s.allocated_bytes || s.allocated_bytes > s.budget_bytes ||
        s.resident_bytes != resident[i] || s.records != records[i] ||
        p.unpinned.size() != unpinned[i]) {
      return absl::InternalError(
          absl::StrCat(p.name, ": allocated ", s.allocated_bytes, " (slabs ", allocated,
                       "), budget ", s.budget_bytes, ", resident ", s.resident_bytes, " (found ",
                       resident[i], "), records ", s.records, " (found ", records[i], "), ranked ",
                       p.unpinned.size(), " (unpinned ", unpinned[i], ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckv::engine
