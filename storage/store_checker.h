// SPDX-License-Identifier: Apache-2.0
// storage/store_checker.h: the checks and repairs of a ChunkStore, apart from its reads and
// writes. Verify reads every record back and checks the in-memory index against itself and the
// catalog; Repair removes what Verify found damaged, with every chunk after it in its prefixes;
// Gc gives back the blocks of free slots and deletes segment files that hold no chunk.
//
// ChunkStore::Verify, Repair and Gc each run one. A checker works on its store's state under the
// store's lock (it is a friend of ChunkStore) and keeps nothing of its own between calls.
#ifndef CKV_STORAGE_STORE_CHECKER_H_
#define CKV_STORAGE_STORE_CHECKER_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/chunk_key.h"
#include "ckv/reports.h"
#include "storage/chunk_store.h"

namespace ckv::storage {

class StoreChecker {
 public:
  explicit StoreChecker(ChunkStore& store) : store_(store) {}

  // Every record read and checked, and the structure of the index and the catalog. With
  // `corrupt`, also the chunks that failed a check, which Repair may act on; in `unreadable` the
  // records whose read failed otherwise (EIO may pass: not repaired).
  absl::StatusOr<VerifyReport> Verify(const ProgressFn& progress,
                                      absl::flat_hash_set<ChunkKey>* corrupt,
                                      std::vector<std::string>* unreadable);
  absl::StatusOr<RepairReport> Repair(const ProgressFn& progress);
  absl::StatusOr<GcReport> Gc();

 private:
  // Verify's steps: the in-memory structure (parents, depths, child counts, prefix ends); each
  // catalog record's key against the hash of its parent, spec and tokens; every record's
  // checksum, read in slot order.
  // Sets `depths` to the depth of each chunk whose parent links reach a first chunk.
  void CheckStructureLocked(VerifyReport& report, absl::flat_hash_set<ChunkKey>* corrupt,
                            absl::flat_hash_map<ChunkKey, uint32_t>* depths)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_.mu_);
  void CheckKeys(std::span<const ChunkKey> keys,
                 const absl::flat_hash_map<ChunkKey, uint32_t>& depths, VerifyReport& report,
                 absl::flat_hash_set<ChunkKey>* corrupt);
  absl::Status VerifyRecords(std::span<const ChunkKey> keys, uint64_t total_bytes,
                             const ProgressFn& progress, VerifyReport& report,
                             absl::flat_hash_set<ChunkKey>* corrupt,
                             std::vector<std::string>* unreadable);

  ChunkStore& store_;
};

}  // namespace ckv::storage

#endif  // CKV_STORAGE_STORE_CHECKER_H_
