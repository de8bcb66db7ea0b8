// kernels/selector.cc: the selectors (see selector.h).
#include "kernels/selector.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_path.h"
#include "kernels/simd.h"

namespace ckv::kernels {
namespace {

constexpr SelectorKind kKinds[] = {SelectorKind::kPeriodExact, SelectorKind::kQuest,
                                   SelectorKind::kMeanKey,     SelectorKind::kOracle,
                                   SelectorKind::kImpress,     SelectorKind::kH2o};

float DotI8(const float* a, const int8_t* q, size_t n) {
  return UseAvx2() ? simd::DotI8Avx2(a, q, n) : simd::DotI8Scalar(a, q, n);
}

absl::Status CheckInput(SelectorKind kind, const SelectorInput& in, const SelectOptions& o) {
  if (auto st = in.shape.Validate(); !st.ok()) return st;
  if (!(o.budget_fraction > 0 && o.budget_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget fraction ", o.budget_fraction, " is not in (0, 1]"));
  }
  const size_t want = size_t{in.window} * in.shape.q_heads * in.shape.head_dim;
  if (in.window == 0 || in.queries.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("queries of ", in.queries.size(), " floats; ",
                                                   in.window, " x ", in.shape.q_heads, " x ",
                                                   in.shape.head_dim, " need ", want));
  }
  if (in.chunks == 0) return absl::InvalidArgumentError("a prefix of 0 chunks");
  if (kind == SelectorKind::kQuest || kind == SelectorKind::kMeanKey) {
    const auto& parts = kind == SelectorKind::kQuest ? in.minmax : in.mean;
    if (parts.size() != in.chunks || in.layer >= in.layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          std::string(SelectorName(kind)), ": ", parts.size(), " summaries for ", in.chunks,
          " chunks, layer ", in.layer, " of ", in.layers));
    }
  } else if (in.records.size() != in.chunks) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(SelectorName(kind)), ": ", in.records.size(),
                                                   " records for ", in.chunks, " chunks"));
  }
  if (kind == SelectorKind::kImpress &&
      (o.impress_block_tokens == 0 || o.impress_block_tokens % in.shape.chunk_tokens != 0 ||
       o.impress_probe_heads == 0 || o.impress_probe_heads > in.shape.q_heads)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "impress: blocks of ", o.impress_block_tokens, " tokens (chunks of ",
        in.shape.chunk_tokens, "), ", o.impress_probe_heads, " probe heads of ",
        in.shape.q_heads));
  }
  return absl::OkStatus();
}

std::vector<float> QuestScores(const SelectorInput& in) {
  const KvShape& s = in.shape;
  const uint32_t d_n = s.head_dim;
  const SummaryFormat f{in.layers, s.kv_heads, d_n};
  // Per kv head: the sums of the positive and of the negative parts of its group's queries.
  std::vector<float> pos(size_t{s.kv_heads} * d_n, 0.0f), neg(size_t{s.kv_heads} * d_n, 0.0f);
  for (uint32_t i = 0; i < in.window; ++i) {
    for (uint32_t g = 0; g < s.q_heads; ++g) {
      const float* q = in.queries.data() + (size_t{i} * s.q_heads + g) * d_n;
      float* p = pos.data() + size_t{g / s.group()} * d_n;
      float* n = neg.data() + size_t{g / s.group()} * d_n;
      for (uint32_t d = 0; d < d_n; ++d) (q[d] > 0 ? p : n)[d] += q[d];
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_n));
  std::vector<float> scores(in.chunks, 0.0f);
  for (size_t j = 0; j < in.chunks; ++j) {
    float sum = 0;
    for (uint32_t h = 0; h < s.kv_heads; ++h) {
      const MinMaxEntry e = MinMaxAt(f, in.minmax[j], in.layer, h);
      sum += DotI8(pos.data() + size_t{h} * d_n, e.max, d_n) * e.scale_max +
             DotI8(neg.data() + size_t{h} * d_n, e.min, d_n) * e.scale_min;
    }
    scores[j] = sum * scale;
  }
  return scores;
}

