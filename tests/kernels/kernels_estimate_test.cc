// SPDX-License-Identifier: Apache-2.0
// Tests of the estimate of the chunks a selection did not load (kernels/estimate.h).
#include "kernels/estimate.h"

#include <cmath>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "kernels/fidelity.h"
#include "kernels/half.h"
#include "kernels/summary.h"
#include "tests/test_util.h"

namespace ckv::kernels {
namespace {

constexpr EstimateKind kKinds[] = {EstimateKind::kMean, EstimateKind::kGaussian,
                                   EstimateKind::kGaussianWindow, EstimateKind::kGaussianCapped};

KvShape EstimateShape(DType dtype) { return KvShape{8, 2, 32, 16, dtype}; }

// Chunks whose keys and values are drawn per token (`repeated`: one draw per chunk and kv head,
// repeated over the chunk's tokens), keys scaled by `key_scale`.
std::vector<std::vector<std::byte>> Records(const KvShape& s, size_t chunks, bool repeated,
                                            float key_scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const size_t row = size_t{s.kv_heads} * s.head_dim;
  std::vector<float> k(s.chunk_tokens * row), v(s.chunk_tokens * row);
  std::vector<std::vector<std::byte>> out;
  for (size_t j = 0; j < chunks; ++j) {
    for (uint32_t t = 0; t < s.chunk_tokens; ++t) {
      for (size_t e = 0; e < row; ++e) {
        if (repeated && t > 0) {
          k[t * row + e] = k[e];
          v[t * row + e] = v[e];
        } else {
          k[t * row + e] = key_scale * normal(rng);
          v[t * row + e] = normal(rng);
        }
      }
    }
    out.emplace_back(s.record_bytes());
    FromFloat(s.dtype, k.data(), k.size(), out.back().data());
    FromFloat(s.dtype, v.data(), v.size(), out.back().data() + s.half_record_bytes());
  }
  return out;
}

using ::ckv::testing::Pointers;

std::vector<float> Queries(const KvShape& s, uint32_t window, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t{window} * s.q_heads * s.head_dim);
  for (float& x : q) x = scale * normal(rng);
  return q;
}

struct Split {
  std::vector<uint32_t> loaded, rest;
};
Split SplitEvery(uint32_t chunks, uint32_t stride) {
  Split s;
  for (uint32_t j = 0; j < chunks; ++j) (j % stride == 0 ? s.loaded : s.rest).push_back(j);
  return s;
}

// Relative L2 error of each kind of estimate, and of dropping, against the full output.
std::map<EstimateKind, double> Errors(const KvShape& s, const std::vector<const std::byte*>& recs,
                                      const std::vector<float>& q, uint32_t window,
                                      const Split& split) {
  std::vector<uint32_t> all(recs.size());
  for (uint32_t j = 0; j < all.size(); ++j) all[j] = j;
  const auto full = ReferenceAttention(s, q, window, *Gather(s, recs, all));
  const auto kv = Gather(s, recs, split.loaded);
  const auto stats = ChunkStats::Of(s, recs, split.rest);
  EXPECT_TRUE(full.ok() && kv.ok() && stats.ok());
  std::map<EstimateKind, double> out;
  for (EstimateKind e : {EstimateKind::kNone, EstimateKind::kMean, EstimateKind::kGaussian,
                         EstimateKind::kGaussianWindow, EstimateKind::kGaussianCapped}) {
    const auto o = EstimatedAttention(s, q, window, *kv, *stats, e);
    EXPECT_TRUE(o.ok()) << o.status();
    out[e] = RelativeL2Error(*o, *full);
  }
  return out;
}

TEST(EstimateTest, ChunksOfOneRepeatedTokenAreEstimatedExactly) {
  for (DType dtype : {DType::kFp32, DType::kFp16}) {
    const KvShape s = EstimateShape(dtype);
    const auto records = Records(s, 20, /*repeated=*/true, 1.0f, 7);
    const auto q = Queries(s, 4, 2.0f, 8);
    const auto e = Errors(s, Pointers(records), q, 4, SplitEvery(20, 5));
    EXPECT_GT(e.at(EstimateKind::kNone), 0.1) << "dropping 16 of 20 chunks must be visible";
    for (EstimateKind k : kKinds) {
      EXPECT_LT(e.at(k), 1e-5) << EstimateKindName(k) << ", dtype " << int(dtype);
    }
  }
}

TEST(EstimateTest, EveryEstimateBeatsDroppingAndTheVarianceBeatsTheMeanOnGaussianKeys) {
  // Keys drawn per token around nothing: every chunk holds a similar share, so dropping 3 of 4
  // loses about 3/4 of the mass, and the logits' spread (variance 0.5 at key scale 0.5 and
  // query scale sqrt(2)) is what the mean alone misses.
  const KvShape s = EstimateShape(DType::kFp32);
  const auto records = Records(s, 64, /*repeated=*/false, 0.5f, 11);
  const auto q = Queries(s, 8, std::sqrt(2.0f), 12);
  const auto e = Errors(s, Pointers(records), q, 8, SplitEvery(64, 4));
  EXPECT_LT(e.at(EstimateKind::kMean), e.at(EstimateKind::kNone));
  EXPECT_LT(e.at(EstimateKind::kGaussian), e.at(EstimateKind::kMean));
  EXPECT_LT(e.at(EstimateKind::kGaussianWindow), e.at(EstimateKind::kMean));
  EXPECT_LE(e.at(EstimateKind::kGaussianCapped), e.at(EstimateKind::kGaussian) + 1e-6);
}

TEST(EstimateTest, TheBoxCapsTheGaussianWhereBimodalKeysOverstateIt) {
  // Chunk 0: tokens alternate +A and -A on every channel, so the variance is A^2 and the Gaussian
  // share grows with (qA)^2 while no logit exceeds the box bound qA * sqrt(d). Chunk 1: one key
  // repeated at 0.99 of +A, estimated exactly. Values are one-hot: channel 0 for chunk 0,
  // channel 1 for chunk 1, so the output's first two channels are the two chunks' weights.
  const KvShape s = EstimateShape(DType::kFp32);
  const size_t row = size_t{s.kv_heads} * s.head_dim;
  constexpr float kA = 4.0f, kQ = 4.0f;
  std::vector<std::vector<std::byte>> records;
  for (int j = 0; j < 2; ++j) {
    std::vector<float> k(s.chunk_tokens * row), v(s.chunk_tokens * row, 0.0f);
    for (uint32_t t = 0; t < s.chunk_tokens; ++t) {
      const float key = j == 0 ? (t % 2 == 0 ? kA : -kA) : 0.99f * kA;
      for (size_t e = 0; e < row; ++e) k[t * row + e] = key;
      for (uint32_t h = 0; h < s.kv_heads; ++h) v[t * row + h * s.head_dim + j] = 1.0f;
    }
    records.emplace_back(s.record_bytes());
    FromFloat(s.dtype, k.data(), k.size(), records.back().data());
    FromFloat(s.dtype, v.data(), v.size(), records.back().data() + s.half_record_bytes());
  }
  const std::vector<float> q(size_t{s.q_heads} * s.head_dim, kQ);
  const auto recs = Pointers(records);
  const std::vector<uint32_t> both{0, 1};
  const auto full = ReferenceAttention(s, q, 1, *Gather(s, recs, both));
  const auto stats = ChunkStats::Of(s, recs, both);
  ASSERT_TRUE(full.ok() && stats.ok());
  const auto gauss = EstimatedAttention(s, q, 1, GatheredKv{}, *stats, EstimateKind::kGaussian);
  const auto capped =
      EstimatedAttention(s, q, 1, GatheredKv{}, *stats, EstimateKind::kGaussianCapped);
  ASSERT_TRUE(gauss.ok() && capped.ok());
  // Exact: chunk 1 weighs 2 exp(-0.01 qA sqrt(d)) = 0.81 of chunk 0. The Gaussian puts nearly
  // all the weight on chunk 0; the cap brings it back to exp(0.01 qA sqrt(d)) = 2.47 times.
  EXPECT_NEAR((*full)[1] / (*full)[0], 2 * std::exp(-0.01 * kQ * kA * std::sqrt(32.0)), 5e-3);
  EXPECT_LT((*gauss)[1], 1e-6);
  EXPECT_NEAR((*capped)[0] / (*capped)[1], std::exp(0.01 * kQ * kA * std::sqrt(32.0)), 5e-3);
  EXPECT_LT(RelativeL2Error(*capped, *full), 0.5 * RelativeL2Error(*gauss, *full));
}

TEST(EstimateTest, NoEstimateIsTheReferenceAttentionOverTheLoadedChunks) {
  const KvShape s = EstimateShape(DType::kFp16);
  const auto records = Records(s, 10, false, 1.0f, 3);
  const auto q = Queries(s, 3, 1.0f, 4);
  const Split split = SplitEvery(10, 3);
  const auto kv = Gather(s, Pointers(records), split.loaded);
  const auto stats = ChunkStats::Of(s, Pointers(records), split.rest);
  ASSERT_TRUE(kv.ok() && stats.ok());
  const auto want = ReferenceAttention(s, q, 3, *kv);
  const auto got = EstimatedAttention(s, q, 3, *kv, *stats, EstimateKind::kNone);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(*want, *got);
  // With nothing loaded, the estimates alone give an output.
  const auto only = EstimatedAttention(s, q, 3, GatheredKv{}, *stats, EstimateKind::kGaussian);
  ASSERT_TRUE(only.ok()) << only.status();
  EXPECT_GT(RelativeL2Error(*only, std::vector<float>(only->size(), 0.0f)), 0.5);
}

TEST(EstimateTest, StatisticsAreExactAndTheirEightBitFormKeepsTheBox) {
  const KvShape s = EstimateShape(DType::kFp32);
  const auto records = Records(s, 3, false, 3.0f, 5);
  auto stats = ChunkStats::Of(s, Pointers(records), std::vector<uint32_t>{2, 0});
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->chunks, 2u);
  // Chunk 2, kv head 1, channel 5, by hand.
  const size_t row = size_t{s.kv_heads} * s.head_dim, e = s.head_dim + 5;
  const float* k = reinterpret_cast<const float*>(records[2].data());
  const float* v = reinterpret_cast<const float*>(records[2].data() + s.half_record_bytes());
  double mean = 0, vmean = 0, var = 0, mn = 1e9, mx = -1e9;
  for (uint32_t t = 0; t < s.chunk_tokens; ++t) {
    mean += k[t * row + e] / 16.0;
    vmean += v[t * row + e] / 16.0;
    mn = std::min<double>(mn, k[t * row + e]);
    mx = std::max<double>(mx, k[t * row + e]);
  }
  for (uint32_t t = 0; t < s.chunk_tokens; ++t) var += std::pow(k[t * row + e] - mean, 2) / 16.0;
  EXPECT_NEAR(stats->key_mean[e], mean, 1e-5);
  EXPECT_NEAR(stats->value_mean[e], vmean, 1e-5);
  EXPECT_NEAR(stats->key_var[e], var, 1e-4);
  EXPECT_EQ(stats->key_min[e], static_cast<float>(mn));
  EXPECT_EQ(stats->key_max[e], static_cast<float>(mx));

