// SPDX-License-Identifier: Apache-2.0
// storage/chunk_store_reclaim.cc: ChunkStore's background reclaimer: evicting ahead of
// need so that a Put under a full cap rarely evicts inline, the eviction planner both paths
// share, and the batched punching of freed slots.
//
// Life of a reclaim round (the thread's, or ReclaimNow's on the caller's thread; one at a time),
// all under mu_:
//   1. when less than the margin is free under the cap (slots that are free but still hold
//      blocks count as free here), plan up to kMaxReclaimVictims victims in EvictionPolicy order
//      (least recent use, then lowest score; leaves only, none held by a reader or a Put),
//      freeing what brings usage back under cap - margin.
//   2. one synced catalog batch removes them (RemoveChunksLocked, the same removal Delete and
//      inline eviction use; the removal observer sees it).
//   3. their slots are freed in their segments but not punched: they keep their blocks, stay
//      counted in used_bytes_ (the cap is on allocated blocks) and wait in unpunched_ for the
//      next Put of their segment's model to write over them. Writing over allocated blocks skips
//      the punch, the re-reservation and the file system's unwritten-extent conversion that a
//      punched slot costs the Put that reuses it (docs/results.md, "Put at steady state").
//      Slots of another model are punched, one PunchSlots per run, when a Put needs their room
//      (MakeRoomLocked), by Gc, or by the next Open's reclamation.
// A crash anywhere leaves a consistent store: before step 2's commit nothing changed; after it
// the chunks are gone and their blocks are orphan space that Open reclaims.
//
// The thread sleeps on reclaim_cv_ until a Put leaves less than half the margin free (a kick),
// or the store closes; it never sleeps on time. The destructor stops it and joins it before
// anything the rounds use goes away.
#include <algorithm>
#include <queue>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "storage/chunk_store.h"
#include "storage/chunk_store_internal.h"