std::vector<float> MeanKeyScores(const SelectorInput& in) {
  const KvShape& s = in.shape;
  const uint32_t d_n = s.head_dim;
  const SummaryFormat f{in.layers, s.kv_heads, d_n};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_n));
  std::vector<float> scores(in.chunks, 0.0f), logits(in.chunks), q(d_n);
  for (uint32_t g = 0; g < s.q_heads; ++g) {
    std::fill(q.begin(), q.end(), 0.0f);
    for (uint32_t i = 0; i < in.window; ++i) {
      const float* qi = in.queries.data() + (size_t{i} * s.q_heads + g) * d_n;
      for (uint32_t d = 0; d < d_n; ++d) q[d] += qi[d];
    }
    for (float& x : q) x /= static_cast<float>(in.window);
    const uint32_t h = g / s.group();
    for (size_t j = 0; j < in.chunks; ++j) {
      const MeanEntry e = MeanAt(f, in.mean[j], in.layer, h);
      logits[j] = DotI8(q.data(), e.mean, d_n) * e.scale * scale;
    }
    const float max = *std::max_element(logits.begin(), logits.end());
    const float sum = UseAvx2() ? simd::ExpSubAvx2(logits.data(), logits.size(), max)
                                : simd::ExpSubScalar(logits.data(), logits.size(), max);
    const float norm = 1.0f / (sum * static_cast<float>(s.q_heads));
    for (size_t j = 0; j < in.chunks; ++j) scores[j] += logits[j] * norm;
  }
  return scores;
}

std::vector<uint32_t> ImpressProbeHeads(const KvShape& s, uint32_t probes) {
  std::vector<uint32_t> heads;
  for (uint32_t i = 0; i < probes; ++i) heads.push_back(i * s.q_heads / probes);
  return heads;
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
  return idx;
}

}  // namespace

std::string_view SelectorName(SelectorKind kind) {
  switch (kind) {
    case SelectorKind::kPeriodExact: return "period-exact";
    case SelectorKind::kQuest: return "quest";
    case SelectorKind::kMeanKey: return "mean-key";
    case SelectorKind::kOracle: return "oracle";
    case SelectorKind::kImpress: return "impress";
    case SelectorKind::kH2o: return "h2o";
  }
  return "unknown";
}

absl::StatusOr<SelectorKind> ParseSelectorKind(std::string_view name) {
  for (SelectorKind k : kKinds) {
    if (SelectorName(k) == name) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown selector '", std::string(name),
      "' (period-exact, quest, mean-key, oracle, impress, h2o)"));
}

std::vector<SelectorKind> AllSelectorKinds() { return {std::begin(kKinds), std::end(kKinds)}; }

bool ReadsSummaries(SelectorKind kind) {
  return kind == SelectorKind::kQuest || kind == SelectorKind::kMeanKey;
}
bool ReadsKeys(SelectorKind kind) { return !ReadsSummaries(kind); }

size_t BudgetChunks(size_t n, const SelectOptions& o) {
  const size_t floor = std::min(n, size_t{o.sink_chunks} + o.recent_chunks);
  const auto k = static_cast<size_t>(std::floor(o.budget_fraction * static_cast<double>(n) + 0.5));
  return std::clamp(k, floor, n);
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
    case SelectorKind::kImpress: {
      const auto heads = ImpressProbeHeads(in.shape, o.impress_probe_heads);
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
    sel.chunks = TopKChunks(sel.scores, BudgetChunks(n, o), o.sink_chunks, o.recent_chunks);
    return sel;
  }
  // Token-level baselines.
  const uint32_t c = in.shape.chunk_tokens;
  std::vector<uint32_t> heads;
  if (kind == SelectorKind::kImpress) heads = ImpressProbeHeads(in.shape, o.impress_probe_heads);
  auto mass = TokenAttention(in.shape, in.queries, in.window, in.records, heads);
  if (!mass.ok()) return mass.status();
  const size_t tokens = n * c;
  const auto k_tokens = std::clamp<size_t>(
      static_cast<size_t>(std::floor(o.budget_fraction * static_cast<double>(tokens) + 0.5)), 1,
      tokens);
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
  return sel;
}

}  // namespace ckv::kernels
