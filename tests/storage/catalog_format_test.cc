// SPDX-License-Identifier: Apache-2.0
// Tests for storage/catalog_format.h: the chunk record as opening a store decodes it.
#include "storage/catalog_format.h"

#include <string>

#include "gtest/gtest.h"

namespace ckv::storage {
namespace {

ChunkRecord SampleRecord() {
  ChunkRecord r;
  r.parent = ChunkKey{1, 2};
  r.fingerprint = ChunkKey{3, 4};
  r.depth = 5;
  r.segment = 6;
  r.slot = 7;
  r.put_seq = 8;
  r.created_unix_ms = 9;
  r.importance = 1.5;
  r.loads = 10;
  r.tokens = {11, 12, 13, 14};
  r.checksums = {0xabc, 0xdef};
  return r;
}

TEST(ChunkRecordTest, DecodingWithoutTokensKeepsEveryOtherFieldAndReusesTheRecord) {
  const ChunkRecord want = SampleRecord();
  const std::string bytes = EncodeChunkRecord(want);
  ChunkRecord got;
  got.tokens = {99};  // left over from the previous chunk of a scan
  ASSERT_TRUE(DecodeChunkRecordInto(bytes, "chunk x", /*with_tokens=*/false, &got).ok());
  EXPECT_TRUE(got.tokens.empty());
  EXPECT_EQ(got.parent, want.parent);
  EXPECT_EQ(got.fingerprint, want.fingerprint);
  EXPECT_EQ(got.depth, want.depth);
  EXPECT_EQ(got.segment, want.segment);
  EXPECT_EQ(got.slot, want.slot);
  EXPECT_EQ(got.put_seq, want.put_seq);
  EXPECT_EQ(got.created_unix_ms, want.created_unix_ms);
  EXPECT_EQ(got.importance, want.importance);
  EXPECT_EQ(got.loads, want.loads);
  EXPECT_EQ(got.checksums, want.checksums);
  ASSERT_TRUE(DecodeChunkRecordInto(bytes, "chunk x", /*with_tokens=*/true, &got).ok());
  EXPECT_EQ(got.tokens, want.tokens);
}

TEST(ChunkRecordTest, ARecordCutInsideItsTokensIsDataLossEvenWhenTheTokensAreSkipped) {
  const std::string bytes = EncodeChunkRecord(SampleRecord());
  // 1 version byte, 2 keys, 3 u32, 2 i64/u64, a double, a u64, the token count, then 2 tokens.
  const size_t cut = 1 + 32 + 12 + 16 + 8 + 8 + 4 + 8;
  ChunkRecord got;
  for (bool with_tokens : {false, true}) {
    const absl::Status s =
        DecodeChunkRecordInto(bytes.substr(0, cut), "chunk 42", with_tokens, &got);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("chunk 42"), std::string::npos) << s;
    EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
  }
  // And trailing bytes after the checksums are refused the same way.
  const absl::Status s =
      DecodeChunkRecordInto(bytes + "x", "chunk 42", /*with_tokens=*/false, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

}  // namespace
}  // namespace ckv::storage
