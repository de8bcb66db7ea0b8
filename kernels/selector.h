// SPDX-License-Identifier: Apache-2.0
// kernels/selector.h: turning one layer's suffix queries into the set of chunks to load.
//
// Every selector scores the n chunks of a prefix and keeps the top ones under the budget, always
// keeping the first `sink_chunks` and the last `recent_chunks`:
//
//   budget   k = clamp(round(budget_fraction * n), min(n, sink + recent), n) chunks, exactly
//            (round half up).
//   period-exact  (ContiguousKV) exact attention of the queries over every token of the layer:
//            per (query, q head) the softmax over all tokens, averaged over queries and q heads,
//            summed per chunk (TokenAttention, PerChunk). The caller scores the head layer of
//            each period (PeriodHead) and serves the period's p layers with that selection; it
//            needs the head layer's keys.
//   oracle   the same scoring at every layer: the evaluation reference.
//   quest    Quest's bound on a query's logits, sum_d max(q_d M_d, q_d m_d) / sqrt(D), from each
//            chunk's quantised channel-wise min m and max M (kernels/summary.h). Per q head, the
//            window's mean bound; its softmax over the chunks; the mean of those over the q
//            heads. The mean over queries collapses exactly: sum_q max(q_d M_d, q_d m_d) =
//            (sum_q q+_d) M_d + (sum_q q-_d) m_d with q+ = max(q, 0) and q- = min(q, 0), so a
//            layer costs one dot product of 2D per (chunk, q head). Reads no KV.
//            Why a softmax per q head and not the raw bounds summed over heads: the attention
//            mass to be caught is a mean of per-head distributions, each summing to 1, and raw
//            bounds let the heads with the largest logits decide alone (the regression test
//            AHeadWithLargeLogitsDoesNotDecideAlone builds such a case). On the planted data of
//            tools/synthetic_attention.h (qwen2.5-7b, 8K tokens, seed 1, 10% budget) the raw sum
//            reached 0.960x of the oracle's recall, the per-head softmax 0.995x
//            (bench/selector_fidelity; docs/results.md).
//   mean-key per q head, the softmax over chunks of (mean query of the window) . (chunk's mean
//            key) / sqrt(D) (ShadowKV-style landmarks); the mean of those over the q heads.
//            Averaging the window's queries before the softmax makes a layer cost one dot
//            product per (chunk, q head), where a softmax per query (as period-exact takes)
//            would cost w of them. Reads no KV.
//   Both are distributions over the chunks (they sum to 1), as every selector's scores are.
//   impress  (baseline) exact attention over all keys for its probe q heads: the ones named in
//            impress_probe_q_heads, or by default impress_probe_heads heads spread one per GQA
//            group, i * q_heads / 3 for i = 0, 1, 2 (qwen2.5-7b: 0, 9, 18, in kv groups 0, 1, 2).
//            The benchmark's default names 3 q heads of ONE group instead, as IMPRESS reads only
//            the probe heads' keys and heads of one group share one kv head under GQA. The mass
//            is the mean of the probes' per-head distributions; token-level top-k at
//            budget_fraction of the tokens; each selected token's 64-token block (4 chunks at
//            c = 16) is loaded whole, so it loads more chunks than the budget: that is its read
//            amplification (chunks.size() against BudgetChunks). Selection::probe_jaccard is the
//            mean pairwise Jaccard similarity of the probes' own top-k token sets: IMPRESS's gate
//            (falling back to every head when the probes disagree) is the caller's, which must
//            read the other heads' keys to do it.
//   h2o      (baseline) exact attention over all keys and heads, token-level top-k at
//            budget_fraction of the tokens; the chunks holding a selected token are loaded.
//   Both token-level baselines select k_tokens = clamp(round(budget_fraction * n * c), 1, n * c)
//   tokens (round half up) and also load the sink and recent chunks.
//
// Ties in a top-k go to the lower index. Output chunks are sorted and unique.
//
// Thread-safety: pure functions.
#ifndef CKV_KERNELS_SELECTOR_H_
#define CKV_KERNELS_SELECTOR_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/attention.h"
#include "kernels/summary.h"

