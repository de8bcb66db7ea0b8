// storage/chunk_store_reclaim.cc: ChunkStore's background reclaimer (issue 20): evicting ahead of
// need so that a Put under a full cap rarely evicts inline, the eviction planner both paths
// share, and the batched punching of freed slots.
//
// Life of a reclaim round (the thread's, or ReclaimNow's on the caller's thread; one at a time):
//   1. under mu_: when more than the margin's worth of the cap is used, plan up to
//      kMaxReclaimVictims victims in EvictionPolicy order (least recent use, then lowest score;
//      leaves only, none held by a reader or a Put), freeing what brings usage back under
//      cap - margin.
//   2. under mu_: one synced catalog batch removes them (RemoveChunksLocked, the same removal
//      Delete and inline eviction use; the removal observer sees it). Their slots are not freed:
//      they stay allocated in their segments, so no Put can reuse them, and stay counted in
//      used_bytes_ (reclaim_punching_bytes_ says how much of it is on its way out).
//   3. without mu_: one PunchSlots per contiguous run of slots (a run punches each band once).
//   4. under mu_: the runs are freed in their segments and leave used_bytes_; a run whose punch
//      failed is freed but stays counted (unpunched_), as a failed punch does elsewhere.
// A crash anywhere leaves a consistent store: before step 2's commit nothing changed; after it
// the chunks are gone and their blocks, punched or not, are orphan space that Open reclaims.
//
// The thread sleeps on reclaim_cv_ until a Put leaves less than half the margin free (a kick),
// or the store closes; it never sleeps on time. The destructor stops it and joins it before
// anything the rounds use goes away; a round in progress finishes its punches first.
#include <algorithm>
#include <queue>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/assert.h"
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
  const uint64_t in_use = used_bytes_ - reclaim_punching_bytes_;
  return in_use + margin / 2 > data_cap;
}

void ChunkStore::KickReclaimerLocked() {
  if (!reclaimer_.joinable() || !ReclaimWantedLocked()) return;
  ++reclaim_kicks_;
  reclaim_cv_.SignalAll();
}

ChunkStore::EvictionPlan ChunkStore::PlanEvictionLocked(uint64_t bytes,
                                                        size_t max_victims) const {
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
  for (const auto& [key, e] : chunks_) {
    if (e.children != 0 || HeldLocked(key, e)) continue;
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
    if (e.parent.IsZero()) continue;
    auto parent = chunks_.find(e.parent);
    if (parent == chunks_.end()) continue;
    auto [it, inserted] = children_left.try_emplace(e.parent, parent->second.children);
    if (--it->second == 0 && !HeldLocked(e.parent, parent->second)) {
      heap.push(candidate(e.parent, parent->second));
    }
  }
  plan.exhausted = all_kept && heap.empty();
  return plan;
}

void ChunkStore::FreeSlotsLocked(std::vector<SlotId> slots) {
  std::sort(slots.begin(), slots.end());
  for (size_t i = 0; i < slots.size();) {
    // The run of consecutive slots of one segment starting at i.
    size_t j = i + 1;
    while (j < slots.size() && slots[j].first == slots[i].first &&
           slots[j].second == slots[j - 1].second + 1) {
      ++j;
    }
    Segment* seg = segments_.at(slots[i].first).get();
    const SlotRun run{slots[i].second, static_cast<uint32_t>(j - i)};
    for (size_t k = i; k < j; ++k) {
      // A slot is freed once, when no chunk names it and no reader holds it.
      CKV_DCHECK(!read_pins_.contains(slots[k]) && !deferred_free_.contains(slots[k]) &&
                 !unpunched_.contains(slots[k]));
    }
    absl::Status s = seg->PunchSlots(run);
    seg->Free(run);
    if (PunchGaveBack(s)) {
      CKV_DCHECK(used_bytes_ >= run.count * seg->chunk_bytes());
      used_bytes_ -= run.count * seg->chunk_bytes();
    } else {
      logger_->Log(LogLevel::kWarning,
                   absl::StrCat("could not free blocks of slots ", run.start, "..",
                                run.start + run.count - 1, " of segment ", seg->id(), ": ",
                                s.message()));
      // Their blocks are still allocated: they keep counting against the cap until a retry
      // punches them or a Put reuses them.
      last_punch_error_ = std::string(s.message());
      for (size_t k = i; k < j; ++k) unpunched_.insert(slots[k]);
    }
    i = j;
  }
}

