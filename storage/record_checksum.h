// SPDX-License-Identifier: Apache-2.0
// storage/record_checksum.h: the checksum of a record, the one definition every reader and
// writer uses.
//
// XXH3-64 over the record bytes (K then V, without padding), seed 0. On x86, libxxhash's
// dispatching entry point (xxh_x86dispatch.h) picks its AVX2 or AVX-512 code at run time where
// the CPU has it (XXH3_64bits itself is the SSE2 build); elsewhere (aarch64) plain XXH3_64bits,
// NEON or scalar as libxxhash was built. XXH3 is defined independently of the instructions that
// compute it, so the values, and a store's bytes, are identical on every path
// (tests/storage/record_checksum_test.cc checks them against the scalar reference).
//
// Thread-safety: pure functions.
#ifndef CKV_STORAGE_RECORD_CHECKSUM_H_
#define CKV_STORAGE_RECORD_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "xxhash.h"
#if defined(__x86_64__) || defined(__i386__)
#include "xxh_x86dispatch.h"
#endif

namespace ckv::storage {

inline uint64_t RecordChecksum(const void* data, size_t bytes) {
#if defined(__x86_64__) || defined(__i386__)
  return XXH3_64bits_dispatch(data, bytes);
#else
  return XXH3_64bits(data, bytes);
#endif
}

// RecordChecksum of the bytes of `a` followed by those of `b`, without joining them (a record
// written straight from the caller's K and V tensors). `state` is scratch from XXH3_createState.
inline uint64_t RecordChecksum2(XXH3_state_t* state, const void* a, size_t a_bytes, const void* b,
                                size_t b_bytes) {
  XXH3_64bits_reset(state);
#if defined(__x86_64__) || defined(__i386__)
  XXH3_64bits_update_dispatch(state, a, a_bytes);
  XXH3_64bits_update_dispatch(state, b, b_bytes);
#else
  XXH3_64bits_update(state, a, a_bytes);
  XXH3_64bits_update(state, b, b_bytes);
#endif
  return XXH3_64bits_digest(state);
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
  return absl::DataLossError(
      absl::StrFormat("%s: checksum 0x%016x != 0x%016x", what(), actual, expected));
}

}  // namespace ckv::storage

#endif  // CKV_STORAGE_RECORD_CHECKSUM_H_
