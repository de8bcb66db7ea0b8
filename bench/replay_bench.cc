// SPDX-License-Identifier: Apache-2.0
// bench/replay_bench.cc: the store's capacity policy on a trace of production shape.
//
//   replay_bench --store DIR (--trace FILE | --synthetic N) [--format auto|mooncake|bailian]
//                [--block-tokens 32] [--max-requests N] [--model qwen2.5-0.5b]
//                [--caps 0.1,0.25,0.5] [--selector mean-key] [--budget 0.1] [--no-reprefill]
//                [--json [PATH]] [--plot PNG]
//   replay_bench --synthetic N --write-trace FILE
//
// The trace (tools/block_trace.h: Mooncake or Bailian JSON Lines, or the SYNTHETIC Mooncake-format
// trace of tools/synthetic_trace.h with --synthetic) is turned into prompts, and its unique KV
// bytes (distinct chunks x layers x record bytes) measured. For each cap, a fraction of those
// bytes, a fresh store capped at it replays every request in order: Lookup of the prompt
// (the hit: its stored leading chunks), a Re-Prefill session over them (every layer, synthetic
// queries; it fills the chunks' I and F, which the store's eviction ranks by), then a Put of the
// prompt's whole chunks. Beside it, over the same chunk sequence in the same run, two simulated
// caches (tools/prefix_cache_sim.h): leaf-only LRU holding as many chunks as the cap's bytes hold
// of the store's chunks (summaries included, without the store's small metadata reserve: LRU gets
// the benefit of the doubt), and the infinite cache, the bound on any policy.
//
// Per cap it reports, for the store (ckv: score S = I x F, then least recent use), LRU and
// infinite: the token hit rate (hit tokens / request tokens, all requests) and the request hit
// rate (requests with at least one chunk hit / requests); for the store also Put throughput and
// latency (p50, p99, max), Re-Prefill latency and requests per second, with where the time of a
// request goes. A table, --json for machines, --plot for people (gnuplot).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "ckv/engine.h"
#include "ckv/session.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "tools/block_trace.h"
#include "tools/cli.h"
#include "tools/json_reader.h"
#include "tools/json_writer.h"
#include "tools/prefix_cache_sim.h"
#include "tools/synthetic_kv.h"
#include "tools/synthetic_trace.h"

namespace ckv::bench {
namespace {

constexpr char kProg[] = "replay_bench";
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Flags {
  std::string store;
  std::string trace;
  uint64_t synthetic = 0;
  std::string write_trace;
  std::string format = "auto";
  uint32_t block_tokens = 32;
  uint64_t max_requests = 0;
  std::string model = "qwen2.5-0.5b";
  std::vector<double> caps = {0.1, 0.25, 0.5};
  std::string selector = "mean-key";
  double budget = 0.1;
  bool no_reprefill = false;
  std::optional<uint64_t> reclaim_margin;  // unset: the store's default
  cli::JsonOutput json;
  std::string plot;
};

std::optional<int> ParseFlags(int argc, char** argv, Flags* f) {
  CLI::App app{
      "The store's capacity policy on a trace: prefix hit rates of ckv's eviction, LRU "
      "and the infinite cache per cap, with Put and Re-Prefill latency.",
      kProg};
  cli::Configure(app, "What is measured and how is described in bench/replay_bench.cc.");
  app.add_option("--store", f->store, "directory for the stores (one per cap, made and removed)")
      ->type_name("DIR");
  app.add_option("--trace", f->trace, "a mooncake or bailian trace, JSON Lines")->type_name("FILE");
  cli::AddUint(app, "--synthetic", &f->synthetic,
               "replay a SYNTHETIC Mooncake-format trace of N requests instead");
  app.add_option("--write-trace", f->write_trace, "write the --synthetic trace to FILE and stop")
      ->type_name("FILE");
  cli::AddChoice(app, "--format", &f->format, {"auto", "mooncake", "bailian"},
                 "the trace's format (default auto)");
  cli::AddUint(app, "--block-tokens", &f->block_tokens, "tokens per hash id, 1..65536 (default 32)",
               "B");
  cli::AddUint(app, "--max-requests", &f->max_requests, "replay the first N (default 0: all)");
  app.add_option("--model", f->model, "model preset (default qwen2.5-0.5b)")->type_name("PRESET");
  cli::AddParsed(
      app, "--caps",
      "caps as fractions of the trace's unique KV bytes (default "
      "0.1,0.25,0.5)",
      "F,...", "a list of fractions in (0, 1]", [f](const std::string& v) {
        f->caps.clear();
        for (absl::string_view s : absl::StrSplit(v, ',')) {
          double c = 0;
          if (!cli::ParseDouble(std::string_view(s.data(), s.size()), &c) || !(c > 0 && c <= 1)) {
            return false;
          }
          f->caps.push_back(c);
        }
        return !f->caps.empty();
      });
  cli::AddChoice(app, "--selector", &f->selector,
                 {"period-exact", "quest", "mean-key", "outlier-key", "oracle"},
                 "the Re-Prefill sessions' selector (default mean-key)");
  cli::AddDouble(app, "--budget", &f->budget, "the sessions' budget, (0, 1] (default 0.1)");
  app.add_flag("--no-reprefill", f->no_reprefill,
               "no Re-Prefill sessions: scores stay zero and the store evicts by recency alone");
  cli::AddParsed(app, "--reclaim-margin",
                 "free space the background reclaimer keeps under each cap (default: the store's, "
                 "EngineOptions::reclaim_margin_bytes; 0: no reclaimer, every eviction inline)",
                 "BYTES", "a byte count", [f](const std::string& v) {
                   uint64_t bytes = 0;
                   if (!cli::ParseBytes(v, &bytes)) return false;
                   f->reclaim_margin = bytes;
                   return true;
                 });
  cli::AddJson(app, &f->json);
  app.add_option("--plot", f->plot, "draw hit rate by cap with gnuplot into PNG")->type_name("PNG");
  return cli::Parse(app, argc, argv);
}

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "%s: %s\n", kProg, std::string(s.message()).c_str());
  std::exit(cli::kExitError);
}

