// SPDX-License-Identifier: Apache-2.0
// put_bench: Put throughput of one large prefix into a fresh store, or of a long run of
// request-sized Puts into a full, capped store (--steady-state).
//
//   put_bench --store DIR [--model PRESET] [--tokens N] [--repeat R] [--json [PATH]]
//             [--dtype fp16|bf16|fp32] [--seed S] [--layout layer-major|period-major]
//             [--io-backend auto|uring|threads] [--direct-writes] [--keep] [--print-bytes]
//   put_bench --steady-state --store DIR [--model PRESET] [--tokens N] [--puts N]
//             [--cap-puts K] [--json [PATH]] [...]
//
// The KV is handed to Put in page-aligned tensors; with --direct-writes
// (EngineOptions::put_direct_writes) Put writes them straight from there instead of copying them
// into its staging buffers.
//
// Generates one synthetic prefix (tools/synthetic_kv.h; not timed), then R times: opens a fresh
// store in DIR/put-bench-<i> (removing the previous one first), times Engine::Put of the whole
// prefix (records written with O_DIRECT, fdatasync'd, catalog batch committed: everything a Put
// does before it returns), and closes the store. Nothing is dropped from caches: the data path
// uses O_DIRECT. Prints a table (GB, seconds, GB/s per repeat; median, min and max), or with
// --json one JSON object of the same in its place (--json PATH: in PATH, beside the table; see
// tools/cli.h). GB are 10^9 bytes, as fio counts them.
//
// --steady-state: request-sized Puts (default qwen2.5-0.5b, 4096
// tokens, each prefix new) back to back, first K into an uncapped store (the uncapped figure),
// then N into a store capped at K prefixes and a half, so that after the first K (warm-up) every
// Put evicts. Reports throughput median/min/max and latency p50/p99/max of the Puts after the
// warm-up, whether each of them evicted, and the store's own Put latency figures (EngineStats).
//
// bench/put_vs_fio.sh runs this program and fio back to back on the same filesystem.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/engine.h"
#include "ckv/kv.h"
#include "ckv/model_spec.h"
#include "ckv/options.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "tools/cli.h"
#include "tools/json_writer.h"
#include "tools/store_stats_json.h"
#include "tools/synthetic_kv.h"

