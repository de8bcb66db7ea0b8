// SPDX-License-Identifier: Apache-2.0
// kernels/attention.h: exact attention over a prefix's keys, gather of selected chunks, and the
// reference attention output, on the CPU (AVX2/FMA/F16C where present, scalar otherwise; both
// built on kernels/matmul.h).
//
// Conventions shared by every kernel:
//   - Queries of one layer are float32 [w, q_heads, head_dim] (the suffix's last w tokens).
//   - GQA: q head g reads kv head g / (q_heads / kv_heads).
//   - A prefix's keys at one layer are given as one pointer per chunk to that chunk's record
//     (K [c, kv_heads, head_dim] then V, in the spec's dtype: what ckv stores).
//   - Scores are q . k / sqrt(head_dim); probabilities are the softmax over all tokens given.
//
// Thread-safety: pure functions.
#ifndef CKV_KERNELS_ATTENTION_H_
#define CKV_KERNELS_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/model_spec.h"
#include "kernels/half.h"

namespace ckv::kernels {

// The shape of one layer's KV, from a ModelSpec's fields.
struct KvShape {
  uint32_t q_heads = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t chunk_tokens = 0;
  DType dtype = DType::kFp16;

  static KvShape Of(const ModelSpec& spec) {
    return KvShape{spec.q_heads, spec.kv_heads, spec.head_dim, spec.chunk_tokens, spec.dtype};
  }
  uint32_t group() const { return q_heads / kv_heads; }
  // Bytes of K (or V) of one chunk, and of its record (K then V).
  size_t half_record_bytes() const {
    return size_t{chunk_tokens} * kv_heads * head_dim * ElementBytes(dtype);
  }
  size_t record_bytes() const { return 2 * half_record_bytes(); }
  // InvalidArgument unless the fields are positive and q_heads is a multiple of kv_heads.
  absl::Status Validate() const;
};

// One pointer per chunk to its record (K then V).
using ChunkRecords = std::span<const std::byte* const>;

// Exact attention mass per token: for each query and each q head in `heads` (empty: all), the
// softmax of its scores over every token of `records`, summed over queries and heads and divided
// by their number, so that the masses sum to 1. Returns chunks * c floats.
// Errors: InvalidArgument for a bad shape, queries of the wrong size, a head out of range.
absl::StatusOr<std::vector<float>> TokenAttention(const KvShape& shape,
                                                  std::span<const float> queries, uint32_t window,
                                                  ChunkRecords records,
                                                  std::span<const uint32_t> heads = {});

// Sums per chunk of per-token values (chunk_tokens consecutive values each).
std::vector<float> PerChunk(std::span<const float> per_token, uint32_t chunk_tokens);

// The K and V of some chunks, converted to float32 and laid out [tokens, kv_heads, head_dim],
// with each token's position in the prefix. Float32 (not the spec's dtype) because the only
// consumer on the CPU is ReferenceAttention, which computes in float32: converting once here
// keeps the conversion out of its inner loops. The conversion is exact.
struct GatheredKv {
  uint32_t tokens = 0;
  std::vector<float> k;
  std::vector<float> v;
  std::vector<uint32_t> positions;
};
// Gathers chunks `chunks` (indices into `records`, any order) in the order given.
// Errors: InvalidArgument for a bad shape or an index out of range.
absl::StatusOr<GatheredKv> Gather(const KvShape& shape, ChunkRecords records,
                                  std::span<const uint32_t> chunks);

// softmax(q K^T / sqrt(D)) V with GQA over `kv` (all of a prefix's chunks or any subset, in any
// order), for every query and q head: float32 [w, q_heads, head_dim]. No mask: every prefix token
// precedes every suffix query, and stored keys already carry their positions (RoPE), so
// kv.positions are not read. Over no tokens the output is zeros.
// Errors: InvalidArgument for a bad shape, queries of the wrong size, or k / v not
// kv.tokens * kv_heads * head_dim floats.
absl::StatusOr<std::vector<float>> ReferenceAttention(const KvShape& shape,
                                                      std::span<const float> queries,
                                                      uint32_t window, const GatheredKv& kv);

}  // namespace ckv::kernels

#endif  // CKV_KERNELS_ATTENTION_H_
