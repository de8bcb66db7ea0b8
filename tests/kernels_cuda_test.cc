// SPDX-License-Identifier: Apache-2.0
// Tests of the CUDA kernels against the CPU path. They run where a CUDA device is present and
// skip, saying why, everywhere else (a build without nvcc, or no device).
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda_kernels.h"
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

TEST(CudaKernelsBuildTest, WithoutADeviceEveryCallSaysUnavailable) {
  if (cuda::DeviceAvailable().ok()) GTEST_SKIP() << "a CUDA device is present";
  const KvShape s{14, 2, 64, 16, DType::kFp16};
  EXPECT_EQ(cuda::Gather(s, {}, {}).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(cuda::QuestScores(SelectorInput{}).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(cuda::DeviceAvailable().message().empty());
}

}  // namespace
}  // namespace ckv::kernels
