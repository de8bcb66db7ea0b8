// SPDX-License-Identifier: Apache-2.0
// kernels/selector.cc: the selectors (see selector.h).
#include "kernels/selector.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/assert.h"
#include "kernels/matmul.h"
#include "kernels/simd.h"

namespace ckv::kernels {
namespace {

constexpr SelectorKind kKinds[] = {SelectorKind::kPeriodExact, SelectorKind::kQuest,
                                   SelectorKind::kMeanKey,     SelectorKind::kOracle,
                                   SelectorKind::kImpress,     SelectorKind::kH2o,
                                   SelectorKind::kOutlierKey};

absl::Status CheckInput(SelectorKind kind, const SelectorInput& in, const SelectOptions& o) {
  if (auto st = in.shape.Validate(); !st.ok()) return st;
  if (!(o.budget_fraction > 0 && o.budget_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget fraction ", o.budget_fraction, " is not in (0, 1]"));
  }
  if (!(o.target_mass >= 0 && o.target_mass <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("target mass ", o.target_mass, " is not in [0, 1]"));
  }
  const size_t want = size_t{in.window} * in.shape.q_heads * in.shape.head_dim;
  if (in.window == 0 || in.queries.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("queries of ", in.queries.size(), " floats; ",
                                                   in.window, " x ", in.shape.q_heads, " x ",
                                                   in.shape.head_dim, " need ", want));
  }
  if (in.chunks == 0) return absl::InvalidArgumentError("a prefix of 0 chunks");
  if (ReadsSummaries(kind)) {
    const auto& parts = kind == SelectorKind::kQuest ? in.minmax : in.mean;
    if (parts.size() != in.chunks || in.layer >= in.layers ||
        std::find(parts.begin(), parts.end(), nullptr) != parts.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(SelectorName(kind)), ": ", parts.size(), " summaries for ",
                       in.chunks, " chunks (none null), layer ", in.layer, " of ", in.layers));
    }
    if (kind == SelectorKind::kOutlierKey && in.outlier.size() != in.chunks) {
      return absl::InvalidArgumentError(absl::StrCat("outlier-key: ", in.outlier.size(),
                                                     " outlier parts for ", in.chunks, " chunks"));
    }
  } else if (in.records.size() != in.chunks) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(SelectorName(kind)), ": ",
                                                   in.records.size(), " records for ", in.chunks,
                                                   " chunks"));
  }
  if (kind == SelectorKind::kImpress &&
      (o.impress_block_tokens == 0 || o.impress_block_tokens % in.shape.chunk_tokens != 0 ||
       o.impress_probe_heads == 0 || o.impress_probe_heads > in.shape.q_heads)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "impress: blocks of ", o.impress_block_tokens, " tokens (chunks of ", in.shape.chunk_tokens,
        "), ", o.impress_probe_heads, " probe heads of ", in.shape.q_heads));
  }
  if (kind == SelectorKind::kImpress) {
    for (const auto& [what, list] :
         {std::pair<const char*, const std::vector<uint32_t>&>{"probe", o.impress_probe_q_heads},
          std::pair<const char*, const std::vector<uint32_t>&>{"scoring",
                                                               o.impress_score_q_heads}}) {
      std::vector<bool> seen(in.shape.q_heads, false);
      for (uint32_t h : list) {
        if (h >= in.shape.q_heads || seen[h]) {
          return absl::InvalidArgumentError(absl::StrCat("impress: ", what, " q head ", h, " of ",
                                                         in.shape.q_heads, " (or named twice)"));
        }
        seen[h] = true;
      }
    }
  }
  return absl::OkStatus();
}

// Each chunk's summary sits in its own part (a page or more from the previous one), so reading
// a layer's entries starts with a cache miss per chunk: the scoring loop fetches the entries
// kPrefetchChunks chunks ahead. (Quest at 2048 chunks: 0.93 ms with it, 1.12 ms without, in
// kernels_microbench on a shared 2-core machine.)
constexpr size_t kPrefetchChunks = 8;
// Chunks whose decoded entries are scored at a time: one kv head's block, 256 x 256 floats
// (quest at D = 128), is 256 KiB, which the blocked product then reads from L2.
constexpr size_t kSummaryBlock = 256;

