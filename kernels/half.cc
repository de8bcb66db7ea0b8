// SPDX-License-Identifier: Apache-2.0
// kernels/half.cc: bulk conversions, with an F16C path chosen at run time.
#include "kernels/half.h"

#include <immintrin.h>

#include <cstring>

namespace ckv::kernels {
namespace {

__attribute__((target("avx2,f16c"))) void HalfToFloatF16c(const std::byte* src, size_t n,
                                                         float* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = HalfToFloat(h);
  }
}

__attribute__((target("avx2,f16c"))) void FloatToHalfF16c(const float* src, size_t n,
                                                         std::byte* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  for (; i < n; ++i) {
    const uint16_t h = FloatToHalf(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

bool HasF16c() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
}

}  // namespace

void ToFloat(DType dtype, const std::byte* src, size_t n, float* dst) {
  switch (dtype) {
    case DType::kFp32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kFp16:
      if (HasF16c()) return HalfToFloatF16c(src, n, dst);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = HalfToFloat(h);
      }
      return;
    case DType::kBf16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        dst[i] = Bf16ToFloat(b);
      }
      return;
  }
}

void FromFloat(DType dtype, const float* src, size_t n, std::byte* dst) {
  switch (dtype) {
    case DType::kFp32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kFp16:
      if (HasF16c()) return FloatToHalfF16c(src, n, dst);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = FloatToHalf(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case DType::kBf16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t b = FloatToBf16(src[i]);
        std::memcpy(dst + 2 * i, &b, 2);
      }
      return;
  }
}

}  // namespace ckv::kernels