// The trace as prompts and chunk chains.
struct Workload {
  tools::BlockTrace trace;
  std::vector<std::vector<uint32_t>> chains;  // per request: dense ids of its whole chunks
  uint64_t unique_chunks = 0;
  uint64_t request_tokens = 0;
};

Workload LoadWorkload(const Flags& f, const ModelSpec& spec) {
  const tools::TraceLimits limits;
  std::string text;
  std::string name = f.trace;
  if (f.synthetic > 0) {
    tools::SyntheticTraceOptions o;
    o.requests = f.synthetic;
    text = tools::SyntheticMooncakeTrace(o);
    name = absl::StrCat("synthetic-mooncake-", f.synthetic);
  } else {
    auto read = tools::ReadFileUpTo(f.trace, limits.max_file_bytes, "trace");
    if (!read.ok()) Die(read.status());
    text = *std::move(read);
  }
  auto format = f.format == "auto" ? tools::DetectTraceFormat(text, name, limits)
                                   : tools::ParseTraceFormat(f.format);
  if (!format.ok()) Die(format.status());
  if (*format == tools::TraceFormat::kCkv) {
    Die(absl::InvalidArgumentError(name + ": a ckv trace; replay_bench reads mooncake or bailian "
                                          "traces (kvctl replay reads ckv traces)"));
  }
  tools::BlockTraceOptions options;
  options.block_tokens = f.block_tokens;
  options.max_requests = f.max_requests;
  auto trace = tools::ParseBlockTrace(text, name, *format, options, limits);
  if (!trace.ok()) Die(trace.status());
  Workload w;
  w.trace = *std::move(trace);
  absl::flat_hash_map<ChunkKey, uint32_t> ids;
  for (const tools::BlockRequest& r : w.trace.requests) {
    const std::vector<int32_t> tokens = tools::RequestTokens(w.trace, r);
    std::vector<uint32_t>& chain = w.chains.emplace_back();
    for (const ChunkKey& key : ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens)) {
      chain.push_back(ids.try_emplace(key, static_cast<uint32_t>(ids.size())).first->second);
    }
    w.request_tokens += r.tokens;
  }
  w.unique_chunks = ids.size();
  return w;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1;
  return v[std::min(i, v.size() - 1)];
}

struct Latency {
  double p50 = 0, p99 = 0, max = 0, mean = 0;
  static Latency Of(const std::vector<double>& v) {
    Latency l;
    if (v.empty()) return l;
    l.p50 = Percentile(v, 0.5);
    l.p99 = Percentile(v, 0.99);
    l.max = *std::max_element(v.begin(), v.end());
    double sum = 0;
    for (double x : v) sum += x;
    l.mean = sum / static_cast<double>(v.size());
    return l;
  }
};

