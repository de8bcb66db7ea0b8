// SPDX-License-Identifier: Apache-2.0
// kernels/matmul.cc: blocked Q K^T and P V (see matmul.h).
#include "kernels/matmul.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cpu_path.h"
#include "kernels/simd.h"

// Under the sanitizers the two tiled loops below (and the inline helpers they use, whose
// attributes must match theirs, or g++ 12 fails with an internal error) are not instrumented:
// they load each query row once per key and each key once per 4 query rows, and checking every
// 32-byte load cost the replay tests 80% of their time in the sanitizer builds (one replay test:
// 26 s under ASan+UBSan, 82 s under TSan; 6.5 s and 31 s without). Instead the call declares, row
// by row, the bytes it reads and writes, as the instrumentation would (__asan_loadN/storeN,
// __tsan_read/write_range): an overflow, a use after free or a race on any of those rows is still
// reported, at the call. The loops index within the rows so declared (no undefined behaviour to
// check there: unsigned sizes, no shifts, no casts).
#if defined(__SANITIZE_ADDRESS__)
extern "C" void __asan_loadN(uintptr_t addr, uintptr_t size);
extern "C" void __asan_storeN(uintptr_t addr, uintptr_t size);
#define CKV_SANITIZER_READ(p, n) __asan_loadN(reinterpret_cast<uintptr_t>(p), (n))
#define CKV_SANITIZER_WRITE(p, n) __asan_storeN(reinterpret_cast<uintptr_t>(p), (n))
#elif defined(__SANITIZE_THREAD__)
extern "C" void __tsan_read_range(void* addr, unsigned long size);
extern "C" void __tsan_write_range(void* addr, unsigned long size);
#define CKV_SANITIZER_READ(p, n) \
  __tsan_read_range(const_cast<void*>(static_cast<const void*>(p)), (n))
#define CKV_SANITIZER_WRITE(p, n) __tsan_write_range(static_cast<void*>(p), (n))
#else
#define CKV_SANITIZER_READ(p, n) (static_cast<void>(p), static_cast<void>(n))
#define CKV_SANITIZER_WRITE(p, n) (static_cast<void>(p), static_cast<void>(n))
#endif
#define CKV_NOT_INSTRUMENTED \
  __attribute__((no_sanitize_address, no_sanitize_thread, no_sanitize_undefined))

namespace ckv::kernels {
namespace {

// Declares `rows` rows of `n` floats, `ld` apart from `p`, read (or written) by an uninstrumented
// loop. Nothing outside the sanitizer builds.
[[maybe_unused]] void DeclareRows(const float* p, size_t ld, size_t rows, size_t n, bool write) {
  if (n == 0) return;
  for (size_t r = 0; r < rows; ++r) {
    if (write) {
      CKV_SANITIZER_WRITE(const_cast<float*>(p + r * ld), n * sizeof(float));
    } else {
      CKV_SANITIZER_READ(p + r * ld, n * sizeof(float));
    }
  }
}

#if CKV_X86

// Query rows per pass over the keys: 32 rows of 128 floats (16 KiB) stay in L1 while the keys
// stream past them once, 3 at a time.
constexpr size_t kRowBlock = 32;
// Values per block of P V: 128 x 128 floats (64 KiB at d = 128) stay in L2 while every output
// tile of the rows passes over them.
constexpr size_t kValueBlock = 128;

#define CKV_AVX2_INLINE \
  __attribute__((target("avx2,fma,f16c"), always_inline)) CKV_NOT_INSTRUMENTED inline

// The lane sums of a0..a3, as one vector.
CKV_AVX2_INLINE __m128 Sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// R <= 4 query rows against C keys: 4 x 3 keeps 12 accumulators, 3 keys and a query in the 16
// vector registers, so a step loads 7 vectors for 12 FMAs. REQUIRES: d % 8 == 0.
template <int R, int C>
CKV_AVX2_INLINE void QkTile(const float* q, size_t ldq, const float* k, size_t ldk, size_t d,
                            __m128 scale, float* s, size_t lds) {
  __m256 acc[4][C];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 3
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  for (size_t i = 0; i < d; i += 8) {
    __m256 kv[C];
#pragma GCC unroll 3
    for (int c = 0; c < C; ++c) kv[c] = _mm256_loadu_ps(k + c * ldk + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 qv = _mm256_loadu_ps(q + r * ldq + i);
#pragma GCC unroll 3
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(qv, kv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 3
  for (int c = 0; c < C; ++c) {
    alignas(16) float sum[4];
    _mm_store_ps(sum, _mm_mul_ps(Sum4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]), scale));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) s[r * lds + c] = sum[r];
  }
}

// Keys [t, t + C) against every row.
template <int C>
CKV_AVX2_INLINE void QkColumns(const float* q, size_t ldq, size_t rows, const float* k, size_t ldk,
                               size_t d, __m128 scale, float* s, size_t lds) {
  size_t r = 0;
  for (; r + 4 <= rows; r += 4) QkTile<4, C>(q + r * ldq, ldq, k, ldk, d, scale, s + r * lds, lds);
  for (; r < rows; ++r) QkTile<1, C>(q + r * ldq, ldq, k, ldk, d, scale, s + r * lds, lds);
}

CKV_AVX2 CKV_NOT_INSTRUMENTED void ScoresQKAvx2(const float* q, size_t ldq, size_t rows,
                                                const float* k, size_t ldk, size_t tokens, size_t d,
                                                float scale_f, float* s, size_t lds) {
  const __m128 scale = _mm_set1_ps(scale_f);
  for (size_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const size_t rn = rows - r0 < kRowBlock ? rows - r0 : kRowBlock;  // no instrumented std::min
    const float* qb = q + r0 * ldq;
    float* sb = s + r0 * lds;
    size_t t = 0;
    for (; t + 3 <= tokens; t += 3)
      QkColumns<3>(qb, ldq, rn, k + t * ldk, ldk, d, scale, sb + t, lds);
    for (; t < tokens; ++t) QkColumns<1>(qb, ldq, rn, k + t * ldk, ldk, d, scale, sb + t, lds);
  }
}

// R rows x 8V channels of outputs, kept in registers over `tokens` values: 6 x 16 holds 12
// accumulators, 2 value vectors and a broadcast weight.
template <int R, int V>
CKV_AVX2_INLINE void PvTile(const float* p, size_t ldp, const float* v, size_t ldv, size_t tokens,
                            float* o, size_t ldo) {
  __m256 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int j = 0; j < V; ++j) acc[r][j] = _mm256_loadu_ps(o + r * ldo + 8 * j);
  }
  for (size_t t = 0; t < tokens; ++t) {
    __m256 vv[V];
#pragma GCC unroll 2
    for (int j = 0; j < V; ++j) vv[j] = _mm256_loadu_ps(v + t * ldv + 8 * j);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(p + r * ldp + t);
#pragma GCC unroll 2
      for (int j = 0; j < V; ++j) acc[r][j] = _mm256_fmadd_ps(w, vv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < V; ++j) _mm256_storeu_ps(o + r * ldo + 8 * j, acc[r][j]);
  }
}