void Prefetch(const std::byte* p, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i);
}

// The logits shared by quest, mean-key and outlier-key. `rows` holds one vector of `width` floats
// per q head ([q_heads, width]); decode(part, h, out) writes the entry of kv head h at in.layer of
// a chunk's summary part (entries of `entry_bytes`) as `width` floats. Returns [q_heads, n]:
// scale * rows[g] . decoded(j, kv head of g).
template <typename Decode>
std::vector<float> SummaryLogits(const SelectorInput& in, std::span<const std::byte* const> parts,
                                 size_t entry_bytes, std::span<const float> rows, size_t width,
                                 float scale, Decode decode) {
  const KvShape& s = in.shape;
  const size_t n = in.chunks, group_rows = size_t{s.group()} * width;
  const size_t layer_offset = size_t{in.layer} * s.kv_heads * entry_bytes;
  const size_t layer_bytes = s.kv_heads * entry_bytes;
  // Logits [q head, chunk], a block of chunks at a time: each entry is decoded once and scored
  // against its group's rows by the blocked product.
  std::vector<float> logits(s.q_heads * n), block(s.kv_heads * kSummaryBlock * width);
  for (size_t j0 = 0; j0 < n; j0 += kSummaryBlock) {
    const size_t jn = std::min(kSummaryBlock, n - j0);
    for (size_t j = 0; j < jn; ++j) {
      if (j0 + j + kPrefetchChunks < n) {
        Prefetch(parts[j0 + j + kPrefetchChunks] + layer_offset, layer_bytes);
      }
      for (uint32_t h = 0; h < s.kv_heads; ++h) {
        decode(parts[j0 + j], h, block.data() + (h * kSummaryBlock + j) * width);
      }
    }
    for (uint32_t h = 0; h < s.kv_heads; ++h) {
      ScoresQK(rows.data() + h * group_rows, width, s.group(),
               block.data() + h * kSummaryBlock * width, width, jn, width, scale,
               logits.data() + h * s.group() * n + j0, n);
    }
  }
  return logits;
}

// The mean over q heads g of softmax over chunks j of logits[g, j]: a distribution over the
// chunks, as the exact attention mass is, in which every q head weighs the same.
std::vector<float> MeanOfSoftmaxes(std::vector<float> logits, uint32_t q_heads, size_t n) {
  std::vector<float> scores(n, 0.0f);
  for (uint32_t g = 0; g < q_heads; ++g) {
    float* row = logits.data() + g * n;
    simd::Axpy(1.0f / (simd::SoftmaxNumerators(row, n) * static_cast<float>(q_heads)), row,
               scores.data(), n);
  }
  return scores;
}

template <typename Decode>
std::vector<float> SummaryScores(const SelectorInput& in, std::span<const std::byte* const> parts,
                                 size_t entry_bytes, std::span<const float> rows, size_t width,
                                 float scale, Decode decode) {
  return MeanOfSoftmaxes(SummaryLogits(in, parts, entry_bytes, rows, width, scale, decode),
                         in.shape.q_heads, in.chunks);
}

std::vector<float> QuestScores(const SelectorInput& in) {
  const uint32_t d_n = in.shape.head_dim;
  const SummaryFormat f{in.layers, in.shape.kv_heads, d_n};
  // The rows hold the window's sums: the scale makes the logits the mean bound over the window.
  const float scale = 1.0f / (static_cast<float>(in.window) * std::sqrt(static_cast<float>(d_n)));
  return SummaryScores(in, in.minmax, f.MinMaxEntryBytes(), QuestQueryRows(in), 2 * d_n, scale,
                       [&](const std::byte* part, uint32_t h, float* out) {
                         const MinMaxEntry e = MinMaxAt(f, part, in.layer, h);
                         simd::DecodeI8(e.min, e.scale_min, d_n, out);
                         simd::DecodeI8(e.max, e.scale_max, d_n, out + d_n);
                       });
}

