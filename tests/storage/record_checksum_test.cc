// SPDX-License-Identifier: Apache-2.0
// Tests that a record's checksum (storage/record_checksum.h) does not depend on the SIMD path
// that computes it: on x86 it goes through libxxhash's run-time dispatch (SSE2, AVX2 or
// AVX-512), on aarch64 through plain XXH3_64bits (NEON). Both must equal XXH3-64 as its scalar
// code defines it, or a store written on one machine would read as corrupt on the other.
#include "storage/record_checksum.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace ckv::storage {
namespace {

// RecordChecksum2 over the bytes split in two at a third, with a state of libxxhash's own (the
// reference below renames the state type).
uint64_t Checksum2(const unsigned char* data, size_t n) {
  XXH3_state_t* state = XXH3_createState();
  const uint64_t h = RecordChecksum2(state, data, n / 3, data + n / 3, n - n / 3);
  XXH3_freeState(state);
  return h;
}

}  // namespace
}  // namespace ckv::storage

// The reference: xxhash.h again, inlined (its functions renamed XXH_INLINE_*, which also undoes
// xxh_x86dispatch.h's renaming in this file) and built for no vector unit (XXH_VECTOR 0 is
// XXH_SCALAR). From here on XXH3_64bits is that scalar code.
#define XXH_INLINE_ALL
#define XXH_VECTOR 0
#include "xxhash.h"

namespace ckv::storage {
namespace {

std::vector<unsigned char> Bytes(size_t n) {
  std::vector<unsigned char> b(n);
  uint64_t x = 0x9e3779b97f4a7c15u;
  for (auto& c : b) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<unsigned char>(x);
  }
  return b;
}

// Every length up to 300 bytes (XXH3's short-input cases end at 240) and longer ones growing by a
// quarter up to 4 MiB (stripes, 1 KiB blocks, partial last stripes), at an odd offset.
TEST(RecordChecksumTest, EqualsTheScalarXxh3AtEveryLength) {
  const std::vector<unsigned char> bytes = Bytes((4 << 20) + 1);
  const unsigned char* data = bytes.data() + 1;
  for (size_t n = 0; n <= (4u << 20); n = n < 300 ? n + 1 : n + n / 4) {
    SCOPED_TRACE(n);
    const uint64_t want = XXH3_64bits(data, n);
    ASSERT_EQ(RecordChecksum(data, n), want);
    ASSERT_EQ(Checksum2(data, n), want);
  }
}

// XXH3-64 of no bytes, seed 0, as xxHash's own test vectors give it: the reference above is the
// published function, not something this file made up.
TEST(RecordChecksumTest, EmptyInputHasThePublishedValue) {
  EXPECT_EQ(RecordChecksum(nullptr, 0), uint64_t{0x2D06800538D394C2});
}

}  // namespace
}  // namespace ckv::storage
