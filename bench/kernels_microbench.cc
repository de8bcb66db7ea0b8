// SPDX-License-Identifier: Apache-2.0
// bench/kernels_microbench.cc: Google Benchmark microbenchmarks of every selector, gather and the
// reference attention, on qwen2.5-7b shapes (28 q heads, 4 kv heads, head dim 128, c = 16,
// fp16, w = 32) at 8K and 32K prefix tokens, one layer per iteration, on one core, from random
// records and the summaries Put would compute from them.
//
//   build/bench/kernels_microbench --benchmark_repetitions=5 --benchmark_filter='Quest|MeanKey'
//
// Counters: chunks/s (chunks scored, gathered or attended per second), bytes/s of records read
// by gather, flop/s of the reference attention.
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/attention.h"
#include "kernels/selector.h"
#include "kernels/summary.h"

namespace ckv::kernels {
namespace {

// One layer of a 7b prefix of `tokens` tokens: random records, their summaries, queries.
struct Layer {
  ModelSpec spec;
  size_t chunks = 0;
  std::vector<std::byte> records, minmax, mean;
  std::vector<const std::byte*> record_ptr, minmax_ptr, mean_ptr;
  std::vector<float> queries;

  explicit Layer(size_t tokens) {
    spec = *ModelSpec::Preset("qwen2.5-7b");
    chunks = tokens / spec.chunk_tokens;
    const KvShape s = KvShape::Of(spec);
    const SummaryFormat f = SummaryFormat::For(spec);
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal;
    std::vector<float> x(s.record_bytes() / 2);
    records.resize(chunks * s.record_bytes());
    minmax.resize(chunks * f.MinMaxBytes());
    mean.resize(chunks * f.MeanBytes());
    for (size_t j = 0; j < chunks; ++j) {
      for (float& v : x) v = normal(rng);
      std::byte* rec = records.data() + j * s.record_bytes();
      FromFloat(DType::kFp16, x.data(), x.size(), rec);
      record_ptr.push_back(rec);
      minmax_ptr.push_back(minmax.data() + j * f.MinMaxBytes());
      mean_ptr.push_back(mean.data() + j * f.MeanBytes());
      SummarizeChunkLayer(spec, 0, std::span(rec, s.half_record_bytes()),
                          std::span(minmax.data() + j * f.MinMaxBytes(), f.MinMaxBytes()),
                          std::span(mean.data() + j * f.MeanBytes(), f.MeanBytes()));
    }
    queries.resize(size_t{32} * s.q_heads * s.head_dim);
    for (float& v : queries) v = normal(rng);
  }

  SelectorInput Input() const {
    SelectorInput in;
    in.shape = KvShape::Of(spec);
    in.layers = spec.layers;
    in.layer = 0;
    in.queries = queries;
    in.window = 32;
    in.chunks = chunks;
    in.minmax = minmax_ptr;
    in.mean = mean_ptr;
    in.records = record_ptr;
    return in;
  }
};

const Layer& LayerOf(int64_t tokens) {
  static Layer l8k(8192), l32k(32768);
  return tokens == 8192 ? l8k : l32k;
}

// One selector on one layer of the prefix of state.range(0) tokens, at a 10% budget.
void BM_Select(benchmark::State& state, SelectorKind kind) {
  const Layer& layer = LayerOf(state.range(0));
  const SelectorInput in = layer.Input();
  SelectOptions o;
  for (auto _ : state) {
    auto sel = Select(kind, in, o);
    if (!sel.ok()) {
      state.SkipWithError(std::string(sel.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(sel->chunks.data());
  }
  state.counters["chunks/s"] = benchmark::Counter(static_cast<double>(layer.chunks),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

// Every state.range(1)-th chunk: a 1 / range(1) budget spread over the prefix.
std::vector<uint32_t> EveryNth(const Layer& layer, int64_t nth) {
  std::vector<uint32_t> chosen;
  for (size_t j = 0; j < layer.chunks; j += static_cast<size_t>(nth)) {
    chosen.push_back(static_cast<uint32_t>(j));
  }
  return chosen;
}

void BM_Gather(benchmark::State& state) {
  const Layer& layer = LayerOf(state.range(0));
  const KvShape s = KvShape::Of(layer.spec);
  const auto chosen = EveryNth(layer, state.range(1));
  for (auto _ : state) {
    auto kv = Gather(s, layer.record_ptr, chosen);
    if (!kv.ok()) {
      state.SkipWithError(std::string(kv.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(kv->k.data());
  }
  state.counters["bytes/s"] =
      benchmark::Counter(static_cast<double>(chosen.size() * s.record_bytes()),
                         benchmark::Counter::kIsIterationInvariantRate);
}

// Attention of the 32 queries over every state.range(1)-th chunk (1: the full KV).
void BM_ReferenceAttention(benchmark::State& state) {
  const Layer& layer = LayerOf(state.range(0));
  const KvShape s = KvShape::Of(layer.spec);
  const auto chosen = EveryNth(layer, state.range(1));
  const auto kv = Gather(s, layer.record_ptr, chosen);
  if (!kv.ok()) {
    state.SkipWithError(std::string(kv.status().message()).c_str());
    return;
  }
  for (auto _ : state) {
    auto out = ReferenceAttention(s, layer.queries, 32, *kv);
    if (!out.ok()) {
      state.SkipWithError(std::string(out.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(out->data());
  }
  state.counters["chunks/s"] = benchmark::Counter(static_cast<double>(chosen.size()),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  // Q K^T and P V: 2 FLOPs per multiply-add, w * q_heads * tokens * head_dim of each.
  state.counters["flop/s"] =
      benchmark::Counter(4.0 * 32 * s.q_heads * static_cast<double>(kv->tokens) * s.head_dim,
                         benchmark::Counter::kIsIterationInvariantRate);
}

#define CKV_SELECTOR_BENCHMARK(name, kind)               \
  BENCHMARK_CAPTURE(BM_Select, name, SelectorKind::kind) \
      ->ArgName("tokens")                                \
      ->Arg(8192)                                        \
      ->Arg(32768)                                       \
      ->Unit(benchmark::kMillisecond)

CKV_SELECTOR_BENCHMARK(Quest, kQuest);
CKV_SELECTOR_BENCHMARK(MeanKey, kMeanKey);
CKV_SELECTOR_BENCHMARK(PeriodExact, kPeriodExact);
CKV_SELECTOR_BENCHMARK(Oracle, kOracle);
CKV_SELECTOR_BENCHMARK(Impress, kImpress);
CKV_SELECTOR_BENCHMARK(H2o, kH2o);
BENCHMARK(BM_Gather)
    ->ArgNames({"tokens", "nth"})
    ->Args({8192, 10})
    ->Args({32768, 10})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReferenceAttention)
    ->ArgNames({"tokens", "nth"})
    ->Args({8192, 10})
    ->Args({8192, 1})
    ->Args({32768, 10})
    ->Args({32768, 1})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ckv::kernels

BENCHMARK_MAIN();