// Hits of one policy over the trace.
struct Hits {
  double token_rate = 0;    // hit tokens / request tokens
  double request_rate = 0;  // requests with a hit / requests
  static Hits Of(const Workload& w, const std::vector<uint64_t>& hit_chunks, uint32_t c) {
    Hits h;
    uint64_t tokens = 0, requests = 0;
    for (uint64_t n : hit_chunks) {
      tokens += n * c;
      requests += n > 0;
    }
    h.token_rate = static_cast<double>(tokens) / static_cast<double>(w.request_tokens);
    h.request_rate = static_cast<double>(requests) / static_cast<double>(hit_chunks.size());
    return h;
  }
};

// One cap's figures.
struct CapResult {
  double fraction = 0;
  uint64_t cap_bytes = 0;
  uint64_t chunk_bytes = 0;  // a chunk on disk, records and summaries
  uint64_t lru_chunks = 0;   // the simulated LRU's capacity
  Hits ckv, lru, infinite;
  uint64_t evicted = 0, refused = 0, lru_evicted = 0;
  uint64_t inline_evictions = 0, reclaim_margin_bytes = 0;  // the store's (EngineStats)
  uint64_t put_bytes = 0;
  double seconds = 0, lookup_seconds = 0, reprefill_seconds = 0, kv_seconds = 0, put_seconds = 0;
  Latency put, reprefill;
};

absl::Status Reprefill(Engine& engine, const ModelSpec& spec, const ReprefillOptions& options,
                       std::span<const int32_t> tokens, uint64_t seed) {
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<ReprefillSession> session,
                       engine.BeginReprefill(spec, tokens, options));
  if (session->matched_chunks() > 0) {
    for (uint32_t layer = 0; layer < spec.layers; ++layer) {
      CKV_RETURN_IF_ERROR(
          session->SubmitQueries(layer, synth::ReplayQueries(spec, options.window, seed, layer)));
      CKV_ASSIGN_OR_RETURN(LayerView view, session->AwaitLayer(layer));
    }
  }
  return session->Finish().status();
}

// Replays the workload against a fresh store capped at r->cap_bytes; fills r's store figures
// and returns each request's hit in chunks.
absl::StatusOr<std::vector<uint64_t>> RunStore(const Flags& f, const ModelSpec& spec,
                                               const ReprefillOptions& options, const Workload& w,
                                               const std::string& dir, CapResult* r) {
  EngineOptions eo;
  eo.error_if_exists = true;
  eo.max_disk_bytes = r->cap_bytes;
  eo.reclaim_margin_bytes = f.reclaim_margin;
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Open(eo, dir));
  synth::ReplayKv kv(spec);
  // A background reclaimer may evict a chunk Lookup found before the Put (synthetic_kv.h): then
  // the KV of every chunk is generated, not only of the new ones.
  const bool reclaimer = engine->Stats().reclaim_margin_bytes > 0;
  std::vector<uint64_t> hits;
  std::vector<double> put_latency, reprefill_latency;
  const auto start = Clock::now();
  for (size_t i = 0; i < w.trace.requests.size(); ++i) {
    const std::vector<int32_t> tokens = tools::RequestTokens(w.trace, w.trace.requests[i]);
    auto t = Clock::now();
    CKV_ASSIGN_OR_RETURN(const uint64_t matched, engine->Lookup(spec, tokens));
    r->lookup_seconds += SecondsSince(t);
    hits.push_back(matched);
    if (matched > 0 && !f.no_reprefill) {
      t = Clock::now();
      CKV_RETURN_IF_ERROR(Reprefill(*engine, spec, options, tokens, i));
      reprefill_latency.push_back(SecondsSince(t));
    }
    const size_t chunks = tokens.size() / spec.chunk_tokens;
    if (chunks == 0 || matched == chunks) continue;
    const std::span<const int32_t> whole(tokens.data(), chunks * spec.chunk_tokens);
    t = Clock::now();
    const size_t generated_from = reclaimer ? 0 : matched;
    const KvTensors& tensors = kv.Fill(whole, generated_from);
    r->kv_seconds += SecondsSince(t);
    t = Clock::now();
    absl::StatusOr<PutResult> put = engine->Put(spec, whole, tensors);
    put_latency.push_back(SecondsSince(t));
    if (absl::IsResourceExhausted(put.status())) {  // longer than the cap: not cached
      ++r->refused;
      continue;
    }
    CKV_RETURN_IF_ERROR(put.status());
    if (put->chunks_existing < generated_from) {  // chunks written from unspecified bytes
      return absl::InternalError(absl::StrCat("request ", i, ": Put found ", put->chunks_existing,
                                              " chunks stored of the ", matched, " Lookup found"));
    }
  }
  r->seconds = SecondsSince(start);
  const EngineStats stats = engine->Stats();
  r->evicted = stats.chunks_evicted;  // inline and the reclaimer's
  r->inline_evictions = stats.inline_evictions;
  r->reclaim_margin_bytes = stats.reclaim_margin_bytes;
  r->put_bytes = stats.bytes_written;
  r->chunk_bytes = stats.chunks_written == 0 ? 0 : stats.bytes_written / stats.chunks_written;
  for (double s : put_latency) r->put_seconds += s;
  for (double s : reprefill_latency) r->reprefill_seconds += s;
  r->put = Latency::Of(put_latency);
  r->reprefill = Latency::Of(reprefill_latency);
  return hits;
}

