// SPDX-License-Identifier: Apache-2.0
// Tests of the selectors (kernels/selector.h) against scalar references written here, on random
// and planted data, on both CPU paths.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/cpu_path.h"
#include "kernels/fidelity.h"
#include "kernels/selector.h"
#include "kernels/summary.h"
#include "tests/shaped_spec.h"

namespace ckv::kernels {
namespace {

// A small GQA model: 4 q heads over 2 kv heads, head dim 64, 16-token chunks, 3 layers.
ModelSpec SmallSpec(DType dtype = DType::kFp16) {
  return ::ckv::testing::ShapedSpec("small", 3, 4, 2, 64, 16, dtype);
}

// One layer of a prefix: records (as ckv stores them), summaries of every layer (only `layer`
// filled), and queries.
struct Prefix {
  ModelSpec spec;
  uint32_t layer = 1;
  uint32_t window = 8;
  size_t chunks = 0;
  std::vector<std::vector<std::byte>> records, minmax, mean, outlier;
  std::vector<const std::byte*> record_ptr, minmax_ptr, mean_ptr, outlier_ptr;
  std::vector<float> queries;

  SelectorInput Input() const {
    SelectorInput in;
    in.shape = KvShape::Of(spec);
    in.layers = spec.layers;
    in.layer = layer;
    in.queries = queries;
    in.window = window;
    in.chunks = chunks;
    in.minmax = minmax_ptr;
    in.mean = mean_ptr;
    in.outlier = outlier_ptr;
    in.records = record_ptr;
    return in;
  }
};

// Random keys and values; chunks in `planted` get keys aligned with the queries' direction.
// `edit`, when given, changes each chunk's float K and V before they are stored and summarised.
Prefix MakePrefix(size_t chunks, uint64_t seed, std::vector<uint32_t> planted = {},
                  DType dtype = DType::kFp16,
                  const std::function<void(size_t, std::vector<float>&)>& edit = {}) {
  Prefix p;
  p.spec = SmallSpec(dtype);
  p.chunks = chunks;
  const KvShape s = KvShape::Of(p.spec);
  const SummaryFormat f = SummaryFormat::For(p.spec);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> dir(s.head_dim);
  for (float& x : dir) x = normal(rng);
  const size_t row = size_t{s.kv_heads} * s.head_dim;
  const size_t elems = size_t{s.chunk_tokens} * row;
  std::vector<float> kv(2 * elems);
  for (size_t j = 0; j < chunks; ++j) {
    const bool hot = std::find(planted.begin(), planted.end(), j) != planted.end();
    for (size_t i = 0; i < kv.size(); ++i) {
      kv[i] = normal(rng);
      if (hot && i < elems) kv[i] += 2.5f * dir[i % s.head_dim];
    }
    if (edit) edit(j, kv);
    std::vector<std::byte> rec(s.record_bytes());
    FromFloat(dtype, kv.data(), kv.size(), rec.data());
    p.records.push_back(std::move(rec));
    p.minmax.emplace_back(f.MinMaxBytes());
    p.mean.emplace_back(f.MeanBytes());
    p.outlier.emplace_back(f.OutlierBytes());
    SummarizeChunkLayer(p.spec, p.layer, std::span(p.records.back().data(), s.half_record_bytes()),
                        p.minmax.back(), p.mean.back(), p.outlier.back());
  }
  for (size_t j = 0; j < chunks; ++j) {
    p.record_ptr.push_back(p.records[j].data());
    p.minmax_ptr.push_back(p.minmax[j].data());
    p.mean_ptr.push_back(p.mean[j].data());
    p.outlier_ptr.push_back(p.outlier[j].data());
  }
  p.queries.resize(size_t{p.window} * s.q_heads * s.head_dim);
  for (size_t i = 0; i < p.queries.size(); ++i) {
    p.queries[i] = 0.5f * normal(rng) + (planted.empty() ? 0.0f : dir[i % s.head_dim]);
  }
  return p;
}

// The keys of chunk j, head h, token t, as float.
float Key(const Prefix& p, size_t j, uint32_t t, uint32_t h, uint32_t d) {
  const KvShape s = KvShape::Of(p.spec);
  float x;
  ToFloat(
      s.dtype,
      p.records[j].data() + ((size_t{t} * s.kv_heads + h) * s.head_dim + d) * ElementBytes(s.dtype),
      1, &x);
  return x;
}

const float* Query(const Prefix& p, uint32_t i, uint32_t g) {
  return p.queries.data() + (size_t{i} * p.spec.q_heads + g) * p.spec.head_dim;
}

// Exact attention mass per token in double precision, over q heads `heads` (all when empty).
std::vector<double> ReferenceTokenMass(const Prefix& p, std::vector<uint32_t> heads = {}) {
  const KvShape s = KvShape::Of(p.spec);
  if (heads.empty()) {
    for (uint32_t g = 0; g < s.q_heads; ++g) heads.push_back(g);
  }
  const size_t tokens = p.chunks * s.chunk_tokens;
  std::vector<double> mass(tokens, 0.0), logit(tokens);
  for (uint32_t g : heads) {
    const uint32_t h = g / s.group();
    for (uint32_t i = 0; i < p.window; ++i) {
      double max = -1e300;
      for (size_t t = 0; t < tokens; ++t) {
        double dot = 0;
        for (uint32_t d = 0; d < s.head_dim; ++d) {
          dot += double{Query(p, i, g)[d]} * Key(p, t / s.chunk_tokens, t % s.chunk_tokens, h, d);
        }
        logit[t] = dot / std::sqrt(double(s.head_dim));
        max = std::max(max, logit[t]);
      }
      double sum = 0;
      for (double& x : logit) sum += (x = std::exp(x - max));
      for (size_t t = 0; t < tokens; ++t) mass[t] += logit[t] / sum / (p.window * heads.size());
    }
  }
  return mass;
}

std::vector<double> ReferenceChunkScores(SelectorKind kind, const Prefix& p) {
  const KvShape s = KvShape::Of(p.spec);
  const SummaryFormat f = SummaryFormat::For(p.spec);
  const uint32_t d_n = s.head_dim;
  std::vector<double> scores(p.chunks, 0.0);
  std::vector<float> mn(d_n), mx(d_n), mean(d_n);
  // Adds softmax_j(logit[j]) / q_heads to scores.
  auto add_softmax = [&](std::vector<double> logit) {
    const double max = *std::max_element(logit.begin(), logit.end());
    double sum = 0;
    for (double& x : logit) sum += (x = std::exp(x - max));
    for (size_t j = 0; j < p.chunks; ++j) scores[j] += logit[j] / sum / s.q_heads;
  };
  if (kind == SelectorKind::kQuest) {
    // Per q head, the window's mean bound, each query's taken from its definition.
    for (uint32_t g = 0; g < s.q_heads; ++g) {
      std::vector<double> logit(p.chunks, 0.0);
      for (size_t j = 0; j < p.chunks; ++j) {
        DecodeMinMax(MinMaxAt(f, p.minmax_ptr[j], p.layer, g / s.group()), d_n, mn.data(),
                     mx.data());
        for (uint32_t i = 0; i < p.window; ++i) {
          for (uint32_t d = 0; d < d_n; ++d) {
            const double q = Query(p, i, g)[d];
            logit[j] += std::max(q * mx[d], q * mn[d]) / std::sqrt(double(d_n)) / p.window;
          }
        }
      }
      add_softmax(logit);
    }
    return scores;
  }
  if (kind == SelectorKind::kMeanKey || kind == SelectorKind::kOutlierKey) {
    std::vector<float> far(d_n);
    const double c = s.chunk_tokens;
    for (uint32_t g = 0; g < s.q_heads; ++g) {
      std::vector<double> qbar(d_n, 0.0), logit(p.chunks);
      for (uint32_t i = 0; i < p.window; ++i) {
        for (uint32_t d = 0; d < d_n; ++d) qbar[d] += Query(p, i, g)[d] / p.window;
      }
      for (size_t j = 0; j < p.chunks; ++j) {
        DecodeMean(MeanAt(f, p.mean_ptr[j], p.layer, g / s.group()), d_n, mean.data());
        DecodeOutlier(OutlierAt(f, p.outlier_ptr[j], p.layer, g / s.group()), d_n, far.data());
        // Outlier-key by its definition: one token at the outlier, c - 1 at the others' mean.
        double lm = 0, lo = 0, lr = 0;
        for (uint32_t d = 0; d < d_n; ++d) {
          lm += qbar[d] * mean[d] / std::sqrt(double(d_n));
          lo += qbar[d] * far[d] / std::sqrt(double(d_n));
          lr += qbar[d] * (c * mean[d] - far[d]) / (c - 1) / std::sqrt(double(d_n));
        }
        logit[j] = kind == SelectorKind::kMeanKey
                       ? lm
                       : std::log(((c - 1) * std::exp(lr) + std::exp(lo)) / c);
      }
      add_softmax(logit);
    }
    return scores;
  }
  std::vector<uint32_t> heads;
  if (kind == SelectorKind::kImpress) heads = {0, s.q_heads / 3, 2 * s.q_heads / 3};
  const auto mass = ReferenceTokenMass(p, heads);
  for (size_t t = 0; t < mass.size(); ++t) scores[t / s.chunk_tokens] += mass[t];
  return scores;
}

// Quest's bounds summed over queries and every q head, without normalisation.
std::vector<double> ReferenceRawQuestSums(const Prefix& p) {
  const KvShape s = KvShape::Of(p.spec);
  const SummaryFormat f = SummaryFormat::For(p.spec);
  std::vector<float> mn(s.head_dim), mx(s.head_dim);
  std::vector<double> sums(p.chunks, 0.0);
  for (size_t j = 0; j < p.chunks; ++j) {
    for (uint32_t g = 0; g < s.q_heads; ++g) {
      DecodeMinMax(MinMaxAt(f, p.minmax_ptr[j], p.layer, g / s.group()), s.head_dim, mn.data(),
                   mx.data());
      for (uint32_t i = 0; i < p.window; ++i) {
        for (uint32_t d = 0; d < s.head_dim; ++d) {
          const double q = Query(p, i, g)[d];
          sums[j] += std::max(q * mx[d], q * mn[d]);
        }
      }
    }
  }
  return sums;
}

class SelectorTest : public ::testing::TestWithParam<CpuPath> {
 protected:
  void SetUp() override { SetCpuPath(GetParam()); }
  void TearDown() override { SetCpuPath(CpuPath::kAuto); }
};

TEST_P(SelectorTest, ScoresMatchTheScalarReferenceOnRandomData) {
  for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    const Prefix p = MakePrefix(40, 7, {}, dtype);
    for (SelectorKind kind : AllSelectorKinds()) {
      auto got = ScoreChunks(kind, p.Input(), SelectOptions{});
      ASSERT_TRUE(got.ok()) << got.status();
      const auto want = ReferenceChunkScores(kind, p);
      double total = 0;
      for (float x : *got) total += x;
      EXPECT_NEAR(total, 1.0, 1e-4) << SelectorName(kind) << ": scores are a distribution";
      double scale = 0;
      for (double w : want) scale = std::max(scale, std::fabs(w));
      for (size_t j = 0; j < p.chunks; ++j) {
        EXPECT_NEAR((*got)[j], want[j], 2e-4 * scale + 1e-7)
            << SelectorName(kind) << " chunk " << j << " " << DTypeName(dtype);
      }
    }
  }
}

TEST_P(SelectorTest, SelectionsHoldTheInvariantsAndFollowTheScores) {
  const Prefix p = MakePrefix(50, 11);
  for (double budget : {0.02, 0.1, 0.25, 0.5, 1.0}) {
    SelectOptions o;
    o.budget_fraction = budget;
    o.recent_chunks = 2;
    for (SelectorKind kind : AllSelectorKinds()) {
      auto sel = Select(kind, p.Input(), o);
      ASSERT_TRUE(sel.ok()) << sel.status();
      const auto& c = sel->chunks;
      SCOPED_TRACE(::testing::Message() << SelectorName(kind) << " at " << budget);
      ASSERT_TRUE(std::is_sorted(c.begin(), c.end()));
      ASSERT_EQ(std::adjacent_find(c.begin(), c.end()), c.end());
      ASSERT_FALSE(c.empty());
      EXPECT_EQ(c.front(), 0u);  // sink
      EXPECT_EQ(c.back(), p.chunks - 1);
      EXPECT_TRUE(std::binary_search(c.begin(), c.end(), p.chunks - 2));  // 2 recent chunks
      if (kind == SelectorKind::kImpress || kind == SelectorKind::kH2o) {
        // Token-level: the budget is in tokens; whole chunks or 64-token blocks are loaded.
        const size_t want_tokens = static_cast<size_t>(std::floor(budget * 50 * 16 + 0.5));
        EXPECT_EQ(sel->tokens.size(), std::max<size_t>(want_tokens, 1));
        for (uint32_t t : sel->tokens) {
          EXPECT_TRUE(std::binary_search(c.begin(), c.end(), t / 16)) << "token " << t;
        }
        if (kind == SelectorKind::kImpress) {
          for (uint32_t t : sel->tokens) {
            for (uint32_t j = t / 64 * 4; j < std::min<uint32_t>(50, t / 64 * 4 + 4); ++j) {
              EXPECT_TRUE(std::binary_search(c.begin(), c.end(), j)) << "block chunk " << j;
            }
          }
        }
        continue;
      }
      EXPECT_EQ(c.size(), BudgetChunks(50, o));
      // Every chosen chunk (bar the forced ones) scores at least as high as every other.
      float worst_in = INFINITY, best_out = -INFINITY;
      for (uint32_t j = 1; j + 2 < p.chunks; ++j) {
        const bool in = std::binary_search(c.begin(), c.end(), j);
        if (in) worst_in = std::min(worst_in, sel->scores[j]);
        if (!in) best_out = std::max(best_out, sel->scores[j]);
      }
      EXPECT_GE(worst_in, best_out);
    }
  }
}

TEST_P(SelectorTest, ImpressScoresOnlyTheNamedProbeHeadsAndMeasuresTheirAgreement) {
  const Prefix p = MakePrefix(40, 5);
  const KvShape s = KvShape::Of(p.spec);
  SelectOptions o;
  o.budget_fraction = 0.1;
  // Three q heads of kv group 0 (the benchmark's "group" probes).
  o.impress_probe_q_heads = {0, 1, 2};
  ASSERT_LE(3u, s.q_heads);
  auto sel = Select(SelectorKind::kImpress, p.Input(), o);
  ASSERT_TRUE(sel.ok()) << sel.status();
  const auto mass = ReferenceTokenMass(p, o.impress_probe_q_heads);
  std::vector<double> want(p.chunks, 0.0);
  for (size_t t = 0; t < mass.size(); ++t) want[t / s.chunk_tokens] += mass[t];
  for (size_t j = 0; j < p.chunks; ++j) EXPECT_NEAR(sel->scores[j], want[j], 2e-4) << j;
  EXPECT_GE(sel->probe_jaccard, 0.0);
  EXPECT_LE(sel->probe_jaccard, 1.0);
  // One head named three times is refused; the same head as its own only probe agrees with
  // itself (Jaccard 1 when there is nothing to compare).
  o.impress_probe_q_heads = {1, 1};
  EXPECT_EQ(Select(SelectorKind::kImpress, p.Input(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.impress_probe_q_heads = {1};
  sel = Select(SelectorKind::kImpress, p.Input(), o);
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ(sel->probe_jaccard, 1.0);
}

TEST_P(SelectorTest, ImpressScoresWithEveryNamedHeadWhileItsProbesGate) {
  // IMPRESS loads its probes' kv heads' keys; every q head those keys serve may rank the tokens,
  // while the gate stays the probes' agreement.
  const Prefix p = MakePrefix(40, 5);
  const KvShape s = KvShape::Of(p.spec);
  ASSERT_GE(s.q_heads, 2 * s.group());
  SelectOptions probes_only;
  probes_only.budget_fraction = 0.1;
  probes_only.impress_probe_q_heads = {0, s.group()};  // one q head in each of kv heads 0 and 1
  SelectOptions o = probes_only;
  for (uint32_t q = 0; q < 2 * s.group(); ++q) o.impress_score_q_heads.push_back(q);
  auto base = Select(SelectorKind::kImpress, p.Input(), probes_only);
  auto sel = Select(SelectorKind::kImpress, p.Input(), o);
  ASSERT_TRUE(base.ok() && sel.ok());
  EXPECT_EQ(sel->probe_jaccard, base->probe_jaccard);  // the gate: the probes alone
  const auto mass = ReferenceTokenMass(p, o.impress_score_q_heads);
  std::vector<double> want(p.chunks, 0.0);
  for (size_t t = 0; t < mass.size(); ++t) want[t / s.chunk_tokens] += mass[t];
  double differs = 0;
  for (size_t j = 0; j < p.chunks; ++j) {
    EXPECT_NEAR(sel->scores[j], want[j], 2e-4) << j;
    differs += std::abs(sel->scores[j] - base->scores[j]);
  }
  EXPECT_GT(differs, 1e-3) << "the extra heads changed the ranking's scores";
  // Scoring more heads costs more modelled FLOPs.
  EXPECT_GT(ScoringFlops(SelectorKind::kImpress, p.Input(), o),
            ScoringFlops(SelectorKind::kImpress, p.Input(), probes_only));
  o.impress_score_q_heads = {0, s.q_heads};
  EXPECT_EQ(Select(SelectorKind::kImpress, p.Input(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(SelectorTest, EverySelectorFindsAPlantedChunk) {
  const std::vector<uint32_t> planted = {17, 33};
  const Prefix p = MakePrefix(64, 3, planted);
  SelectOptions o;
  o.budget_fraction = 0.1;  // 6 chunks: the sink, the last, and 4 more
  for (SelectorKind kind : AllSelectorKinds()) {
    auto sel = Select(kind, p.Input(), o);
    ASSERT_TRUE(sel.ok()) << sel.status();
    for (uint32_t j : planted) {
      EXPECT_TRUE(std::binary_search(sel->chunks.begin(), sel->chunks.end(), j))
          << SelectorName(kind) << " missed planted chunk " << j;
    }
  }
}

// The outlier part holds, per kv head, the key of the token farthest from the chunk's mean, in 8
// bits (half a step of its fp16 scale), and leaves the other layers' entries alone.
TEST(OutlierPartTest, HoldsTheKeyFarthestFromTheMean) {
  const ModelSpec spec = SmallSpec();
  const KvShape s = KvShape::Of(spec);
  const SummaryFormat f = SummaryFormat::For(spec);
  const size_t row = size_t{s.kv_heads} * s.head_dim;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> k(size_t{s.chunk_tokens} * row);
  for (float& x : k) x = normal(rng);
  // Kv head h's farthest token is 3 + 4h: its key is pushed 4 units out on 8 channels (a
  // squared distance about 128 beyond the others' 64 +- 11).
  for (uint32_t h = 0; h < s.kv_heads; ++h) {
    for (uint32_t d = 0; d < 8; ++d) k[(3 + 4 * h) * row + h * s.head_dim + d] += 4.0f;
  }
  std::vector<std::byte> keys(k.size() * 2);
  FromFloat(DType::kFp16, k.data(), k.size(), keys.data());
  std::vector<float> stored(k.size());
  ToFloat(DType::kFp16, keys.data(), k.size(), stored.data());
  std::vector<std::byte> minmax(f.MinMaxBytes()), mean(f.MeanBytes());
  std::vector<std::byte> part(f.OutlierBytes(), std::byte{0x5a});
  SummarizeChunkLayer(spec, 1, keys, minmax, mean, part);
  for (uint32_t h = 0; h < s.kv_heads; ++h) {
    std::vector<float> got(s.head_dim);
    DecodeOutlier(OutlierAt(f, part.data(), 1, h), s.head_dim, got.data());
    const float* want = stored.data() + (3 + 4 * h) * row + h * s.head_dim;
    float step = 0;
    for (uint32_t d = 0; d < s.head_dim; ++d) step = std::max(step, std::fabs(want[d]) / 127);
    for (uint32_t d = 0; d < s.head_dim; ++d) {
      EXPECT_NEAR(got[d], want[d], 0.51f * step + 1e-6f) << "kv head " << h << " channel " << d;
    }
  }
  EXPECT_EQ(part[0], std::byte{0x5a}) << "layer 0's entries are not touched";
}

// A chunk whose attention sits on one token: outlier-key keeps that token's key and finds the
// chunk; mean-key averages it with 15 others and prefers decoys whose every token leans a little
// toward the queries (a larger mean, a far smaller mass). With no outlier parts (chunks stored
// before them) outlier-key scores as mean-key does.
TEST_P(SelectorTest, OutlierKeyFindsAChunkWhoseAttentionIsOneToken) {
  const std::vector<uint32_t> planted = {9, 21, 40, 52}, decoys = {13, 27, 45, 58};
  const uint32_t d_n = SmallSpec().head_dim, kv_heads = SmallSpec().kv_heads;
  std::vector<float> dir;
  // The planted chunks' token 5 (every kv head) points along the queries' direction, which
  // MakePrefix draws from its seed: read it back from the queries of a prefix with one plant.
  const Prefix probe = MakePrefix(64, 21, {0});
  dir.assign(probe.queries.begin(), probe.queries.begin() + d_n);
  Prefix p = MakePrefix(64, 21, {0}, DType::kFp16, [&](size_t j, std::vector<float>& kv) {
    const size_t row = size_t{kv_heads} * d_n;
    for (size_t i = 0; i < kv.size() / 2; ++i) kv[i] = 0.5f * kv[i];  // no chunk stands out
    if (std::find(decoys.begin(), decoys.end(), j) != decoys.end()) {
      for (size_t i = 0; i < kv.size() / 2; ++i) kv[i] += 0.6f * dir[i % d_n];
    }
    if (std::find(planted.begin(), planted.end(), j) == planted.end()) return;
    for (uint32_t h = 0; h < kv_heads; ++h) {
      for (uint32_t d = 0; d < d_n; ++d) kv[5 * row + h * d_n + d] += 6.0f * dir[d];
    }
  });
  SelectOptions o;
  o.budget_fraction = 6.0 / 64;  // the sink, the last chunk and 4 more
  auto found = [&](SelectorKind kind, const SelectorInput& in) {
    auto sel = Select(kind, in, o);
    EXPECT_TRUE(sel.ok()) << sel.status();
    size_t n = 0;
    for (uint32_t j : planted) n += std::binary_search(sel->chunks.begin(), sel->chunks.end(), j);
    return n;
  };
  EXPECT_EQ(found(SelectorKind::kOracle, p.Input()), planted.size());
  EXPECT_EQ(found(SelectorKind::kOutlierKey, p.Input()), planted.size());
  EXPECT_EQ(found(SelectorKind::kMeanKey, p.Input()), 0u);
  SelectorInput without = p.Input();
  const std::vector<const std::byte*> none(p.chunks, nullptr);
  without.outlier = none;
  const auto a = ScoreChunks(SelectorKind::kOutlierKey, without, o);
  const auto b = ScoreChunks(SelectorKind::kMeanKey, p.Input(), o);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t j = 0; j < p.chunks; ++j) EXPECT_NEAR((*a)[j], (*b)[j], 1e-6f) << j;
  without.outlier = {};
  EXPECT_EQ(ScoreChunks(SelectorKind::kOutlierKey, without, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Regression test for quest's first aggregation, the raw bounds summed over q heads, in which a
// q head with large logits decided alone. Here q heads 1-3 attend to planted chunk 17, and q head
// 0, with 8x longer queries, to chunk 40: the true attention is 3/4 on chunk 17.
TEST_P(SelectorTest, AHeadWithLargeLogitsDoesNotDecideAlone) {
  const uint32_t d_n = SmallSpec().head_dim;
  std::mt19937_64 rng(14);
  std::normal_distribution<float> normal;
  std::vector<float> other(d_n);
  for (float& x : other) x = normal(rng);
  Prefix p = MakePrefix(64, 13, {17}, DType::kFp16, [&](size_t j, std::vector<float>& kv) {
    if (j != 40) return;
    for (size_t i = 0; i < kv.size() / 2; ++i) kv[i] += 2.5f * other[i % d_n];
  });
  const KvShape s = KvShape::Of(p.spec);
  for (uint32_t i = 0; i < p.window; ++i) {
    float* q = p.queries.data() + size_t{i} * s.q_heads * d_n;  // q head 0
    for (uint32_t d = 0; d < d_n; ++d) q[d] = 8 * (other[d] + 0.5f * normal(rng));
  }
  SelectOptions o;
  o.budget_fraction = 3.0 / 64;  // the sink, the last chunk and one more
  // The raw sum of the bounds over the heads picks chunk 40: the case is a real one.
  const auto raw = ReferenceRawQuestSums(p);
  EXPECT_EQ(std::max_element(raw.begin() + 1, raw.end() - 1) - raw.begin(), 40);
  for (SelectorKind kind : {SelectorKind::kOracle, SelectorKind::kQuest, SelectorKind::kMeanKey}) {
    auto sel = Select(kind, p.Input(), o);
    ASSERT_TRUE(sel.ok()) << sel.status();
    EXPECT_EQ(sel->chunks, (std::vector<uint32_t>{0, 17, 63})) << SelectorName(kind);
  }
}

TEST_P(SelectorTest, OracleHasRecallOneAtFullBudgetAndEveryOtherAtMost) {
  const Prefix p = MakePrefix(30, 5);
  const auto mass =
      PerChunk(*TokenAttention(KvShape::Of(p.spec), p.queries, p.window, p.record_ptr), 16);
  double total = 0;
  for (float m : mass) total += m;
  EXPECT_NEAR(total, 1.0, 1e-4);
  SelectOptions full;
  full.budget_fraction = 1.0;
  auto oracle = Select(SelectorKind::kOracle, p.Input(), full);
  ASSERT_TRUE(oracle.ok());
  EXPECT_EQ(oracle->chunks.size(), 30u);
  EXPECT_NEAR(AttentionRecall(mass, oracle->chunks), 1.0, 1e-6);
  SelectOptions tenth;
  const double best =
      AttentionRecall(mass, Select(SelectorKind::kOracle, p.Input(), tenth)->chunks);
  for (SelectorKind kind : {SelectorKind::kQuest, SelectorKind::kMeanKey}) {
    EXPECT_LE(AttentionRecall(mass, Select(kind, p.Input(), tenth)->chunks), best + 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(CpuPaths, SelectorTest,
                         ::testing::Values(CpuPath::kScalar, CpuPath::kAvx2), [](const auto& info) {
                           return info.param == CpuPath::kScalar ? "scalar" : "avx2";
                         });

// The two CPU paths sum in different orders (blocked FMA against plain loops) and use different
// exp implementations (a polynomial against libm): scores agree to 1e-5 of the largest score,
// and on this data the selections are the same.
TEST(SelectorPathsTest, VectorisedAndScalarPathsAgree) {
  SetCpuPath(CpuPath::kAvx2);
  if (!UseAvx2()) {
    SetCpuPath(CpuPath::kAuto);
    GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C: only the scalar path exists";
  }
  const Prefix p = MakePrefix(300, 21, {40, 41, 200});
  SelectOptions o;
  o.budget_fraction = 0.1;
  for (SelectorKind kind : AllSelectorKinds()) {
    SetCpuPath(CpuPath::kAvx2);
    auto vec = Select(kind, p.Input(), o);
    SetCpuPath(CpuPath::kScalar);
    auto scalar = Select(kind, p.Input(), o);
    ASSERT_TRUE(vec.ok() && scalar.ok());
    const float max = *std::max_element(scalar->scores.begin(), scalar->scores.end());
    for (size_t j = 0; j < p.chunks; ++j) {
      ASSERT_NEAR(vec->scores[j], scalar->scores[j], 1e-5f * max) << SelectorName(kind) << " " << j;
    }
    EXPECT_EQ(vec->chunks, scalar->chunks) << SelectorName(kind);
    EXPECT_EQ(vec->tokens, scalar->tokens) << SelectorName(kind);
  }
  SetCpuPath(CpuPath::kAuto);
}

TEST(BudgetTest, RoundsHalfUpAndKeepsTheForcedChunks) {
  SelectOptions o;
  o.budget_fraction = 0.1;
  EXPECT_EQ(BudgetChunks(512, o), 51u);  // 51.2
  EXPECT_EQ(BudgetChunks(25, o), 3u);    // 2.5 rounds up
  EXPECT_EQ(BudgetChunks(5, o), 2u);     // sink + recent at least
  EXPECT_EQ(BudgetChunks(1, o), 1u);     // never more than there are
  o.budget_fraction = 1.0;
  EXPECT_EQ(BudgetChunks(77, o), 77u);
}

TEST(BudgetTest, ATargetMassTakesTheFewestChunksThatReachItUnderTheCeiling) {
  // Sink 0.30 and recent 0.05 count first; then 0.25, 0.20, 0.10, 0.05, 0.03, 0.02.
  const std::vector<float> scores = {0.30f, 0.10f, 0.25f, 0.02f, 0.20f, 0.03f, 0.05f, 0.05f};
  SelectOptions o;
  o.budget_fraction = 1.0;
  EXPECT_EQ(SelectedCount(scores, o), 8u) << "off: the budget's count";
  o.target_mass = 0.30;
  EXPECT_EQ(SelectedCount(scores, o), 2u) << "sink and recent alone reach 0.35";
  o.target_mass = 0.60;
  EXPECT_EQ(SelectedCount(scores, o), 3u) << "0.35 + 0.25";
  o.target_mass = 0.61;
  EXPECT_EQ(SelectedCount(scores, o), 4u) << "+ 0.20";
  o.target_mass = 1.0;
  EXPECT_EQ(SelectedCount(scores, o), 8u) << "every chunk when only all of them reach it";
  o.budget_fraction = 0.5;  // a ceiling of 4
  EXPECT_EQ(SelectedCount(scores, o), 4u);
  o.budget_fraction = 1.0;
  o.target_mass = 0.01;
  o.sink_chunks = 2;
  o.recent_chunks = 2;
  EXPECT_EQ(SelectedCount(scores, o), 4u) << "never fewer than sink + recent";
  const std::vector<float> nan = {0.5f, NAN, 0.4f, 0.1f};
  o = SelectOptions{};
  o.budget_fraction = 1.0;
  o.target_mass = 0.95;
  EXPECT_EQ(SelectedCount(nan, o), 3u) << "a NaN score counts as no mass";
  EXPECT_EQ(TopKChunks(nan, 3, 1, 1), (std::vector<uint32_t>{0, 2, 3}));
}

// Select takes the count from the scores: a concentrated layer loads fewer chunks than a
// diffuse one at the same target.
TEST_P(SelectorTest, ATargetMassLoadsLessWhereAttentionIsConcentrated) {
  const Prefix diffuse = MakePrefix(64, 3);
  const Prefix planted = MakePrefix(64, 3, {17});  // chunk 17 holds most of the attention
  SelectOptions o;
  o.budget_fraction = 1.0;
  o.target_mass = 0.5;
  for (SelectorKind kind : AllSelectorKinds()) {
    if (kind == SelectorKind::kImpress || kind == SelectorKind::kH2o) continue;
    auto spread = Select(kind, diffuse.Input(), o);
    ASSERT_TRUE(spread.ok()) << spread.status();
    EXPECT_EQ(spread->chunks.size(), SelectedCount(spread->scores, o)) << SelectorName(kind);
    double got = 0;
    for (uint32_t j : spread->chunks) got += spread->scores[j];
    EXPECT_GE(got, 0.5 - 1e-5) << SelectorName(kind);
    auto peaked = Select(kind, planted.Input(), o);
    ASSERT_TRUE(peaked.ok()) << peaked.status();
    EXPECT_LT(peaked->chunks.size(), spread->chunks.size()) << SelectorName(kind);
    EXPECT_TRUE(std::binary_search(peaked->chunks.begin(), peaked->chunks.end(), 17u))
        << SelectorName(kind);
  }
}

TEST(TopKTest, ForcedChunksFirstThenHighestWithTiesToTheLowerIndex) {
  const std::vector<float> scores = {0, 5, 3, 5, 9, 1, 5, 0};
  EXPECT_EQ(TopKChunks(scores, 4, 1, 1), (std::vector<uint32_t>{0, 1, 4, 7}));
  EXPECT_EQ(TopKChunks(scores, 5, 1, 1), (std::vector<uint32_t>{0, 1, 3, 4, 7}));
  EXPECT_EQ(TopKChunks(scores, 3, 0, 0), (std::vector<uint32_t>{1, 3, 4}));
  const std::vector<float> nan = {NAN, 1, NAN, 2};
  EXPECT_EQ(TopKChunks(nan, 2, 0, 0), (std::vector<uint32_t>{1, 3}));
}

// Each bad input is InvalidArgument, and the message names what was wrong.
TEST(SelectorErrorsTest, BadInputsAreInvalidArgumentWithTheValue) {
  Prefix p = MakePrefix(10, 1);
  auto expect_invalid = [](const absl::Status& st, const std::string& says) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr(says));
  };
  SelectOptions o;
  o.budget_fraction = 0;
  expect_invalid(Select(SelectorKind::kQuest, p.Input(), o).status(), "budget fraction 0 ");
  o.budget_fraction = 1.5;
  expect_invalid(Select(SelectorKind::kQuest, p.Input(), o).status(), "not in (0, 1]");
  o.budget_fraction = 0.5;
  o.target_mass = 1.5;
  expect_invalid(Select(SelectorKind::kMeanKey, p.Input(), o).status(), "target mass 1.5 ");
  o.target_mass = 0;
  SelectorInput in = p.Input();
  in.queries = std::span(p.queries).first(10);
  expect_invalid(Select(SelectorKind::kOracle, in, o).status(), "queries of 10 floats");
  in = p.Input();
  in.minmax = std::span(p.minmax_ptr).first(3);
  expect_invalid(Select(SelectorKind::kQuest, in, o).status(), "quest: 3 summaries for 10 chunks");
  in = p.Input();
  in.layer = 3;  // of 3 layers
  expect_invalid(Select(SelectorKind::kMeanKey, in, o).status(), "layer 3 of 3");
  in = p.Input();
  in.records = {};
  expect_invalid(Select(SelectorKind::kH2o, in, o).status(), "h2o: 0 records for 10 chunks");
  in = p.Input();
  in.chunks = 0;
  expect_invalid(Select(SelectorKind::kOracle, in, o).status(), "0 chunks");
  in = p.Input();
  in.shape.kv_heads = 3;  // 4 q heads are not a multiple
  expect_invalid(Select(SelectorKind::kOracle, in, o).status(), "4 q heads, 3 kv heads");
  o.impress_probe_heads = 5;
  expect_invalid(Select(SelectorKind::kImpress, p.Input(), o).status(), "5 probe heads of 4");
  expect_invalid(ParseSelectorKind("best").status(), "unknown selector 'best'");
  for (SelectorKind kind : AllSelectorKinds()) {
    EXPECT_EQ(*ParseSelectorKind(SelectorName(kind)), kind);
  }
}

}  // namespace
}  // namespace ckv::kernels
