// SPDX-License-Identifier: Apache-2.0
// kernels/half.h: conversions between the KV element types (fp16, bf16, fp32) and float.
//
// The scalar conversions are exact where the target can represent the value and round to nearest
// even otherwise (the rule of the F16C instructions and of PyTorch's bf16 casts), so the CPU path
// and the vectorised path give identical bits. ToFloat and FromFloat use F16C when UseAvx2()
// (kernels/cpu_path.h: x86 with AVX2, FMA and F16C, unless a test forces the scalar path).
//
// Thread-safety: pure functions.
#ifndef CKV_KERNELS_HALF_H_
#define CKV_KERNELS_HALF_H_

#include <bit>
#include <cstddef>
#include <cstdint>

#include "ckv/model_spec.h"
#include "common/half.h"

namespace ckv::kernels {

// Bytes per element of `dtype` (kernels/ does not link the storage library that defines
// ckv::DTypeBytes).
inline size_t ElementBytes(DType dtype) { return dtype == DType::kFp32 ? 4 : 2; }

// The scalar conversions live in common/ (the record codecs use them too).
using ckv::Bf16ToFloat;
using ckv::FloatToBf16;
using ckv::FloatToHalf;
using ckv::HalfToFloat;

// Converts `n` elements of `dtype` at `src` (any alignment) to float.
void ToFloat(DType dtype, const std::byte* src, size_t n, float* dst);

// Converts `n` floats to `dtype` at `dst` (round to nearest even).
void FromFloat(DType dtype, const float* src, size_t n, std::byte* dst);

}  // namespace ckv::kernels

#endif  // CKV_KERNELS_HALF_H_
