// SPDX-License-Identifier: Apache-2.0
// storage/chunk_store_gc.cc: ChunkStore::Gc: gives back the blocks of free slots.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "storage/chunk_store.h"
#include "storage/chunk_store_internal.h"

namespace ckv::storage {

namespace {

using chunk_store_internal::kSegmentsDir;

}  // namespace

absl::StatusOr<GcReport> ChunkStore::Gc() {
  CKV_RETURN_IF_ERROR(RefuseIfReadOnly("Gc"));
  GcReport report;
  absl::MutexLock lock(&mu_);
  CKV_ASSIGN_OR_RETURN(report.bytes_reclaimed, RetryPunchesLocked());
  std::vector<uint32_t> empty;
  for (auto& [id, segment] : segments_) {
    if (segment->used_slots() == 0) {
      CKV_ASSIGN_OR_RETURN(uint64_t bytes, segment->file()->AllocatedBytes());
      empty.push_back(id);
      report.bytes_reclaimed += bytes;
      continue;
    }
    CKV_ASSIGN_OR_RETURN(uint64_t freed, PunchFreeRuns(*segment));
    report.bytes_reclaimed += freed;
  }
  if (empty.empty()) return report;
  // Removing a segment a reader still holds would leave it reading freed memory: a pinned slot
  // stays used until unpinned, and every failed punch was retried above.
  CKV_DCHECK(unpunched_.empty());
  for (const auto& [slot, pins] : read_pins_) {
    CKV_CHECK(std::find(empty.begin(), empty.end(), slot.first) == empty.end());
  }
  // A segment with no used slot has no chunk, no Put writing into it (allocation marks slots
  // used under mu_) and no reader (a pinned slot stays used until unpinned). The catalog forgets
  // it first, so a crash in between leaves a file Open reclaims as an orphan.
  Catalog::Batch batch = catalog_->NewBatch();
  for (uint32_t id : empty) batch.DeleteSegment(id);
  CKV_RETURN_IF_ERROR(catalog_->Commit(batch));
  for (uint32_t id : empty) {
    segments_.erase(id);
    CKV_RETURN_IF_ERROR(fs_->DeleteFile(SegmentPath(id)));
    report.segments_removed++;
  }
  CKV_RETURN_IF_ERROR(fs_->SyncDir(absl::StrCat(path_, "/", kSegmentsDir)));
  return report;
}

}  // namespace ckv::storage