absl::StatusOr<uint64_t> ChunkStore::ReclaimRoundLocked(bool* more) {
  *more = false;
  const uint64_t margin = ReclaimMarginLocked();
  if (margin == 0) return 0;
  if (!unpunched_.empty()) {
    // A punch that fails again leaves its slot counted; eviction below makes up for it.
    RetryPunchesLocked().IgnoreError();
  }
  const uint64_t target = DataCapLocked() - margin;
  if (used_bytes_ <= target) return 0;
  EvictionPlan plan = PlanEvictionLocked(used_bytes_ - target, kMaxReclaimVictims);
  if (plan.victims.empty()) return 0;
  Catalog::Batch batch = catalog_->NewBatch();
  std::vector<SlotId> slots;
  CKV_RETURN_IF_ERROR(RemoveChunksLocked(plan.victims, batch, Removal::kEvict, &slots));
  ++reclaim_rounds_;
  reclaim_chunks_ += plan.victims.size();
  // The runs to punch; their slots stay allocated (not reusable) until punched.
  std::sort(slots.begin(), slots.end());
  struct Run {
    Segment* segment;
    SlotRun run;
    absl::Status punched;
  };
  std::vector<Run> runs;
  uint64_t punching = 0;
  for (const SlotId& slot : slots) {
    Segment* seg = segments_.at(slot.first).get();
    punching += seg->chunk_bytes();
    if (!runs.empty() && runs.back().segment == seg &&
        runs.back().run.start + runs.back().run.count == slot.second) {
      runs.back().run.count++;
    } else {
      runs.push_back(Run{seg, SlotRun{slot.second, 1}, absl::OkStatus()});
    }
  }
  reclaim_punching_bytes_ += punching;
  mu_.Unlock();
  // Segments outlive the round: a segment with used slots is never deleted (Gc), and the store
  // joins this thread before it destroys them.
  for (Run& r : runs) r.punched = r.segment->PunchSlots(r.run);
  mu_.Lock();
  uint64_t given_back = 0;
  bool all_punched = true;
  for (const Run& r : runs) {
    r.segment->Free(r.run);
    const uint64_t bytes = r.run.count * r.segment->chunk_bytes();
    if (PunchGaveBack(r.punched)) {
      CKV_DCHECK(used_bytes_ >= bytes);
      used_bytes_ -= bytes;
      given_back += bytes;
      continue;
    }
    logger_->Log(LogLevel::kWarning,
                 absl::StrCat("reclaimer could not free blocks of slots ", r.run.start, "..",
                              r.run.start + r.run.count - 1, " of segment ", r.segment->id(),
                              ": ", r.punched.message()));
    last_punch_error_ = std::string(r.punched.message());
    all_punched = false;
    for (uint32_t i = 0; i < r.run.count; ++i) {
      unpunched_.insert(SlotId{r.segment->id(), r.run.start + i});
    }
  }
  reclaim_punching_bytes_ -= punching;
  reclaim_bytes_ += given_back;
  reclaim_cv_.SignalAll();
  // After a failed punch, no further round: evicting more chunks to make up for blocks the file
  // system will not give back would destroy data for nothing. A Put that needs the room evicts
  // inline and reports the punch's error.
  *more = all_punched && used_bytes_ > target && !plan.exhausted;
  return given_back;
}

absl::StatusOr<uint64_t> ChunkStore::ReclaimNow() {
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