namespace ckv::bench {
namespace {

constexpr int kExitError = cli::kExitError;

struct Flags {
  std::string store;
  std::string model;    // "" = qwen2.5-7b, or qwen2.5-0.5b with --steady-state
  uint64_t tokens = 0;  // 0 = 16384, or 4096 with --steady-state
  bool steady_state = false;
  bool direct_writes = false;
  std::optional<uint64_t> reclaim_margin;  // --steady-state: EngineOptions::reclaim_margin_bytes
  uint64_t puts = 48;                      // --steady-state: Puts into the capped store
  uint64_t cap_puts = 8;  // --steady-state: prefixes the cap holds (and warm-up Puts)
  uint64_t repeat = 3;
  uint64_t seed = 1;
  cli::JsonOutput json;
  DType dtype = DType::kFp16;
  RecordLayout layout = RecordLayout::kLayerMajor;
  IoBackend io_backend = IoBackend::kAuto;
  bool keep = false;
  double settle_seconds = 3;
  bool print_bytes = false;
};

int Usage(const std::string& message) { return cli::UsageError("put_bench", message); }

// Returns the exit code when the program should stop (help, version, a usage error).
std::optional<int> ParseFlags(int argc, char** argv, Flags* f) {
  CLI::App app{"Times Engine::Put of one synthetic prefix into a fresh store under DIR, R times.",
               "put_bench"};
  cli::Configure(app);
  app.add_option("--store", f->store,
                 "directory for the stores (DIR/put-bench-<i>; created if "
                 "missing)")
      ->type_name("DIR");
  app.add_option("--model", f->model,
                 "qwen2.5-0.5b, qwen2.5-7b (default; qwen2.5-0.5b with --steady-state), "
                 "qwen2.5-14b, qwen2.5-32b")
      ->type_name("PRESET");
  cli::AddUint(app, "--tokens", &f->tokens,
               "prefix length, a multiple of 16 (default 16384: ~0.94 GB for 7b; 4096 with "
               "--steady-state)");
  app.add_flag("--direct-writes", f->direct_writes,
               "EngineOptions::put_direct_writes: write the (page-aligned) K and V straight from "
               "the tensors with gathered writes instead of copying them into staging");
  cli::AddParsed(app, "--reclaim-margin",
                 "--steady-state: EngineOptions::reclaim_margin_bytes of the capped store (0 = no "
                 "background reclaimer: each Put evicts inline; default: the store's default)",
                 "BYTES", "a byte count", [f](const std::string& v) {
                   uint64_t bytes = 0;
                   if (!cli::ParseBytes(v, &bytes)) return false;
                   f->reclaim_margin = bytes;
                   return true;
                 });
  app.add_flag("--steady-state", f->steady_state,
               "time a long run of request-sized Puts into a capped, full store, where every "
               "Put after the warm-up evicts");
  cli::AddUint(app, "--puts", &f->puts,
               "--steady-state: Puts into the capped store, warm-up included (default 48)", "N");
  cli::AddUint(app, "--cap-puts", &f->cap_puts,
               "--steady-state: the cap holds K prefixes and a half; the first K Puts are the "
               "warm-up, and K Puts into an uncapped store give the uncapped figure (default 8)",
               "K");
  cli::AddUint(app, "--repeat", &f->repeat, "timed Puts, each into a fresh store (default 3)", "R");
  cli::AddJson(app, &f->json);
  cli::AddParsed(app, "--dtype", "fp16 (default), bf16, fp32", "T", "fp16, bf16 or fp32",
                 [f](const std::string& v) {
                   auto dtype = ParseDType(v);
                   if (dtype.ok()) f->dtype = *dtype;
                   return dtype.ok();
                 });
  cli::AddUint(app, "--seed", &f->seed, "seed of the prefix's tokens (default 1)", "S");
  cli::AddParsed(app, "--layout", "record layout of the stores (default layer-major)", "L",
                 "layer-major or period-major", [f](const std::string& v) {
                   if (v != "layer-major" && v != "period-major") return false;
                   f->layout =
                       v == "layer-major" ? RecordLayout::kLayerMajor : RecordLayout::kPeriodMajor;
                   return true;
                 });
  cli::AddParsed(app, "--io-backend", "auto (default), uring, threads", "B",
                 "auto, uring or threads", [f](const std::string& v) {
                   if (v == "auto")
                     f->io_backend = IoBackend::kAuto;
                   else if (v == "uring")
                     f->io_backend = IoBackend::kUring;
                   else if (v == "threads")
                     f->io_backend = IoBackend::kThreads;
                   else
                     return false;
                   return true;
                 });
  app.add_flag("--keep", f->keep, "keep the last store instead of removing it");
  cli::AddParsed(app, "--settle",
                 "seconds to wait (after a sync) between repeats, so that the discards of the "
                 "deleted previous store finish outside the timing (default 3)",
                 "S", "a number of seconds >= 0", [f](const std::string& v) {
                   return cli::ParseDouble(v, &f->settle_seconds) && f->settle_seconds >= 0;
                 });
  app.add_flag("--print-bytes", f->print_bytes,
               "print the KV bytes of the prefix and exit (for fio's --size)");
  return cli::Parse(app, argc, argv);
}

// The synthetic KV as the Put gets it: copied into page-aligned tensors, as a caller that lets Put
// write straight from its memory (EngineOptions::put_direct_writes) allocates them.
class BenchKv {
 public:
  explicit BenchKv(const synth::SyntheticKv& kv) : tensors_(kv.tensors()) {
    for (auto* side : {&tensors_.k, &tensors_.v}) {
      for (std::span<const std::byte>& t : *side) {
        const size_t rounded = (t.size() + 4095) / 4096 * 4096;
        std::byte* p =
            static_cast<std::byte*>(std::aligned_alloc(4096, std::max<size_t>(rounded, 4096)));
        CKV_CHECK(p != nullptr);  // a benchmark without memory for its input stops here
        memory_.emplace_back(p, &std::free);
        std::memcpy(p, t.data(), t.size());
        t = std::span<const std::byte>(p, t.size());
      }
    }
  }
  const KvTensors& tensors() const { return tensors_; }