  ChunkStats rounded = *stats;
  rounded.RoundTripInt8(s.kv_heads, s.head_dim);
  for (size_t i = 0; i < rounded.key_min.size(); ++i) {
    EXPECT_LE(rounded.key_min[i], stats->key_min[i]);
    EXPECT_GE(rounded.key_max[i], stats->key_max[i]);
    // Within one step of the vector's scale (max |x| / 127, at most |x| <= 3 * 5 here).
    EXPECT_NEAR(rounded.key_mean[i], stats->key_mean[i], 15.0 / 127);
  }
  const ChunkStats one = stats->Subset(std::vector<uint32_t>{1}, s.kv_heads, s.head_dim);
  ASSERT_EQ(one.chunks, 1u);
  EXPECT_EQ(std::vector<float>(stats->key_var.begin() + row, stats->key_var.end()), one.key_var);
}

TEST(EstimateTest, VirtualTokensGiveTheEstimateToAKernelThatKnowsNothingOfIt) {
  const KvShape s = EstimateShape(DType::kFp16);
  const auto records = Records(s, 24, /*repeated=*/false, 0.7f, 21);
  const auto q = Queries(s, 6, 1.5f, 22);
  const Split split = SplitEvery(24, 3);
  const auto kv = Gather(s, Pointers(records), split.loaded);
  const auto stats = ChunkStats::Of(s, Pointers(records), split.rest);
  ASSERT_TRUE(kv.ok() && stats.ok());
  for (EstimateKind k : {EstimateKind::kMean, EstimateKind::kGaussianWindow}) {
    const auto vt = VirtualTokensOf(s, q, 6, *stats, k);
    ASSERT_TRUE(vt.ok()) << vt.status();
    ASSERT_EQ(vt->count, 16u);
    const auto want = EstimatedAttention(s, q, 6, *kv, *stats, k);
    const auto got = AttentionWithVirtualTokens(s, q, 6, *kv, *vt);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_LT(RelativeL2Error(*got, *want), 1e-6) << EstimateKindName(k);
  }
  // Only the mean bias is log c; the window's bias adds the (positive) variance term.
  const auto mean = VirtualTokensOf(s, q, 6, *stats, EstimateKind::kMean);
  const auto win = VirtualTokensOf(s, q, 6, *stats, EstimateKind::kGaussianWindow);
  EXPECT_FLOAT_EQ(mean->bias[5], std::log(16.0f));
  EXPECT_GT(win->bias[5], std::log(16.0f) + 0.01f);
  // Any queries take them, not only the window's.
  const auto other = Queries(s, 2, 1.0f, 23);
  EXPECT_TRUE(AttentionWithVirtualTokens(s, other, 2, *kv, *win).ok());
  EXPECT_EQ(VirtualTokensOf(s, q, 6, *stats, EstimateKind::kGaussian).status().code(),
            absl::StatusCode::kInvalidArgument);
  VirtualTokens short_bias = *win;
  short_bias.bias.pop_back();
  EXPECT_EQ(AttentionWithVirtualTokens(s, q, 6, *kv, short_bias).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EstimateTest, TheStoredPartHoldsTheValueMeanInEightBits) {
  ModelSpec spec;
  spec.model_id = "estimate-test";
  spec.layers = 2;
  spec.q_heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 32;
  spec.dtype = DType::kFp16;
  spec.chunk_tokens = 16;
  const KvShape s = KvShape::Of(spec);
  const SummaryFormat f = SummaryFormat::For(spec);
  ASSERT_EQ(f.EstimateBytes(), 2u * 2 * (2 + 32));
  for (bool repeated : {false, true}) {
    const auto records = Records(s, 1, repeated, 2.0f, 31);
    std::vector<std::byte> part(f.EstimateBytes(), std::byte{0x5a});
    EstimateChunkLayer(
        spec, 1, std::span(records[0].data() + s.half_record_bytes(), s.half_record_bytes()), part);
    const auto exact = ChunkStats::Of(s, Pointers(records), std::vector<uint32_t>{0});
    ASSERT_TRUE(exact.ok());
    ChunkStats rounded = *exact;
    rounded.RoundTripInt8(s.kv_heads, s.head_dim);
    for (uint32_t h = 0; h < s.kv_heads; ++h) {
      std::vector<float> vm(s.head_dim);
      DecodeEstimate(EstimateAt(f, part.data(), 1, h), s.head_dim, vm.data());
      const float* want = exact->value_mean.data() + size_t{h} * s.head_dim;
      // Half a step of the vector's scale (max |x| / 127, rounded up to an fp16), and a little.
      float step = 0;
      for (uint32_t d = 0; d < s.head_dim; ++d) step = std::max(step, std::fabs(want[d]) / 127);
      for (uint32_t d = 0; d < s.head_dim; ++d) {
        EXPECT_NEAR(vm[d], want[d], 0.51 * step + 1e-6) << "channel " << d;
        // What the measurements round through (ChunkStats::RoundTripInt8), the same quantiser.
        EXPECT_EQ(vm[d], rounded.value_mean[size_t{h} * s.head_dim + d]) << "channel " << d;
      }
    }
    EXPECT_EQ(part[0], std::byte{0x5a}) << "layer 0's entries are not touched";
  }
}

TEST(EstimateTest, BadInputsAreRefusedWithTheirSizes) {
  const KvShape s = EstimateShape(DType::kFp16);
  const auto records = Records(s, 4, false, 1.0f, 1);
  EXPECT_EQ(ChunkStats::Of(s, Pointers(records), std::vector<uint32_t>{4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto stats = ChunkStats::Of(s, Pointers(records), std::vector<uint32_t>{1, 2});
  ASSERT_TRUE(stats.ok());
  const auto kv = Gather(s, Pointers(records), std::vector<uint32_t>{0});
  ASSERT_TRUE(kv.ok());
  const auto q = Queries(s, 2, 1.0f, 2);
  stats->key_var.pop_back();
  const auto bad = EstimatedAttention(s, q, 2, *kv, *stats, EstimateKind::kGaussian);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("2 chunks"), std::string::npos) << bad.status();
  const auto short_q = EstimatedAttention(
      s, std::vector<float>(5), 2, *kv,
      *ChunkStats::Of(s, Pointers(records), std::vector<uint32_t>{1}), EstimateKind::kMean);
  EXPECT_EQ(short_q.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckv::kernels
