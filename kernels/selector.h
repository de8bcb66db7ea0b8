// kernels/selector.h: turning one layer's suffix queries into the set of chunks to load.
//
// Every selector scores the n chunks of a prefix and keeps the top ones under the budget, always
// keeping the first `sink_chunks` and the last `recent_chunks`:
//
//   budget   k = clamp(round(budget_fraction * n), min(n, sink + recent), n) chunks, exactly
//            (round half up).
//   period-exact  (ContiguousKV) exact attention of the queries over every token of the layer,
//            summed per chunk. The caller scores the head layer of each period (PeriodHead) and
//            serves the period's p layers with that selection; it needs the head layer's keys.
//   oracle   the same scoring at every layer: the evaluation reference.
//   quest    Quest's bound sum_d max(q_d M_d, q_d m_d) from each chunk's quantised channel-wise
//            min m and max M (kernels/summary.h), summed over the window's queries and the q
//            heads of each GQA group, and over groups. The sum over queries collapses exactly:
//            sum_q max(q_d M_d, q_d m_d) = (sum_q q+_d) M_d + (sum_q q-_d) m_d with q+ = max(q, 0)
//            and q- = min(q, 0), so scoring costs two dot products per (chunk, kv head).
//            Reads no KV.
//   mean-key per q head, the softmax over chunks of (mean query of the window) . (chunk's mean
//            key) / sqrt(D), summed over q heads (ShadowKV-style landmarks). Averaging the
//            window's queries before the softmax makes a layer cost one dot product per
//            (chunk, q head). Reads no KV.
//   impress  (baseline) exact attention over all keys for 3 probe q heads (spread over the kv
//            groups: heads g * q_heads / 3), token-level top-k at budget_fraction of the tokens;
//            each selected token's 64-token block (4 chunks at c = 16) is loaded whole, so it
//            loads more chunks than the budget: that is its read amplification.
//   h2o      (baseline) exact attention over all keys and heads, token-level top-k at
//            budget_fraction of the tokens; the chunks holding a selected token are loaded.
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

enum class SelectorKind : uint8_t { kPeriodExact, kQuest, kMeanKey, kOracle, kImpress, kH2o };

// "period-exact", "quest", "mean-key", "oracle", "impress", "h2o".
std::string_view SelectorName(SelectorKind kind);
absl::StatusOr<SelectorKind> ParseSelectorKind(std::string_view name);
// Every kind, in the order above.
std::vector<SelectorKind> AllSelectorKinds();
// What a selector reads: the chunks' summaries, or the layer's keys.
bool ReadsSummaries(SelectorKind kind);
bool ReadsKeys(SelectorKind kind);

struct SelectOptions {
  // Fraction of the chunks (token-level baselines: of the tokens) to select, in (0, 1].
  double budget_fraction = 0.1;
  uint32_t sink_chunks = 1;
  uint32_t recent_chunks = 1;
  // impress: tokens per block loaded for a selected token. Multiple of chunk_tokens.
  uint32_t impress_block_tokens = 64;
  // impress: probe q heads.
  uint32_t impress_probe_heads = 3;
};

// The chunks k selectors keep out of n (see the header comment).
size_t BudgetChunks(size_t n, const SelectOptions& options);

// One layer's inputs. Summary selectors read `minmax` / `mean` (one pointer per chunk to its
// summary part) and `layer`; key selectors read `records`.
struct SelectorInput {
  KvShape shape;
  uint32_t layers = 0;  // of the model (summary parts hold every layer)
  uint32_t layer = 0;
  std::span<const float> queries;  // [window, q_heads, head_dim]
  uint32_t window = 0;
  size_t chunks = 0;
  std::span<const std::byte* const> minmax;
  std::span<const std::byte* const> mean;
  ChunkRecords records;
};

struct Selection {
  std::vector<uint32_t> chunks;   // sorted, unique
  std::vector<float> scores;      // per chunk of the prefix (token selectors: summed per chunk)
  std::vector<uint32_t> tokens;   // token selectors: the selected tokens, sorted
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

// The head layer of `layer`'s period of `period_layers` layers.
inline uint32_t PeriodHead(uint32_t layer, uint32_t period_layers) {
  return layer - layer % period_layers;
}

}  // namespace ckv::kernels

#endif  // CKV_KERNELS_SELECTOR_H_