 private:
  std::vector<std::unique_ptr<std::byte, void (*)(void*)>> memory_;
  KvTensors tensors_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Run {
  uint64_t bytes_written = 0;
  double seconds = 0;
  double gbps() const {
    return seconds > 0 ? static_cast<double>(bytes_written) / 1e9 / seconds : 0;
  }
};

// The options of a store each measurement creates afresh (it must not exist yet).
EngineOptions FreshStoreOptions(const Flags& f) {
  EngineOptions options;
  options.create_if_missing = true;
  options.error_if_exists = true;
  options.layout = f.layout;
  options.io_backend = f.io_backend;
  options.put_direct_writes = f.direct_writes;
  return options;
}

// R timed Puts of `tokens` into fresh stores under f.store (see the banner).
absl::StatusOr<std::vector<Run>> TimePuts(const Flags& f, const ModelSpec& spec,
                                          const std::vector<int32_t>& tokens, const BenchKv& kv) {
  std::error_code ec;
  std::vector<Run> runs;
  std::string previous;
  for (uint64_t i = 1; i <= f.repeat; ++i) {
    const std::string dir =
        (std::filesystem::path(f.store) / ("put-bench-" + std::to_string(i))).string();
    for (const std::string& stale : {previous, dir}) {
      if (stale.empty()) continue;
      std::filesystem::remove_all(stale, ec);
      if (ec) return ErrnoToStatus(ec.value(), "remove " + stale);
    }
    if (i > 1 && f.settle_seconds > 0) {
      // The previous store was just deleted: on a file system mounted with online discard its
      // freed blocks go to the device now. Let that finish outside the timed Put.
      ::sync();
      std::this_thread::sleep_for(std::chrono::duration<double>(f.settle_seconds));
    }
    EngineOptions options = FreshStoreOptions(f);
    Run run;
    {
      auto engine = Engine::Open(options, dir);
      if (!engine.ok()) {
        return absl::Status(engine.status().code(),
                            "open " + dir + ": " + engine.status().ToString());
      }
      const auto start = std::chrono::steady_clock::now();
      auto result = (*engine)->Put(spec, tokens, kv.tensors());
      run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!result.ok()) {
        return absl::Status(result.status().code(),
                            "put into " + dir + ": " + result.status().ToString());
      }
      run.bytes_written = result->bytes_written;
    }  // the store closes here, untimed
    std::fprintf(stderr, "put_bench: repeat %llu/%llu: %.3f GB in %.3f s = %.3f GB/s\n",
                 static_cast<unsigned long long>(i), static_cast<unsigned long long>(f.repeat),
                 static_cast<double>(run.bytes_written) / 1e9, run.seconds, run.gbps());
    runs.push_back(run);
    previous = dir;
  }
  if (!f.keep && !previous.empty()) {
    std::filesystem::remove_all(previous, ec);
    if (ec) {
      std::fprintf(stderr, "put_bench: remove %s: %s\n", previous.c_str(), ec.message().c_str());
    }
  }
  return runs;
}

struct Summary {
  double median = 0, min = 0, max = 0;  // GB/s
};

Summary Summarize(const std::vector<Run>& runs) {
  std::vector<double> gbps;
  for (const Run& r : runs) gbps.push_back(r.gbps());
  return {Median(gbps), *std::min_element(gbps.begin(), gbps.end()),
          *std::max_element(gbps.begin(), gbps.end())};
}

void PrintTable(const Flags& f, const ModelSpec& spec, uint64_t kv_bytes,
                const std::vector<Run>& runs, const Summary& s) {
  std::printf("Put of one prefix: %s, %llu tokens, %.3f GB of KV, store under %s\n",
              spec.DebugString().c_str(), static_cast<unsigned long long>(f.tokens),
              static_cast<double>(kv_bytes) / 1e9, f.store.c_str());
  std::printf("%-8s %10s %10s %10s\n", "repeat", "GB", "seconds", "GB/s");
  for (size_t i = 0; i < runs.size(); ++i) {
    std::printf("%-8zu %10.3f %10.3f %10.3f\n", i + 1,
                static_cast<double>(runs[i].bytes_written) / 1e9, runs[i].seconds, runs[i].gbps());
  }
  std::printf("median %.3f GB/s, min %.3f, max %.3f (spread %.1f%% of the median)\n", s.median,
              s.min, s.max, s.median > 0 ? 100.0 * (s.max - s.min) / s.median : 0.0);
}

std::string ResultJson(const Flags& f, const ModelSpec& spec, uint64_t kv_bytes,
                       const std::vector<Run>& runs, const Summary& s) {
  tools::JsonWriter w;
  w.BeginObject()
      .Key("benchmark")
      .String("put_bench")
      .Key("model")
      .String(f.model)
      .Key("spec")
      .String(spec.DebugString())
      .Key("dtype")
      .String(DTypeName(spec.dtype))
      .Key("layout")
      .String(f.layout == RecordLayout::kLayerMajor ? "layer-major" : "period-major")
      .Key("tokens")
      .Uint(f.tokens)
      .Key("direct_writes")
      .Bool(f.direct_writes)
      .Key("chunks")
      .Uint(f.tokens / spec.chunk_tokens)
      .Key("kv_bytes")
      .Uint(kv_bytes)
      .Key("store")
      .String(f.store)
      .Key("runs")
      .BeginArray();
  for (const Run& r : runs) {
    w.BeginObject()
        .Key("bytes_written")
        .Uint(r.bytes_written)
        .Key("seconds")
        .Double(r.seconds)
        .Key("gbps")
        .Double(r.gbps())
        .EndObject();
  }
  w.EndArray()
      .Key("median_gbps")
      .Double(s.median)
      .Key("min_gbps")
      .Double(s.min)
      .Key("max_gbps")
      .Double(s.max)
      .EndObject();
  return w.str();
}

// ---- --steady-state ----

// One timed Put of the steady-state run.
struct SteadyPut {
  uint64_t bytes_written = 0;
  double seconds = 0;
  uint64_t chunks_evicted = 0;  // by the store since the previous Put returned (inline + reclaimer)
  bool warmup = false;
  double gbps() const {
    return seconds > 0 ? static_cast<double>(bytes_written) / 1e9 / seconds : 0;
  }
};

struct SteadyPhase {
  std::vector<SteadyPut> puts;
  EngineStats stats;  // the store's, after the phase
};

// Nearest-rank percentile of `v` (pct in 0..100).
double Percentile(std::vector<double> v, double pct) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(pct / 100 * static_cast<double>(v.size())));
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

// Puts `count` new prefixes (tokens from seeds first_seed, first_seed + 1, ...; the same KV
// bytes each time: only the tokens name the chunks) back to back into a fresh store at `dir`.
absl::StatusOr<SteadyPhase> RunSteadyPhase(const Flags& f, const ModelSpec& spec, const BenchKv& kv,
                                           const std::string& dir, uint64_t count,
                                           uint64_t cap_bytes, uint64_t warmup) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), "remove " + dir);
  EngineOptions options = FreshStoreOptions(f);
  options.max_disk_bytes = cap_bytes;
  if (cap_bytes > 0) options.reclaim_margin_bytes = f.reclaim_margin;
  auto engine = Engine::Open(options, dir);
  if (!engine.ok()) {
    return absl::Status(engine.status().code(), "open " + dir + ": " + engine.status().ToString());
  }
  SteadyPhase phase;
  uint64_t evicted_before = (*engine)->Stats().chunks_evicted;
  for (uint64_t i = 0; i < count; ++i) {
    const std::vector<int32_t> tokens = synth::Tokens(f.seed + 1000 + i, f.tokens);
    const auto start = std::chrono::steady_clock::now();
    auto result = (*engine)->Put(spec, tokens, kv.tensors());
    SteadyPut put;
    put.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!result.ok()) {
      return absl::Status(result.status().code(), "put " + std::to_string(i + 1) + " into " + dir +
                                                      ": " + result.status().ToString());
    }
    put.bytes_written = result->bytes_written;
    // Evictions since the previous Put returned: this Put's inline ones and the background
    // reclaimer's (counted in the store's chunks_evicted too).
    const uint64_t evicted = (*engine)->Stats().chunks_evicted;
    put.chunks_evicted = evicted - evicted_before;
    evicted_before = evicted;
    put.warmup = i < warmup;
    phase.puts.push_back(put);
  }
  phase.stats = (*engine)->Stats();
  return phase;
}

