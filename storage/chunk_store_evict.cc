// SPDX-License-Identifier: Apache-2.0
// storage/chunk_store_evict.cc: ChunkStore capacity and removal: the data cap, score-ordered
// eviction to make room, the removal of chunks (eviction, Delete, Repair) and of their slots, the
// removal listeners, and the usage counts (I and F) eviction orders by.
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

}  // namespace

uint64_t ChunkStore::DataCapLocked() const {
  // The cap bounds the blocks the segment files occupy. Besides the data, a sparse file's extent
  // tree takes blocks (ext4: one 4 KiB block per ~340 extents, and a punched slot can split an
  // extent): reserve one block per segment (one more for a segment a Put may create) and 1/256
  // of the data, several times the worst case of one extent per record.
  const uint64_t per_segment = (segments_.size() + 1) * io::kDirectIoAlignment;
  if (max_disk_bytes_ <= per_segment) return 0;
  return (max_disk_bytes_ - per_segment) / 257 * 256;
}

bool ChunkStore::OwnsLocked(const SlotOwner& owner, const Segment& segment) const {
  const SegmentRecord& g = segment.geometry();
  return g.fingerprint == owner.fingerprint && g.layout == layout_ &&
         g.aux_record_bytes == *owner.aux_bytes;
}

absl::Status ChunkStore::MakeRoomLocked(uint64_t need, uint64_t* evicted, const SlotOwner* owner) {
  if (max_disk_bytes_ == 0) return absl::OkStatus();
  const uint64_t data_cap = DataCapLocked();
  // Bytes of evicted slots kept for the owner's Put, which writes over every one of them (at most
  // owner->slots): they are counted in used_bytes_ and are part of `need`.
  uint64_t kept = 0;
  auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return used_bytes_ - kept + need <= data_cap;
  };
  if (fits()) return absl::OkStatus();
  // Free slots that still hold blocks first (the reclaimer's, kept for Puts of their model to
  // write over, or a failed punch's): they hold space no chunk uses. The Put calling this took
  // those of its own model already (ReservePutLocked).
  if (!unpunched_.empty()) {
    // Only as many runs as make room. A punch that fails again leaves its slot counted; eviction
    // below makes up for it.
    RetryPunchesLocked(used_bytes_ + need - data_cap).IgnoreError();
    if (fits()) return absl::OkStatus();
  }
  ++inline_evictions_;
  const uint64_t target = data_cap - std::min(need, data_cap);
  const uint64_t excess = used_bytes_ > target ? used_bytes_ - target : 0;
  // Nothing changes until the plan is known to succeed. A first plan bounded by the chunks the
  // excess needs at the smallest chunk size keeps the heap small; the rare plan it cuts short
  // (held leaves, parents competing) is made again without the bound.
  uint64_t min_chunk = UINT64_MAX;
  for (const auto& [id, seg] : segments_) min_chunk = std::min(min_chunk, seg->chunk_bytes());
  const size_t bound = min_chunk == UINT64_MAX ? 1 : static_cast<size_t>(excess / min_chunk) + 2;
  EvictionPlan plan = PlanEvictionLocked(excess, 2 * bound + 16);
  if (plan.bytes < excess && !plan.exhausted) plan = PlanEvictionLocked(excess, SIZE_MAX);
  if (plan.bytes < excess) {
    // Free slots whose punch failed (the retry above) hold blocks no eviction can give back.
    const std::string unpunched =
        unpunched_.empty()
            ? std::string()
            : absl::StrCat(", or by ", unpunched_.size(),
                           " freed slots whose blocks the store could not give back (",
                           last_punch_error_, ")");
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot make room for ", need, " bytes under max_disk_bytes ", max_disk_bytes_, ": ",
        used_bytes_, " bytes in use, of which ", plan.bytes,
        " can be evicted (the rest is held by readers or Puts in flight", unpunched, ")"));
  }
  Catalog::Batch batch = catalog_->NewBatch();
  std::vector<SlotId> slots;
  CKV_RETURN_IF_ERROR(RemoveChunksLocked(plan.victims, batch, Removal::kEvict,
                                         owner != nullptr ? &slots : nullptr));
  *evicted += plan.victims.size();
  if (owner != nullptr) {
    // The owner's Put writes over its model's evicted slots (no punch, no new reservation);
    // the others are punched.
    std::vector<SlotId> others;
    size_t wanted = owner->slots;
    for (const SegmentRun& r : RunsOfLocked(std::move(slots))) {
      const uint32_t keep = OwnsLocked(*owner, *r.segment)
                                ? static_cast<uint32_t>(std::min<size_t>(r.run.count, wanted))
                                : 0;
      for (uint32_t i = keep; i < r.run.count; ++i) {
        others.push_back({r.segment->id(), r.run.start + i});
      }
      if (keep == 0) continue;
      const SlotRun run{r.run.start, keep};
      r.segment->Free(run);
      KeepUnpunchedLocked(*r.segment, run);
      kept += keep * r.segment->chunk_bytes();
      wanted -= keep;
    }
    FreeSlotsLocked(std::move(others));
  }
  if (!fits()) {
    // Punches of evicted chunks failed: their blocks are still on disk, so the Put would pass
    // the cap. The chunks are gone (committed); the Put is refused.
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot make room for ", need, " bytes under max_disk_bytes ", max_disk_bytes_,
        ": evicted ", plan.victims.size(), " chunks but could not give back the blocks of ",
        unpunched_.size(), " slots (", last_punch_error_, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ChunkStore::FreeDiskLocked(uint64_t bytes, uint64_t at_least,
                                                    uint64_t* evicted) {
  // What was given back is what left used_bytes_: a punch that fails keeps its slot counted.
  const uint64_t used_before = used_bytes_;
  auto freed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return used_before - used_bytes_; };
  // A punch that fails again leaves its slot; eviction below makes up for it.
  if (!unpunched_.empty()) RetryPunchesLocked(bytes).IgnoreError();
  if (freed() >= bytes) return freed();
  const EvictionPlan plan = PlanEvictionLocked(bytes - freed(), SIZE_MAX);
  if (plan.victims.empty()) return freed();
  if (freed() + plan.bytes < at_least) {
    // Evicting would not make the room: the chunks stay, and the Put fails.
    return absl::ResourceExhaustedError(
        absl::StrCat("it still needs ", at_least, " bytes, but only ", freed() + plan.bytes,
                     " can be given back (", used_bytes_,
                     " bytes in use; the rest is held by readers or "
                     "Puts in flight); nothing was evicted"));
  }
  Catalog::Batch batch = catalog_->NewBatch();
  CKV_RETURN_IF_ERROR(RemoveChunksLocked(plan.victims, batch, Removal::kEvict, nullptr));
  *evicted += plan.victims.size();
  return freed();
}

