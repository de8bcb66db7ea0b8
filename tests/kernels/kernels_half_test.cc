// SPDX-License-Identifier: Apache-2.0
// Tests of the bulk conversions (kernels/half.h) on each CPU path: the F16C path (x86 only) and
// the scalar path, which is the only one on other architectures, must give the bits of the
// element-wise scalar conversions, so that a store written on one machine reads the same on
// another.
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_path.h"
#include "kernels/half.h"

namespace ckv::kernels {
namespace {

class HalfConversionTest : public ::testing::TestWithParam<CpuPath> {
 protected:
  void SetUp() override { SetCpuPath(GetParam()); }
  void TearDown() override { SetCpuPath(CpuPath::kAuto); }
};

bool IsHalfNaN(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

// Every fp16 bit pattern, at an odd offset (any alignment is allowed) and a length that is not a
// multiple of the vector width, so that both the vector body and the scalar tail run.
TEST_P(HalfConversionTest, ToFloatGivesTheScalarConversionOfEveryHalf) {
  constexpr size_t kN = 65536 + 5;
  std::vector<std::byte> buf(2 * kN + 1);
  for (size_t i = 0; i < kN; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    std::memcpy(buf.data() + 1 + 2 * i, &h, 2);
  }
  std::vector<float> out(kN);
  ToFloat(DType::kFp16, buf.data() + 1, kN, out.data());
  for (size_t i = 0; i < kN; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    // A signalling NaN may come back quiet from F16C; a NaN stays a NaN of the same sign.
    if (IsHalfNaN(h)) {
      ASSERT_TRUE(std::isnan(out[i])) << std::hex << h;
      ASSERT_EQ(std::signbit(out[i]), (h & 0x8000u) != 0) << std::hex << h;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(HalfToFloat(h)))
        << std::hex << h;
  }
}

// Floats near every rounding boundary of fp16 (halfway points, the subnormal range, overflow)
// and random ones.
TEST_P(HalfConversionTest, FromFloatGivesTheScalarConversion) {
  std::vector<float> in;
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const uint32_t f = std::bit_cast<uint32_t>(HalfToFloat(static_cast<uint16_t>(h)));
    for (uint32_t delta : {0u, 1u, 0xfffu, 0x1000u, 0x1001u}) {
      in.push_back(std::bit_cast<float>(f + delta));
      in.push_back(-std::bit_cast<float>(f + delta));
    }
  }
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 100000; ++i) {
    const float f = std::bit_cast<float>(bits(rng));
    if (!std::isnan(f)) in.push_back(f);
  }
  in.push_back(65504.0f);
  in.push_back(65520.0f);
  in.push_back(1e30f);
  in.push_back(std::bit_cast<float>(0x7f800000u));
  in.push_back(std::bit_cast<float>(0xff800000u));
  in.push_back(3.0f);  // a length that is not a multiple of 8
  std::vector<std::byte> out(2 * in.size());
  FromFloat(DType::kFp16, in.data(), in.size(), out.data());
  for (size_t i = 0; i < in.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, out.data() + 2 * i, 2);
    ASSERT_EQ(h, FloatToHalf(in[i])) << std::hexfloat << in[i];
  }
}

INSTANTIATE_TEST_SUITE_P(CpuPaths, HalfConversionTest,
                         ::testing::Values(CpuPath::kScalar, CpuPath::kAvx2), [](const auto& info) {
                           return info.param == CpuPath::kScalar ? "scalar" : "avx2";
                         });

}  // namespace
}  // namespace ckv::kernels
