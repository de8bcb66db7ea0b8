// storage/record_checksum.h: the checksum of a record, the one definition every reader and
// writer uses.
//
// XXH3-64 over the record bytes (K then V, without padding), seed 0. libxxhash's dispatching
// entry point picks its AVX2 or AVX-512 code at run time where the CPU has it (XXH3_64bits itself
// is the SSE2 build); the values are identical either way.
//
// Thread-safety: pure functions.
#ifndef CKV_STORAGE_RECORD_CHECKSUM_H_
#define CKV_STORAGE_RECORD_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "xxhash.h"
#include "xxh_x86dispatch.h"

namespace ckv::storage {

inline uint64_t RecordChecksum(const void* data, size_t bytes) {
  return XXH3_64bits_dispatch(data, bytes);
}

// The one verification of bytes read against the checksum their writer recorded, used by every
// read path (the store's synchronous reads and the read engine's): OK, or DataLoss
// "<what>: checksum 0x<actual> != 0x<expected>", where `what` names the record and where it was
// read from (called only on a mismatch).
template <typename Describe>
absl::Status VerifyRecordChecksum(const void* data, size_t bytes, uint64_t expected,
                                  const Describe& what) {
  const uint64_t actual = RecordChecksum(data, bytes);
  if (actual == expected) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat("%s: checksum 0x%016x != 0x%016x", what(), actual,
                                             expected));
}

}  // namespace ckv::storage

#endif  // CKV_STORAGE_RECORD_CHECKSUM_H_