// REQUIRES: d % 8 == 0.
template <int R>
CKV_AVX2_INLINE void PvRows(const float* p, size_t ldp, const float* v, size_t ldv, size_t tokens,
                            size_t d, float* o, size_t ldo) {
  size_t i = 0;
  for (; i + 16 <= d; i += 16) PvTile<R, 2>(p, ldp, v + i, ldv, tokens, o + i, ldo);
  if (i < d) PvTile<R, 1>(p, ldp, v + i, ldv, tokens, o + i, ldo);
}

CKV_AVX2 CKV_NOT_INSTRUMENTED void AccumulatePVAvx2(const float* p, size_t ldp, size_t rows,
                                                    const float* v, size_t ldv, size_t tokens,
                                                    size_t d, float* o, size_t ldo) {
  for (size_t t0 = 0; t0 < tokens; t0 += kValueBlock) {
    const size_t n = tokens - t0 < kValueBlock ? tokens - t0 : kValueBlock;
    const float* vb = v + t0 * ldv;
    size_t r = 0;
    for (; r + 6 <= rows; r += 6) PvRows<6>(p + r * ldp + t0, ldp, vb, ldv, n, d, o + r * ldo, ldo);
    for (; r < rows; ++r) PvRows<1>(p + r * ldp + t0, ldp, vb, ldv, n, d, o + r * ldo, ldo);
  }
}

#endif  // CKV_X86

}  // namespace

void ScoresQK(const float* q, size_t ldq, size_t rows, const float* k, size_t ldk, size_t tokens,
              size_t d, float scale, float* s, size_t lds) {
#if CKV_X86
  if (UseAvx2() && d % 8 == 0) {
    DeclareRows(q, ldq, rows, d, /*write=*/false);
    DeclareRows(k, ldk, tokens, d, /*write=*/false);
    DeclareRows(s, lds, rows, tokens, /*write=*/true);
    return ScoresQKAvx2(q, ldq, rows, k, ldk, tokens, d, scale, s, lds);
  }
#endif
  for (size_t r = 0; r < rows; ++r) {
    for (size_t t = 0; t < tokens; ++t) {
      s[r * lds + t] = simd::DotScalar(q + r * ldq, k + t * ldk, d) * scale;
    }
  }
}

void AccumulatePV(const float* p, size_t ldp, size_t rows, const float* v, size_t ldv,
                  size_t tokens, size_t d, float* o, size_t ldo) {
#if CKV_X86
  if (UseAvx2() && d % 8 == 0) {
    DeclareRows(p, ldp, rows, tokens, /*write=*/false);
    DeclareRows(v, ldv, tokens, d, /*write=*/false);
    DeclareRows(o, ldo, rows, d, /*write=*/true);  // read, then written
    return AccumulatePVAvx2(p, ldp, rows, v, ldv, tokens, d, o, ldo);
  }
#endif
  for (size_t r = 0; r < rows; ++r) {
    for (size_t t = 0; t < tokens; ++t)
      simd::AxpyScalar(p[r * ldp + t], v + t * ldv, o + r * ldo, d);
  }
}

}  // namespace ckv::kernels
