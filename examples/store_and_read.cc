// SPDX-License-Identifier: Apache-2.0
// examples/store_and_read.cc: store a prefix's KV cache, look it up, read a record back.
//   store_and_read [STORE]   (default /tmp/ckv-example-store)
#include <cstdio>
#include <vector>

#include "ckv/engine.h"
#include "example_kv.h"  // stand-in for a model's tokens and KV

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "/tmp/ckv-example-store";
  // Open (or create) a store capped at 64 GiB.
  ckv::EngineOptions options;
  options.max_disk_bytes = 64ull << 30;
  // A store thread keeps this much free under the cap by evicting ahead of need, so Puts rarely
  // evict inline (default max(64 MiB, 5% of the cap); 0 = evict inline only).
  options.reclaim_margin_bytes = 1ull << 30;
  auto engine = ckv::Engine::Open(options, path);
  if (!engine.ok()) {
    std::fprintf(stderr, "open: %s\n", engine.status().ToString().c_str());
    return 1;
  }

  // The shape of the model's KV cache; the model id binds the data to these weights.
  ckv::ModelSpec spec = ckv::ModelSpec::Preset("qwen2.5-7b").value();
  spec.model_id = "Qwen/Qwen2.5-7B-Instruct";

  // A 4096-token prefix and its KV: per layer, K and V as [tokens, kv_heads, head_dim].
  std::vector<int32_t> tokens = example::Tokens(/*seed=*/1, 4096);
  example::Kv kv(spec, tokens.size(), /*seed=*/1);

  // Persist it: whole chunks of 16 tokens, durable before the call returns.
  auto put = (*engine)->Put(spec, tokens, kv.tensors());
  if (!put.ok()) {
    std::fprintf(stderr, "put: %s\n", put.status().ToString().c_str());
    return 1;
  }
  std::printf("wrote %llu chunks, %llu already stored\n",
              static_cast<unsigned long long>(put->chunks_written),
              static_cast<unsigned long long>(put->chunks_existing));

  // A later request: how many leading chunks of its prompt are stored?
  uint64_t stored = (*engine)->Lookup(spec, tokens).value();

  // Read chunk 0's record at layer 3 (K then V), checksum verified.
  std::vector<ckv::ChunkKey> keys =
      ckv::ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  std::vector<std::byte> record(spec.RecordBytes());
  absl::Status read = (*engine)->ReadRecord(spec, keys[0], /*layer=*/3, record);
  std::printf("%llu chunks stored; read: %s\n", static_cast<unsigned long long>(stored),
              read.ToString().c_str());
  return read.ok() ? 0 : 1;
}
