// Tests of the planted-attention generator (tools/synthetic_attention.h): determinism, shapes,
// and that the exact attention over its data shows the structure it plants.
#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/fidelity.h"
#include "kernels/selector.h"
#include "tools/synthetic_attention.h"

namespace ckv::synth {
namespace {

ModelSpec Spec() { return *ModelSpec::Preset("qwen2.5-0.5b"); }

// Exact attention mass per chunk of `layer` over q heads `heads` (all when empty).
std::vector<float> ChunkMass(const SyntheticAttention& gen, const SyntheticAttention::Layer& l,
                             std::vector<uint32_t> heads = {}) {
  const auto records = gen.Records(l);
  const kernels::KvShape s = kernels::KvShape::Of(gen.spec());
  std::vector<const std::byte*> ptr;
  for (size_t j = 0; j < gen.chunks(); ++j) ptr.push_back(records.data() + j * s.record_bytes());
  auto mass = kernels::TokenAttention(s, l.q, gen.params().window, ptr, heads);
  EXPECT_TRUE(mass.ok()) << mass.status();
  return kernels::PerChunk(*mass, s.chunk_tokens);
}

TEST(SyntheticAttentionTest, IsDeterministicWithTheDocumentedShapes) {
  AttentionParams p;
  const SyntheticAttention a(Spec(), 512, p), b(Spec(), 512, p);
  const auto la = a.Generate(3), lb = b.Generate(3);
  EXPECT_EQ(la.k, lb.k);
  EXPECT_EQ(la.v, lb.v);
  EXPECT_EQ(la.q, lb.q);
  EXPECT_EQ(la.k.size(), 512u * 2 * 64);
  EXPECT_EQ(la.q.size(), size_t{p.window} * 14 * 64);
  for (float x : la.k) ASSERT_TRUE(std::isfinite(x));
  EXPECT_NE(a.Generate(4).k, la.k);
  p.seed = 2;
  EXPECT_NE(SyntheticAttention(Spec(), 512, p).Generate(3).k, la.k);
  EXPECT_EQ(a.Records(la).size(), 32u * Spec().RecordBytes());
}

TEST(SyntheticAttentionTest, PlantedSetsDriftAsConfigured) {
  for (double overlap : {0.3, 0.6, 0.9}) {
    AttentionParams p;
    p.period_overlap = overlap;
    p.heavy_fraction = 0.1;
    p.head_disagreement = 0;  // measured alone: the per-head swaps blur it (see below)
    p.layer_drift = 0;
    const SyntheticAttention gen(Spec(), 8192, p);  // 512 chunks, 51 heavy hitters
    double kept = 0;
    int pairs = 0;
    for (uint32_t l = 8; l < Spec().layers; l += 8) {
      // Head disagreement is per period: compare kv head 0 of adjacent period heads.
      const auto before = gen.HeavyHitters(l - 8, 0), after = gen.HeavyHitters(l, 0);
      const double j = kernels::Jaccard(before, after);
      kept += 2 * j / (1 + j);
      ++pairs;
    }
    EXPECT_NEAR(kept / pairs, overlap, 0.03) << "period_overlap " << overlap;
  }
  // With the defaults, one kv head's sets of adjacent periods keep about half of their chunks
  // (0.6 kept by the period, then each period's own 20% per-head swaps).
  const SyntheticAttention gen(Spec(), 8192, AttentionParams{});
  const double j = kernels::Jaccard(gen.HeavyHitters(0, 1), gen.HeavyHitters(8, 1));
  EXPECT_NEAR(2 * j / (1 + j), 0.45, 0.15);
}

TEST(SyntheticAttentionTest, ExactAttentionShowsTheSinkRecencyAndHeavyHitters) {
  const AttentionParams p;
  const SyntheticAttention gen(Spec(), 4096, p);  // 256 chunks
  const size_t n = gen.chunks();
  double sink = 0, held = 0;
  int last_in_top = 0, heavy_found = 0, heavy_total = 0;
  const uint32_t layers[] = {0, 5, 11};
  for (uint32_t layer : layers) {
    const auto l = gen.Generate(layer);
    const auto mass = ChunkMass(gen, l);
    sink += mass[0];
    kernels::SelectOptions o;
    const auto top = kernels::TopKChunks(mass, kernels::BudgetChunks(n, o), 0, 0);
    held += kernels::AttentionRecall(mass, top);
    last_in_top += std::binary_search(top.begin(), top.end(), n - 1);
    for (uint32_t h = 0; h < Spec().kv_heads; ++h) {
      for (uint32_t j : gen.HeavyHitters(layer, h)) {
        heavy_found += std::binary_search(top.begin(), top.end(), j);
        ++heavy_total;
      }
    }
  }
  const double layers_n = std::size(layers);
  EXPECT_GT(sink / layers_n, 0.1) << "the sink chunk holds a large share";
  EXPECT_EQ(last_in_top, 3) << "the last chunk is always among the top 10%";
  EXPECT_GT(double(heavy_found) / heavy_total, 0.6) << "planted chunks are where attention goes";
  // Realistic concentration: the best 10% of chunks hold most, not all, of the attention.
  EXPECT_GT(held / layers_n, 0.6);
  EXPECT_LT(held / layers_n, 0.97);
}

TEST(SyntheticAttentionTest, QHeadsOfAGroupAgreeMoreThanHeadsOfDifferentGroups) {
  const SyntheticAttention gen(Spec(), 4096, AttentionParams{});
  const auto l = gen.Generate(2);
  kernels::SelectOptions o;
  const size_t k = kernels::BudgetChunks(gen.chunks(), o);
  std::vector<std::vector<uint32_t>> top;
  for (uint32_t g : {0u, 1u, 7u}) {  // 0 and 1 share kv head 0; 7 reads kv head 1
    top.push_back(kernels::TopKChunks(ChunkMass(gen, l, {g}), k, 0, 0));
  }
  const double same = kernels::Jaccard(top[0], top[1]);
  const double other = kernels::Jaccard(top[0], top[2]);
  EXPECT_GT(same, 0.5);
  EXPECT_GT(same, other);
  EXPECT_GT(other, 0.2) << "groups still share most heavy hitters";
}

}  // namespace
}  // namespace ckv::synth