absl::Status ChunkStore::RemoveChunksLocked(const std::vector<ChunkKey>& victims,
                                            Catalog::Batch& batch, Removal why,
                                            std::vector<SlotId>* unpunched) {
  const bool evicted = why == Removal::kEvict;
  const bool carry_ends = why != Removal::kDelete;
  if (victims.empty()) {
    if (!batch.empty()) return catalog_->Commit(batch);
    return absl::OkStatus();
  }
  absl::flat_hash_set<ChunkKey> gone(victims.begin(), victims.end());
  absl::flat_hash_map<ChunkKey, uint32_t> children_left;
  // Chunks that end an evicted prefix: a victim that ended one, or whose removed descendants did,
  // hands the end on to its parent (evicting C then B of A<-B<-C leaves A as the end).
  absl::flat_hash_set<ChunkKey> carries_end;
  absl::flat_hash_set<ChunkKey> parent_gets_end;
  std::vector<std::pair<ChunkKey, PrefixEntry>> new_prefix_ends;
  StoredCounters next = counters_;
  const int64_t now = NowMs();
  for (const ChunkKey& key : victims) {
    const ChunkEntry& e = chunks_.at(key);
    batch.DeleteChunk(key);
    if (e.prefix_end) batch.DeletePrefix(key);
    const uint64_t bytes = segments_.at(e.segment)->chunk_bytes();
    if (evicted) {
      next.chunks_evicted++;
      next.bytes_evicted += bytes;
    } else {
      next.chunks_deleted++;
    }
    // An evicted (or repaired) prefix end leaves its parent as the end of the (shorter) prefix
    // when nothing else extends the parent. A deleted one does not: the caller asked for it.
    const bool ends = carry_ends && (e.prefix_end || carries_end.contains(key));
    const ChunkKey parent_key = ParentKeyLocked(key, e);
    if (parent_key.IsZero()) continue;
    if (gone.contains(parent_key)) {
      if (ends) carries_end.insert(parent_key);
      continue;
    }
    auto parent = chunks_.find(parent_key);
    if (parent == chunks_.end()) continue;
    auto [it, inserted] = children_left.try_emplace(parent_key, parent->second.children);
    --it->second;
    if (ends) parent_gets_end.insert(parent_key);
    if (it->second == 0 && parent_gets_end.contains(parent_key) && !parent->second.prefix_end) {
      PrefixEntry p{FingerprintOf(e), ChainLengthLocked(parent_key), now};
      batch.PutPrefix(parent_key, PrefixRecord{p.fingerprint, p.chunks, p.created_unix_ms});
      new_prefix_ends.emplace_back(parent_key, p);
    }
  }
  batch.PutCounters(next);
  if (removal_observer_) removal_observer_(RemovalEvent{RemovalEvent::Phase::kCommitting, victims});
  CKV_RETURN_IF_ERROR(catalog_->Commit(batch));
  if (removal_observer_) removal_observer_(RemovalEvent{RemovalEvent::Phase::kCommitted, victims});
  counters_ = next;
  // Committed: apply to memory and give the space back, one punch per run of slots.
  std::vector<SlotId> to_free;
  // The parents' keys first: links are ids, and a victim's parent may be a victim too.
  std::vector<ChunkKey> parent_keys;
  parent_keys.reserve(victims.size());
  for (const ChunkKey& key : victims) parent_keys.push_back(ParentKeyLocked(key, chunks_.at(key)));
  removals_++;
  for (size_t v = 0; v < victims.size(); ++v) {
    const ChunkKey& key = victims[v];
    const ChunkKey& parent_key = parent_keys[v];
    auto it = chunks_.find(key);
    const ChunkEntry e = std::move(it->second);
    chunks_.erase(it);
    lost_parents_.erase(key);
    leaves_.erase(key);
    if (e.prefix_end) prefixes_.erase(key);
    auto parent = chunks_.find(parent_key);
    // A stored chunk is counted among its stored parent's children.
    CKV_DCHECK(parent == chunks_.end() || parent->second.children > 0);
    if (parent != chunks_.end() && --parent->second.children == 0) leaves_.insert(parent_key);
    const SlotId slot{e.segment, e.slot};
    if (read_pins_.contains(slot)) {
      deferred_free_.insert(slot);
    } else {
      to_free.push_back(slot);
    }
  }
  if (unpunched != nullptr) {
    unpunched->insert(unpunched->end(), to_free.begin(), to_free.end());
  } else {
    FreeSlotsLocked(std::move(to_free));
  }
  if (removal_listener_) {
    for (const ChunkKey& key : victims) removal_listener_(key);
  }
  for (auto& [key, p] : new_prefix_ends) {
    auto it = chunks_.find(key);
    if (it == chunks_.end()) continue;
    it->second.prefix_end = true;
    prefixes_[key] = p;
  }
  return absl::OkStatus();
}

