// SPDX-License-Identifier: Apache-2.0
// kernels/fidelity.h: how well a selection stands in for the full KV, per layer.
//
// Thread-safety: pure functions.
#ifndef CKV_KERNELS_FIDELITY_H_
#define CKV_KERNELS_FIDELITY_H_

#include <cstdint>
#include <span>

namespace ckv::kernels {

// Attention recall: the share of the true attention mass (per chunk, summing to 1 over the
// prefix: PerChunk(TokenAttention(...)) with every head) that the selected chunks hold.
double AttentionRecall(std::span<const float> chunk_mass, std::span<const uint32_t> selected);

// ||out - reference|| / ||reference|| (L2 over every element); 0 when both are zero.
double RelativeL2Error(std::span<const float> out, std::span<const float> reference);

// |a ∩ b| / |a ∪ b| of two sorted, unique index sets (1 when both are empty).
double Jaccard(std::span<const uint32_t> a, std::span<const uint32_t> b);

}  // namespace ckv::kernels

#endif  // CKV_KERNELS_FIDELITY_H_
