// storage/chunk_store_internal.h: helpers shared by the files that implement ChunkStore
// (chunk_store*.cc). Not for use outside them.
#ifndef CKV_STORAGE_CHUNK_STORE_INTERNAL_H_
#define CKV_STORAGE_CHUNK_STORE_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ckv::storage::chunk_store_internal {

// Directories below the store's path.
inline constexpr char kCatalogDir[] = "catalog";
inline constexpr char kSegmentsDir[] = "segments";

inline int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// Whether a punch gave its blocks back (a file system without hole punching never had them
// allocated apart: Unimplemented counts as given back).
inline bool PunchGaveBack(const absl::Status& s) { return s.ok() || absl::IsUnimplemented(s); }

}  // namespace ckv::storage::chunk_store_internal

#endif  // CKV_STORAGE_CHUNK_STORE_INTERNAL_H_
