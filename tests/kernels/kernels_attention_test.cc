// SPDX-License-Identifier: Apache-2.0
// Tests of gather, the reference attention, the fidelity metrics and the dtype conversions.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/cpu_path.h"
#include "kernels/fidelity.h"
#include "kernels/half.h"
#include "tests/test_util.h"

namespace ckv::kernels {
namespace {

KvShape AttentionShape(DType dtype) { return KvShape{6, 2, 32, 16, dtype}; }

std::vector<std::vector<std::byte>> RandomRecords(const KvShape& s, size_t chunks, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(s.record_bytes() / ElementBytes(s.dtype));
  std::vector<std::vector<std::byte>> out;
  for (size_t j = 0; j < chunks; ++j) {
    for (float& v : x) v = normal(rng);
    out.emplace_back(s.record_bytes());
    FromFloat(s.dtype, x.data(), x.size(), out.back().data());
  }
  return out;
}

using ::ckv::testing::Pointers;

std::vector<float> RandomQueries(const KvShape& s, uint32_t window, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t{window} * s.q_heads * s.head_dim);
  for (float& v : q) v = 2 * normal(rng);
  return q;
}

class AttentionTest : public ::testing::TestWithParam<CpuPath> {
 protected:
  void SetUp() override { SetCpuPath(GetParam()); }
  void TearDown() override { SetCpuPath(CpuPath::kAuto); }
};

TEST_P(AttentionTest, GatherIsBitExactWithPositions) {
  for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    const KvShape s = AttentionShape(dtype);
    const auto records = RandomRecords(s, 9, 1);
    const std::vector<uint32_t> chosen = {7, 0, 4};
    auto kv = Gather(s, Pointers(records), chosen);
    ASSERT_TRUE(kv.ok()) << kv.status();
    ASSERT_EQ(kv->tokens, 48u);
    const size_t half = s.half_record_bytes() / ElementBytes(dtype);
    for (size_t i = 0; i < chosen.size(); ++i) {
      std::vector<float> k(half), v(half);
      ToFloat(dtype, records[chosen[i]].data(), half, k.data());
      ToFloat(dtype, records[chosen[i]].data() + s.half_record_bytes(), half, v.data());
      EXPECT_EQ(0, std::memcmp(kv->k.data() + i * half, k.data(), half * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(kv->v.data() + i * half, v.data(), half * sizeof(float)));
      for (uint32_t t = 0; t < 16; ++t) EXPECT_EQ(kv->positions[i * 16 + t], chosen[i] * 16 + t);
    }
  }
  const KvShape s = AttentionShape(DType::kFp16);
  const auto records = RandomRecords(s, 2, 1);
  EXPECT_EQ(Gather(s, Pointers(records), std::vector<uint32_t>{2}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(AttentionTest, ReferenceAttentionMatchesANaiveDoublePrecisionOne) {
  const KvShape s = AttentionShape(DType::kFp32);
  const uint32_t window = 5;
  const auto records = RandomRecords(s, 12, 2);
  const auto q = RandomQueries(s, window, 3);
  std::vector<uint32_t> all(12);
  for (uint32_t j = 0; j < 12; ++j) all[j] = j;
  auto kv = Gather(s, Pointers(records), all);
  ASSERT_TRUE(kv.ok());
  auto out = ReferenceAttention(s, q, window, *kv);
  ASSERT_TRUE(out.ok()) << out.status();
  const uint32_t d_n = s.head_dim;
  for (uint32_t i = 0; i < window; ++i) {
    for (uint32_t g = 0; g < s.q_heads; ++g) {
      const uint32_t h = g / s.group();
      std::vector<double> logit(kv->tokens);
      double max = -1e300;
      for (uint32_t t = 0; t < kv->tokens; ++t) {
        double dot = 0;
        for (uint32_t d = 0; d < d_n; ++d) {
          dot += double{q[(size_t{i} * s.q_heads + g) * d_n + d]} *
                 kv->k[(size_t{t} * s.kv_heads + h) * d_n + d];
        }
        logit[t] = dot / std::sqrt(double(d_n));
        max = std::max(max, logit[t]);
      }
      double sum = 0;
      for (double& x : logit) sum += (x = std::exp(x - max));
      for (uint32_t d = 0; d < d_n; ++d) {
        double want = 0;
        for (uint32_t t = 0; t < kv->tokens; ++t) {
          want += logit[t] / sum * kv->v[(size_t{t} * s.kv_heads + h) * d_n + d];
        }
        EXPECT_NEAR((*out)[(size_t{i} * s.q_heads + g) * d_n + d], want, 1e-4)
            << "query " << i << " head " << g << " channel " << d;
      }
    }
  }
}

TEST_P(AttentionTest, GatherOrderDoesNotChangeTheOutputAndBadKvIsRejected) {
  const KvShape s = AttentionShape(DType::kBf16);
  const auto records = RandomRecords(s, 20, 5);
  const auto q = RandomQueries(s, 4, 6);
  std::vector<uint32_t> ascending(20), shuffled(20);
  for (uint32_t j = 0; j < 20; ++j) ascending[j] = j;
  shuffled = ascending;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(7));
  const auto full = *ReferenceAttention(s, q, 4, *Gather(s, Pointers(records), ascending));
  const auto permuted = *ReferenceAttention(s, q, 4, *Gather(s, Pointers(records), shuffled));
  EXPECT_LT(RelativeL2Error(permuted, full), 1e-6);
  GatheredKv bad = *Gather(s, Pointers(records), ascending);
  bad.v.pop_back();
  const auto st = ReferenceAttention(s, q, 4, bad).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("gathered kv of"), absl::string_view::npos) << st;
}

INSTANTIATE_TEST_SUITE_P(CpuPaths, AttentionTest,
                         ::testing::Values(CpuPath::kScalar, CpuPath::kAvx2), [](const auto& info) {
                           return info.param == CpuPath::kScalar ? "scalar" : "avx2";
                         });

// Token masses agree to 1e-5 of the largest, outputs to 1e-5 in relative L2 (different summation
// orders and exp implementations).
TEST(AttentionPathsTest, VectorisedAndScalarPathsAgree) {
  SetCpuPath(CpuPath::kAvx2);
  if (!UseAvx2()) {
    SetCpuPath(CpuPath::kAuto);
    GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C: only the scalar path exists";
  }
  const KvShape s{8, 2, 128, 16, DType::kFp16};
  const auto records = RandomRecords(s, 70, 8);
  const auto q = RandomQueries(s, 32, 9);
  std::vector<uint32_t> chosen;
  for (uint32_t j = 0; j < 70; j += 3) chosen.push_back(j);
  const auto kv = *Gather(s, Pointers(records), chosen);
  std::vector<float> mass[2], out[2];
  for (int scalar = 0; scalar < 2; ++scalar) {
    SetCpuPath(scalar ? CpuPath::kScalar : CpuPath::kAvx2);
    mass[scalar] = *TokenAttention(s, q, 32, Pointers(records));
    out[scalar] = *ReferenceAttention(s, q, 32, kv);
  }
  SetCpuPath(CpuPath::kAuto);
  const float max = *std::max_element(mass[1].begin(), mass[1].end());
  for (size_t t = 0; t < mass[1].size(); ++t) ASSERT_NEAR(mass[0][t], mass[1][t], 1e-5f * max) << t;
  EXPECT_LT(RelativeL2Error(out[0], out[1]), 1e-5);
}

TEST(FidelityTest, MetricsOnHandComputedCases) {
  const std::vector<float> mass = {0.5f, 0.1f, 0.3f, 0.1f};
  EXPECT_NEAR(AttentionRecall(mass, std::vector<uint32_t>{0, 2}), 0.8, 1e-6);
  EXPECT_NEAR(AttentionRecall(mass, std::vector<uint32_t>{}), 0.0, 1e-12);
  const std::vector<float> ref = {3, 4}, out = {3, 3};
  EXPECT_NEAR(RelativeL2Error(out, ref), 0.2, 1e-9);
  EXPECT_NEAR(RelativeL2Error(ref, ref), 0.0, 1e-12);
  EXPECT_NEAR(Jaccard(std::vector<uint32_t>{1, 2, 3}, std::vector<uint32_t>{2, 3, 4, 5}), 0.4,
              1e-12);
  EXPECT_NEAR(Jaccard(std::vector<uint32_t>{}, std::vector<uint32_t>{}), 1.0, 1e-12);
}

TEST(HalfTest, EveryHalfRoundTripsAndTheVectorPathAgreesWithTheScalarOne) {
  std::vector<std::byte> bytes(2 * 65536), back(2 * 65536);
  std::vector<float> f(65536), g(65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto u = static_cast<uint16_t>(h);
    std::memcpy(bytes.data() + 2 * h, &u, 2);
  }
  SetCpuPath(CpuPath::kAuto);
  ToFloat(DType::kFp16, bytes.data(), 65536, f.data());
  for (uint32_t h = 0; h < 65536; ++h) {
    const float scalar = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(scalar)) {
      EXPECT_TRUE(std::isnan(f[h]));
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(f[h]), std::bit_cast<uint32_t>(scalar)) << h;
    ASSERT_EQ(FloatToHalf(scalar), h) << h;
  }
  // Rounding: random floats through the F16C path and the scalar one give the same bits.
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<float> wide(-70000.0f, 70000.0f);
  for (float& x : g) x = wide(rng) * (rng() % 2 ? 1.0f : 1e-6f);
  FromFloat(DType::kFp16, g.data(), g.size(), back.data());
  for (size_t i = 0; i < g.size(); ++i) {
    uint16_t vec;
    std::memcpy(&vec, back.data() + 2 * i, 2);
    ASSERT_EQ(vec, FloatToHalf(g[i])) << g[i];
  }
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie to even
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
}

}  // namespace
}  // namespace ckv::kernels
