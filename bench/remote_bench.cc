// SPDX-License-Identifier: Apache-2.0
// remote_bench: the remote tier on a Redis Cluster (docs/remote.md), measured.
//
//   remote_bench --remote HOST:PORT --dir DIR [--model PRESET] [--tokens N] [--budget F]
//                [--selector NAME] [--runs R] [--depth P] [--seconds S]
//                [--redis-benchmark PATH] [--json [PATH]]
//
// 1. Re-Prefill from a cold local store, served from the cluster, against the same Re-Prefill
//    from the local NVMe. Engine A (DIR/a, remote tier on) stores a prefix of N tokens and
//    publishes it. Then, R times each: a Re-Prefill of the prefix on A (every layer, synthetic
//    queries, budget F, selector NAME (default period-exact): records read from NVMe with
//    O_DIRECT, no tiers), and the same Re-Prefill on a fresh engine with an empty store
//    (DIR/cold-<r>, remote tier on). With period-exact (or oracle, or budget 1) the cold engine
//    first fetches every chunk from the cluster, verifies it and stores it (a Lookup, timed as
//    the fill) before the session starts; with quest or mean-key below budget 1 the session reads
//    the chunks' heads and then only the records it selects from the cluster (docs/remote.md),
//    and the fill of the whole prefix it queues at Finish runs after the timing, waited for
//    before the next run. Medians are printed, with the cold one split into the fill and the
//    session, and the bytes the cold run took from the cluster before its session ended.
// 2. GET throughput of the tier's client against redis-benchmark, on the same cluster, with the
//    same value size (one chunk's value: remote::ChunkValueBytes of the model) and pipeline depth
//    P, in the same run. The client runs calls of P x masters keys from one thread (one
//    pipeline of about P GETs per master, the masters in parallel), over 256 keys it SET first:
//    MultiGetInto for S seconds (each value read into the string the last call left, as a
//    caller that reads repeatedly would use it), then MultiGet for S seconds (a fresh string
//    per value, freed by the caller). redis-benchmark runs
//    `--cluster -t get -d SIZE -P P -c MASTERS -r 256`, one connection per master, after
//    `-t set` filled the same key space. The ratios are the client's GET/s (each way) over
//    redis-benchmark's. Skipped, saying so, when redis-benchmark is not found.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ckv/engine.h"
#include "ckv/model_spec.h"
#include "ckv/options.h"
#include "engine/internal.h"
#include "remote/chunk_value.h"
#include "remote/cluster_client.h"
#include "tools/cli.h"
#include "tools/json_writer.h"
#include "tools/synthetic_kv.h"

namespace ckv {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string remote;
  std::string dir;
  std::string model = "qwen2.5-0.5b";
  uint64_t tokens = 4096;
  double budget = 0.1;
  std::string selector = "period-exact";
  uint64_t runs = 3;
  uint64_t depth = 16;
  double seconds = 3;
  std::string redis_benchmark = "redis-benchmark";
  cli::JsonOutput json;
};

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One whole Re-Prefill session over `tokens`; its seconds, or < 0 on error (printed).
double TimedReprefill(Engine& engine, const ModelSpec& spec, const std::vector<int32_t>& tokens,
                      double budget, Selector selector, uint64_t* matched) {
  ReprefillOptions o;
  o.budget_fraction = budget;
  o.selector = selector;
  std::vector<float> queries(size_t{o.window} * spec.q_heads * spec.head_dim, 0.5f);
  const auto start = Clock::now();
  auto session = engine.BeginReprefill(spec, tokens, o);
  if (!session.ok()) {
    std::fprintf(stderr, "remote_bench: BeginReprefill: %s\n", session.status().ToString().c_str());
    return -1;
  }
  *matched = (*session)->matched_chunks();
  for (uint32_t l = 0; l < spec.layers; ++l) {
    absl::Status s = (*session)->SubmitQueries(l, queries);
    auto view = s.ok() ? (*session)->AwaitLayer(l) : absl::StatusOr<LayerView>(s);
    if (!view.ok()) {
      std::fprintf(stderr, "remote_bench: layer %u: %s\n", l, view.status().ToString().c_str());
      return -1;
    }
  }
  if (auto st = (*session)->Finish(); !st.ok()) return -1;
  return Since(start);
}

