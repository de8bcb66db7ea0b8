// SPDX-License-Identifier: Apache-2.0
// kernels/simd.h: the few vector primitives the CPU kernels are built from, most in a scalar
// form and an AVX2/FMA form, and the forms that choose between them through UseAvx2().
// The AVX2 forms exist only where CKV_X86 is 1 (kernels/cpu_path.h); elsewhere the chosen forms
// are the scalar ones. Internal to kernels/.
#ifndef CKV_KERNELS_SIMD_H_
#define CKV_KERNELS_SIMD_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu_path.h"

#if CKV_X86
#include <immintrin.h>

// Compiles one function for AVX2/FMA/F16C; callers reach it only when UseAvx2().
#define CKV_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

namespace ckv::kernels::simd {

inline float DotScalar(const float* a, const float* b, size_t n) {
  float s = 0;
  for (size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// out[i] = q[i] * scale: an int8 vector decoded.
inline void DecodeI8Scalar(const int8_t* q, float scale, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]) * scale;
}

inline float MaxScalar(const float* v, size_t n) { return *std::max_element(v, v + n); }

// In place: v[i] = exp(v[i] - max); returns the sum.
inline float ExpSubScalar(float* v, size_t n, float max) {
  float sum = 0;
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::exp(v[i] - max);
    sum += v[i];
  }
  return sum;
}

// y += a * x
inline void AxpyScalar(float a, const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

#if CKV_X86

CKV_AVX2 inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

CKV_AVX2 inline void DecodeI8Avx2(const int8_t* q, float scale, size_t n, float* out) {
  const __m256 sv = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), sv));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(q[i]) * scale;
}

CKV_AVX2 inline float MaxAvx2(const float* v, size_t n) {
  if (n < 8) return MaxScalar(v, n);
  __m256 m = _mm256_loadu_ps(v);
  size_t i = 8;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(v + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float max = MaxScalar(lanes, 8);
  for (; i < n; ++i) max = std::max(max, v[i]);
  return max;
}

// exp(x) for x <= 0 (softmax after subtracting the max), to about 2 ulp; exp(-88) and below
// flush to 0.
CKV_AVX2 inline __m256 ExpNonPositiveAvx2(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 dead = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  // exp(x) = 2^n * exp(r), r = x - n ln2 in [-ln2/2, ln2/2].
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(dead, result);
}

CKV_AVX2 inline float ExpSubAvx2(float* v, size_t n, float max) {
  const __m256 m = _mm256_set1_ps(max);
  __m256 s = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = ExpNonPositiveAvx2(_mm256_sub_ps(_mm256_loadu_ps(v + i), m));
    _mm256_storeu_ps(v + i, e);
    s = _mm256_add_ps(s, e);
  }
  float sum = HorizontalSum(s);
  for (; i < n; ++i) {
    v[i] = std::exp(v[i] - max);
    sum += v[i];
  }
  return sum;
}

// y += a * x
CKV_AVX2 inline void AxpyAvx2(float a, const float* x, float* y, size_t n) {
  const __m256 av = _mm256_set1_ps(a);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

#endif  // CKV_X86

// The forms chosen by UseAvx2(). On x86 they are written as before the guard, so that the
// machine code there is unchanged.

inline void DecodeI8(const int8_t* q, float scale, size_t n, float* out) {
#if CKV_X86
  UseAvx2() ? DecodeI8Avx2(q, scale, n, out) : DecodeI8Scalar(q, scale, n, out);
#else
  DecodeI8Scalar(q, scale, n, out);
#endif
}

inline void Axpy(float a, const float* x, float* y, size_t n) {
#if CKV_X86
  UseAvx2() ? AxpyAvx2(a, x, y, n) : AxpyScalar(a, x, y, n);
#else
  AxpyScalar(a, x, y, n);
#endif
}

// In place: v[i] = exp(v[i] - max_j v[j]), the numerators of the softmax of v; returns their sum,
// the denominator (>= 1). REQUIRES: n > 0.
inline float SoftmaxNumerators(float* v, size_t n) {
#if CKV_X86
  return UseAvx2() ? ExpSubAvx2(v, n, MaxAvx2(v, n)) : ExpSubScalar(v, n, MaxScalar(v, n));
#else
  return ExpSubScalar(v, n, MaxScalar(v, n));
#endif
}

}  // namespace ckv::kernels::simd

#endif  // CKV_KERNELS_SIMD_H_