std::vector<float> MeanKeyScores(const SelectorInput& in) {
  const uint32_t d_n = in.shape.head_dim;
  const SummaryFormat f{in.layers, in.shape.kv_heads, d_n};
  return SummaryScores(in, in.mean, f.MeanEntryBytes(), MeanQueryRows(in), d_n,
                       1.0f / std::sqrt(static_cast<float>(d_n)),
                       [&](const std::byte* part, uint32_t h, float* out) {
                         const MeanEntry e = MeanAt(f, part, in.layer, h);
                         simd::DecodeI8(e.mean, e.scale, d_n, out);
                       });
}

// outlier-key: per chunk and q head, lm = q . mean / sqrt(d) (the mean query of the window, as
// mean-key) and lo = q . outlier / sqrt(d); the other c - 1 tokens' mean key is (c mean -
// outlier) / (c - 1), so their logit is lr = (c lm - lo) / (c - 1), and the chunk's log-mean-exp
// is estimated as log(((c - 1) exp(lr) + exp(lo)) / c). A chunk without an outlier part scores
// its mean as its outlier: lo = lr = lm, mean-key's logit.
std::vector<float> OutlierKeyScores(const SelectorInput& in) {
  const uint32_t d_n = in.shape.head_dim, c = in.shape.chunk_tokens;
  const SummaryFormat f{in.layers, in.shape.kv_heads, d_n};
  const std::vector<float> qbar = MeanQueryRows(in);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_n));
  auto decode = [&](const std::byte* part, uint32_t h, float* out) {
    // An outlier entry has a mean entry's layout (fp16 scale | int8[d]) at the same index.
    const MeanEntry e = MeanAt(f, part, in.layer, h);
    simd::DecodeI8(e.mean, e.scale, d_n, out);
  };
  std::vector<float> lm = SummaryLogits(in, in.mean, f.MeanEntryBytes(), qbar, d_n, scale, decode);
  if (c < 2) return MeanOfSoftmaxes(std::move(lm), in.shape.q_heads, in.chunks);
  std::vector<const std::byte*> outlier(in.outlier.begin(), in.outlier.end());
  for (size_t j = 0; j < in.chunks; ++j) {
    if (outlier[j] == nullptr) outlier[j] = in.mean[j];
  }
  const std::vector<float> lo =
      SummaryLogits(in, outlier, f.OutlierEntryBytes(), qbar, d_n, scale, decode);
  const float cf = static_cast<float>(c), log_rest = std::log(cf - 1), log_c = std::log(cf);
  for (size_t i = 0; i < lm.size(); ++i) {
    const float lr = (cf * lm[i] - lo[i]) / (cf - 1);
    const float a = log_rest + lr, b = lo[i];
    const float top = std::max(a, b);
    lm[i] = top + std::log(std::exp(a - top) + std::exp(b - top)) - log_c;
  }
  return MeanOfSoftmaxes(std::move(lm), in.shape.q_heads, in.chunks);
}

std::vector<uint32_t> ImpressProbeHeads(const KvShape& s, const SelectOptions& o) {
  if (!o.impress_probe_q_heads.empty()) return o.impress_probe_q_heads;
  std::vector<uint32_t> heads;
  for (uint32_t i = 0; i < o.impress_probe_heads; ++i) {
    heads.push_back(i * s.q_heads / o.impress_probe_heads);
  }
  return heads;
}

// The q heads whose mean attention ranks impress's tokens: impress_score_q_heads when named,
// else the probes themselves.
std::vector<uint32_t> ImpressRankHeads(const KvShape& s, const SelectOptions& o) {
  return o.impress_score_q_heads.empty() ? ImpressProbeHeads(s, o) : o.impress_score_q_heads;
}