struct ReprefillFigures {
  uint64_t chunks = 0;
  double local_s = 0;      // median Re-Prefill on the store that holds the prefix
  double cold_s = 0;       // median Re-Prefill on an empty store, filled from the cluster
  double cold_fill_s = 0;  // of which the fill (a Lookup that fetches and stores)
  double cold_session_s = 0;
  uint64_t fetched_bytes = 0;  // per cold run, from the cluster before its session ended
  bool selecting = false;      // the cold session read only its selection from the cluster
};

int MeasureReprefill(const Flags& f, const ModelSpec& spec, ReprefillFigures* out) {
  EngineOptions eo;
  eo.remote.seeds = {f.remote};
  eo.remote.key_prefix = absl::StrCat("remote-bench-", ::getpid());
  eo.remote.call_timeout_ms = 10000;  // large fetches on a busy machine: measure, not miss
  eo.remote.publish_queue_chunks = 1'000'000;
  const std::vector<int32_t> tokens = synth::Tokens(4242, f.tokens);
  auto a = Engine::Open(eo, f.dir + "/a");
  if (!a.ok()) {
    std::fprintf(stderr, "remote_bench: open %s/a: %s\n", f.dir.c_str(),
                 a.status().ToString().c_str());
    return cli::kExitError;
  }
  {
    synth::SyntheticKv kv(spec, tokens);
    auto put = (*a)->Put(spec, tokens, kv.tensors());
    if (!put.ok()) {
      std::fprintf(stderr, "remote_bench: put: %s\n", put.status().ToString().c_str());
      return cli::kExitError;
    }
    out->chunks = put->chunks;
  }
  if (!engine::WaitUntilRemotePublished(**a, absl::Seconds(300)) ||
      (*a)->Stats().remote_published_chunks != out->chunks) {
    std::fprintf(stderr, "remote_bench: published %llu of %llu chunks\n",
                 static_cast<unsigned long long>((*a)->Stats().remote_published_chunks),
                 static_cast<unsigned long long>(out->chunks));
    return cli::kExitError;
  }
  const Selector selector = *ParseSelector(f.selector);  // checked by main
  out->selecting =
      (selector == Selector::kQuest || selector == Selector::kMeanKey) && f.budget < 1.0;
  std::vector<double> local, cold, fill, session;
  for (uint64_t r = 0; r < f.runs; ++r) {
    uint64_t matched = 0;
    const double t = TimedReprefill(**a, spec, tokens, f.budget, selector, &matched);
    if (t < 0 || matched != out->chunks) return cli::kExitError;
    local.push_back(t);

    const std::string cold_dir = absl::StrCat(f.dir, "/cold-", r);
    std::error_code ec;
    std::filesystem::remove_all(cold_dir, ec);
    auto b = Engine::Open(eo, cold_dir);
    if (!b.ok()) return cli::kExitError;
    double fill_s = 0;
    if (!out->selecting) {
      const auto start = Clock::now();
      auto found = (*b)->Lookup(spec, tokens);  // the fill: fetch, verify, store
      fill_s = Since(start);
      if (!found.ok() || *found != out->chunks) {
        std::fprintf(stderr, "remote_bench: cold fill found %llu of %llu chunks\n",
                     static_cast<unsigned long long>(found.ok() ? *found : 0),
                     static_cast<unsigned long long>(out->chunks));
        return cli::kExitError;
      }
    }
    const double session_s = TimedReprefill(**b, spec, tokens, f.budget, selector, &matched);
    if (session_s < 0) return cli::kExitError;
    if (matched != out->chunks) {
      std::fprintf(stderr, "remote_bench: the cold session matched %llu of %llu chunks\n",
                   static_cast<unsigned long long>(matched),
                   static_cast<unsigned long long>(out->chunks));
      return cli::kExitError;
    }
    fill.push_back(fill_s);
    session.push_back(session_s);
    cold.push_back(fill_s + session_s);
    const EngineStats st = (*b)->Stats();
    out->fetched_bytes = out->selecting
                             ? st.remote_head_chunks * remote::LayoutOfChunkValue(spec).head_bytes +
                                   st.remote_session_record_bytes
                             : st.remote_fetched_bytes;
    // The fill a selecting session queued at Finish: done before the next run is timed.
    if (!engine::WaitUntilRemotePublished(**b, absl::Seconds(300))) return cli::kExitError;
    b->reset();
    std::filesystem::remove_all(cold_dir, ec);
  }
  out->local_s = Median(local);
  out->cold_s = Median(cold);
  out->cold_fill_s = Median(fill);
  out->cold_session_s = Median(session);
  return cli::kExitOk;
}