struct SteadySummary {
  Summary gbps;  // of the Puts after the warm-up
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  uint64_t measured = 0;  // Puts after the warm-up
  uint64_t evicting = 0;  // of which evicted
  Summary uncapped_gbps;
  double uncapped_p50_ms = 0;
};

SteadySummary SummarizeSteady(const SteadyPhase& capped, const SteadyPhase& uncapped) {
  SteadySummary s;
  std::vector<Run> runs, free_runs;
  std::vector<double> ms, free_ms;
  for (const SteadyPut& p : capped.puts) {
    if (p.warmup) continue;
    runs.push_back(Run{p.bytes_written, p.seconds});
    ms.push_back(p.seconds * 1e3);
    ++s.measured;
    if (p.chunks_evicted > 0) ++s.evicting;
  }
  for (const SteadyPut& p : uncapped.puts) {
    free_runs.push_back(Run{p.bytes_written, p.seconds});
    free_ms.push_back(p.seconds * 1e3);
  }
  if (!runs.empty()) s.gbps = Summarize(runs);
  if (!free_runs.empty()) s.uncapped_gbps = Summarize(free_runs);
  s.p50_ms = Percentile(ms, 50);
  s.p99_ms = Percentile(ms, 99);
  s.max_ms = Percentile(ms, 100);
  s.uncapped_p50_ms = Percentile(free_ms, 50);
  return s;
}

