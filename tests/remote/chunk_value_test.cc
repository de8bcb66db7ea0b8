// SPDX-License-Identifier: Apache-2.0
// remote/chunk_value.h: a chunk's value round-trips, and every kind of damage or foreign value
// is DataLoss, never served; a head and records read apart verify on their own.
#include "remote/chunk_value.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/summary.h"
#include "tests/shaped_spec.h"

namespace ckv::remote {
namespace {

ModelSpec SmallSpec(const std::string& id = "tiny") {
  return ::ckv::testing::ShapedSpec(id, 3, 2, 1, 8, 4);
}

struct Records {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<std::span<const std::byte>> spans;
  std::vector<std::byte> minmax, mean;  // the chunk's summaries (any bytes of their sizes)
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
  const ChunkValueLayout layout = LayoutOfChunkValue(spec);
  for (size_t i = 0; i < layout.minmax_bytes; ++i) r.minmax.push_back(std::byte(i * 3 + seed));
  for (size_t i = 0; i < layout.mean_bytes; ++i) r.mean.push_back(std::byte(i * 5 + seed));
  return r;
}

std::string Encode(const ModelSpec& spec, const ChunkKey& key, const Records& r) {
  return EncodeChunkValue(spec, key, r.spans, r.minmax, r.mean);
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
  const std::string value = Encode(spec, key, r);
  EXPECT_EQ(value.size(), ChunkValueBytes(spec));
  // Summaries of kernels::SummaryFormat's sizes: 3 layers x 1 kv head x (4 + 2 x 8) and (2 + 8).
  const ChunkValueLayout layout = LayoutOfChunkValue(spec);
  EXPECT_EQ(layout.minmax_bytes, kernels::SummaryFormat::For(spec).MinMaxBytes());
  EXPECT_EQ(layout.mean_bytes, kernels::SummaryFormat::For(spec).MeanBytes());
  EXPECT_EQ(layout.head_bytes, 56u + 8 * 3 + 16 + 60 + 30);
  EXPECT_EQ(value.size(), layout.head_bytes + 3 * spec.RecordBytes());
  EXPECT_EQ(value.substr(0, 4), "CKVR");
  auto decoded = DecodeChunkValue(spec, key, value);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->records.size(), 3u);
  for (uint32_t l = 0; l < 3; ++l) {
    ASSERT_EQ(decoded->records[l].size(), spec.RecordBytes());
    EXPECT_EQ(std::memcmp(decoded->records[l].data(), r.bytes[l].data(), spec.RecordBytes()), 0);
  }
  ASSERT_EQ(decoded->head.minmax.size(), r.minmax.size());
  EXPECT_EQ(std::memcmp(decoded->head.minmax.data(), r.minmax.data(), r.minmax.size()), 0);
  ASSERT_EQ(decoded->head.mean.size(), r.mean.size());
  EXPECT_EQ(std::memcmp(decoded->head.mean.data(), r.mean.data(), r.mean.size()), 0);
}

// What a session reads of a chunk it found in the cluster: the head (GETRANGE 0 H-1), then only
// the records it selected, each verified on its own against the head.
TEST(ChunkValueTest, HeadAndRecordsReadApartVerify) {
  const ModelSpec spec = SmallSpec();
  const ChunkKey key{42, 43};
  Records r = MakeRecords(spec, 6);
  const std::string value = Encode(spec, key, r);
  const ChunkValueLayout layout = LayoutOfChunkValue(spec);
  const std::string head_bytes = value.substr(0, layout.head_bytes);
  auto head = DecodeChunkHead(spec, key, head_bytes);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(std::memcmp(head->mean.data(), r.mean.data(), r.mean.size()), 0);
  for (uint32_t l = 0; l < spec.layers; ++l) {
    std::string rec = value.substr(layout.RecordOffset(l), layout.record_bytes);
    auto bytes = [&] { return std::as_bytes(std::span(rec.data(), rec.size())); };
    EXPECT_TRUE(VerifyChunkRecord(spec, key, *head, l, bytes()).ok());
    // Another layer's record, a flipped byte, or a short read: DataLoss naming the layer.
    if (l > 0) {
      const absl::Status other = VerifyChunkRecord(spec, key, *head, l - 1, bytes());
      EXPECT_EQ(other.code(), absl::StatusCode::kDataLoss);
      EXPECT_NE(other.message().find(absl::StrCat("record L", l - 1)), absl::string_view::npos)
          << other;
    }
    rec[7] ^= 0x10;
    EXPECT_EQ(VerifyChunkRecord(spec, key, *head, l, bytes()).code(), absl::StatusCode::kDataLoss);
    rec.pop_back();
    EXPECT_EQ(VerifyChunkRecord(spec, key, *head, l, bytes()).code(), absl::StatusCode::kDataLoss);
  }
  // Every flipped byte of the head, and a head one byte short or long, is DataLoss.
  for (size_t i = 0; i < head_bytes.size(); ++i) {
    std::string bad = head_bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    ASSERT_EQ(DecodeChunkHead(spec, key, bad).status().code(), absl::StatusCode::kDataLoss)
        << "byte " << i;
  }
  EXPECT_EQ(DecodeChunkHead(spec, key, head_bytes.substr(0, head_bytes.size() - 1)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeChunkHead(spec, key, value.substr(0, head_bytes.size() + 1)).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(ChunkValueTest, EveryFlippedByteIsDataLoss) {
  const ModelSpec spec = SmallSpec();
  const ChunkKey key{42, 43};
  Records r = MakeRecords(spec, 2);
  const std::string value = Encode(spec, key, r);
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
  std::string value = Encode(spec, key, r);
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
  const std::string value = Encode(spec, key, r);
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
  const std::string value = Encode(spec, key, r);
  for (size_t size : {size_t{0}, size_t{3}, size_t{55}, size_t{60}, value.size() - 1}) {
    EXPECT_EQ(DecodeChunkValue(spec, key, value.substr(0, size)).status().code(),
              absl::StatusCode::kDataLoss)
        << size;
  }
  EXPECT_EQ(DecodeChunkValue(spec, key, value + "x").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace ckv::remote
