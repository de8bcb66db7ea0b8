// SPDX-License-Identifier: Apache-2.0
// storage/chunk_store_internal.h: helpers shared by the files that implement ChunkStore
// (chunk_store*.cc). Not for use outside them.
#ifndef CKV_STORAGE_CHUNK_STORE_INTERNAL_H_
#define CKV_STORAGE_CHUNK_STORE_INTERNAL_H_

#include "absl/status/status.h"

namespace ckv::storage::chunk_store_internal {

// Directories below the store's path.
inline constexpr char kCatalogDir[] = "catalog";
inline constexpr char kSegmentsDir[] = "segments";
// The index a clean close leaves for the next open (storage/chunk_store_snapshot.cc).
inline constexpr char kSnapshotFile[] = "index.snapshot";

// Whether a punch gave its blocks back (a file system without hole punching never had them
// allocated apart: Unimplemented counts as given back).
inline bool PunchGaveBack(const absl::Status& s) { return s.ok() || absl::IsUnimplemented(s); }

}  // namespace ckv::storage::chunk_store_internal

#endif  // CKV_STORAGE_CHUNK_STORE_INTERNAL_H_