void ChunkStore::FreeSlotLocked(uint32_t segment, uint32_t slot) {
  Segment* seg = segments_.at(segment).get();
  // A slot is freed once, when no chunk names it and no reader holds it.
  CKV_DCHECK(!read_pins_.contains(SlotId{segment, slot}) &&
             !deferred_free_.contains(SlotId{segment, slot}) &&
             !unpunched_.contains(SlotId{segment, slot}));
  absl::Status s = seg->PunchSlots(SlotRun{slot, 1});
  seg->Free(SlotRun{slot, 1});
  if (!PunchGaveBack(s)) {
    logger_->Log(LogLevel::kWarning, absl::StrCat("could not free blocks of slot ", slot,
                                                  " of segment ", segment, ": ", s.message()));
    // Its blocks are still allocated: it keeps counting against the cap until a retry punches
    // it or a Put reuses it.
    last_punch_error_ = std::string(s.message());
    KeepUnpunchedLocked(*seg, SlotRun{slot, 1});
    return;
  }
  // Counted until here, not until the catalog forgot the chunk: a slot a reader still holds keeps
  // its blocks on disk, so it keeps counting against the cap.
  CKV_DCHECK(used_bytes_ >= seg->chunk_bytes());
  used_bytes_ -= seg->chunk_bytes();
}