void PrintSteady(const Flags& f, const ModelSpec& spec, uint64_t cap_bytes, const SteadySummary& s,
                 const EngineStats& st) {
  std::printf(
      "Put at steady state: %s, %llu tokens a Put, %llu Puts (%llu warm-up) into a store "
      "capped at %.3f GB, under %s\n",
      spec.DebugString().c_str(), static_cast<unsigned long long>(f.tokens),
      static_cast<unsigned long long>(f.puts), static_cast<unsigned long long>(f.cap_puts),
      static_cast<double>(cap_bytes) / 1e9, f.store.c_str());
  std::printf(
      "capped    median %.3f GB/s, min %.3f, max %.3f; latency p50 %.1f ms, p99 %.1f ms, "
      "max %.1f ms; %llu of %llu Puts evicted\n",
      s.gbps.median, s.gbps.min, s.gbps.max, s.p50_ms, s.p99_ms, s.max_ms,
      static_cast<unsigned long long>(s.evicting), static_cast<unsigned long long>(s.measured));
  std::printf("uncapped  median %.3f GB/s, min %.3f, max %.3f; latency p50 %.1f ms (%llu Puts)\n",
              s.uncapped_gbps.median, s.uncapped_gbps.min, s.uncapped_gbps.max, s.uncapped_p50_ms,
              static_cast<unsigned long long>(f.cap_puts));
  std::printf(
      "store     put latency p50 %.1f ms, p99 %.1f ms, max %.1f ms over %llu Puts; "
      "%llu waited for staging\n",
      static_cast<double>(st.put_latency_p50_us) / 1e3,
      static_cast<double>(st.put_latency_p99_us) / 1e3,
      static_cast<double>(st.put_latency_max_us) / 1e3,
      static_cast<unsigned long long>(st.put_latency_window),
      static_cast<unsigned long long>(st.put_staging_waits));
}

