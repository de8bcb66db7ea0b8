// SPDX-License-Identifier: Apache-2.0
// tools/kvctl/open_to_free.h: how kvctl rm and gc open a store whose file system is too full for
// it to open (RocksDB writes files when it opens). Header-only, with the open and the freeing
// passed in, so that a test drives it through the engine's seams
// (tests/storage/chunk_store_fault_test.cc, FullDiskOpenTest) exactly as kvctl does through the
// real file system.
//
// The blocks are given back without writing (engine::FreeSpaceToOpen), in two steps:
//   1. the free slots' and the index snapshot's blocks, which nothing catalogued uses, then
//      open again;
//   2. only when that open still finds the file system full, and the caller is removing
//      prefixes (rm): the blocks of the chunks the removal frees, then open again.
// Step 2 punches chunks that stay catalogued until the caller's DeletePrefix commits: should the
// open still fail, they read back as DataLoss. So it is the last resort; when step 1 is enough the
// removal goes through the ordinary DeletePrefix, which commits before it punches.
//
// Thread-safety: reentrant.
#ifndef CKV_TOOLS_KVCTL_OPEN_TO_FREE_H_
#define CKV_TOOLS_KVCTL_OPEN_TO_FREE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>

#include "absl/status/statusor.h"
#include "ckv/chunk_key.h"
#include "ckv/engine.h"
#include "ckv/status.h"
#include "common/status_macros.h"

namespace ckv::kvctl {

using OpenFn = std::function<absl::StatusOr<std::unique_ptr<Engine>>()>;
// engine::FreeSpaceToOpen for the store, freeing the chunks of `delete_prefixes` too.
using FreeFn = std::function<absl::StatusOr<uint64_t>(std::span<const ChunkKey> delete_prefixes)>;
// Told what each step gave back: `freed` bytes, `prefixes` when the prefixes' chunks were among
// them.
using FreedFn = std::function<void(uint64_t freed, bool prefixes)>;

// `opened` is the store's first open (or a NoSpaceError standing for one not tried): returned as
// it is unless it failed for a full file system (IsNoSpace). Otherwise the steps above; an error
// of `free` returns the open's error before it (which says what is wrong).
inline absl::StatusOr<std::unique_ptr<Engine>> OpenToFree(
    absl::StatusOr<std::unique_ptr<Engine>> opened, std::span<const ChunkKey> delete_prefixes,
    const OpenFn& open, const FreeFn& free, const FreedFn& freed) {
  if (opened.ok() || !IsNoSpace(opened.status())) return opened;
  absl::StatusOr<uint64_t> given_back = free({});
  if (!given_back.ok()) return opened;
  freed(*given_back, false);
  opened = open();
  if (opened.ok() || !IsNoSpace(opened.status()) || delete_prefixes.empty()) return opened;
  given_back = free(delete_prefixes);
  if (!given_back.ok()) return opened;
  freed(*given_back, true);
  return open();
}

}  // namespace ckv::kvctl

#endif  // CKV_TOOLS_KVCTL_OPEN_TO_FREE_H_
