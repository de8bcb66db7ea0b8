// SPDX-License-Identifier: Apache-2.0
// reclaim_bench: what eviction costs a Put under a full cap, inline and with the background
// reclaimer (storage/chunk_store_reclaim.cc).
//
//   reclaim_bench --store DIR [--chunks N] [--chunks-per-put C] [--puts P] [--margin BYTES]
//
// For each mode (inline: reclaim_margin_bytes = 0; background: the given or default margin) it
// fills a fresh store DIR/reclaim-bench-<mode> to a cap of N chunks of a small model (2 layers,
// 1 KV head of 64, 16-token chunks: 4 KiB records) with Puts of C new chunks, then times P more
// Puts of C new chunks each, every one of which needs room. Prints one row per mode: Put
// latency (p50, p99, max), the Puts that evicted inline, the reclaimer's rounds and chunks.
// The stores are removed afterwards.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "ckv/engine.h"
#include "ckv/model_spec.h"
#include "ckv/options.h"
#include "tools/cli.h"
#include "tools/synthetic_kv.h"

namespace ckv {
namespace {

struct Flags {
  std::string store;
  uint64_t chunks = 100000;
  uint64_t chunks_per_put = 64;
  uint64_t puts = 200;
  uint64_t margin = 0;  // 0: the engine's default
};

ModelSpec BenchSpec() {
  ModelSpec spec;
  spec.model_id = "reclaim-bench-model";
  spec.layers = 2;
  spec.q_heads = 1;
  spec.kv_heads = 1;
  spec.head_dim = 64;
  spec.dtype = DType::kFp16;
  spec.chunk_tokens = 16;
  return spec;
}

struct Row {
  std::string mode;
  uint64_t chunks = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  uint64_t inline_evictions = 0, reclaim_rounds = 0, reclaim_chunks = 0, margin = 0;
};

// Puts prefix `seed` of `chunks` new chunks; returns its latency in ms, or < 0 on error.
double TimedPut(Engine& engine, const ModelSpec& spec, uint64_t seed, uint64_t chunks) {
  const auto tokens = synth::Tokens(seed, chunks * spec.chunk_tokens);
  synth::SyntheticKv kv(spec, tokens);
  const auto start = std::chrono::steady_clock::now();
  auto put = engine.Put(spec, tokens, kv.tensors());
  const auto end = std::chrono::steady_clock::now();
  if (!put.ok()) {
    std::fprintf(stderr, "reclaim_bench: Put of prefix %llu: %s\n",
                 static_cast<unsigned long long>(seed), put.status().ToString().c_str());
    return -1;
  }
  return std::chrono::duration<double, std::milli>(end - start).count();
}

int RunMode(const Flags& f, bool background, Row* row) {
  const ModelSpec spec = BenchSpec();
  const std::string dir =
      f.store + (background ? "/reclaim-bench-background" : "/reclaim-bench-inline");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  // One chunk's bytes: measured from a probe store (records and key summaries, 4 KiB slots).
  uint64_t chunk_bytes = 0;
  {
    auto probe = Engine::Open(EngineOptions{}, dir + "-probe");
    if (!probe.ok() || TimedPut(**probe, spec, 1, 1) < 0) return cli::kExitError;
    chunk_bytes = (*probe)->Stats().disk_bytes_used;
  }
  std::filesystem::remove_all(dir + "-probe", ec);
  EngineOptions options;
  options.max_disk_bytes = f.chunks * chunk_bytes / 256 * 257 + (64 << 10);
  options.reclaim_margin_bytes = background
                                     ? (f.margin > 0 ? std::optional(f.margin) : std::nullopt)
                                     : std::optional<uint64_t>(0);
  auto engine = Engine::Open(options, dir);
  if (!engine.ok()) {
    std::fprintf(stderr, "reclaim_bench: open %s: %s\n", dir.c_str(),
                 engine.status().ToString().c_str());
    return cli::kExitError;
  }
  uint64_t seed = 1000;
  for (uint64_t stored = 0; stored < f.chunks; stored += f.chunks_per_put) {
    if (TimedPut(**engine, spec, seed++, f.chunks_per_put) < 0) return cli::kExitError;
  }
  const EngineStats before = (*engine)->Stats();
  std::vector<double> ms;
  for (uint64_t i = 0; i < f.puts; ++i) {
    const double t = TimedPut(**engine, spec, seed++, f.chunks_per_put);
    if (t < 0) return cli::kExitError;
    ms.push_back(t);
  }
  const EngineStats after = (*engine)->Stats();
  std::sort(ms.begin(), ms.end());
  row->mode = background ? "background" : "inline";
  row->chunks = after.chunks;
  row->p50_ms = ms[ms.size() / 2];
  row->p99_ms = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  row->max_ms = ms.back();
  row->inline_evictions = after.inline_evictions - before.inline_evictions;
  row->reclaim_rounds = after.reclaim_rounds - before.reclaim_rounds;
  row->reclaim_chunks = after.reclaim_chunks - before.reclaim_chunks;
  row->margin = after.reclaim_margin_bytes;
  engine->reset();
  std::filesystem::remove_all(dir, ec);
  return cli::kExitOk;
}

}  // namespace
}  // namespace ckv

int main(int argc, char** argv) {
  using namespace ckv;
  Flags f;
  CLI::App app{
      "Times Puts under a full cap with inline eviction and with the background "
      "reclaimer.",
      "reclaim_bench"};
  cli::Configure(app);
  app.add_option("--store", f.store, "directory for the stores (created if missing)")
      ->type_name("DIR")
      ->required();
  cli::AddUint(app, "--chunks", &f.chunks, "chunks the cap holds (default 100000)");
  cli::AddUint(app, "--chunks-per-put", &f.chunks_per_put, "new chunks per Put (default 64)");
  cli::AddUint(app, "--puts", &f.puts, "timed Puts per mode (default 200)");
  cli::AddBytes(app, "--margin", &f.margin,
                "reclaim margin of the background mode (default: "
                "the engine's, max(64 MiB, 5% of the cap) <= cap/8)");
  if (auto code = cli::Parse(app, argc, argv)) return *code;
  if (f.chunks == 0 || f.chunks_per_put == 0 || f.puts == 0) {
    return cli::UsageError("reclaim_bench", "--chunks, --chunks-per-put and --puts must be > 0");
  }
  std::filesystem::create_directories(f.store);
  std::printf("%-10s %9s %10s %10s %10s %8s %8s %9s %12s\n", "mode", "chunks", "p50 ms", "p99 ms",
              "max ms", "inline", "rounds", "reclaimed", "margin B");
  for (bool background : {false, true}) {
    Row row;
    if (int code = RunMode(f, background, &row); code != cli::kExitOk) return code;
    std::printf("%-10s %9llu %10.2f %10.2f %10.2f %8llu %8llu %9llu %12llu\n", row.mode.c_str(),
                static_cast<unsigned long long>(row.chunks), row.p50_ms, row.p99_ms, row.max_ms,
                static_cast<unsigned long long>(row.inline_evictions),
                static_cast<unsigned long long>(row.reclaim_rounds),
                static_cast<unsigned long long>(row.reclaim_chunks),
                static_cast<unsigned long long>(row.margin));
  }
  return cli::kExitOk;
}
