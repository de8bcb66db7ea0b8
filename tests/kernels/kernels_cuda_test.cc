// SPDX-License-Identifier: Apache-2.0
// Tests of the CUDA kernels against the CPU path. They run where a CUDA device is present and
// skip, saying why, everywhere else (a build without nvcc, or no device).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ckv/codec.h"
#include "ckv/model_spec.h"
#include "gtest/gtest.h"
#include "kernels/cuda_kernels.h"
#include "kernels/device_memory.h"
#include "kernels/estimate.h"
#include "kernels/half.h"
#include "kernels/selector.h"
#include "kernels/summary.h"

namespace ckv::kernels {
namespace {

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status device = cuda::DeviceAvailable();
    if (!device.ok()) GTEST_SKIP() << device.message();
    spec_ = *ModelSpec::Preset("qwen2.5-0.5b");
    const KvShape s = KvShape::Of(spec_);
    const SummaryFormat f = SummaryFormat::For(spec_);
    std::mt19937_64 rng(9);
    std::normal_distribution<float> normal;
    std::vector<float> x(s.record_bytes() / 2);
    for (size_t j = 0; j < kChunks; ++j) {
      for (float& v : x) v = normal(rng);
      records_.emplace_back(s.record_bytes());
      FromFloat(DType::kFp16, x.data(), x.size(), records_.back().data());
      minmax_.emplace_back(f.MinMaxBytes());
      mean_.emplace_back(f.MeanBytes());
      SummarizeChunkLayer(spec_, 2, std::span(records_.back().data(), s.half_record_bytes()),
                          minmax_.back(), mean_.back());
    }
    for (size_t j = 0; j < kChunks; ++j) {
      record_ptr_.push_back(records_[j].data());
      minmax_ptr_.push_back(minmax_[j].data());
      mean_ptr_.push_back(mean_[j].data());
    }
    queries_.resize(size_t{kWindow} * s.q_heads * s.head_dim);
    for (float& v : queries_) v = normal(rng);
  }

  SelectorInput Input() const {
    SelectorInput in;
    in.shape = KvShape::Of(spec_);
    in.layers = spec_.layers;
    in.layer = 2;
    in.queries = queries_;
    in.window = kWindow;
    in.chunks = kChunks;
    in.minmax = minmax_ptr_;
    in.mean = mean_ptr_;
    in.records = record_ptr_;
    return in;
  }

  static void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    float scale = 0;
    for (float w : want) scale = std::max(scale, std::fabs(w));
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4f * scale) << i;
  }

  static constexpr size_t kChunks = 96;
  static constexpr uint32_t kWindow = 16;
  ModelSpec spec_;
  std::vector<std::vector<std::byte>> records_, minmax_, mean_;
  std::vector<const std::byte*> record_ptr_, minmax_ptr_, mean_ptr_;
  std::vector<float> queries_;
};

TEST_F(CudaKernelsTest, QuestAndMeanKeyScoresMatchTheCpu) {
  ExpectClose(*cuda::QuestScores(Input()), *ScoreChunks(SelectorKind::kQuest, Input(), {}));
  ExpectClose(*cuda::MeanKeyScores(Input()), *ScoreChunks(SelectorKind::kMeanKey, Input(), {}));
}

TEST_F(CudaKernelsTest, TokenAttentionMatchesTheCpu) {
  const KvShape s = KvShape::Of(spec_);
  ExpectClose(*cuda::TokenAttention(s, queries_, kWindow, record_ptr_),
              *TokenAttention(s, queries_, kWindow, record_ptr_));
  const std::vector<uint32_t> heads = {0, 5, 9};
  ExpectClose(*cuda::TokenAttention(s, queries_, kWindow, record_ptr_, heads),
              *TokenAttention(s, queries_, kWindow, record_ptr_, heads));
}

TEST_F(CudaKernelsTest, GatherIsBitExactWithTheCpu) {
  const KvShape s = KvShape::Of(spec_);
  const std::vector<uint32_t> chosen = {0, 17, 95, 3};
  auto gpu = cuda::Gather(s, record_ptr_, chosen);
  auto cpu = Gather(s, record_ptr_, chosen);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->k, cpu->k);
  EXPECT_EQ(gpu->v, cpu->v);
  EXPECT_EQ(gpu->positions, cpu->positions);
}

