// SPDX-License-Identifier: Apache-2.0
// tools/attention_profile_file.h: a profile file written here is read back value for value, and a
// wrong file is refused with a message naming the file and what is wrong.
#include "tools/attention_profile_file.h"

#include <cstring>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tools/attention_profile_writer.h"
#include "tests/test_util.h"

namespace ckv::synth {
namespace {

using ::ckv::testing::TempDir;
using ::ckv::testing::TestProfile;
using ::testing::AllOf;
using ::testing::HasSubstr;

uint16_t HalfAt(const std::vector<std::byte>& bytes, size_t i) {
  uint16_t h;
  std::memcpy(&h, bytes.data() + i * 2, 2);
  return h;
}

TEST(AttentionProfileFileTest, ReadsBackTheShapeTokensQueriesAndKv) {
  TempDir dir;
  const std::string path = dir.path() + "/p.safetensors";
  TestProfile p;
  ASSERT_TRUE(p.Write(path).ok());
  auto f = AttentionProfileFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const AttentionProfileFile& file = **f;
  EXPECT_EQ(file.spec().model_id, "test/tiny");
  EXPECT_EQ(file.spec().layers, 2u);
  EXPECT_EQ(file.spec().q_heads, 4u);
  EXPECT_EQ(file.spec().kv_heads, 2u);
  EXPECT_EQ(file.spec().head_dim, 8u);
  EXPECT_EQ(file.spec().chunk_tokens, 16u);
  EXPECT_EQ(file.spec().dtype, DType::kFp16);
  EXPECT_EQ(file.conversations(), 2u);
  EXPECT_EQ(file.prefix_tokens(), 32u);
  EXPECT_EQ(file.suffix_tokens(), 16u);
  EXPECT_EQ(file.turns(), 2u);
  EXPECT_EQ(file.window(), 4u);
  EXPECT_EQ(file.rope_theta(), 10000.0);
  EXPECT_EQ(file.total_tokens(), 64u);
  EXPECT_EQ(file.hidden(), 0u);  // not in this file's metadata
  EXPECT_EQ(file.intermediate(), 0u);

  const uint32_t t_all = 64, row = 2 * 8;  // tokens, kv elements per token
  // Tokens of conversation 1.
  ASSERT_EQ(file.Tokens(1).size(), t_all);
  EXPECT_EQ(file.Tokens(1)[5], p.tokens[t_all + 5]);

  // q[c=1, t=1, l=1]: the window's 4 queries of 4 heads of 8.
  const auto q = file.Queries(1, 1);
  ASSERT_EQ(q.size(), 2u);
  ASSERT_EQ(q[1].size(), 4u * 4 * 8);
  const size_t q_base = ((1 * 2 + 1) * 2 + 1) * size_t{4 * 4 * 8};
  EXPECT_EQ(q[1][0], p.q[q_base]);
  EXPECT_EQ(q[1][37], p.q[q_base + 37]);

  // KV of conversation 1's first 48 tokens: k[1, l, i, h, d].
  auto kv = file.ReadKv(1, 48);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(kv->tensors.tokens, 48u);
  ASSERT_EQ(kv->tensors.k.size(), 2u);
  ASSERT_EQ(kv->tensors.k[1].size(), 48u * row * 2);
  const size_t k_base = (1 * 2 + 1) * size_t{t_all} * row;  // [c=1, l=1, token 0]
  EXPECT_EQ(HalfAt(kv->k[1], 0), p.k[k_base]);
  EXPECT_EQ(HalfAt(kv->k[1], 47 * row + 15), p.k[k_base + 47 * row + 15]);
  EXPECT_EQ(HalfAt(kv->v[1], 47 * row + 15), p.v[k_base + 47 * row + 15]);

  // Records of layer 0, first 40 tokens: 2 whole chunks, each K then V.
  auto rec = file.Records(1, 0, 40);
  ASSERT_TRUE(rec.ok()) << rec.status();
  const size_t half = 16 * row;  // elements of K (or V) in a chunk
  ASSERT_EQ(rec->size(), 2 * 2 * half * 2);
  const size_t l0 = (1 * 2 + 0) * size_t{t_all} * row;
  EXPECT_EQ(HalfAt(*rec, 0), p.k[l0]);
  EXPECT_EQ(HalfAt(*rec, half), p.v[l0]);                     // chunk 0's V
  EXPECT_EQ(HalfAt(*rec, 2 * half + 3), p.k[l0 + half + 3]);  // chunk 1's K
  EXPECT_EQ(HalfAt(*rec, 3 * half + 3), p.v[l0 + half + 3]);  // chunk 1's V

  EXPECT_EQ(file.ReadKv(2, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(file.ReadKv(0, 65).status().code(), absl::StatusCode::kInvalidArgument);
}

// Opens a profile made wrong by `spoil` and expects InvalidArgument naming the file and `what`.
void ExpectRefused(const std::function<void(TestProfile&)>& spoil, const std::string& what) {
  TempDir dir;
  const std::string path = dir.path() + "/bad.safetensors";
  TestProfile p;
  spoil(p);
  ASSERT_TRUE(p.Write(path).ok());
  auto f = AttentionProfileFile::Open(path);
  ASSERT_FALSE(f.ok()) << what;
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  EXPECT_THAT(std::string(f.status().message()), AllOf(HasSubstr(path), HasSubstr(what)));
}

TEST(AttentionProfileFileTest, AWrongFileIsRefusedSayingWhatIsWrong) {
  ExpectRefused([](TestProfile& p) { p.k_dtype = safetensors::Dtype::kF32; },
                "tensor k is F32, not F16");
  ExpectRefused([](TestProfile& p) { p.q_dtype = safetensors::Dtype::kF16; },
                "tensor q is F16, not F32");
  ExpectRefused([](TestProfile& p) { p.omit = {"v"}; }, "no tensor v");
  ExpectRefused([](TestProfile& p) { p.k_extra_token = true; },
                "tensor k has shape [2, 2, 65, 2, 8], want [2, 2, 64, 2, 8]");
  // The metadata disagrees with the tensors: one turn more than q holds.
  ExpectRefused([](TestProfile& p) { p.metadata_overrides["turns"] = "3"; },
                "tensor k has shape [2, 2, 64, 2, 8], want [2, 2, 80, 2, 8]");
  ExpectRefused([](TestProfile& p) { p.metadata_overrides["kv_heads"] = "1"; },
                "tensor k has shape [2, 2, 64, 2, 8], want [2, 2, 64, 1, 8]");
  ExpectRefused([](TestProfile& p) { p.metadata_overrides["window"] = ""; },
                "__metadata__ has no \"window\"");
  ExpectRefused([](TestProfile& p) { p.metadata_overrides["layers"] = "two"; },
                "\"layers\" is \"two\", not a positive integer");
  ExpectRefused([](TestProfile& p) { p.metadata_overrides["rope_theta"] = "-1"; },
                "\"rope_theta\" is \"-1\", not a positive number");
  ExpectRefused([](TestProfile& p) { p.metadata_overrides["window"] = "17"; },
                "window 17 > suffix_tokens 16");
  ExpectRefused([](TestProfile& p) { p.metadata_overrides["hidden"] = "0"; },
                "\"hidden\" is \"0\", not a positive integer");
}

// The optional network sizes, for the benchmark's modelled compute.
TEST(AttentionProfileFileTest, ReadsTheNetworksSizesWhenTheMetadataHasThem) {
  TempDir dir;
  const std::string path = dir.path() + "/p.safetensors";
  TestProfile p;
  p.metadata_overrides["hidden"] = "128";
  p.metadata_overrides["intermediate"] = "384";
  ASSERT_TRUE(p.Write(path).ok());
  auto f = AttentionProfileFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->hidden(), 128u);
  EXPECT_EQ((*f)->intermediate(), 384u);
}

TEST(AttentionProfileFileTest, AMissingFileIsNotFoundNamingIt) {
  TempDir dir;
  const std::string path = dir.path() + "/absent.safetensors";
  auto f = AttentionProfileFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(path));
}

}  // namespace
}  // namespace ckv::synth