// The `k` highest of `values` (ties to the lower index), sorted ascending.
std::vector<uint32_t> TopK(std::span<const float> values, size_t k) {
  std::vector<uint32_t> idx(values.size());
  std::iota(idx.begin(), idx.end(), 0u);
  k = std::min(k, idx.size());
  auto better = [&](uint32_t a, uint32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  };
  std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(), better);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  CKV_DCHECK(idx.size() == k && (k == 0 || idx.back() < values.size()));
  return idx;
}

}  // namespace

std::vector<float> QuestQueryRows(const SelectorInput& in) {
  const KvShape& s = in.shape;
  const uint32_t d_n = s.head_dim;
  // Branch-free (and so vectorised by the compiler): a query's signs are a coin toss for a
  // branch predictor.
  std::vector<float> rows(size_t{s.q_heads} * 2 * d_n, 0.0f);
  for (uint32_t i = 0; i < in.window; ++i) {
    for (uint32_t g = 0; g < s.q_heads; ++g) {
      const float* q = in.queries.data() + (size_t{i} * s.q_heads + g) * d_n;
      float* neg = rows.data() + size_t{g} * 2 * d_n;
      float* pos = neg + d_n;
      for (uint32_t d = 0; d < d_n; ++d) {
        neg[d] += std::min(q[d], 0.0f);
        pos[d] += std::max(q[d], 0.0f);
      }
    }
  }
  return rows;
}

std::vector<float> MeanQueryRows(const SelectorInput& in) {
  const size_t ldq = size_t{in.shape.q_heads} * in.shape.head_dim;
  std::vector<float> qbar(ldq, 0.0f);
  for (uint32_t i = 0; i < in.window; ++i) {
    simd::Axpy(1.0f / static_cast<float>(in.window), in.queries.data() + i * ldq, qbar.data(), ldq);
  }
  return qbar;
}

std::string_view SelectorName(SelectorKind kind) {
  switch (kind) {
    case SelectorKind::kPeriodExact:
      return "period-exact";
    case SelectorKind::kQuest:
      return "quest";
    case SelectorKind::kMeanKey:
      return "mean-key";
    case SelectorKind::kOracle:
      return "oracle";
    case SelectorKind::kImpress:
      return "impress";
    case SelectorKind::kH2o:
      return "h2o";
    case SelectorKind::kOutlierKey:
      return "outlier-key";
  }
  return "unknown";
}

absl::StatusOr<SelectorKind> ParseSelectorKind(std::string_view name) {
  for (SelectorKind k : kKinds) {
    if (SelectorName(k) == name) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown selector '", std::string(name),
                   "' (period-exact, quest, mean-key, oracle, impress, h2o, outlier-key)"));
}

std::vector<SelectorKind> AllSelectorKinds() { return {std::begin(kKinds), std::end(kKinds)}; }

bool ReadsSummaries(SelectorKind kind) {
  return kind == SelectorKind::kQuest || kind == SelectorKind::kMeanKey ||
         kind == SelectorKind::kOutlierKey;
}
bool ReadsKeys(SelectorKind kind) { return !ReadsSummaries(kind); }

double ScoringFlops(SelectorKind kind, const SelectorInput& in, const SelectOptions& o) {
  const double n = static_cast<double>(in.chunks);
  const double d = in.shape.head_dim;
  // impress: the ranking heads, or the probes when they are more (their per-head attention is
  // computed for the gate).
  const double heads = kind != SelectorKind::kImpress
                           ? in.shape.q_heads
                           : static_cast<double>(std::max(ImpressRankHeads(in.shape, o).size(),
                                                          ImpressProbeHeads(in.shape, o).size()));
  switch (kind) {
    case SelectorKind::kQuest:
      return 2 * n * heads * 2 * d;
    case SelectorKind::kMeanKey:
      return 2 * n * heads * d;
    case SelectorKind::kOutlierKey:
      return 2 * n * heads * 2 * d;
    default:
      return 2.0 * in.window * n * in.shape.chunk_tokens * heads * d;
  }
}

