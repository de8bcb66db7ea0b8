// SPDX-License-Identifier: Apache-2.0
// kernels/half.cc: bulk conversions, with an F16C path chosen at run time on x86 (UseAvx2()) and
// the scalar conversions of half.h everywhere else; the two give identical bits.
#include "kernels/half.h"

#include <cstring>

#include "kernels/cpu_path.h"

#if CKV_X86
#include <immintrin.h>
#endif

namespace ckv::kernels {
namespace {

void HalfToFloatScalar(const std::byte* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = HalfToFloat(h);
  }
}

void FloatToHalfScalar(const float* src, size_t n, std::byte* dst) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = FloatToHalf(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

#if CKV_X86

__attribute__((target("avx2,f16c"))) void HalfToFloatF16c(const std::byte* src, size_t n,
                                                          float* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  HalfToFloatScalar(src + 2 * i, n - i, dst + i);
}

__attribute__((target("avx2,f16c"))) void FloatToHalfF16c(const float* src, size_t n,
                                                          std::byte* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  FloatToHalfScalar(src + i, n - i, dst + 2 * i);
}

#endif  // CKV_X86

}  // namespace

void ToFloat(DType dtype, const std::byte* src, size_t n, float* dst) {
  switch (dtype) {
    case DType::kFp32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kFp16:
#if CKV_X86
      if (UseAvx2()) return HalfToFloatF16c(src, n, dst);
#endif
      return HalfToFloatScalar(src, n, dst);
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
#if CKV_X86
      if (UseAvx2()) return FloatToHalfF16c(src, n, dst);
#endif
      return FloatToHalfScalar(src, n, dst);
    case DType::kBf16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t b = FloatToBf16(src[i]);
        std::memcpy(dst + 2 * i, &b, 2);
      }
      return;
  }
}

}  // namespace ckv::kernels