void ChunkStore::SetRemovalListener(RemovalListener listener) {
  absl::MutexLock lock(&mu_);
  removal_listener_ = std::move(listener);
}

void ChunkStore::SetRemovalObserver(RemovalObserver observer) {
  absl::MutexLock lock(&mu_);
  removal_observer_ = std::move(observer);
}

absl::StatusOr<std::vector<std::pair<size_t, ChunkRecord>>> ChunkStore::ReadRecords(
    std::span<const ChunkKey> keys) {
  std::vector<std::pair<size_t, ChunkRecord>> records;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto record = catalog_->GetChunk(keys[i]);
    if (absl::IsNotFound(record.status())) continue;
    CKV_RETURN_IF_ERROR(record.status());
    records.emplace_back(i, std::move(*record));
  }
  return records;
}

absl::Status ChunkStore::ReadRecordsForUpdateLocked(
    std::span<const ChunkKey> keys, std::vector<std::pair<size_t, ChunkRecord>>* out) {
  // A chunk removed meanwhile may be stored again, in the same slot, with a new record: a read
  // during which no chunk was removed gives the records of the chunks stored now. A few tries
  // without the lock; then one with it, while nothing can change them.
  constexpr int kUnlockedTries = 3;
  for (int attempt = 0; attempt < kUnlockedTries; ++attempt) {
    const uint64_t removals = removals_;
    mu_.Unlock();
    auto records = ReadRecords(keys);
    mu_.Lock();
    CKV_RETURN_IF_ERROR(records.status());
    if (removals_ == removals) {
      *out = std::move(*records);
      return absl::OkStatus();
    }
  }
  CKV_ASSIGN_OR_RETURN(*out, ReadRecords(keys));
  return absl::OkStatus();
}