namespace ckv::kernels {

enum class SelectorKind : uint8_t {
  kPeriodExact,
  kQuest,
  kMeanKey,
  kOracle,
  kImpress,
  kH2o,
  // Mean-key with each chunk's farthest key kept exactly beside its mean (the outlier part,
  // summary.h): a chunk's log-mean-exp estimated from 1 outlier and c - 1 tokens at the rest's
  // mean. Chunks without the part score as mean-key (docs/results.md, "What the summaries miss").
  kOutlierKey,
};

// "period-exact", "quest", "mean-key", "oracle", "impress", "h2o", "outlier-key".
std::string_view SelectorName(SelectorKind kind);
absl::StatusOr<SelectorKind> ParseSelectorKind(std::string_view name);
// Every kind, in the order above.
std::vector<SelectorKind> AllSelectorKinds();
// What a selector reads: the chunks' summaries, or the layer's keys.
bool ReadsSummaries(SelectorKind kind);
bool ReadsKeys(SelectorKind kind);

struct SelectOptions;
struct SelectorInput;
// The FLOPs of the scoring Select does for `input` (the q . k or q . summary products; the
// softmax and top-k are left out): what a GPU would spend on it. The benchmark harness charges
// it to its modelled GPU.
double ScoringFlops(SelectorKind kind, const SelectorInput& input, const SelectOptions& options);

struct SelectOptions {
  // Fraction of the chunks (token-level baselines: of the tokens) to select, in (0, 1].
  // Default: 0.1.
  double budget_fraction = 0.1;
  // Our selectors: when > 0, select by quality instead of a fixed share: the fewest chunks whose
  // scores (each chunk's estimated share of the layer's attention) sum to at least target_mass,
  // the sink and recent chunks counted first, then by score; at most BudgetChunks (so that
  // budget_fraction is the ceiling) and at least sink + recent. In [0, 1]. Default: 0 (off).
  double target_mass = 0;
  // The first and the last chunks of the prefix, always selected. Default: 1 and 1.
  uint32_t sink_chunks = 1;
  uint32_t recent_chunks = 1;
  // impress: tokens per block loaded for a selected token; a multiple of chunk_tokens.
  // Default: 64 (IMPRESS's block).
  uint32_t impress_block_tokens = 64;
  // impress: probe q heads, 1..q_heads. Default: 3.
  uint32_t impress_probe_heads = 3;
  // impress: the probe q heads by index (each < q_heads, no repeats); when not empty it replaces
  // impress_probe_heads' spread choice. Default: empty.
  std::vector<uint32_t> impress_probe_q_heads;
  // impress: the q heads whose mean attention ranks the tokens (each < q_heads, no repeats);
  // empty: the probe heads. IMPRESS loads its probes' kv heads' keys, and every q head those
  // keys serve can score with them: 7 per kv head on qwen2.5-7b. The gate (probe_jaccard)
  // stays the probes'. Default: empty.
  std::vector<uint32_t> impress_score_q_heads;
};

// The chunks k selectors keep out of n (see the header comment), or at most keep with
// target_mass.
size_t BudgetChunks(size_t n, const SelectOptions& options);

// How many chunks `options` selects from `scores` (one per chunk): BudgetChunks, or with
// target_mass the fewest whose scores reach it (see SelectOptions::target_mass).
size_t SelectedCount(std::span<const float> scores, const SelectOptions& options);

// One layer's inputs. Summary selectors (ReadsSummaries) read `minmax` or `mean`, and `layers`
// and `layer`; key selectors read `records`. Every pointer must stay valid for the call.
struct SelectorInput {
  KvShape shape;
  uint32_t layers = 0;             // of the model: a summary part holds every layer's entries
  uint32_t layer = 0;              // the layer scored, < layers
  std::span<const float> queries;  // [window, q_heads, head_dim] float32
  uint32_t window = 0;             // w >= 1
  size_t chunks = 0;               // n >= 1
  // quest: n pointers, each to a chunk's min/max part (SummaryFormat::MinMaxBytes()).
  std::span<const std::byte* const> minmax;
  // mean-key and outlier-key: n pointers, each to a chunk's mean part (SummaryFormat::MeanBytes()).
  std::span<const std::byte* const> mean;
  // outlier-key: n pointers, each to a chunk's outlier part (SummaryFormat::OutlierBytes()), or
  // null for a chunk without one (written before it existed, or from the shared tier).
  std::span<const std::byte* const> outlier;
  // period-exact, oracle, impress, h2o: n pointers, each to a chunk's record at this layer.
  ChunkRecords records;
};

struct Selection {
  // The chunks to load: sorted, unique. Our selectors: exactly SelectedCount(scores) of them.
  std::vector<uint32_t> chunks;
  // Every chunk's score: n floats summing to 1, the selector's estimate of the share of the
  // layer's attention that each chunk holds (impress: of its probe heads' attention).
  std::vector<float> scores;
  // impress and h2o: the selected tokens (indices into the prefix), sorted; empty otherwise.
  std::vector<uint32_t> tokens;
  // impress and h2o: every token's attention mass (the scored heads' mean), n * c floats.
  std::vector<float> token_mass;
  // impress with 2 or more probes: the mean pairwise Jaccard similarity of the probe heads' own
  // top-k token sets (k as for `tokens`); 1 otherwise.
  double probe_jaccard = 1;
};

// Errors: InvalidArgument for inputs of the wrong size or a budget outside (0, 1].
absl::StatusOr<Selection> Select(SelectorKind kind, const SelectorInput& input,
                                 const SelectOptions& options);

// Chunk scores alone (the part of Select before the top-k), per chunk of the prefix.
absl::StatusOr<std::vector<float>> ScoreChunks(SelectorKind kind, const SelectorInput& input,
                                               const SelectOptions& options);

// The `k` highest-scoring of scores.size() chunks, the first `sink` and last `recent` always
// among them, ties to the lower index; sorted. REQUIRES: k >= min(n, sink + recent).
std::vector<uint32_t> TopKChunks(std::span<const float> scores, size_t k, uint32_t sink,
                                 uint32_t recent);

// The query side of quest and mean-key, shared by the CPU and the device paths
// (kernels/cuda_kernels.h) so that both score the same thing. REQUIRES: `input` valid (Select's
// checks passed).
//
// quest: per q head g, the row [sum over the window of min(q, 0), sum of max(q, 0)] (2 x D
// floats; [q_heads, 2D] in all). Its dot product with a chunk's [min, max] entry is the window's
// summed bound.
std::vector<float> QuestQueryRows(const SelectorInput& input);
// mean-key: per q head, the mean query of the window ([q_heads, D]).
std::vector<float> MeanQueryRows(const SelectorInput& input);

// The head layer of `layer`'s period of `period_layers` layers: period-exact scores that layer
// and every layer of the period uses its selection. REQUIRES: period_layers > 0.
inline uint32_t PeriodHead(uint32_t layer, uint32_t period_layers) {
  return layer - layer % period_layers;
}

}  // namespace ckv::kernels

#endif  // CKV_KERNELS_SELECTOR_H_
