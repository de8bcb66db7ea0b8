// SPDX-License-Identifier: Apache-2.0
// Tests of the blocked products of attention (kernels/matmul.h) against double-precision loops,
// on shapes that hit every edge of the blocking: rows not a multiple of 4 or 6, keys not a
// multiple of 3, head dims that are not multiples of 16 or 8 (the last takes the scalar loops),
// and leading dimensions larger than the rows.
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_path.h"
#include "kernels/matmul.h"

namespace ckv::kernels {
namespace {

struct Shape {
  size_t rows, tokens, d;
};

std::vector<float> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

class MatmulTest : public ::testing::TestWithParam<CpuPath> {
 protected:
  void SetUp() override { SetCpuPath(GetParam()); }
  void TearDown() override { SetCpuPath(CpuPath::kAuto); }
};

// Tolerance: float rounding of a d-term sum, 1e-5 of the sum of the terms' magnitudes.
TEST_P(MatmulTest, ScoresMatchDoublePrecisionAndLeaveTheRestOfTheRowsAlone) {
  for (const Shape& sh : {Shape{1, 1, 8}, Shape{5, 7, 16}, Shape{4, 3, 24}, Shape{9, 301, 128},
                          Shape{33, 40, 64}, Shape{3, 5, 12}, Shape{6, 2, 1}}) {
    SCOPED_TRACE(::testing::Message() << sh.rows << " x " << sh.tokens << " x " << sh.d);
    const size_t ldq = sh.d + 3, ldk = sh.d + 5, lds = sh.tokens + 2;
    const auto q = Random(sh.rows * ldq, 1), k = Random(sh.tokens * ldk, 2);
    std::vector<float> s(sh.rows * lds, -7.0f);
    ScoresQK(q.data(), ldq, sh.rows, k.data(), ldk, sh.tokens, sh.d, 0.5f, s.data(), lds);
    for (size_t r = 0; r < sh.rows; ++r) {
      for (size_t t = 0; t < sh.tokens; ++t) {
        double want = 0, mag = 0;
        for (size_t i = 0; i < sh.d; ++i) {
          want += double{q[r * ldq + i]} * k[t * ldk + i];
          mag += std::fabs(double{q[r * ldq + i]} * k[t * ldk + i]);
        }
        ASSERT_NEAR(s[r * lds + t], 0.5 * want, 1e-5 * mag) << "row " << r << " key " << t;
      }
      for (size_t t = sh.tokens; t < lds; ++t) ASSERT_EQ(s[r * lds + t], -7.0f);
    }
  }
}

TEST_P(MatmulTest, WeightedValuesAccumulateAsInDoublePrecision) {
  for (const Shape& sh : {Shape{1, 1, 8}, Shape{7, 5, 16}, Shape{6, 33, 24}, Shape{13, 300, 128},
                          Shape{2, 9, 12}, Shape{3, 4, 1}}) {
    SCOPED_TRACE(::testing::Message() << sh.rows << " x " << sh.tokens << " x " << sh.d);
    const size_t ldp = sh.tokens + 1, ldv = sh.d + 3, ldo = sh.d + 2;
    const auto p = Random(sh.rows * ldp, 3), v = Random(sh.tokens * ldv, 4);
    auto o = Random(sh.rows * ldo, 5);
    const auto before = o;
    AccumulatePV(p.data(), ldp, sh.rows, v.data(), ldv, sh.tokens, sh.d, o.data(), ldo);
    for (size_t r = 0; r < sh.rows; ++r) {
      for (size_t i = 0; i < sh.d; ++i) {
        double want = before[r * ldo + i], mag = std::fabs(want);
        for (size_t t = 0; t < sh.tokens; ++t) {
          want += double{p[r * ldp + t]} * v[t * ldv + i];
          mag += std::fabs(double{p[r * ldp + t]} * v[t * ldv + i]);
        }
        ASSERT_NEAR(o[r * ldo + i], want, 1e-5 * mag) << "row " << r << " channel " << i;
      }
      for (size_t i = sh.d; i < ldo; ++i) ASSERT_EQ(o[r * ldo + i], before[r * ldo + i]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CpuPaths, MatmulTest, ::testing::Values(CpuPath::kScalar, CpuPath::kAvx2),
                         [](const auto& info) {
                           return info.param == CpuPath::kScalar ? "scalar" : "avx2";
                         });

}  // namespace
}  // namespace ckv::kernels
