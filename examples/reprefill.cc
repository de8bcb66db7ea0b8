// SPDX-License-Identifier: Apache-2.0
// examples/reprefill.cc: a request that reuses a stored prefix loads only its important chunks,
// layer by layer.
//   reprefill [STORE]   (default /tmp/ckv-example-store)
#include <cstdio>
#include <vector>

#include "ckv/engine.h"
#include "example_kv.h"  // stand-in for a model's tokens, KV and queries

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "/tmp/ckv-example-store";
  ckv::EngineOptions options;
  options.gpu_tier_bytes = 2ull << 30;  // device memory on a GPU machine, host memory otherwise
  options.cpu_tier_bytes = 8ull << 30;
  auto engine = ckv::Engine::Open(options, path);
  if (!engine.ok()) return 1;
  ckv::ModelSpec spec = ckv::ModelSpec::Preset("qwen2.5-7b").value();
  std::vector<int32_t> prefix = example::Tokens(/*seed=*/1, 4096);
  example::Kv kv(spec, prefix.size(), /*seed=*/1);
  if (!(*engine)->Put(spec, prefix, kv.tensors()).ok()) return 1;

  // A new request: the stored prefix plus a question.
  std::vector<int32_t> prompt = prefix;
  for (int32_t t : example::Tokens(/*seed=*/2, 64)) prompt.push_back(t);
  ckv::ReprefillOptions ro;
  ro.selector = ckv::Selector::kQuest;  // or kPeriodExact (published), kMeanKey, kOutlierKey
  ro.budget_fraction = 0.05;            // load 5% of the chunks per layer
  auto session = (*engine)->BeginReprefill(spec, prompt, ro);
  if (!session.ok()) return 1;
  for (uint32_t layer = 0; layer < spec.layers; ++layer) {
    // This layer's queries for the suffix's last `window` tokens, from the model.
    std::vector<float> queries =
        example::Queries(layer, size_t{ro.window} * spec.q_heads * spec.head_dim);
    if (!(*session)->SubmitQueries(layer, queries).ok()) return 1;
    auto view = (*session)->AwaitLayer(layer);  // the selected chunks' K/V, pinned
    if (!view.ok()) return 1;
    // ... attention over view->records(): each is K [16, kv_heads, head_dim] then V (a spec
    // with a codec hands out its stored bytes: ckv::DecodeRecord, or on the GPU
    // kernels::cuda::DecodeRecords, makes them K and V again) ...
  }
  auto stats = (*session)->Finish();  // adds this request's attention to I, its loads to F
  if (!stats.ok()) return 1;
  std::printf("%llu chunks matched, %llu records served, read amplification %.2f\n",
              static_cast<unsigned long long>(stats->matched_chunks),
              static_cast<unsigned long long>(stats->records_served), stats->read_amplification());
  return 0;
}