absl::Status ChunkStore::AddUsage(std::span<const Usage> usage) {
  CKV_RETURN_IF_ERROR(RefuseIfReadOnly("AddUsage"));
  // The immutable fields come from the catalog; I and F from memory, updated and written under
  // mu_, so that concurrent additions do not lose each other.
  std::vector<ChunkKey> keys;
  keys.reserve(usage.size());
  for (const Usage& u : usage) keys.push_back(u.key);
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<size_t, ChunkRecord>> records;
  CKV_RETURN_IF_ERROR(ReadRecordsForUpdateLocked(keys, &records));
  Catalog::Batch batch = catalog_->NewBatch();
  std::vector<std::pair<ChunkEntry*, const Usage*>> applied;
  for (auto& [i, record] : records) {
    const Usage* u = &usage[i];
    auto it = chunks_.find(u->key);
    // Only a chunk still stored, in the place its record names: one deleted meanwhile must not
    // come back (ReadRecordsForUpdateLocked gives the records of chunks stored again).
    if (it == chunks_.end() || it->second.segment != record.segment ||
        it->second.slot != record.slot) {
      continue;
    }
    record.importance = double{it->second.importance} + u->importance;
    record.loads = uint64_t{it->second.loads} + u->loads;
    batch.PutChunk(u->key, record);
    applied.emplace_back(&it->second, u);
  }
  if (applied.empty()) return absl::OkStatus();
  CKV_RETURN_IF_ERROR(catalog_->Commit(batch, /*sync=*/false));
  for (auto& [entry, u] : applied) {
    entry->importance += static_cast<float>(u->importance);
    entry->loads =
        static_cast<uint32_t>(std::min<uint64_t>(uint64_t{entry->loads} + u->loads, UINT32_MAX));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ChunkStore::ResetUsage() {
  CKV_RETURN_IF_ERROR(RefuseIfReadOnly("ResetUsage"));
  std::vector<ChunkKey> used;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, entry] : chunks_) {
      if (entry.importance != 0 || entry.loads != 0) used.push_back(key);
    }
  }
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<size_t, ChunkRecord>> records;
  CKV_RETURN_IF_ERROR(ReadRecordsForUpdateLocked(used, &records));
  Catalog::Batch batch = catalog_->NewBatch();
  std::vector<ChunkEntry*> applied;
  for (auto& [i, record] : records) {
    const ChunkKey& key = used[i];
    auto it = chunks_.find(key);
    if (it == chunks_.end() || it->second.segment != record.segment ||
        it->second.slot != record.slot) {
      continue;
    }
    record.importance = 0;
    record.loads = 0;
    batch.PutChunk(key, record);
    applied.push_back(&it->second);
  }
  if (applied.empty()) return 0;
  CKV_RETURN_IF_ERROR(catalog_->Commit(batch, /*sync=*/true));
  for (ChunkEntry* entry : applied) {
    entry->importance = 0;
    entry->loads = 0;
  }
  return applied.size();
}

absl::Status ChunkStore::Delete(const ModelSpec& spec, std::span<const int32_t> tokens) {
  CKV_RETURN_IF_ERROR(RefuseIfReadOnly("Delete"));
  CKV_RETURN_IF_ERROR(spec.Validate());
  if (tokens.empty() || tokens.size() % spec.chunk_tokens != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Delete of ", tokens.size(), " tokens: a stored prefix is a whole number of chunks of ",
        spec.chunk_tokens, " tokens"));
  }
  const std::vector<ChunkKey> keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  return DeletePrefix(keys.back());
}

absl::Status ChunkStore::DeletePrefix(const ChunkKey& prefix_id) {
  CKV_RETURN_IF_ERROR(RefuseIfReadOnly("DeletePrefix"));
  absl::MutexLock lock(&mu_);
  auto p = prefixes_.find(prefix_id);
  if (p == prefixes_.end()) {
    return absl::NotFoundError(absl::StrCat("no stored prefix ", prefix_id.ToHex()));
  }
  Catalog::Batch batch = catalog_->NewBatch();
  batch.DeletePrefix(prefix_id);
  // Walk up from the prefix's end while chunks become unused.
  std::vector<ChunkKey> victims;
  ChunkKey key = prefix_id;
  uint32_t removed_children = 0;
  while (!key.IsZero()) {
    auto it = chunks_.find(key);
    if (it == chunks_.end()) break;
    const ChunkEntry& e = it->second;
    const bool is_end = e.prefix_end && !(key == prefix_id);
    if (is_end || e.children != removed_children || put_pins_.contains(key) ||
        inflight_.contains(key)) {
      break;
    }
    victims.push_back(key);
    key = ParentKeyLocked(key, e);
    removed_children = 1;
  }
  // The prefix entry goes whether or not its chunks do (others may still use them).
  const PrefixEntry entry = p->second;
  chunks_.at(prefix_id).prefix_end = false;
  prefixes_.erase(p);
  absl::Status s = RemoveChunksLocked(victims, batch, Removal::kDelete);
  if (!s.ok()) {
    chunks_.at(prefix_id).prefix_end = true;
    prefixes_.emplace(prefix_id, entry);
    return s;
  }
  return absl::OkStatus();
}

}  // namespace ckv::storage
