// SPDX-License-Identifier: Apache-2.0
// kernels/matmul.h: the two products of attention, S = scale * Q K^T and O += P V, on row-major
// float matrices with leading dimensions (so that a head can be read in place out of
// [tokens, heads, head_dim]). Internal to kernels/.
//
// The AVX2/FMA path (taken when UseAvx2() and d % 8 == 0) is blocked for the registers: 4 query
// rows x 3 keys of scores, 6 rows x 16 channels of outputs per step, so that each step does 12
// FMAs for 7 or 8 loads; and for the cache: 32 query rows (16 KiB at d = 128) stay in L1 while
// the keys stream past once, and 128 values in L2 while every output tile passes over them. The
// scalar path is the plain loops. The two sum in different orders, so they agree to float
// rounding, not bit for bit.
//
// Thread-safety: pure functions.
#ifndef CKV_KERNELS_MATMUL_H_
#define CKV_KERNELS_MATMUL_H_

#include <cstddef>

namespace ckv::kernels {

// s[r * lds + t] = scale * dot(q + r * ldq, k + t * ldk) over `d` floats, for r < rows and
// t < tokens.
void ScoresQK(const float* q, size_t ldq, size_t rows, const float* k, size_t ldk, size_t tokens,
              size_t d, float scale, float* s, size_t lds);

// o + r * ldo += sum over t < tokens of p[r * ldp + t] * (v + t * ldv), `d` floats each, for
// r < rows.
void AccumulatePV(const float* p, size_t ldp, size_t rows, const float* v, size_t ldv,
                  size_t tokens, size_t d, float* o, size_t ldo);

}  // namespace ckv::kernels

#endif  // CKV_KERNELS_MATMUL_H_