// The loaded chunks exact and the rest as virtual tokens (both forms a session serves), as the CPU
// computes it: with loaded chunks and virtual tokens, with virtual tokens alone, with neither.
TEST_F(CudaKernelsTest, AttentionWithVirtualTokensMatchesTheCpu) {
  const KvShape s = KvShape::Of(spec_);
  const std::vector<uint32_t> chosen = {0, 17, 95, 3};
  std::vector<uint32_t> rest;
  for (uint32_t j = 0; j < kChunks; ++j) {
    if (std::find(chosen.begin(), chosen.end(), j) == chosen.end()) rest.push_back(j);
  }
  const auto loaded = Gather(s, record_ptr_, chosen);
  const auto stats = ChunkStats::Of(s, record_ptr_, rest);
  ASSERT_TRUE(loaded.ok() && stats.ok());
  for (EstimateKind kind : {EstimateKind::kMean, EstimateKind::kGaussianWindow}) {
    const auto vt = VirtualTokensOf(s, queries_, kWindow, *stats, kind);
    ASSERT_TRUE(vt.ok()) << vt.status();
    ASSERT_GT(vt->count, 0u);
    for (const GatheredKv& kv : {*loaded, GatheredKv{}}) {
      const auto gpu = cuda::AttentionWithVirtualTokens(s, queries_, kWindow, kv, *vt);
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      ExpectClose(*gpu, *AttentionWithVirtualTokens(s, queries_, kWindow, kv, *vt));
    }
  }
  const auto none = cuda::AttentionWithVirtualTokens(s, queries_, kWindow, {}, VirtualTokens{});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, std::vector<float>(queries_.size(), 0.0f));
  VirtualTokens short_bias = *VirtualTokensOf(s, queries_, kWindow, *stats, EstimateKind::kMean);
  short_bias.bias.pop_back();
  EXPECT_EQ(
      cuda::AttentionWithVirtualTokens(s, queries_, kWindow, *loaded, short_bias).status().code(),
      absl::StatusCode::kInvalidArgument);
}

// Random K and V of one record of `spec` (in its dtype): per-channel magnitudes from 1e-3 to 1e2,
// an outlier channel, an all-zero key channel and value token, values near fp16's maximum.
std::vector<std::byte> RandomHalf(const ModelSpec& spec, std::mt19937_64& rng) {
  const size_t hd = size_t{spec.kv_heads} * spec.head_dim;
  const size_t n = size_t{spec.chunk_tokens} * hd;
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-3.0f, 2.0f);
  std::vector<float> channel_scale(hd);
  for (float& c : channel_scale) c = std::pow(10.0f, exponent(rng));
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = normal(rng) * channel_scale[i % hd];
  for (size_t t = 0; t < spec.chunk_tokens; ++t) x[t * hd + hd / 2] = 0.0f;  // a zero channel
  for (size_t d = 0; d < spec.head_dim; ++d) x[hd + d] = 0.0f;  // token 1 head 0 is zero
  x[n / 3] = 60000.0f;  // int8 and fp8 of a group with this round up to fp16's Inf
  x[n / 2] = -59000.0f;
  std::vector<std::byte> out(n * ElementBytes(spec.dtype));
  FromFloat(spec.dtype, x.data(), n, out.data());
  return out;
}

