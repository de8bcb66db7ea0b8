// SPDX-License-Identifier: Apache-2.0
// remote/chunk_value.h: a chunk's value round-trips, and every kind of damage or foreign value
// is DataLoss, never served.
#include "remote/chunk_value.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckv::remote {
namespace {

ModelSpec SmallSpec(const std::string& id = "tiny") {
  ModelSpec s;
  s.model_id = id;
  s.layers = 3;
  s.q_heads = 2;
  s.kv_heads = 1;
  s.head_dim = 8;
  s.chunk_tokens = 4;
  return s;
}

struct Records {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<std::span<const std::byte>> spans;
};

Records MakeRecords(const ModelSpec& spec, int seed) {
  Records r;
  for (uint32_t l = 0; l < spec.layers; ++l) {
    std::vector<std::byte> rec(spec.RecordBytes());
    for (size_t i = 0; i < rec.size(); ++i) {
      rec[i] = static_cast<std::byte>((i * 7 + l * 13 + seed) & 0xff);
    }
    r.bytes.push_back(std::move(rec));
  }
  for (const auto& b : r.bytes) r.spans.emplace_back(b);
  return r;
}

TEST(ChunkValueTest, KeyNamesPrefixFingerprintAndChunk) {
  const ChunkKey fp{0x1, 0x2};
  const ChunkKey key{0xabc, 0xdef};
  EXPECT_EQ(ChunkValueKey("ckv", fp, key),
            "ckv:00000000000000010000000000000002:0000000000000abc0000000000000def");
}

TEST(ChunkValueTest, RoundTripsBitExact) {
  const ModelSpec spec = SmallSpec();
  const ChunkKey key{42, 43};
  Records r = MakeRecords(spec, 1);
  const std::string value = EncodeChunkValue(spec, key, r.spans);
  EXPECT_EQ(value.size(), ChunkValueBytes(spec));
  EXPECT_EQ(value.size(), 48u + 8 * 3 + 8 + 3 * spec.RecordBytes());
  EXPECT_EQ(value.substr(0, 4), "CKVR");
  auto decoded = DecodeChunkValue(spec, key, value);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->records.size(), 3u);
  for (uint32_t l = 0; l < 3; ++l) {
    ASSERT_EQ(decoded->records[l].size(), spec.RecordBytes());
    EXPECT_EQ(std::memcmp(decoded->records[l].data(), r.bytes[l].data(), spec.RecordBytes()), 0);
  }
}

TEST(ChunkValueTest, EveryFlippedByteIsDataLoss) {
  const ModelSpec spec = SmallSpec();
  const ChunkKey key{42, 43};
  Records r = MakeRecords(spec, 2);
  const std::string value = EncodeChunkValue(spec, key, r.spans);
  for (size_t i = 0; i < value.size(); ++i) {
    std::string bad = value;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    auto decoded = DecodeChunkValue(spec, key, bad);
    ASSERT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
  }
}

TEST(ChunkValueTest, RecordDamageNamesTheRecord) {
  const ModelSpec spec = SmallSpec();
  const ChunkKey key{42, 43};
  Records r = MakeRecords(spec, 3);
  std::string value = EncodeChunkValue(spec, key, r.spans);
  value[value.size() - 1] ^= 0x40;  // last byte of layer 2's record
  auto decoded = DecodeChunkValue(spec, key, value);
  ASSERT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(decoded.status().message().find("record L2: checksum"), absl::string_view::npos)
      << decoded.status();
}

TEST(ChunkValueTest, ForeignModelOrKeyIsDataLoss) {
  const ModelSpec spec = SmallSpec("model-a");
  const ModelSpec other = SmallSpec("model-b");  // same shape, other weights
  const ChunkKey key{42, 43};
  Records r = MakeRecords(spec, 4);
  const std::string value = EncodeChunkValue(spec, key, r.spans);
  auto foreign = DecodeChunkValue(other, key, value);
  ASSERT_EQ(foreign.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(foreign.status().message().find("model fingerprint"), absl::string_view::npos);
  auto wrong_key = DecodeChunkValue(spec, ChunkKey{42, 44}, value);
  ASSERT_EQ(wrong_key.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(wrong_key.status().message().find("chunk key"), absl::string_view::npos);
}

TEST(ChunkValueTest, TruncatedOrExtendedIsDataLoss) {
  const ModelSpec spec = SmallSpec();
  const ChunkKey key{1, 2};
  Records r = MakeRecords(spec, 5);
  const std::string value = EncodeChunkValue(spec, key, r.spans);
  for (size_t size : {size_t{0}, size_t{3}, size_t{47}, size_t{60}, value.size() - 1}) {
    EXPECT_EQ(DecodeChunkValue(spec, key, value.substr(0, size)).status().code(),
              absl::StatusCode::kDataLoss)
        << size;
  }
  EXPECT_EQ(DecodeChunkValue(spec, key, value + "x").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace ckv::remote