size_t BudgetChunks(size_t n, const SelectOptions& o) {
  const size_t floor = std::min(n, size_t{o.sink_chunks} + o.recent_chunks);
  const auto k = static_cast<size_t>(std::floor(o.budget_fraction * static_cast<double>(n) + 0.5));
  return std::clamp(k, floor, n);
}

size_t SelectedCount(std::span<const float> scores, const SelectOptions& o) {
  const size_t n = scores.size(), cap = BudgetChunks(n, o);
  if (!(o.target_mass > 0)) return cap;
  const size_t sink = std::min<size_t>(o.sink_chunks, n);
  const size_t recent = std::min<size_t>(o.recent_chunks, n - sink);
  double mass = 0;
  std::vector<float> rest;
  rest.reserve(n - sink - recent);
  for (size_t j = 0; j < n; ++j) {
    const float x = std::isnan(scores[j]) ? 0.0f : scores[j];
    if (j < sink || j >= n - recent) {
      mass += x;
    } else {
      rest.push_back(x);
    }
  }
  std::sort(rest.begin(), rest.end(), std::greater<>());
  size_t k = sink + recent;
  for (size_t i = 0; i < rest.size() && mass < o.target_mass && k < cap; ++i, ++k) mass += rest[i];
  return std::clamp(k, std::min(n, size_t{o.sink_chunks} + o.recent_chunks), cap);
}

std::vector<uint32_t> TopKChunks(std::span<const float> scores, size_t k, uint32_t sink,
                                 uint32_t recent) {
  const size_t n = scores.size();
  std::vector<float> ranked(scores.begin(), scores.end());
  // Forced chunks rank above everything; their own order does not matter.
  const float top = std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < std::min<size_t>(sink, n); ++j) ranked[j] = top;
  for (size_t j = n - std::min<size_t>(recent, n); j < n; ++j) ranked[j] = top;
  for (float& x : ranked) {
    if (std::isnan(x)) x = -top;  // a NaN score never wins a place
  }
  return TopK(ranked, k);
}

absl::StatusOr<std::vector<float>> ScoreChunks(SelectorKind kind, const SelectorInput& in,
                                               const SelectOptions& o) {
  if (auto st = CheckInput(kind, in, o); !st.ok()) return st;
  switch (kind) {
    case SelectorKind::kQuest:
      return QuestScores(in);
    case SelectorKind::kMeanKey:
      return MeanKeyScores(in);
    case SelectorKind::kOutlierKey:
      return OutlierKeyScores(in);
    case SelectorKind::kImpress: {
      const auto heads = ImpressRankHeads(in.shape, o);
      auto mass = TokenAttention(in.shape, in.queries, in.window, in.records, heads);
      if (!mass.ok()) return mass.status();
      return PerChunk(*mass, in.shape.chunk_tokens);
    }
    case SelectorKind::kPeriodExact:
    case SelectorKind::kOracle:
    case SelectorKind::kH2o: {
      auto mass = TokenAttention(in.shape, in.queries, in.window, in.records);
      if (!mass.ok()) return mass.status();
      return PerChunk(*mass, in.shape.chunk_tokens);
    }
  }
  return absl::InvalidArgumentError("unknown selector");
}