// DecodeRecords on the device gives DecodeRecord's bytes exactly, for every codec and dtype, on
// records at odd device addresses given in any order, for a preset and for a shape of an odd
// element count (int4's last payload byte half-filled, its V part at an odd offset).
TEST(CudaDecodeRecordsTest, IsBitExactWithDecodeRecord) {
  const absl::Status device = cuda::DeviceAvailable();
  if (!device.ok()) GTEST_SKIP() << device.message();
  auto memory = NewCudaMemory();
  ASSERT_TRUE(memory.ok()) << memory.status();
  DeviceMemory& dm = **memory;
  std::mt19937_64 rng(17);
  ModelSpec odd;
  odd.model_id = "odd";
  odd.layers = 1;
  odd.q_heads = 6;
  odd.kv_heads = 3;
  odd.head_dim = 5;
  odd.chunk_tokens = 3;
  constexpr size_t kRecords = 5;
  for (const char* shape : {"qwen2.5-0.5b", "odd"}) {
    for (KvCodec codec : {KvCodec::kFp8E4M3, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kNone}) {
      for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
        ModelSpec spec = std::string(shape) == "odd" ? odd : *ModelSpec::Preset(shape);
        spec.dtype = dtype;
        spec.codec = codec;
        SCOPED_TRACE(spec.DebugString());
        ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
        const size_t rb = spec.RecordBytes(), db = spec.DecodedRecordBytes();
        // Records back to back after one byte: at odd addresses when rb is odd or 1.
        std::vector<std::byte> stored(1 + kRecords * rb), want(kRecords * db);
        for (size_t i = 0; i < kRecords; ++i) {
          const auto k = RandomHalf(spec, rng), v = RandomHalf(spec, rng);
          std::span<std::byte> rec(stored.data() + 1 + i * rb, rb);
          ASSERT_TRUE(EncodeRecord(spec, k, v, rec).ok());
          if (codec == KvCodec::kFp8E4M3 && i == 2) {  // NaN codes decode to the CPU's NaN
            rec[3] = std::byte{0x7f};
            rec[spec.RecordKeyBytes() + 4] = std::byte{0xff};
          }
        }
        // Decoded in the order 4, 0, 3, 1, 2 of the stored ones.
        const size_t order[kRecords] = {4, 0, 3, 1, 2};
        for (size_t i = 0; i < kRecords; ++i) {
          ASSERT_TRUE(DecodeRecord(spec, std::span(stored.data() + 1 + order[i] * rb, rb),
                                   std::span(want.data() + i * db, db))
                          .ok());
        }
        auto d_stored = dm.Allocate(stored.size());
        auto d_out = dm.Allocate(want.size());
        ASSERT_TRUE(d_stored.ok() && d_out.ok());
        auto up = dm.CopyFromHostAsync(*d_stored, stored.data(), stored.size());
        ASSERT_TRUE(up.ok()) << up.status();
        ASSERT_TRUE((*up)->Wait().ok());
        std::vector<const std::byte*> ptrs;
        for (size_t j : order) ptrs.push_back(*d_stored + 1 + j * rb);
        const absl::Status st = cuda::DecodeRecords(spec, ptrs, std::span(*d_out, want.size()));
        ASSERT_TRUE(st.ok()) << st;
        EXPECT_EQ(cuda::DecodeRecords(spec, ptrs, std::span(*d_out, want.size() - 2)).code(),
                  absl::StatusCode::kInvalidArgument);
        std::vector<std::byte> got(want.size());
        auto down = dm.CopyToHostAsync(got.data(), *d_out, got.size());
        ASSERT_TRUE(down.ok()) << down.status();
        ASSERT_TRUE((*down)->Wait().ok());
        dm.Free(*d_stored);
        dm.Free(*d_out);
        size_t first = got.size();
        for (size_t b = 0; b < got.size() && first == got.size(); ++b) {
          if (got[b] != want[b]) first = b;
        }
        EXPECT_EQ(first, got.size()) << "first differing byte " << first << " of " << got.size();
      }
    }
  }
}

TEST(CudaKernelsBuildTest, WithoutADeviceEveryCallSaysUnavailable) {
  if (cuda::DeviceAvailable().ok()) GTEST_SKIP() << "a CUDA device is present";
  const KvShape s{14, 2, 64, 16, DType::kFp16};
  EXPECT_EQ(cuda::Gather(s, {}, {}).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(cuda::QuestScores(SelectorInput{}).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(cuda::DecodeRecords(ModelSpec{}, {}, {}).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(cuda::AttentionWithVirtualTokens(s, {}, 1, {}, {}).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_FALSE(cuda::DeviceAvailable().message().empty());
}

}  // namespace
}  // namespace ckv::kernels
