// storage/chunk_store_verify.cc: ChunkStore::Verify (every record read and checked, the catalog's
// structure checked) and ChunkStore::Repair (removes what Verify found damaged).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "storage/chunk_store.h"

namespace ckv::storage {

absl::StatusOr<VerifyReport> ChunkStore::Verify(const ProgressFn& progress) {
  return VerifyInternal(progress, nullptr, nullptr);
}

absl::StatusOr<VerifyReport> ChunkStore::VerifyInternal(const ProgressFn& progress,
                                                        absl::flat_hash_set<ChunkKey>* corrupt,
                                                        std::vector<std::string>* unreadable) {
  VerifyReport report;
  std::vector<ChunkKey> keys;
  uint64_t total_bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    report.problems = open_problems_;
    keys.reserve(chunks_.size());
    for (const auto& [key, e] : chunks_) {
      keys.push_back(key);
      total_bytes += segments_.at(e.segment)->chunk_bytes();
    }
    CheckStructureLocked(report, corrupt);
  }
  std::sort(keys.begin(), keys.end());
  CheckKeys(keys, report, corrupt);
  CKV_RETURN_IF_ERROR(VerifyRecords(keys, total_bytes, progress, report, corrupt, unreadable));
  return report;
}

void ChunkStore::CheckStructureLocked(VerifyReport& report,
                                      absl::flat_hash_set<ChunkKey>* corrupt) {
  for (const auto& [key, e] : chunks_) {
    if (!specs_.contains(FingerprintOf(e))) {
      report.problems.push_back(
          absl::StrCat("chunk ", key.ToHex(), " names an unknown model spec"));
    }
    const ChunkKey parent_key = ParentKeyLocked(key, e);
    if (!parent_key.IsZero()) {
      auto parent = chunks_.find(parent_key);
      if (parent == chunks_.end()) {
        report.problems.push_back(absl::StrCat("chunk ", key.ToHex(), " has no stored parent"));
        if (corrupt != nullptr) corrupt->insert(key);
      } else if (parent->second.depth + 1 != e.depth) {
        report.problems.push_back(absl::StrCat("chunk ", key.ToHex(), " at depth ", e.depth,
                                               " has a parent at depth ",
                                               parent->second.depth));
      }
    } else if (e.depth != 0) {
      report.problems.push_back(
          absl::StrCat("chunk ", key.ToHex(), " at depth ", e.depth, " has no parent"));
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
      report.problems.push_back(absl::StrCat("chunk ", key.ToHex(), " counts ", e.children,
                                             " children; ", want, " stored chunks name it"));
    }
    if ((e.children == 0) != leaves_.contains(key)) {
      report.problems.push_back(absl::StrCat("chunk ", key.ToHex(), " with ", e.children,
                                             " children is ", e.children == 0 ? "not " : "",
                                             "in the set of leaves eviction picks from"));
    }
  }
  if (leaves_.size() > chunks_.size()) {
    report.problems.push_back(absl::StrCat(leaves_.size(), " leaves for ", chunks_.size(),
                                           " stored chunks"));
  }
  for (const auto& [id, p] : prefixes_) {
    auto it = chunks_.find(id);
    if (it == chunks_.end() || it->second.depth + 1 != p.chunks) {
      report.problems.push_back(absl::StrCat("prefix ", id.ToHex(), " of ", p.chunks,
                                             " chunks does not end at a stored chunk of that "
                                             "depth"));
    }
  }
}

void ChunkStore::CheckKeys(std::span<const ChunkKey> keys, VerifyReport& report,
                           absl::flat_hash_set<ChunkKey>* corrupt) {
  // The catalog's own record: its key must be the hash of its parent, spec and tokens.
  for (const ChunkKey& key : keys) {
    auto record = catalog_->GetChunk(key);
    if (!record.ok()) {
      if (!absl::IsNotFound(record.status())) {  // NotFound: removed while we verified
        report.problems.push_back(std::string(record.status().message()));
      }
      continue;
    }
    if (!(ChainChunkKey(record->parent, record->fingerprint, record->tokens) == key)) {
      report.problems.push_back(absl::StrCat("chunk ", key.ToHex(),
                                             ": key does not match the hash of its parent, "
                                             "model and tokens"));
      if (corrupt != nullptr) corrupt->insert(key);
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
        chunks.push_back(PinnedChunks::Chunk{it->first, segments_.at(e.segment).get(), e.slot, {},
                                             e.importance, e.loads});
        PinLocked(SlotId{e.segment, e.slot});
      }
      handle.reset(new PinnedChunks(this, std::move(chunks)));
    }
    CKV_RETURN_IF_ERROR(ReadChecksums(*handle));
    const std::vector<PinnedChunks::Chunk>& pinned = handle->chunks();
    std::vector<BandRead> reads;
    for (size_t i = 0; i < pinned.size(); ++i) {
      for (uint32_t band = 0; band < pinned[i].segment->bands(); ++band) {
        reads.push_back(BandRead{pinned[i].segment, pinned[i].slot, band, &pinned[i].key,
                                 pinned[i].checksums, i});
      }
    }
    absl::Status s = ReadBands(std::move(reads), kMaxIoBytes,
                               [&](const BandRead& read, uint32_t record, const absl::Status& st,
                                   const std::byte*) {
                                 report.records_checked++;
                                 report.bytes_checked += read.seg->record_bytes(record);
                                 done_bytes += read.seg->record_stride(read.band);
                                 if (st.ok()) return;
                                 if (absl::IsDataLoss(st) &&
                                     st.message().find("checksum") != std::string_view::npos) {
                                   report.checksum_failures++;
                                   if (corrupt != nullptr) corrupt->insert(*read.key);
                                 } else if (unreadable != nullptr) {
                                   unreadable->push_back(std::string(st.message()));
                                 }
                                 report.problems.push_back(std::string(st.message()));
                               });
    CKV_RETURN_IF_ERROR(s);
    report.chunks_checked += pinned.size();
    if (progress) progress(done_bytes, total_bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<RepairReport> ChunkStore::Repair(const ProgressFn& progress) {
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
  std::function<bool(const ChunkKey&)> take = [&](const ChunkKey& key) -> bool {
    if (taken.contains(key)) return true;
    const ChunkEntry& e = chunks_.at(key);
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
    if (!all) return false;
    taken.insert(key);
    victims.push_back(key);
    report.removed.push_back(absl::StrCat(
        "chunk ", key.ToHex(), " (depth ", e.depth, ")",
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
    report.removed.push_back(absl::StrCat("catalog entry of chunk ", key.ToHex(),
                                          ": could not be loaded"));
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
    logger_->Log(LogLevel::kWarning, absl::StrCat("repair of ", path_, " removed ",
                                                  report.removed.size(), " entries"));
  }
  return report;
}

}  // namespace ckv::storage
