// SPDX-License-Identifier: Apache-2.0
// Tests of ckv/chunk_key.h: hex form and the hash chain.
#include "ckv/chunk_key.h"

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckv {
namespace {

using ::testing::HasSubstr;

std::vector<int32_t> Iota(size_t n, int32_t first = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(ChunkKeyTest, HexRoundTrip) {
  const ChunkKey keys[] = {
      {0, 0}, {0x0123456789abcdefULL, 0xfedcba9876543210ULL}, {~uint64_t{0}, ~uint64_t{0}}, {1, 0},
      {0, 1},
  };
  for (const ChunkKey& k : keys) {
    const std::string hex = k.ToHex();
    ASSERT_EQ(hex.size(), 32u);
    absl::StatusOr<ChunkKey> back = ChunkKey::FromHex(hex);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, k) << hex;
  }
  EXPECT_EQ((ChunkKey{0x0123456789abcdefULL, 0xfedcba9876543210ULL}.ToHex()),
            "0123456789abcdeffedcba9876543210");  // hi first, lowercase
  EXPECT_EQ((ChunkKey{1, 2}.ToHex()), "00000000000000010000000000000002");
  EXPECT_EQ(*ChunkKey::FromHex("0123456789ABCDEFFEDCBA9876543210"),
            (ChunkKey{0x0123456789abcdefULL, 0xfedcba9876543210ULL}));
}

TEST(ChunkKeyTest, FromHexRejectsBadInput) {
  const std::string bad[] = {
      "",
      "0123456789abcdef0123456789abcde",             // 31 digits
      "0123456789abcdef0123456789abcdef0",           // 33 digits
      "0123456789abcdef0123456789abcdeg",            // not hex
      "0x23456789abcdef0123456789abcdef",            // prefix
      " 123456789abcdef0123456789abcdef",            // space
      "-123456789abcdef0123456789abcdef",            // sign
      std::string(32, '0').replace(16, 1, 1, '\0'),  // NUL inside
  };
  for (const std::string& s : bad) {
    absl::StatusOr<ChunkKey> k = ChunkKey::FromHex(s);
    EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(k.status().message(), HasSubstr("chunk key")) << s;
  }
}

TEST(ChunkKeyTest, IsZeroOrderingAndHash) {
  EXPECT_TRUE(ChunkKey{}.IsZero());
  EXPECT_FALSE((ChunkKey{0, 1}.IsZero()));
  EXPECT_LT((ChunkKey{0, 5}), (ChunkKey{1, 0}));  // hi is the major field
  absl::flat_hash_set<ChunkKey> set = {{1, 2}, {2, 1}, {1, 2}};
  EXPECT_EQ(set.size(), 2u);
}

TEST(ChainChunkKeyTest, DependsOnParentFingerprintAndTokens) {
  const ChunkKey fp{0x1111, 0x2222};
  const std::vector<int32_t> tokens = Iota(16);
  const ChunkKey k = ChainChunkKey(ChunkKey{}, fp, tokens);
  EXPECT_FALSE(k.IsZero());
  EXPECT_EQ(k, ChainChunkKey(ChunkKey{}, fp, tokens));  // deterministic

  absl::flat_hash_set<ChunkKey> seen = {k};
  EXPECT_TRUE(seen.insert(ChainChunkKey(ChunkKey{0, 1}, fp, tokens)).second);
  EXPECT_TRUE(seen.insert(ChainChunkKey(ChunkKey{1, 0}, fp, tokens)).second);
  EXPECT_TRUE(seen.insert(ChainChunkKey(ChunkKey{}, ChunkKey{0x1111, 0x2223}, tokens)).second);
  EXPECT_TRUE(seen.insert(ChainChunkKey(ChunkKey{}, ChunkKey{0x1112, 0x2222}, tokens)).second);
  // Parent and fingerprint are not interchangeable.
  EXPECT_TRUE(seen.insert(ChainChunkKey(fp, ChunkKey{}, tokens)).second);
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<int32_t> changed = tokens;
    changed[i] += 1;
    EXPECT_TRUE(seen.insert(ChainChunkKey(ChunkKey{}, fp, changed)).second) << i;
  }
  std::vector<int32_t> swapped = tokens;
  std::swap(swapped[0], swapped[1]);
  EXPECT_TRUE(seen.insert(ChainChunkKey(ChunkKey{}, fp, swapped)).second);
  std::vector<int32_t> negative = tokens;
  negative[3] = -1;
  EXPECT_TRUE(seen.insert(ChainChunkKey(ChunkKey{}, fp, negative)).second);
  // A different length is a different key, too (the empty chunk included).
  EXPECT_TRUE(seen.insert(ChainChunkKey(ChunkKey{}, fp, Iota(15))).second);
  EXPECT_TRUE(seen.insert(ChainChunkKey(ChunkKey{}, fp, {})).second);
}

TEST(ChainChunkKeysTest, ChainsWholeChunksAndIgnoresTail) {
  const ChunkKey fp{7, 9};
  const std::vector<int32_t> tokens = Iota(16 * 3 + 5, 100);
  const std::vector<ChunkKey> keys = ChainChunkKeys(fp, 16, tokens);
  ASSERT_EQ(keys.size(), 3u);
  const std::span<const int32_t> all(tokens);
  EXPECT_EQ(keys[0], ChainChunkKey(ChunkKey{}, fp, all.subspan(0, 16)));
  EXPECT_EQ(keys[1], ChainChunkKey(keys[0], fp, all.subspan(16, 16)));
  EXPECT_EQ(keys[2], ChainChunkKey(keys[1], fp, all.subspan(32, 16)));
  // The tail (5 tokens) has no key and does not change the others.
  EXPECT_EQ(ChainChunkKeys(fp, 16, all.first(48)), keys);
  EXPECT_TRUE(ChainChunkKeys(fp, 16, all.first(15)).empty());
  EXPECT_TRUE(ChainChunkKeys(fp, 16, {}).empty());
  EXPECT_EQ(ChainChunkKeys(fp, 1, all.first(4)).size(), 4u);
}

TEST(ChainChunkKeysTest, SharedPrefixSharesLeadingKeys) {
  const ChunkKey fp{3, 4};
  std::vector<int32_t> a = Iota(16 * 5);
  std::vector<int32_t> b = a;
  b[16 * 2 + 7] = 999999;  // diverge inside chunk 2
  const std::vector<ChunkKey> ka = ChainChunkKeys(fp, 16, a);
  const std::vector<ChunkKey> kb = ChainChunkKeys(fp, 16, b);
  ASSERT_EQ(ka.size(), 5u);
  ASSERT_EQ(kb.size(), 5u);
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_EQ(ka[1], kb[1]);
  // From the divergence on, every key differs, even where the chunk's own tokens agree.
  for (size_t i = 2; i < 5; ++i) EXPECT_NE(ka[i], kb[i]) << i;
  // Equal chunk tokens at different depths get different keys.
  std::vector<int32_t> repeated(16 * 2, 42);
  const std::vector<ChunkKey> kr = ChainChunkKeys(fp, 16, repeated);
  EXPECT_NE(kr[0], kr[1]);
  // The same tokens under another model share nothing.
  const std::vector<ChunkKey> other = ChainChunkKeys(ChunkKey{3, 5}, 16, a);
  for (size_t i = 0; i < 5; ++i) EXPECT_NE(ka[i], other[i]) << i;
}

// Chunk keys name every stored record; a silent change of the encoding (see chunk_key.cc) would
// orphan every existing store. These pin it.
TEST(ChainChunkKeyTest, GoldenValues) {
  const std::vector<int32_t> tokens = Iota(16);
  EXPECT_EQ(ChainChunkKey(ChunkKey{}, ChunkKey{}, tokens).ToHex(),
            "4f44d4cc90374bccc18261732bdaa281");
  const ChunkKey fp = *ChunkKey::FromHex("ca530f437de0d38f792edea6d47d0f3d");  // qwen2.5-7b fp16
  EXPECT_EQ(ChainChunkKey(ChunkKey{}, fp, tokens).ToHex(), "d0f291700f9d6d203bc6fdd198697643");
}

}  // namespace
}  // namespace ckv