std::vector<uint64_t> Simulate(const Workload& w, uint64_t capacity_chunks, uint64_t* evicted) {
  tools::PrefixLruSim sim(capacity_chunks);
  std::vector<uint64_t> hits;
  hits.reserve(w.chains.size());
  for (const std::vector<uint32_t>& chain : w.chains) hits.push_back(sim.Access(chain));
  if (evicted != nullptr) *evicted = sim.evicted();
  return hits;
}

std::string Ms(double seconds) { return absl::StrFormat("%.1f", seconds * 1e3); }

void PrintTable(const Flags& f, const ModelSpec& spec, const Workload& w,
                const std::vector<CapResult>& results) {
  const size_t n = w.trace.requests.size();
  std::printf(
      "%s: %zu requests of %s (%s, %u tokens per hash id), %s, %llu unique chunks "
      "(%.1f MiB of KV)%s\n",
      kProg, n, f.synthetic > 0 ? "a SYNTHETIC trace" : f.trace.c_str(),
      std::string(tools::TraceFormatName(w.trace.format)).c_str(), w.trace.block_tokens,
      spec.model_id.c_str(), static_cast<unsigned long long>(w.unique_chunks),
      static_cast<double>(w.unique_chunks * spec.layers * spec.RecordBytes()) / 1048576,
      f.no_reprefill ? ", no Re-Prefill sessions" : "");
  std::printf("token hit rate (request hit rate)\n");
  std::printf("%5s %10s %15s %15s %15s %9s %9s %9s %9s %9s %8s\n", "cap", "cap bytes", "ckv store",
              "lru (sim)", "infinite", "put MB/s", "put p50", "put p99", "put max", "rp p50",
              "req/s");
  for (const CapResult& r : results) {
    auto rate = [](const Hits& h) {
      return absl::StrFormat("%5.1f%% (%4.1f%%)", h.token_rate * 100, h.request_rate * 100);
    };
    std::printf("%4.0f%% %9.1fM %15s %15s %15s %9.1f %8sm %8sm %8sm %8sm %8.1f\n", r.fraction * 100,
                static_cast<double>(r.cap_bytes) / 1048576, rate(r.ckv).c_str(),
                rate(r.lru).c_str(), rate(r.infinite).c_str(),
                r.put_seconds > 0 ? static_cast<double>(r.put_bytes) / r.put_seconds / 1e6 : 0,
                Ms(r.put.p50).c_str(), Ms(r.put.p99).c_str(), Ms(r.put.max).c_str(),
                Ms(r.reprefill.p50).c_str(), static_cast<double>(n) / r.seconds);
  }
  std::printf("time per request (ms): ");
  for (const CapResult& r : results) {
    const double other =
        r.seconds - r.lookup_seconds - r.reprefill_seconds - r.kv_seconds - r.put_seconds;
    std::printf("%s%.0f%%: %s (put %s, re-prefill %s, kv generation %s, lookup %s, other %s)",
                &r == &results.front() ? "" : "; ", r.fraction * 100, Ms(r.seconds / n).c_str(),
                Ms(r.put_seconds / n).c_str(), Ms(r.reprefill_seconds / n).c_str(),
                Ms(r.kv_seconds / n).c_str(), Ms(r.lookup_seconds / n).c_str(),
                Ms(other / n).c_str());
  }
  std::printf("\n");
}

