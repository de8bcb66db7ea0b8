// SPDX-License-Identifier: Apache-2.0
// storage/store_checker.cc: StoreChecker (see store_checker.h): Verify (every record read and
// checked, the catalog's structure checked), Repair (removes what Verify found damaged) and Gc
// (gives back the blocks of free slots).
#include "storage/store_checker.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "storage/chunk_store_internal.h"

namespace ckv::storage {
namespace {

using chunk_store_internal::kSegmentsDir;

VerifyProblem Problem(VerifyProblem::Kind kind, const ChunkKey& chunk, std::string message) {
  return VerifyProblem{.kind = kind, .chunk = chunk, .message = std::move(message)};
}

}  // namespace

absl::StatusOr<VerifyReport> StoreChecker::Verify(const ProgressFn& progress,
                                                  absl::flat_hash_set<ChunkKey>* corrupt,
                                                  std::vector<std::string>* unreadable) {
  VerifyReport report;
  std::vector<ChunkKey> keys;
  absl::flat_hash_map<ChunkKey, uint32_t> depths;  // of the chunks on a rooted chain
  uint64_t total_bytes = 0;
  {
    absl::MutexLock lock(&store_.mu_);
    report.problems = store_.open_problems_;
    keys.reserve(store_.chunks_.size());
    for (const auto& [key, e] : store_.chunks_) {
      keys.push_back(key);
      total_bytes += store_.segments_.at(e.segment)->chunk_bytes();
    }
    CheckStructureLocked(report, corrupt, &depths);
  }
  std::sort(keys.begin(), keys.end());
  CheckKeys(keys, depths, report, corrupt);
  CKV_RETURN_IF_ERROR(VerifyRecords(keys, total_bytes, progress, report, corrupt, unreadable));
  return report;
}

void StoreChecker::CheckStructureLocked(VerifyReport& report,
                                        absl::flat_hash_set<ChunkKey>* corrupt,
                                        absl::flat_hash_map<ChunkKey, uint32_t>* depths) {
  // Each chunk's depth, from the parent links (memoised by id), for the prefixes' lengths here and
  // the records' depths in CheckKeys. A chain whose first chunk's parent is not stored has none.
  constexpr uint32_t kUnknown = UINT32_MAX, kLost = UINT32_MAX - 1, kLoop = UINT32_MAX - 2;
  std::vector<uint32_t> depth(store_.chunks_.IdBound(), kUnknown);
  std::vector<uint32_t> path;
  for (auto it = store_.chunks_.begin(); it != store_.chunks_.end(); ++it) {
    path.clear();
    uint32_t id = it.id();
    uint32_t d = kUnknown;
    while (d == kUnknown) {
      if (depth[id] != kUnknown) {
        d = depth[id];
        break;
      }
      path.push_back(id);
      const uint32_t parent = store_.chunks_.ValueAt(id).parent;
      if (parent == ChunkStore::ChunkEntry::kRoot) {
        d = 0;
        path.pop_back();
        depth[id] = 0;
      } else if (parent == ChunkStore::ChunkEntry::kLostParent) {
        d = kLost;  // below a chunk whose parent is not stored
      } else if (path.size() > store_.chunks_.size()) {
        d = kLoop;  // a loop of links (a damaged catalog) walks longer than the table
      } else {
        id = parent;
      }
    }
    while (!path.empty()) {  // nearest the known one first
      if (d < kLoop) ++d;
      depth[path.back()] = d;
      path.pop_back();
    }
  }
  for (auto it = store_.chunks_.begin(); it != store_.chunks_.end(); ++it) {
    const auto [key, e] = *it;
    if (!store_.specs_.contains(store_.FingerprintOf(e))) {
      report.problems.push_back(
          Problem(VerifyProblem::Kind::kInconsistent, key,
                  absl::StrCat("chunk ", key.ToHex(), " names an unknown model spec")));
    }
    if (e.parent == ChunkStore::ChunkEntry::kLostParent) {
      report.problems.push_back(
          Problem(VerifyProblem::Kind::kDamaged, key,
                  absl::StrCat("chunk ", key.ToHex(), " has no stored parent")));
      if (corrupt != nullptr) corrupt->insert(key);
    } else if (depth[it.id()] == kLoop) {
      report.problems.push_back(
          Problem(VerifyProblem::Kind::kDamaged, key,
                  absl::StrCat("chunk ", key.ToHex(), " is on a loop of parent links")));
      if (corrupt != nullptr) corrupt->insert(key);
    } else if (depth[it.id()] != kLost) {
      depths->emplace(key, depth[it.id()]);
    }
  }
  // Child counts are derived state: they must agree with the parent links they count.
  absl::flat_hash_map<ChunkKey, uint32_t> linked_children;
  for (const auto& [key, e] : store_.chunks_) {
    const ChunkKey parent_key = store_.ParentKeyLocked(key, e);
    if (!parent_key.IsZero() && store_.chunks_.contains(parent_key)) linked_children[parent_key]++;
  }
  for (const auto& [key, e] : store_.chunks_) {
    auto linked = linked_children.find(key);
    const uint32_t want = linked == linked_children.end() ? 0 : linked->second;
    if (e.children != want) {
      report.problems.push_back(
          Problem(VerifyProblem::Kind::kInconsistent, key,
                  absl::StrCat("chunk ", key.ToHex(), " counts ", e.children, " children; ", want,
                               " stored chunks name it")));
    }
    if ((e.children == 0) != store_.leaves_.contains(key)) {
      report.problems.push_back(Problem(
          VerifyProblem::Kind::kInconsistent, key,
          absl::StrCat("chunk ", key.ToHex(), " with ", e.children, " children is ",
                       e.children == 0 ? "not " : "", "in the set of leaves eviction picks from")));
    }
  }
  if (store_.leaves_.size() > store_.chunks_.size()) {
    report.problems.push_back(Problem(VerifyProblem::Kind::kInconsistent, ChunkKey{},
                                      absl::StrCat(store_.leaves_.size(), " leaves for ",
                                                   store_.chunks_.size(), " stored chunks")));
  }
  for (const auto& [id, p] : store_.prefixes_) {
    auto it = store_.chunks_.find(id);
    auto d = depths->find(id);
    if (it == store_.chunks_.end() || d == depths->end() || d->second + 1 != p.chunks) {
      report.problems.push_back(
          Problem(VerifyProblem::Kind::kInconsistent, id,
                  absl::StrCat("prefix ", id.ToHex(), " of ", p.chunks,
                               " chunks does not end at a stored chunk of that depth")));
    }
  }
}

void StoreChecker::CheckKeys(std::span<const ChunkKey> keys,
                             const absl::flat_hash_map<ChunkKey, uint32_t>& depths,
                             VerifyReport& report, absl::flat_hash_set<ChunkKey>* corrupt) {
  // The catalog's own record: its key must be the hash of its parent, spec and tokens.
  for (const ChunkKey& key : keys) {
    auto record = store_.catalog_->GetChunk(key);
    if (!record.ok()) {
      if (!absl::IsNotFound(record.status())) {  // NotFound: removed while we verified
        report.problems.push_back(
            Problem(VerifyProblem::Kind::kUnreadable, key, std::string(record.status().message())));
      }
      continue;
    }
    if (!(ChainChunkKey(record->parent, record->fingerprint, record->tokens) == key)) {
      report.problems.push_back(
          Problem(VerifyProblem::Kind::kDamaged, key,
                  absl::StrCat("chunk ", key.ToHex(),
                               ": key does not match the hash of its parent, model and tokens")));
      if (corrupt != nullptr) corrupt->insert(key);
    }
    // The record's depth against its chain's: the index derives depths from the links.
    auto depth = depths.find(key);
    if (depth != depths.end() && record->depth != depth->second) {
      report.problems.push_back(
          Problem(VerifyProblem::Kind::kInconsistent, key,
                  absl::StrCat("chunk ", key.ToHex(), " at depth ", record->depth,
                               " in its record is at depth ", depth->second, " of its chain")));
    }
  }
}

absl::Status StoreChecker::VerifyRecords(std::span<const ChunkKey> keys, uint64_t total_bytes,
                                         const ProgressFn& progress, VerifyReport& report,
                                         absl::flat_hash_set<ChunkKey>* corrupt,
                                         std::vector<std::string>* unreadable) {
  // Every record, read in batches of chunks in slot order, so that the bands of neighbouring
  // slots are read together; a batch's chunks are pinned while it is read.
  constexpr size_t kBatchChunks = 1024;
  constexpr uint64_t kMaxIoBytes = 1 << 20;
  uint64_t done_bytes = 0;
  for (size_t begin = 0; begin < keys.size(); begin += kBatchChunks) {
    const size_t end = std::min(keys.size(), begin + kBatchChunks);
    std::vector<PinnedChunks::Chunk> chunks;
    chunks.reserve(end - begin);
    std::unique_ptr<PinnedChunks> handle;  // unpins the batch when it goes
    {
      absl::MutexLock lock(&store_.mu_);
      for (size_t i = begin; i < end; ++i) {
        auto it = store_.chunks_.find(keys[i]);
        if (it == store_.chunks_.end()) continue;  // removed while we verified
        const ChunkStore::ChunkEntry& e = it->second;
        chunks.push_back(PinnedChunks::Chunk{
            it->first, store_.segments_.at(e.segment).get(), e.slot, {}, e.importance, e.loads});
        store_.PinLocked(ChunkStore::SlotId{e.segment, e.slot});
      }
      handle.reset(new PinnedChunks(&store_, std::move(chunks)));
    }
    std::vector<std::pair<size_t, absl::Status>> unusable;
    CKV_RETURN_IF_ERROR(store_.ReadChecksums(*handle, &unusable));
    const std::vector<PinnedChunks::Chunk>& pinned = handle->chunks();
    // A chunk removed while we verified is skipped; one whose record is damaged is a problem.
    std::vector<bool> skip(pinned.size(), false);
    for (const auto& [i, status] : unusable) {
      skip[i] = true;
      if (absl::IsNotFound(status)) continue;
      // Its checksum table or entry could not be read back: damage, as Repair counts it.
      report.problems.push_back(
          Problem(VerifyProblem::Kind::kDamaged, pinned[i].key, std::string(status.message())));
      if (corrupt != nullptr) corrupt->insert(pinned[i].key);
    }
    std::vector<ChunkStore::BandRead> reads;
    for (size_t i = 0; i < pinned.size(); ++i) {
      if (skip[i]) continue;
      for (uint32_t band = 0; band < pinned[i].segment->bands(); ++band) {
        reads.push_back(ChunkStore::BandRead{pinned[i].segment, pinned[i].slot, band,
                                             &pinned[i].key, pinned[i].checksums, i});
      }
    }
    absl::Status s =
        store_.ReadBands(std::move(reads), kMaxIoBytes,
                         [&](const ChunkStore::BandRead& read, uint32_t record,
                             const absl::Status& st, bool read_failed, const std::byte*) {
                           report.records_checked++;
                           report.bytes_checked += read.seg->record_bytes(record);
                           done_bytes += read.seg->record_stride(read.band);
                           if (st.ok()) return;
                           if (!read_failed) {
                             report.checksum_failures++;
                             if (corrupt != nullptr) corrupt->insert(*read.key);
                           } else if (unreadable != nullptr) {
                             unreadable->push_back(std::string(st.message()));
                           }
                           VerifyProblem p = Problem(read_failed ? VerifyProblem::Kind::kUnreadable
                                                                 : VerifyProblem::Kind::kChecksum,
                                                     *read.key, std::string(st.message()));
                           if (record < read.seg->geometry().layers)
                             p.layer = record;  // not a summary
                           report.problems.push_back(std::move(p));
                         });
    CKV_RETURN_IF_ERROR(s);
    report.chunks_checked += std::count(skip.begin(), skip.end(), false);
    if (progress) progress(done_bytes, total_bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<RepairReport> StoreChecker::Repair(const ProgressFn& progress) {
  CKV_RETURN_IF_ERROR(store_.RefuseIfReadOnly("Repair"));
  RepairReport report;
  absl::flat_hash_set<ChunkKey> corrupt;
  CKV_ASSIGN_OR_RETURN(report.verify, Verify(progress, &corrupt, &report.remaining));
  absl::MutexLock lock(&store_.mu_);
  // Victims: each corrupt chunk and everything after it, descendants before ancestors, so that
  // each is a leaf once the ones before it are gone (store_.RemoveChunksLocked).
  absl::flat_hash_map<ChunkKey, std::vector<ChunkKey>> children;
  for (const auto& [key, e] : store_.chunks_) {
    const ChunkKey parent_key = store_.ParentKeyLocked(key, e);
    if (!parent_key.IsZero()) children[parent_key].push_back(key);
  }
  std::vector<ChunkKey> victims;
  absl::flat_hash_set<ChunkKey> taken;
  absl::flat_hash_set<ChunkKey> visiting;  // on the current path: a loop of links ends here
  std::function<bool(const ChunkKey&)> take =
      [&](const ChunkKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_.mu_) -> bool {
    if (taken.contains(key) || !visiting.insert(key).second) return true;
    if (store_.put_pins_.contains(key) || store_.inflight_.contains(key)) {
      report.remaining.push_back(
          absl::StrCat("chunk ", key.ToHex(), " is being extended by a Put; run repair again"));
      return false;
    }
    bool all = true;
    auto kids = children.find(key);
    if (kids != children.end()) {
      for (const ChunkKey& child : kids->second) all = take(child) && all;
    }
    visiting.erase(key);
    if (!all) return false;
    taken.insert(key);
    victims.push_back(key);
    report.removed.push_back(absl::StrCat(
        "chunk ", key.ToHex(), " (depth ", store_.ChainLengthLocked(key) - 1, ")",
        corrupt.contains(key) ? ": failed a check" : ": follows a chunk that failed a check"));
    return true;
  };
  for (const ChunkKey& key : corrupt) {
    if (store_.chunks_.contains(key)) take(key);
  }
  // Catalog entries Load could not serve, and prefixes that end at no stored chunk.
  Catalog::Batch batch = store_.catalog_->NewBatch();
  for (const ChunkKey& key : store_.dropped_chunks_) {
    if (store_.chunks_.contains(key)) continue;  // a later Put stored it again, soundly
    batch.DeleteChunk(key);
    report.removed.push_back(
        absl::StrCat("catalog entry of chunk ", key.ToHex(), ": could not be loaded"));
  }
  for (const ChunkKey& key : store_.dropped_prefixes_) {
    if (store_.chunks_.contains(key)) continue;
    batch.DeletePrefix(key);
    report.removed.push_back(
        absl::StrCat("prefix ", key.ToHex(), ": ends at a chunk that is not stored"));
  }
  report.chunks_removed = victims.size();
  CKV_RETURN_IF_ERROR(store_.RemoveChunksLocked(victims, batch, ChunkStore::Removal::kRepair));
  store_.dropped_chunks_.clear();
  store_.dropped_prefixes_.clear();
  store_.open_problems_.clear();
  if (!report.removed.empty()) {
    store_.logger_->Log(LogLevel::kWarning, absl::StrCat("repair of ", store_.path_, " removed ",
                                                         report.removed.size(), " entries"));
  }
  return report;
}

absl::StatusOr<GcReport> StoreChecker::Gc() {
  CKV_RETURN_IF_ERROR(store_.RefuseIfReadOnly("Gc"));
  GcReport report;
  absl::MutexLock lock(&store_.mu_);
  CKV_ASSIGN_OR_RETURN(report.bytes_reclaimed, store_.RetryPunchesLocked());
  std::vector<uint32_t> empty;
  for (auto& [id, segment] : store_.segments_) {
    if (segment->used_slots() == 0) {
      CKV_ASSIGN_OR_RETURN(uint64_t bytes, segment->file()->AllocatedBytes());
      empty.push_back(id);
      report.bytes_reclaimed += bytes;
      continue;
    }
    CKV_ASSIGN_OR_RETURN(uint64_t freed, ChunkStore::PunchFreeRuns(*segment));
    report.bytes_reclaimed += freed;
  }
  if (empty.empty()) return report;
  // Removing a segment a reader still holds would leave it reading freed memory: a pinned slot
  // stays used until unpinned, and every failed punch was retried above.
  CKV_DCHECK(store_.unpunched_.empty());
  for (const auto& [slot, pins] : store_.read_pins_) {
    CKV_CHECK(std::find(empty.begin(), empty.end(), slot.first) == empty.end());
  }
  // A segment with no used slot has no chunk, no Put writing into it (allocation marks slots
  // used under store_.mu_) and no reader (a pinned slot stays used until unpinned). The catalog
  // forgets it first, so a crash in between leaves a file Open reclaims as an orphan.
  Catalog::Batch batch = store_.catalog_->NewBatch();
  for (uint32_t id : empty) batch.DeleteSegment(id);
  CKV_RETURN_IF_ERROR(store_.catalog_->Commit(batch));
  for (uint32_t id : empty) {
    store_.segments_.erase(id);
    CKV_RETURN_IF_ERROR(store_.fs_->DeleteFile(store_.SegmentPath(id)));
    report.segments_removed++;
  }
  CKV_RETURN_IF_ERROR(store_.fs_->SyncDir(absl::StrCat(store_.path_, "/", kSegmentsDir)));
  return report;
}

}  // namespace ckv::storage