absl::StatusOr<Selection> Select(SelectorKind kind, const SelectorInput& in,
                                 const SelectOptions& o) {
  if (auto st = CheckInput(kind, in, o); !st.ok()) return st;
  Selection sel;
  const size_t n = in.chunks;
  if (kind != SelectorKind::kImpress && kind != SelectorKind::kH2o) {
    auto scores = ScoreChunks(kind, in, o);
    if (!scores.ok()) return scores.status();
    sel.scores = std::move(*scores);
    const size_t k = SelectedCount(sel.scores, o);
    sel.chunks = TopKChunks(sel.scores, k, o.sink_chunks, o.recent_chunks);
    // One score per chunk; the budget, and every sink and recent chunk, fit in n.
    CKV_DCHECK(sel.scores.size() == n && sel.chunks.size() == k);
    return sel;
  }
  // Token-level baselines.
  const uint32_t c = in.shape.chunk_tokens;
  std::vector<uint32_t> heads;
  if (kind == SelectorKind::kImpress) heads = ImpressProbeHeads(in.shape, o);
  const size_t tokens = n * c;
  const auto k_tokens = std::clamp<size_t>(
      static_cast<size_t>(std::floor(o.budget_fraction * static_cast<double>(tokens) + 0.5)), 1,
      tokens);
  // impress ranks by its scoring heads (the probes unless others are named); h2o by every head.
  const bool ranked_by_probes = kind == SelectorKind::kImpress && o.impress_score_q_heads.empty();
  std::optional<absl::StatusOr<std::vector<float>>> probe_mass;
  if (kind == SelectorKind::kImpress && heads.size() >= 2 && heads.size() < in.shape.q_heads) {
    // Each probe alone (the mass is the mean of the per-head distributions, as TokenAttention
    // over the probes computes it), and how far their top-k sets agree.
    std::vector<float> sum(ranked_by_probes ? tokens : 0, 0.0f);
    std::vector<std::vector<uint32_t>> top;
    for (uint32_t h : heads) {
      auto one = TokenAttention(in.shape, in.queries, in.window, in.records,
                                std::span<const uint32_t>(&h, 1));
      if (!one.ok()) return one.status();
      if (ranked_by_probes) {
        simd::Axpy(1.0f / static_cast<float>(heads.size()), one->data(), sum.data(), tokens);
      }
      top.push_back(TopK(*one, k_tokens));
    }
    double jaccard = 0;
    size_t pairs = 0;
    for (size_t a = 0; a < top.size(); ++a) {
      for (size_t b = a + 1; b < top.size(); ++b, ++pairs) {
        std::vector<uint32_t> both;
        std::set_intersection(top[a].begin(), top[a].end(), top[b].begin(), top[b].end(),
                              std::back_inserter(both));
        jaccard += static_cast<double>(both.size()) /
                   static_cast<double>(top[a].size() + top[b].size() - both.size());
      }
    }
    sel.probe_jaccard = jaccard / static_cast<double>(pairs);
    if (ranked_by_probes) probe_mass = std::move(sum);
  }
  absl::StatusOr<std::vector<float>> mass =
      probe_mass
          ? std::move(*probe_mass)
          : TokenAttention(in.shape, in.queries, in.window, in.records,
                           kind == SelectorKind::kImpress ? ImpressRankHeads(in.shape, o) : heads);
  if (!mass.ok()) return mass.status();
  sel.tokens = TopK(*mass, k_tokens);
  sel.scores = PerChunk(*mass, c);
  const uint32_t chunks_per_unit = kind == SelectorKind::kImpress ? o.impress_block_tokens / c : 1;
  std::vector<bool> take(n, false);
  for (size_t j = 0; j < std::min<size_t>(o.sink_chunks, n); ++j) take[j] = true;
  for (size_t j = n - std::min<size_t>(o.recent_chunks, n); j < n; ++j) take[j] = true;
  for (uint32_t t : sel.tokens) {
    const size_t first = t / c / chunks_per_unit * chunks_per_unit;
    for (size_t j = first; j < std::min(n, first + chunks_per_unit); ++j) take[j] = true;
  }
  for (size_t j = 0; j < n; ++j) {
    if (take[j]) sel.chunks.push_back(static_cast<uint32_t>(j));
  }
  CKV_DCHECK(mass->size() == tokens && sel.tokens.size() == k_tokens && sel.scores.size() == n &&
             sel.chunks.size() <= n);
  sel.token_mass = std::move(*mass);
  return sel;
}

}  // namespace ckv::kernels