void WriteHits(tools::JsonWriter& w, std::string_view key, const Hits& h) {
  w.Key(key)
      .BeginObject()
      .Key("token_hit_rate")
      .Double(h.token_rate)
      .Key("request_hit_rate")
      .Double(h.request_rate)
      .EndObject();
}

void WriteLatency(tools::JsonWriter& w, std::string_view key, const Latency& l) {
  w.Key(key)
      .BeginObject()
      .Key("p50_seconds")
      .Double(l.p50)
      .Key("p99_seconds")
      .Double(l.p99)
      .Key("max_seconds")
      .Double(l.max)
      .Key("mean_seconds")
      .Double(l.mean)
      .EndObject();
}

std::string ResultJson(const Flags& f, const ModelSpec& spec, const Workload& w,
                       const std::vector<CapResult>& results) {
  tools::JsonWriter j;
  j.BeginObject()
      .Key("trace")
      .String(f.synthetic > 0 ? "synthetic" : f.trace)
      .Key("synthetic")
      .Bool(f.synthetic > 0)
      .Key("format")
      .String(std::string(tools::TraceFormatName(w.trace.format)))
      .Key("block_tokens")
      .Uint(w.trace.block_tokens)
      .Key("model")
      .String(spec.model_id)
      .Key("requests")
      .Uint(w.trace.requests.size())
      .Key("request_tokens")
      .Uint(w.request_tokens)
      .Key("unique_chunks")
      .Uint(w.unique_chunks)
      .Key("unique_kv_bytes")
      .Uint(w.unique_chunks * spec.layers * spec.RecordBytes())
      .Key("reprefill")
      .Bool(!f.no_reprefill)
      .Key("selector")
      .String(f.selector)
      .Key("budget")
      .Double(f.budget)
      .Key("caps")
      .BeginArray();
  for (const CapResult& r : results) {
    j.BeginObject()
        .Key("fraction")
        .Double(r.fraction)
        .Key("cap_bytes")
        .Uint(r.cap_bytes)
        .Key("chunk_bytes")
        .Uint(r.chunk_bytes)
        .Key("lru_capacity_chunks")
        .Uint(r.lru_chunks);
    WriteHits(j, "ckv", r.ckv);
    WriteHits(j, "lru", r.lru);
    WriteHits(j, "infinite", r.infinite);
    j.Key("chunks_evicted")
        .Uint(r.evicted)
        .Key("inline_evictions")
        .Uint(r.inline_evictions)
        .Key("reclaim_margin_bytes")
        .Uint(r.reclaim_margin_bytes)
        .Key("lru_chunks_evicted")
        .Uint(r.lru_evicted)
        .Key("puts_refused")
        .Uint(r.refused)
        .Key("put_bytes")
        .Uint(r.put_bytes)
        .Key("seconds")
        .Double(r.seconds)
        .Key("put_seconds")
        .Double(r.put_seconds)
        .Key("reprefill_seconds")
        .Double(r.reprefill_seconds)
        .Key("kv_generation_seconds")
        .Double(r.kv_seconds)
        .Key("lookup_seconds")
        .Double(r.lookup_seconds)
        .Key("requests_per_second")
        .Double(static_cast<double>(w.trace.requests.size()) / r.seconds);
    WriteLatency(j, "put_latency", r.put);
    WriteLatency(j, "reprefill_latency", r.reprefill);
    j.EndObject();
  }
  j.EndArray().EndObject();
  return j.str();
}

