// SPDX-License-Identifier: Apache-2.0
// storage/chunk_store_verify.cc: ChunkStore::Verify (every record read and checked, the catalog's
// structure checked) and ChunkStore::Repair (removes what Verify found damaged).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "storage/chunk_store.h"

namespace ckv::storage {
namespace {

VerifyProblem Problem(VerifyProblem::Kind kind, const ChunkKey& chunk, std::string message) {
  return VerifyProblem{.kind = kind, .chunk = chunk, .message = std::move(message)};
}

}  // namespace

absl::StatusOr<VerifyReport> ChunkStore::Verify(const ProgressFn& progress) {
  return VerifyInternal(progress, nullptr, nullptr);
}

absl::StatusOr<VerifyReport> ChunkStore::VerifyInternal(const ProgressFn& progress,
                                                        absl::flat_hash_set<ChunkKey>* corrupt,
                                                        std::vector<std::string>* unreadable) {
  VerifyReport report;
  std::vector<ChunkKey> keys;
  absl::flat_hash_map<ChunkKey, uint32_t> depths;  // of the chunks on a rooted chain
  uint64_t total_bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    report.problems = open_problems_;
    keys.reserve(chunks_.size());
    for (const auto& [key, e] : chunks_) {
      keys.push_back(key);
      total_bytes += segments_.at(e.segment)->chunk_bytes();
    }
    CheckStructureLocked(report, corrupt, &depths);
  }
  std::sort(keys.begin(), keys.end());
  CheckKeys(keys, depths, report, corrupt);
  CKV_RETURN_IF_ERROR(VerifyRecords(keys, total_bytes, progress, report, corrupt, unreadable));
  return report;
}

