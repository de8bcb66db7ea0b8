// storage/record_checksum.h: the checksum of a record, the one definition every reader and
// writer uses.
//
// XXH3-64 over the record bytes (K then V, without padding), seed 0. libxxhash's dispatching
// entry point picks its AVX2 or AVX-512 code at run time where the CPU has it (XXH3_64bits itself
// is the SSE2 build); the values are identical either way.
//
// Thread-safety: a pure function.
#ifndef CKV_STORAGE_RECORD_CHECKSUM_H_
#define CKV_STORAGE_RECORD_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

#include "xxhash.h"
#include "xxh_x86dispatch.h"

namespace ckv::storage {

inline uint64_t RecordChecksum(const void* data, size_t bytes) {
  return XXH3_64bits_dispatch(data, bytes);
}

}  // namespace ckv::storage

#endif  // CKV_STORAGE_RECORD_CHECKSUM_H_