// Token hit rate by cap, one line per policy, drawn by gnuplot into f.plot.
void Plot(const Flags& f, const std::vector<CapResult>& results) {
  std::string script = "set terminal png size 900,560\nset output '" + f.plot + "'\n";
  script += "set title 'Prefix hit rate by cap (" + f.model +
            (f.synthetic > 0 ? ", SYNTHETIC trace" : "") + ")'\n";
  script += "set xlabel 'cap (% of the trace''s unique KV bytes)'\nset ylabel 'token hit rate'\n";
  script += "set key bottom right\nset yrange [0:1]\nplot ";
  const char* names[] = {"ckv store", "lru (simulated)", "infinite cache"};
  for (int i = 0; i < 3; ++i) {
    script += std::string("'-' with linespoints title '") + names[i] + "'" + (i < 2 ? ", " : "\n");
  }
  for (int i = 0; i < 3; ++i) {
    for (const CapResult& r : results) {
      const Hits& h = i == 0 ? r.ckv : i == 1 ? r.lru : r.infinite;
      script += absl::StrFormat("%g %g\n", r.fraction * 100, h.token_rate);
    }
    script += "e\n";
  }
  FILE* gp = popen("gnuplot", "w");
  if (gp == nullptr || std::fwrite(script.data(), 1, script.size(), gp) != script.size() ||
      pclose(gp) != 0) {
    std::fprintf(stderr, "%s: gnuplot failed; no plot drawn\n", kProg);
  }
}

int Run(const Flags& f) {
  if ((f.synthetic > 0) == !f.trace.empty()) {
    return cli::UsageError(kProg, "give either --trace FILE or --synthetic N");
  }
  if (!f.write_trace.empty()) {
    if (f.synthetic == 0) return cli::UsageError(kProg, "--write-trace needs --synthetic N");
    tools::SyntheticTraceOptions o;
    o.requests = f.synthetic;
    cli::JsonOutput out{true, f.write_trace};
    const std::string text = tools::SyntheticMooncakeTrace(o);
    // JsonOutput::Write adds a newline; the trace ends with one already.
    if (absl::Status s = out.Write(std::string_view(text).substr(0, text.size() - 1)); !s.ok()) {
      Die(s);
    }
    return cli::kExitOk;
  }
  if (f.store.empty()) return cli::UsageError(kProg, "--store DIR is required");
  if (!(f.budget > 0 && f.budget <= 1)) {
    return cli::UsageError(kProg, absl::StrCat("--budget: '", f.budget, "' is not in (0, 1]"));
  }
  auto spec = ModelSpec::Preset(f.model);
  if (!spec.ok()) Die(spec.status());
  ReprefillOptions options;
  options.selector = *ParseSelector(f.selector);
  options.budget_fraction = f.budget;
  const Workload w = LoadWorkload(f, *spec);
  if (w.trace.requests.empty()) Die(absl::InvalidArgumentError("the trace has no requests"));
  const uint64_t unique_bytes = w.unique_chunks * spec->layers * spec->RecordBytes();
  std::error_code made;
  std::filesystem::create_directories(f.store, made);
  if (made) Die(absl::InternalError(absl::StrCat(f.store, ": ", made.message())));
  const std::vector<uint64_t> infinite = Simulate(w, 0, nullptr);
  std::vector<CapResult> results;
  for (double fraction : f.caps) {
    CapResult r;
    r.fraction = fraction;
    r.cap_bytes = static_cast<uint64_t>(fraction * static_cast<double>(unique_bytes));
    const std::string dir = absl::StrCat(f.store, "/cap-", std::lround(fraction * 1000));
    std::fprintf(stderr, "%s: cap %.0f%% (%llu bytes) in %s\n", kProg, fraction * 100,
                 static_cast<unsigned long long>(r.cap_bytes), dir.c_str());
    auto hits = RunStore(f, *spec, options, w, dir, &r);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);  // a scratch store; a leftover is harmless
    if (!hits.ok()) Die(hits.status());
    r.ckv = Hits::Of(w, *hits, spec->chunk_tokens);
    r.lru_chunks = r.chunk_bytes == 0 ? 0 : std::max<uint64_t>(r.cap_bytes / r.chunk_bytes, 1);
    r.lru = Hits::Of(w, Simulate(w, r.lru_chunks, &r.lru_evicted), spec->chunk_tokens);
    r.infinite = Hits::Of(w, infinite, spec->chunk_tokens);
    results.push_back(r);
  }
  if (!f.json.ToStdout()) PrintTable(f, *spec, w, results);
  if (f.json.enabled) {
    if (absl::Status s = f.json.Write(ResultJson(f, *spec, w, results)); !s.ok()) Die(s);
  }
  if (!f.plot.empty()) Plot(f, results);
  return cli::kExitOk;
}

}  // namespace
}  // namespace ckv::bench

int main(int argc, char** argv) {
  return ckv::cli::Main(argc, argv, ckv::bench::ParseFlags, ckv::bench::Run);
}