void ChunkStore::CheckStructureLocked(VerifyReport& report, absl::flat_hash_set<ChunkKey>* corrupt,
                                      absl::flat_hash_map<ChunkKey, uint32_t>* depths) {
  // Each chunk's depth, from the parent links (memoised by id), for the prefixes' lengths here and
  // the records' depths in CheckKeys. A chain whose first chunk's parent is not stored has none.
  constexpr uint32_t kUnknown = UINT32_MAX, kLost = UINT32_MAX - 1, kLoop = UINT32_MAX - 2;
  std::vector<uint32_t> depth(chunks_.IdBound(), kUnknown);
  std::vector<uint32_t> path;
  for (auto it = chunks_.begin(); it != chunks_.end(); ++it) {
    path.clear();
    uint32_t id = it.id();
    uint32_t d = kUnknown;
    while (d == kUnknown) {
      if (depth[id] != kUnknown) {
        d = depth[id];
        break;
      }
      path.push_back(id);
      const uint32_t parent = chunks_.ValueAt(id).parent;
      if (parent == ChunkEntry::kRoot) {
        d = 0;
        path.pop_back();
        depth[id] = 0;
      } else if (parent == ChunkEntry::kLostParent) {
        d = kLost;  // below a chunk whose parent is not stored
      } else if (path.size() > chunks_.size()) {
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
  for (auto it = chunks_.begin(); it != chunks_.end(); ++it) {
    const auto [key, e] = *it;
    if (!specs_.contains(FingerprintOf(e))) {
      report.problems.push_back(
          Problem(VerifyProblem::Kind::kInconsistent, key,
                  absl::StrCat("chunk ", key.ToHex(), " names an unknown model spec")));
    }
    if (e.parent == ChunkEntry::kLostParent) {
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
  for (const auto& [key, e] : chunks_) {
    const ChunkKey parent_key = ParentKeyLocked(key, e);
    if (!parent_key.IsZero() && chunks_.contains(parent_key)) linked_children[parent_key]++;
  }
  for (const auto& [key, e] : chunks_) {
    auto linked = linked_children.find(key);
    const uint32_t want = linked == linked_children.end() ? 0 : linked->second;
    if (e.children != want) {
      report.problems.push_back(
          Problem(VerifyProblem::Kind::kInconsistent, key,
                  absl::StrCat("chunk ", key.ToHex(), " counts ", e.children, " children; ", want,
                               " stored chunks name it")));
    }
    if ((e.children == 0) != leaves_.contains(key)) {
      report.problems.push_back(Problem(
          VerifyProblem::Kind::kInconsistent, key,
          absl::StrCat("chunk ", key.ToHex(), " with ", e.children, " children is ",
                       e.children == 0 ? "not " : "", "in the set of leaves eviction picks from")));
    }
  }
  if (leaves_.size() > chunks_.size()) {
    report.problems.push_back(
        Problem(VerifyProblem::Kind::kInconsistent, ChunkKey{},
                absl::StrCat(leaves_.size(), " leaves for ", chunks_.size(), " stored chunks")));
  }
  for (const auto& [id, p] : prefixes_) {
    auto it = chunks_.find(id);
    auto d = depths->find(id);
    if (it == chunks_.end() || d == depths->end() || d->second + 1 != p.chunks) {
      report.problems.push_back(
          Problem(VerifyProblem::Kind::kInconsistent, id,
                  absl::StrCat("prefix ", id.ToHex(), " of ", p.chunks,
                               " chunks does not end at a stored chunk of that depth")));
    }
  }
}

void ChunkStore::CheckKeys(std::span<const ChunkKey> keys,
                           const absl::flat_hash_map<ChunkKey, uint32_t>& depths,
                           VerifyReport& report, absl::flat_hash_set<ChunkKey>* corrupt) {
  // The catalog's own record: its key must be the hash of its parent, spec and tokens.
  for (const ChunkKey& key : keys) {
    auto record = catalog_->GetChunk(key);
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

absl::Status ChunkStore::VerifyRecords(std::span<const ChunkKey> keys, uint64_t total_bytes,
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
      absl::MutexLock lock(&mu_);
      for (size_t i = begin; i < end; ++i) {
        auto it = chunks_.find(keys[i]);
        if (it == chunks_.end()) continue;  // removed while we verified
        const ChunkEntry& e = it->second;
        chunks.push_back(PinnedChunks::Chunk{
            it->first, segments_.at(e.segment).get(), e.slot, {}, e.importance, e.loads});
        PinLocked(SlotId{e.segment, e.slot});
      }
      handle.reset(new PinnedChunks(this, std::move(chunks)));
    }
    std::vector<std::pair<size_t, absl::Status>> unusable;
    CKV_RETURN_IF_ERROR(ReadChecksums(*handle, &unusable));
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
    std::vector<BandRead> reads;
    for (size_t i = 0; i < pinned.size(); ++i) {
      if (skip[i]) continue;
      for (uint32_t band = 0; band < pinned[i].segment->bands(); ++band) {
        reads.push_back(BandRead{pinned[i].segment, pinned[i].slot, band, &pinned[i].key,
                                 pinned[i].checksums, i});
      }
    }
    absl::Status s = ReadBands(std::move(reads), kMaxIoBytes,
                               [&](const BandRead& read, uint32_t record, const absl::Status& st,
                                   bool read_failed, const std::byte*) {
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
                                 VerifyProblem p =
                                     Problem(read_failed ? VerifyProblem::Kind::kUnreadable
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

absl::StatusOr<RepairReport> ChunkStore::Repair(const ProgressFn& progress) {
  CKV_RETURN_IF_ERROR(RefuseIfReadOnly("Repair"));
  RepairReport report;
  absl::flat_hash_set<ChunkKey> corrupt;
  CKV_ASSIGN_OR_RETURN(report.verify, VerifyInternal(progress, &corrupt, &report.remaining));
  absl::MutexLock lock(&mu_);
  // Victims: each corrupt chunk and everything after it, descendants before ancestors, so that
  // each is a leaf once the ones before it are gone (RemoveChunksLocked).
  absl::flat_hash_map<ChunkKey, std::vector<ChunkKey>> children;
  for (const auto& [key, e] : chunks_) {
    const ChunkKey parent_key = ParentKeyLocked(key, e);
    if (!parent_key.IsZero()) children[parent_key].push_back(key);
  }
  std::vector<ChunkKey> victims;
  absl::flat_hash_set<ChunkKey> taken;
  absl::flat_hash_set<ChunkKey> visiting;  // on the current path: a loop of links ends here
  std::function<bool(const ChunkKey&)> take = [&](const ChunkKey& key)
                                                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> bool {
    if (taken.contains(key) || !visiting.insert(key).second) return true;
    if (put_pins_.contains(key) || inflight_.contains(key)) {
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
        "chunk ", key.ToHex(), " (depth ", ChainLengthLocked(key) - 1, ")",
        corrupt.contains(key) ? ": failed a check" : ": follows a chunk that failed a check"));
    return true;
  };
  for (const ChunkKey& key : corrupt) {
    if (chunks_.contains(key)) take(key);
  }
  // Catalog entries Load could not serve, and prefixes that end at no stored chunk.
  Catalog::Batch batch = catalog_->NewBatch();
  for (const ChunkKey& key : dropped_chunks_) {
    if (chunks_.contains(key)) continue;  // a later Put stored it again, soundly
    batch.DeleteChunk(key);
    report.removed.push_back(
        absl::StrCat("catalog entry of chunk ", key.ToHex(), ": could not be loaded"));
  }
  for (const ChunkKey& key : dropped_prefixes_) {
    if (chunks_.contains(key)) continue;
    batch.DeletePrefix(key);
    report.removed.push_back(
        absl::StrCat("prefix ", key.ToHex(), ": ends at a chunk that is not stored"));
  }
  report.chunks_removed = victims.size();
  CKV_RETURN_IF_ERROR(RemoveChunksLocked(victims, batch, Removal::kRepair));
  dropped_chunks_.clear();
  dropped_prefixes_.clear();
  open_problems_.clear();
  if (!report.removed.empty()) {
    logger_->Log(LogLevel::kWarning,
                 absl::StrCat("repair of ", path_, " removed ", report.removed.size(), " entries"));
  }
  return report;
}

}  // namespace ckv::storage
