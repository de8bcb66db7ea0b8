// SPDX-License-Identifier: Apache-2.0
// kernels/estimate.h: attention over the chunks a selection did not load, estimated from a few
// statistics per chunk instead of dropped, and merged with exact attention over the loaded
// tokens.
//
// When a selection drops a chunk, its share of every query's softmax is lost and the rest is
// renormalised: the output leans toward what was loaded. RetroInfer (arXiv 2505.02922) keeps, per
// cluster of keys, a centroid, a value sum and a count, and attends to those triples beside the
// exact tokens. Here a chunk stands in as one virtual token per kv head:
//
//   chunk j, kv head h, its c tokens' keys k_t and values v_t; q a query of a q head reading h:
//     key mean mu, per-channel key variance var (population), value mean vbar;
//     the chunk's share of the softmax numerator, sum_t exp(q.k_t / sqrt(d)), estimated as
//       kMean:           c * exp(q.mu / sqrt(d))          (the centroid with its count; by
//                        Jensen's inequality an underestimate whenever the keys differ)
//       kGaussian:       c * exp(q.mu / sqrt(d) + sum_i q_i^2 var_i / (2 d))
//                        (the expectation when the keys are Gaussian with diagonal covariance)
//       kGaussianWindow: kGaussian with q_i^2 replaced by its mean over the window's queries (per
//                        q head), so that the variance term is one bias per (chunk, q head) that
//                        every query of the head shares: virtual tokens an attention kernel takes
//                        as keys, values and a per-head logit bias, for queries outside the window
//                        too
//       kGaussianCapped: kGaussian, but never above c * exp(u), where u is the chunk's box bound
//                        sum_i max(q_i min_i, q_i max_i) / sqrt(d) (Quest's): no logit in the
//                        chunk exceeds it, so neither can their log-mean-exp;
//     and its weighted value sum as that share times vbar.
//   The output is the softmax over the loaded tokens' logits and the virtual tokens' estimated
//   log-shares, applied to the loaded values and the value means.
//
// Every estimate is exact when every token of a chunk is the same: the variance is 0, the box is
// the key itself, and c copies of one token weigh c * exp(q.k / sqrt(d)).
//
// Thread-safety: pure functions.
#ifndef CKV_KERNELS_ESTIMATE_H_
#define CKV_KERNELS_ESTIMATE_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "ckv/virtual_tokens.h"
#include "kernels/attention.h"

namespace ckv::kernels {

enum class EstimateKind {
  kNone,            // dropped, as a plain selection does
  kMean,            // centroid and count
  kGaussian,        // centroid, count and per-channel key variance
  kGaussianWindow,  // kGaussian, the variance term from the window's mean q^2 per q head
  kGaussianCapped,  // kGaussian capped by the chunk's min/max box
};
std::string_view EstimateKindName(EstimateKind k);

// The statistics of some chunks at one layer, float, each [chunks, kv_heads, head_dim].
struct ChunkStats {
  uint32_t chunks = 0;
  std::vector<float> key_mean, key_var, key_min, key_max, value_mean;

  // The exact statistics of chunks `which` (indices into `records`, in the order given).
  // Errors: InvalidArgument for a bad shape or an index out of range.
  static absl::StatusOr<ChunkStats> Of(const KvShape& shape, ChunkRecords records,
                                       std::span<const uint32_t> which);

  // Rounds every vector through the 8-bit form ckv's summaries use (kernels/summary.h: per
  // vector, int8 times an fp16 scale of max |x| / 127; minima rounded down, maxima up, the rest to
  // nearest), so that a measurement sees what a stored estimate would give.
  void RoundTripInt8(uint32_t kv_heads, uint32_t head_dim);

  // The statistics of chunks `which` (indices into this, in the order given). REQUIRES: each
  // index < chunks.
  ChunkStats Subset(std::span<const uint32_t> which, uint32_t kv_heads, uint32_t head_dim) const;
};

// softmax over [the loaded tokens' logits, the estimated chunks' log-shares] applied to [their
// values, the value means], for every query and q head: float32 [w, q_heads, head_dim], laid out
// as ReferenceAttention's. With kNone, or no chunk in `rest`, it is ReferenceAttention over
// `loaded`.
// Errors: InvalidArgument for a bad shape, queries of the wrong size, or arrays of the wrong
// size.
absl::StatusOr<std::vector<float>> EstimatedAttention(const KvShape& shape,
                                                      std::span<const float> queries,
                                                      uint32_t window, const GatheredKv& loaded,
                                                      const ChunkStats& rest, EstimateKind kind);

// The chunks not loaded at one layer as virtual tokens (ckv/virtual_tokens.h): the form an
// attention kernel takes beside the loaded tokens without knowing how they were estimated.
using VirtualTokens = ckv::VirtualTokens;

// `rest`'s chunks as virtual tokens for queries like the window's (`chunks` left empty for the
// caller): key mean, value mean, and a bias of log c (kMean) plus, for kGaussianWindow,
// sum_i mean_w(q_i^2) var_i / (2 head_dim) with the mean over the window's queries of each q
// head. rest.key_min/key_max are not used.
// Errors: InvalidArgument for another kind (their logits depend on each query), a bad shape,
// queries of the wrong size, or statistics of the wrong size.
absl::StatusOr<VirtualTokens> VirtualTokensOf(const KvShape& shape, std::span<const float> queries,
                                              uint32_t window, const ChunkStats& rest,
                                              EstimateKind kind);

// What an attention kernel given `loaded` and `virtual_tokens` computes for `queries` (any w
// queries, not only the window's): float32 [w, q_heads, head_dim]. With the virtual tokens of
// VirtualTokensOf(kind) for the same window, it equals EstimatedAttention(kind) up to rounding.
// Errors: InvalidArgument for a bad shape or arrays of the wrong size.
absl::StatusOr<std::vector<float>> AttentionWithVirtualTokens(const KvShape& shape,
                                                              std::span<const float> queries,
                                                              uint32_t window,
                                                              const GatheredKv& loaded,
                                                              const VirtualTokens& virtual_tokens);

// The checks AttentionWithVirtualTokens makes of its input, for other kernels of it (the CUDA
// one, kernels/cuda_kernels.h): OK, or InvalidArgument naming the array and the sizes.
absl::Status CheckVirtualTokenInput(const KvShape& shape, std::span<const float> queries,
                                    uint32_t window, const GatheredKv& loaded,
                                    const VirtualTokens& virtual_tokens);

}  // namespace ckv::kernels

#endif  // CKV_KERNELS_ESTIMATE_H_