std::string SteadyJson(const Flags& f, const ModelSpec& spec, uint64_t kv_bytes, uint64_t cap_bytes,
                       const SteadyPhase& capped, const SteadySummary& s) {
  const EngineStats& st = capped.stats;
  tools::JsonWriter w;
  w.BeginObject()
      .Key("benchmark")
      .String("put_bench")
      .Key("mode")
      .String("steady-state")
      .Key("model")
      .String(f.model)
      .Key("spec")
      .String(spec.DebugString())
      .Key("tokens")
      .Uint(f.tokens)
      .Key("direct_writes")
      .Bool(f.direct_writes)
      .Key("kv_bytes")
      .Uint(kv_bytes)
      .Key("store")
      .String(f.store)
      .Key("puts")
      .Uint(f.puts)
      .Key("warmup_puts")
      .Uint(f.cap_puts)
      .Key("cap_bytes")
      .Uint(cap_bytes)
      .Key("runs")
      .BeginArray();
  for (const SteadyPut& p : capped.puts) {
    w.BeginObject()
        .Key("warmup")
        .Bool(p.warmup)
        .Key("bytes_written")
        .Uint(p.bytes_written)
        .Key("seconds")
        .Double(p.seconds)
        .Key("gbps")
        .Double(p.gbps())
        .Key("chunks_evicted")
        .Uint(p.chunks_evicted)
        .EndObject();
  }
  w.EndArray()
      .Key("measured_puts")
      .Uint(s.measured)
      .Key("puts_evicting")
      .Uint(s.evicting)
      .Key("every_put_evicted")
      .Bool(s.measured > 0 && s.evicting == s.measured)
      .Key("median_gbps")
      .Double(s.gbps.median)
      .Key("min_gbps")
      .Double(s.gbps.min)
      .Key("max_gbps")
      .Double(s.gbps.max)
      .Key("latency_p50_ms")
      .Double(s.p50_ms)
      .Key("latency_p99_ms")
      .Double(s.p99_ms)
      .Key("latency_max_ms")
      .Double(s.max_ms)
      .Key("uncapped")
      .BeginObject()
      .Key("puts")
      .Uint(f.cap_puts)
      .Key("median_gbps")
      .Double(s.uncapped_gbps.median)
      .Key("min_gbps")
      .Double(s.uncapped_gbps.min)
      .Key("max_gbps")
      .Double(s.uncapped_gbps.max)
      .Key("latency_p50_ms")
      .Double(s.uncapped_p50_ms)
      .EndObject()
      .Key("store_stats")
      .BeginObject();
  tools::WriteStoreStatsMembers(w, st);
  w.EndObject().EndObject();
  return w.str();
}

// --steady-state (see the banner). The uncapped phase runs first: it also measures the disk
// bytes one prefix takes (records, padding and summaries), which sizes the cap.
int RunSteadyState(const Flags& f, const ModelSpec& spec, uint64_t kv_bytes) {
  std::fprintf(stderr, "put_bench: generating %s, %llu tokens (%.3f GB of KV)...\n",
               spec.DebugString().c_str(), static_cast<unsigned long long>(f.tokens),
               static_cast<double>(kv_bytes) / 1e9);
  const synth::SyntheticKv generated(spec, synth::Tokens(f.seed, f.tokens));
  const BenchKv kv(generated);
  const std::string free_dir = (std::filesystem::path(f.store) / "put-bench-uncapped").string();
  const std::string capped_dir = (std::filesystem::path(f.store) / "put-bench-capped").string();
  auto uncapped = RunSteadyPhase(f, spec, kv, free_dir, f.cap_puts, 0, 0);
  std::error_code ec;
  if (uncapped.ok()) std::filesystem::remove_all(free_dir, ec);
  if (!uncapped.ok()) {
    std::fprintf(stderr, "put_bench: %s\n", uncapped.status().ToString().c_str());
    return kExitError;
  }
  const uint64_t per_put = uncapped->stats.disk_bytes_used / f.cap_puts;
  // K prefixes and a half, plus the store's allowance for segment metadata (DataCapLocked).
  const uint64_t cap_bytes = (f.cap_puts * per_put + per_put / 2) / 256 * 257 + (4 << 12);
  ::sync();
  auto capped = RunSteadyPhase(f, spec, kv, capped_dir, f.puts, cap_bytes, f.cap_puts);
  if (!f.keep) std::filesystem::remove_all(capped_dir, ec);
  if (!capped.ok()) {
    std::fprintf(stderr, "put_bench: %s\n", capped.status().ToString().c_str());
    return kExitError;
  }
  const SteadySummary s = SummarizeSteady(*capped, *uncapped);
  if (!f.json.ToStdout()) PrintSteady(f, spec, cap_bytes, s, capped->stats);
  if (f.json.enabled) {
    if (absl::Status st = f.json.Write(SteadyJson(f, spec, kv_bytes, cap_bytes, *capped, s));
        !st.ok()) {
      std::fprintf(stderr, "put_bench: %s\n", st.ToString().c_str());
      return kExitError;
    }
  }
  // With the background reclaimer, eviction runs between Puts as well as in them: an interval
  // without any is reported, not an error.
  if (s.evicting != s.measured && f.reclaim_margin == uint64_t{0}) {
    std::fprintf(stderr, "put_bench: only %llu of the %llu Puts after the warm-up evicted\n",
                 static_cast<unsigned long long>(s.evicting),
                 static_cast<unsigned long long>(s.measured));
    return kExitError;
  }
  return 0;
}