struct ThroughputFigures {
  uint64_t value_bytes = 0;
  uint64_t masters = 0;
  double ckv_gets_per_s = 0;              // MultiGetInto: the caller's strings reused
  double ckv_fresh_gets_per_s = 0;        // MultiGet: a fresh string per value
  double redis_benchmark_gets_per_s = 0;  // 0: not measured
  std::string redis_benchmark_note;
};

// "GET","12345.67",... from redis-benchmark --csv: the rps of the GET row, or 0.
double ParseRedisBenchmarkGet(const std::string& csv) {
  for (absl::string_view line : absl::StrSplit(csv, '\n')) {
    if (line.substr(0, 6) != "\"GET\",") continue;
    std::vector<std::string> cells = absl::StrSplit(line, ',');
    if (cells.size() < 2) return 0;
    std::string rps = cells[1];
    rps.erase(std::remove(rps.begin(), rps.end(), '"'), rps.end());
    return std::atof(rps.c_str());
  }
  return 0;
}

std::string RunCommand(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

int MeasureThroughput(const Flags& f, const ModelSpec& spec, ThroughputFigures* out) {
  auto seeds = remote::ParseEndpoints(f.remote);
  if (!seeds.ok()) return cli::UsageError("remote_bench", std::string(seeds.status().message()));
  remote::ClusterOptions co;
  co.seeds = *seeds;
  co.call_timeout = absl::Seconds(10);
  auto client = remote::ClusterClient::Create(co);
  if (!client.ok()) return cli::kExitError;
  auto masters = (*client)->Masters();
  if (!masters.ok()) {
    std::fprintf(stderr, "remote_bench: %s\n", masters.status().ToString().c_str());
    return cli::kExitError;
  }
  out->masters = masters->size();
  out->value_bytes = remote::ChunkValueBytes(spec);
  constexpr int kKeys = 256;
  std::string value(out->value_bytes, '\0');
  std::mt19937_64 rng(7);
  for (char& ch : value) ch = static_cast<char>(rng());
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(absl::StrCat("remote-bench:get:", i));
  for (int i = 0; i < kKeys; i += 16) {
    std::vector<std::pair<std::string, std::string>> items;
    for (int j = i; j < i + 16; ++j) items.emplace_back(keys[j], value);
    for (const absl::Status& s : (*client)->MultiSet(items)) {
      if (!s.ok()) {
        std::fprintf(stderr, "remote_bench: SET: %s\n", s.ToString().c_str());
        return cli::kExitError;
      }
    }
  }
  const size_t batch = f.depth * out->masters;
  std::uniform_int_distribution<int> pick(0, kKeys - 1);
  std::vector<std::string> call(batch);
  // Two passes over the same keys: MultiGetInto, which reads each value into the string the
  // last call left (as a caller that reads again and again would use it), then MultiGet, which
  // returns a fresh string per value that the caller frees.
  uint64_t gets = 0;
  auto start = Clock::now();
  std::vector<std::string> values;
  while (Since(start) < f.seconds) {
    for (std::string& k : call) k = keys[pick(rng)];
    const auto got = (*client)->MultiGetInto(call, &values);
    for (size_t i = 0; i < got.size(); ++i) {
      if (!got[i].ok() || !*got[i] || values[i].size() != out->value_bytes) {
        std::fprintf(stderr, "remote_bench: GET failed or short\n");
        return cli::kExitError;
      }
    }
    gets += batch;
  }
  out->ckv_gets_per_s = static_cast<double>(gets) / Since(start);
  uint64_t fresh_gets = 0;
  start = Clock::now();
  while (Since(start) < f.seconds) {
    for (std::string& k : call) k = keys[pick(rng)];
    for (const auto& got : (*client)->MultiGet(call)) {
      if (!got.ok() || !got->has_value() || (*got)->size() != out->value_bytes) {
        std::fprintf(stderr, "remote_bench: GET failed or short\n");
        return cli::kExitError;
      }
    }
    fresh_gets += batch;
  }
  out->ckv_fresh_gets_per_s = static_cast<double>(fresh_gets) / Since(start);

  const std::string rb = f.redis_benchmark;
  if (RunCommand("command -v " + rb + " 2>/dev/null").empty()) {
    out->redis_benchmark_note = "redis-benchmark not found: not measured";
    return cli::kExitOk;
  }
  const remote::Endpoint& seed = (*seeds)[0];
  const std::string common =
      absl::StrCat(rb, " -h ", seed.host, " -p ", seed.port, " --cluster -d ", out->value_bytes,
                   " -P ", f.depth, " -c ", out->masters, " -r ", kKeys, " --csv");
  RunCommand(absl::StrCat(common, " -t set -n ", 16 * kKeys, " 2>&1"));
  // As many GETs as the client did (at least 2,000), so both run for a similar time.
  const uint64_t n = std::max<uint64_t>(2000, gets);
  const std::string csv = RunCommand(absl::StrCat(common, " -t get -n ", n, " 2>&1"));
  out->redis_benchmark_gets_per_s = ParseRedisBenchmarkGet(csv);
  if (out->redis_benchmark_gets_per_s == 0) {
    out->redis_benchmark_note = "could not read redis-benchmark's GET figure: " + csv;
  }
  return cli::kExitOk;
}

}  // namespace
}  // namespace ckv

