// bench/kernels_microbench.cc: Google Benchmark microbenchmarks of the selectors, gather and the
// reference attention, on qwen2.5-7b shapes (28 q heads, 4 kv heads, head dim 128, c = 16,
// fp16, w = 32) at 8K and 32K prefix tokens, one layer per iteration, on one core.
//
//   build/bench/kernels_microbench --benchmark_repetitions=5 --benchmark_filter='Quest|MeanKey'
//
// Counters: chunks/s (chunks scored per second) and, for gather, bytes/s of records read.
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
  state.counters["chunks/s"] = benchmark::Counter(
      static_cast<double>(layer.chunks), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Gather(benchmark::State& state) {
  const Layer& layer = LayerOf(state.range(0));
  const KvShape s = KvShape::Of(layer.spec);
  std::vector<uint32_t> chosen;
  for (uint32_t j = 0; j < layer.chunks; j += 10) chosen.push_back(j);  // a 10% budget
  for (auto _ : state) {
    auto kv = Gather(s, layer.record_ptr, chosen);
    benchmark::DoNotOptimize(kv->k.data());
  }
  state.counters["bytes/s"] = benchmark::Counter(static_cast<double>(chosen.size() * s.record_bytes()),
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_ReferenceAttention(benchmark::State& state) {
  const Layer& layer = LayerOf(state.range(0));
  const KvShape s = KvShape::Of(layer.spec);
  std::vector<uint32_t> chosen;
  for (uint32_t j = 0; j < layer.chunks; j += 10) chosen.push_back(j);
  const auto kv = *Gather(s, layer.record_ptr, chosen);
  for (auto _ : state) {
    auto out = ReferenceAttention(s, layer.queries, 32, kv);
    benchmark::DoNotOptimize(out->data());
  }
}

BENCHMARK_CAPTURE(BM_Select, Quest, SelectorKind::kQuest)->Arg(8192)->Arg(32768)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, MeanKey, SelectorKind::kMeanKey)->Arg(8192)->Arg(32768)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, PeriodExact, SelectorKind::kPeriodExact)->Arg(8192)->Arg(32768)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, Oracle, SelectorKind::kOracle)->Arg(8192)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, Impress, SelectorKind::kImpress)->Arg(8192)->Arg(32768)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, H2o, SelectorKind::kH2o)->Arg(8192)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gather)->Arg(8192)->Arg(32768)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReferenceAttention)->Arg(8192)->Arg(32768)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ckv::kernels

BENCHMARK_MAIN();