int Main(int argc, char** argv) {
  Flags f;
  if (const std::optional<int> exit = ParseFlags(argc, argv, &f)) return *exit;
  if (f.model.empty()) f.model = f.steady_state ? "qwen2.5-0.5b" : "qwen2.5-7b";
  if (f.tokens == 0) f.tokens = f.steady_state ? 4096 : 16384;
  auto spec_or = ModelSpec::Preset(f.model, f.dtype);
  if (!spec_or.ok()) return Usage(std::string(spec_or.status().message()));
  const ModelSpec spec = *spec_or;
  if (f.tokens == 0 || f.tokens % spec.chunk_tokens != 0) {
    return Usage("--tokens: " + std::to_string(f.tokens) + " is not a positive multiple of " +
                 std::to_string(spec.chunk_tokens));
  }
  if (f.tokens > (uint64_t{1} << 40) / spec.KvBytesPerToken()) {
    return Usage("--tokens: " + std::to_string(f.tokens) + " tokens would need more than 1 TiB");
  }
  const uint64_t kv_bytes = f.tokens * spec.KvBytesPerToken();
  if (f.print_bytes) {
    std::printf("%llu\n", static_cast<unsigned long long>(kv_bytes));
    return 0;
  }
  if (f.store.empty()) return Usage("--store DIR is required");
  if (f.repeat == 0 || f.repeat > 1000) return Usage("--repeat must be in 1..1000");
  if (f.steady_state && (f.cap_puts == 0 || f.puts <= f.cap_puts || f.puts > 100000)) {
    return Usage("--puts " + std::to_string(f.puts) + " --cap-puts " + std::to_string(f.cap_puts) +
                 ": need 1 <= K < N <= 100000");
  }

  std::error_code ec;
  std::filesystem::create_directories(f.store, ec);
  if (ec) {
    std::fprintf(stderr, "put_bench: create %s: %s\n", f.store.c_str(), ec.message().c_str());
    return kExitError;
  }
  if (f.steady_state) return RunSteadyState(f, spec, kv_bytes);

  std::fprintf(stderr, "put_bench: generating %s, %llu tokens (%.3f GB of KV)...\n",
               spec.DebugString().c_str(), static_cast<unsigned long long>(f.tokens),
               static_cast<double>(kv_bytes) / 1e9);
  const std::vector<int32_t> tokens = synth::Tokens(f.seed, f.tokens);
  const synth::SyntheticKv generated(spec, tokens);
  const BenchKv kv(generated);
  const absl::StatusOr<std::vector<Run>> runs = TimePuts(f, spec, tokens, kv);
  if (!runs.ok()) {
    std::fprintf(stderr, "put_bench: %s\n", std::string(runs.status().message()).c_str());
    return kExitError;
  }
  const Summary summary = Summarize(*runs);
  if (!f.json.ToStdout()) PrintTable(f, spec, kv_bytes, *runs, summary);
  if (f.json.enabled) {
    if (absl::Status s = f.json.Write(ResultJson(f, spec, kv_bytes, *runs, summary)); !s.ok()) {
      std::fprintf(stderr, "put_bench: %s\n", s.ToString().c_str());
      return kExitError;
    }
  }
  return 0;
}

}  // namespace
}  // namespace ckv::bench

int main(int argc, char** argv) { return ckv::bench::Main(argc, argv); }