int main(int argc, char** argv) {
  using namespace ckv;
  Flags f;
  CLI::App app{
      "Re-Prefill served from a Redis Cluster against local NVMe, and the tier's GET "
      "throughput against redis-benchmark.",
      "remote_bench"};
  cli::Configure(app, "bench/remote_bench.sh starts a throwaway cluster on loopback and runs it.");
  app.add_option("--remote", f.remote, "any node of the cluster")
      ->type_name("HOST:PORT")
      ->required();
  app.add_option("--dir", f.dir, "directory for the stores (created; removed afterwards)")
      ->type_name("DIR")
      ->required();
  app.add_option("--model", f.model, "model preset (default qwen2.5-0.5b)")->type_name("PRESET");
  cli::AddUint(app, "--tokens", &f.tokens, "prefix length, a multiple of 16 (default 4096)");
  cli::AddDouble(app, "--budget", &f.budget, "Re-Prefill budget fraction (default 0.1)");
  app.add_option("--selector", f.selector,
                 "period-exact (default), quest, mean-key or oracle; quest and mean-key below "
                 "budget 1 read only their selection from the cluster")
      ->type_name("NAME");
  cli::AddUint(app, "--runs", &f.runs, "Re-Prefills of each kind; medians reported (default 3)");
  cli::AddUint(app, "--depth", &f.depth, "pipeline depth per connection (default 16)");
  cli::AddDouble(app, "--seconds", &f.seconds, "seconds of the client's GET run (default 3)");
  app.add_option("--redis-benchmark", f.redis_benchmark, "the redis-benchmark binary")
      ->type_name("PATH");
  cli::AddJson(app, &f.json);
  if (auto code = cli::Parse(app, argc, argv)) return *code;
  auto spec = ModelSpec::Preset(f.model);
  if (!spec.ok()) return cli::UsageError("remote_bench", std::string(spec.status().message()));
  if (auto sel = ParseSelector(f.selector); !sel.ok()) {
    return cli::UsageError("remote_bench", std::string(sel.status().message()));
  }
  if (f.tokens == 0 || f.tokens % spec->chunk_tokens != 0 || f.runs == 0 || f.depth == 0) {
    return cli::UsageError("remote_bench",
                           "--tokens must be a positive multiple of 16; --runs, --depth > 0");
  }
  std::error_code ec;
  std::filesystem::create_directories(f.dir, ec);
  ReprefillFigures rp;
  if (int code = MeasureReprefill(f, *spec, &rp); code != cli::kExitOk) return code;
  ThroughputFigures tp;
  if (int code = MeasureThroughput(f, *spec, &tp); code != cli::kExitOk) return code;
  std::filesystem::remove_all(f.dir + "/a", ec);
  const double ratio =
      tp.redis_benchmark_gets_per_s > 0 ? tp.ckv_gets_per_s / tp.redis_benchmark_gets_per_s : 0;
  const double fresh_ratio = tp.redis_benchmark_gets_per_s > 0
                                 ? tp.ckv_fresh_gets_per_s / tp.redis_benchmark_gets_per_s
                                 : 0;
  if (f.json.enabled) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("model")
        .String(f.model)
        .Key("tokens")
        .Uint(f.tokens)
        .Key("chunks")
        .Uint(rp.chunks)
        .Key("budget")
        .Double(f.budget)
        .Key("selector")
        .String(f.selector)
        .Key("selecting")
        .Bool(rp.selecting)
        .Key("runs")
        .Uint(f.runs)
        .Key("reprefill_local_s")
        .Double(rp.local_s)
        .Key("reprefill_cold_remote_s")
        .Double(rp.cold_s)
        .Key("cold_fill_s")
        .Double(rp.cold_fill_s)
        .Key("cold_session_s")
        .Double(rp.cold_session_s)
        .Key("fetched_bytes")
        .Uint(rp.fetched_bytes)
        .Key("value_bytes")
        .Uint(tp.value_bytes)
        .Key("masters")
        .Uint(tp.masters)
        .Key("depth")
        .Uint(f.depth)
        .Key("ckv_gets_per_s")
        .Double(tp.ckv_gets_per_s)
        .Key("ckv_fresh_gets_per_s")
        .Double(tp.ckv_fresh_gets_per_s)
        .Key("redis_benchmark_gets_per_s")
        .Double(tp.redis_benchmark_gets_per_s)
        .Key("ratio")
        .Double(ratio)
        .Key("fresh_ratio")
        .Double(fresh_ratio)
        .EndObject();
    if (absl::Status s = f.json.Write(w.str()); !s.ok()) return cli::kExitError;
    if (f.json.ToStdout()) return cli::kExitOk;
  }
  std::printf(
      "Re-Prefill of %llu tokens (%llu chunks) of %s, %s at budget %.2f, median of "
      "%llu:\n",
      static_cast<unsigned long long>(f.tokens), static_cast<unsigned long long>(rp.chunks),
      f.model.c_str(), f.selector.c_str(), f.budget, static_cast<unsigned long long>(f.runs));
  std::printf("  local NVMe                 %8.1f ms\n", rp.local_s * 1e3);
  if (rp.selecting) {
    std::printf(
        "  cold, from the cluster     %8.1f ms  (heads and selected records: %.1f MB "
        "fetched, verified)  %.2fx local\n",
        rp.cold_s * 1e3, static_cast<double>(rp.fetched_bytes) / 1e6,
        rp.local_s > 0 ? rp.cold_s / rp.local_s : 0);
  } else {
    std::printf(
        "  cold, from the cluster     %8.1f ms  (fill %.1f ms: %.1f MB fetched, verified, "
        "stored; session %.1f ms)  %.2fx local\n",
        rp.cold_s * 1e3, rp.cold_fill_s * 1e3, static_cast<double>(rp.fetched_bytes) / 1e6,
        rp.cold_session_s * 1e3, rp.local_s > 0 ? rp.cold_s / rp.local_s : 0);
  }
  std::printf("GET of %llu-byte values, pipeline depth %llu per connection, %llu masters:\n",
              static_cast<unsigned long long>(tp.value_bytes),
              static_cast<unsigned long long>(f.depth),
              static_cast<unsigned long long>(tp.masters));
  std::printf("  ckv client, MultiGetInto   %10.0f GET/s  (%.2f GB/s)\n", tp.ckv_gets_per_s,
              tp.ckv_gets_per_s * static_cast<double>(tp.value_bytes) / 1e9);
  std::printf("  ckv client, MultiGet       %10.0f GET/s  (%.2f GB/s)\n", tp.ckv_fresh_gets_per_s,
              tp.ckv_fresh_gets_per_s * static_cast<double>(tp.value_bytes) / 1e9);
  if (tp.redis_benchmark_gets_per_s > 0) {
    std::printf("  redis-benchmark            %10.0f GET/s  (%.2f GB/s)\n",
                tp.redis_benchmark_gets_per_s,
                tp.redis_benchmark_gets_per_s * static_cast<double>(tp.value_bytes) / 1e9);
    std::printf("  ratio                      %10.2fx (MultiGetInto), %.2fx (MultiGet)\n", ratio,
                fresh_ratio);
  } else {
    std::printf("  redis-benchmark            %s\n", tp.redis_benchmark_note.c_str());
  }
  return cli::kExitOk;
}