namespace ckv::storage {

namespace {

using chunk_store_internal::PunchGaveBack;

// The margin when StoreOptions::reclaim_margin_bytes is unset.
constexpr uint64_t kMinDefaultMarginBytes = 64ull << 20;

}  // namespace

uint64_t ChunkStore::ReclaimMarginLocked() const {
  if (max_disk_bytes_ == 0) return 0;
  const uint64_t data_cap = DataCapLocked();
  if (options_.reclaim_margin_bytes.has_value()) {
    return std::min(*options_.reclaim_margin_bytes, data_cap);
  }
  return std::min(std::max(kMinDefaultMarginBytes, data_cap / 20), data_cap / 8);
}

bool ChunkStore::ReclaimWantedLocked() const {
  const uint64_t margin = ReclaimMarginLocked();
  if (margin == 0) return false;
  const uint64_t data_cap = DataCapLocked();
  const uint64_t in_use = used_bytes_ - unpunched_bytes_;
  return in_use + margin / 2 > data_cap;
}

void ChunkStore::KickReclaimerLocked() {
  if (!reclaimer_.joinable() || !ReclaimWantedLocked()) return;
  ++reclaim_kicks_;
  reclaim_cv_.SignalAll();
}

ChunkStore::EvictionPlan ChunkStore::PlanEvictionLocked(uint64_t bytes, size_t max_victims) const {
  EvictionPlan plan;
  if (bytes == 0 || max_victims == 0) return plan;
  auto before = [](const EvictionCandidate& a, const EvictionCandidate& b) {
    return EvictionPolicy::EvictBefore(a, b);
  };
  auto candidate = [](const ChunkKey& key, const ChunkEntry& e) {
    return EvictionCandidate{EvictionPolicy::Score(e.importance, e.loads), e.last_use, key};
  };
  // The max_victims first leaves in eviction order: a max-heap whose front is the last of them.
  std::vector<EvictionCandidate> kept;
  size_t leaves = 0;
  for (const ChunkKey& key : leaves_) {
    const ChunkEntry& e = chunks_.at(key);
    CKV_DCHECK(e.children == 0);
    if (HeldLocked(key, e)) continue;
    ++leaves;
    const EvictionCandidate c = candidate(key, e);
    if (kept.size() < max_victims) {
      kept.push_back(c);
      std::push_heap(kept.begin(), kept.end(), before);
    } else if (before(c, kept.front())) {
      std::pop_heap(kept.begin(), kept.end(), before);
      kept.back() = c;
      std::push_heap(kept.begin(), kept.end(), before);
    }
  }
  // A parent that becomes a leaf competes with the kept leaves, but only up to the last of them:
  // past it, leaves the scan did not keep may come first, so the plan stops there.
  const bool all_kept = leaves == kept.size();
  const bool has_limit = !all_kept && !kept.empty();
  const EvictionCandidate limit = has_limit ? kept.front() : EvictionCandidate{};
  auto after = [&](const EvictionCandidate& a, const EvictionCandidate& b) { return before(b, a); };
  std::priority_queue<EvictionCandidate, std::vector<EvictionCandidate>, decltype(after)> heap(
      after, std::move(kept));
  absl::flat_hash_map<ChunkKey, uint32_t> children_left;
  while (plan.bytes < bytes && !heap.empty() && plan.victims.size() < max_victims) {
    const EvictionCandidate top = heap.top();
    if (has_limit && before(limit, top)) break;
    heap.pop();
    const ChunkEntry& e = chunks_.at(top.key);
    plan.victims.push_back(top.key);
    plan.bytes += segments_.at(e.segment)->chunk_bytes();
    const ChunkKey parent_key = ParentKeyLocked(top.key, e);
    if (parent_key.IsZero()) continue;
    auto parent = chunks_.find(parent_key);
    if (parent == chunks_.end()) continue;
    auto [it, inserted] = children_left.try_emplace(parent_key, parent->second.children);
    if (--it->second == 0 && !HeldLocked(parent_key, parent->second)) {
      heap.push(candidate(parent_key, parent->second));
    }
  }
  plan.exhausted = all_kept && heap.empty();
  return plan;
}

std::vector<ChunkStore::SegmentRun> ChunkStore::RunsOfLocked(std::vector<SlotId> slots) const {
  std::sort(slots.begin(), slots.end());
  std::vector<SegmentRun> runs;
  for (size_t i = 0; i < slots.size();) {
    // The run of consecutive slots of one segment starting at i.
    size_t j = i + 1;
    while (j < slots.size() && slots[j].first == slots[i].first &&
           slots[j].second == slots[j - 1].second + 1) {
      ++j;
    }
    runs.push_back(SegmentRun{segments_.at(slots[i].first).get(),
                              SlotRun{slots[i].second, static_cast<uint32_t>(j - i)}});
    i = j;
  }
  return runs;
}

void ChunkStore::KeepUnpunchedLocked(const Segment& segment, SlotRun run) {
  for (uint32_t i = 0; i < run.count; ++i) {
    const bool inserted = unpunched_.insert(SlotId{segment.id(), run.start + i}).second;
    CKV_DCHECK(inserted);  // a slot is freed once
  }
  unpunched_bytes_ += run.count * segment.chunk_bytes();
}

bool ChunkStore::TakeUnpunchedLocked(const Segment& segment, uint32_t slot) {
  if (unpunched_.erase(SlotId{segment.id(), slot}) == 0) return false;
  CKV_DCHECK(unpunched_bytes_ >= segment.chunk_bytes());
  unpunched_bytes_ -= segment.chunk_bytes();
  return true;
}

void ChunkStore::TakeUnpunchedLocked(const Segment& segment, SlotRun run) {
  for (uint32_t i = 0; i < run.count; ++i) {
    const bool was = TakeUnpunchedLocked(segment, run.start + i);
    CKV_DCHECK(was);
  }
}

void ChunkStore::FreeSlotsLocked(std::vector<SlotId> slots) {
  for (const SlotId& slot : slots) {
    // A slot is freed once, when no chunk names it and no reader holds it.
    CKV_DCHECK(!read_pins_.contains(slot) && !deferred_free_.contains(slot) &&
               !unpunched_.contains(slot));
  }
  for (const auto& [seg, run] : RunsOfLocked(std::move(slots))) {
    absl::Status s = seg->PunchSlots(run);
    seg->Free(run);
    if (PunchGaveBack(s)) {
      CKV_DCHECK(used_bytes_ >= run.count * seg->chunk_bytes());
      used_bytes_ -= run.count * seg->chunk_bytes();
      continue;
    }
    logger_->Log(LogLevel::kWarning, absl::StrCat("could not free blocks of slots ", run.start,
                                                  "..", run.start + run.count - 1, " of segment ",
                                                  seg->id(), ": ", s.message()));
    // Their blocks are still allocated: they keep counting against the cap until a retry
    // punches them or a Put reuses them.
    last_punch_error_ = std::string(s.message());
    KeepUnpunchedLocked(*seg, run);
  }
}

absl::StatusOr<uint64_t> ChunkStore::ReclaimRoundLocked(bool* more) {
  *more = false;
  const uint64_t margin = ReclaimMarginLocked();
  if (margin == 0) return 0;
  const uint64_t target = DataCapLocked() - margin;
  const uint64_t in_use = used_bytes_ - unpunched_bytes_;
  if (in_use <= target) return 0;
  EvictionPlan plan = PlanEvictionLocked(in_use - target, kMaxReclaimVictims);
  if (plan.victims.empty()) return 0;
  Catalog::Batch batch = catalog_->NewBatch();
  std::vector<SlotId> slots;
  CKV_RETURN_IF_ERROR(RemoveChunksLocked(plan.victims, batch, Removal::kEvict, &slots));
  ++reclaim_rounds_;
  reclaim_chunks_ += plan.victims.size();
  // Freed, not punched: the slots keep their blocks, counted in used_bytes_, for the next Puts
  // to write over (ReservePutLocked takes them first).
  uint64_t freed = 0;
  for (const auto& [seg, run] : RunsOfLocked(std::move(slots))) {
    seg->Free(run);
    KeepUnpunchedLocked(*seg, run);
    freed += run.count * seg->chunk_bytes();
  }
  reclaim_bytes_ += freed;
  reclaim_cv_.SignalAll();
  *more = used_bytes_ - unpunched_bytes_ > target && !plan.exhausted;
  return freed;
}

absl::StatusOr<uint64_t> ChunkStore::ReclaimNow() {
  CKV_RETURN_IF_ERROR(RefuseIfReadOnly("ReclaimNow"));
  absl::MutexLock lock(&mu_);
  while (reclaim_running_) reclaim_cv_.Wait(&mu_);
  if (reclaim_stop_) return absl::FailedPreconditionError("ReclaimNow: the store is closing");
  reclaim_running_ = true;
  uint64_t total = 0;
  absl::Status status;
  for (bool more = true; more && status.ok();) {
    absl::StatusOr<uint64_t> round = ReclaimRoundLocked(&more);
    if (round.ok()) {
      total += *round;
    } else {
      status = round.status();
    }
  }
  reclaim_running_ = false;
  reclaim_cv_.SignalAll();
  if (!status.ok()) return status;
  return total;
}

void ChunkStore::WaitForReclaimIdle() {
  absl::MutexLock lock(&mu_);
  if (!reclaimer_.joinable()) return;
  while (!reclaim_stop_ && (reclaim_running_ || reclaim_seen_ != reclaim_kicks_)) {
    reclaim_cv_.Wait(&mu_);
  }
}

void ChunkStore::StartReclaimer() {
  absl::MutexLock lock(&mu_);
  if (!options_.reclaim_in_background || ReclaimMarginLocked() == 0) return;
  reclaimer_ = std::thread([this] { ReclaimLoop(); });
}

void ChunkStore::StopReclaimer() {
  {
    absl::MutexLock lock(&mu_);
    reclaim_stop_ = true;
    reclaim_cv_.SignalAll();
  }
  if (reclaimer_.joinable()) reclaimer_.join();
}

void ChunkStore::ReclaimLoop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    while (!reclaim_stop_ && (reclaim_seen_ == reclaim_kicks_ || reclaim_running_)) {
      reclaim_cv_.Wait(&mu_);
    }
    if (reclaim_stop_) return;
    reclaim_seen_ = reclaim_kicks_;
    reclaim_running_ = true;
    for (bool more = true; more && !reclaim_stop_;) {
      absl::StatusOr<uint64_t> round = ReclaimRoundLocked(&more);
      if (!round.ok()) {
        // The catalog refused the batch (a failing disk): nothing was removed. The next kick
        // tries again; meanwhile Puts evict inline and report the error themselves.
        logger_->Log(LogLevel::kWarning,
                     absl::StrCat("reclaimer round failed: ", round.status().message()));
        break;
      }
    }
    reclaim_running_ = false;
    reclaim_cv_.SignalAll();
  }
}

}  // namespace ckv::storage
