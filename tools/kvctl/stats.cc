// SPDX-License-Identifier: Apache-2.0
// kvctl stats: a store's figures, the spread of S = I x F, and what the tiers would hold; or,
// with --format prom, the store's figures at rest in the Prometheus text format.
#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/container/flat_hash_set.h"

#include "engine/metrics.h"
#include "engine/tier_cache.h"
#include "tools/kvctl/command.h"
#include "tools/kvctl/format.h"

namespace ckv::kvctl {
namespace {

struct StatsOptions {
  std::string store;
  uint64_t gpu_tier_bytes = 0;
  uint64_t cpu_tier_bytes = 0;
  cli::JsonOutput json;
  std::string format = "table";  // table, json (as --json) or prom
};

// What the tiers would hold if they kept the top-S records (see the footer of AddStats).
struct TierFill {
  uint64_t budget_bytes = 0;         // as given
  uint64_t record_budget_bytes = 0;  // the part records may use
  uint64_t records = 0;
  uint64_t bytes = 0;   // slot bytes of those records
  uint64_t chunks = 0;  // chunks all of whose records it holds
  double score = 0;     // sum of the S of its records
};

struct ScoreSpread {
  uint64_t chunks = 0;
  uint64_t zero = 0;
  double min = 0, q1 = 0, median = 0, q3 = 0, max = 0, total = 0;
};

// Linear interpolation between the closest ranks of `sorted` (ascending, not empty).
double Quantile(const std::vector<double>& sorted, double q) {
  const double at = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (at - static_cast<double>(lo));
}

// Every stored chunk once (prefixes share chunks), with its S and its records' slot size.
struct Ranked {
  ChunkKey key;
  double score;
  uint32_t layers;
  uint64_t slot_bytes;
};

// What stats reports.
struct StoreFigures {
  EngineStats stats;
  ScoreSpread spread;
  TierFill gpu, cpu;
  double total_record_score = 0;
  double fill = 0;  // disk used / cap; 0 without a cap

  double Share(const TierFill& t) const {
    return total_record_score > 0 ? t.score / total_record_score : 0.0;
  }
};

void Spread(const std::vector<Ranked>& ranked, StoreFigures* f) {
  ScoreSpread& spread = f->spread;
  spread.chunks = ranked.size();
  if (ranked.empty()) return;
  std::vector<double> s;
  s.reserve(ranked.size());
  for (const Ranked& r : ranked) {
    s.push_back(r.score);
    spread.total += r.score;
    f->total_record_score += r.score * r.layers;
    if (!(r.score > 0)) spread.zero++;
  }
  std::sort(s.begin(), s.end());
  spread.min = s.front();
  spread.q1 = Quantile(s, 0.25);
  spread.median = Quantile(s, 0.5);
  spread.q3 = Quantile(s, 0.75);
  spread.max = s.back();
}

// Top S first: a record enters the GPU tier while it has room, else the CPU tier, else none.
void FillTiers(std::vector<Ranked> ranked, TierFill* gpu, TierFill* cpu) {
  std::sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    if (a.score != b.score) return a.score > b.score;
    return a.key < b.key;
  });
  for (const Ranked& r : ranked) {
    uint32_t in_gpu = 0, in_cpu = 0;
    for (uint32_t l = 0; l < r.layers; ++l) {
      for (TierFill* t : {gpu, cpu}) {
        if (t->bytes + r.slot_bytes > t->record_budget_bytes) continue;
        t->bytes += r.slot_bytes;
        t->records++;
        t->score += r.score;
        (t == gpu ? in_gpu : in_cpu)++;
        break;
      }
    }
    if (in_gpu == r.layers) gpu->chunks++;
    if (in_cpu == r.layers) cpu->chunks++;
  }
}

int PrintStatsJson(const StatsOptions& o, const StoreFigures& f) {
  const ScoreSpread& spread = f.spread;
  tools::JsonWriter w;
  w.BeginObject().Key("store").String(o.store).Key("stats");
  WriteStatsJson(w, f.stats);
  w.Key("fill")
      .Double(f.fill)
      .Key("score")
      .BeginObject()
      .Key("chunks")
      .Uint(spread.chunks)
      .Key("zero")
      .Uint(spread.zero)
      .Key("min")
      .Double(spread.min)
      .Key("q1")
      .Double(spread.q1)
      .Key("median")
      .Double(spread.median)
      .Key("q3")
      .Double(spread.q3)
      .Key("max")
      .Double(spread.max)
      .Key("total")
      .Double(spread.total)
      .EndObject()
      .Key("tiers")
      .BeginObject();
  for (const auto& [name, t] : {std::pair<const char*, const TierFill*>{"gpu", &f.gpu},
                                std::pair<const char*, const TierFill*>{"cpu", &f.cpu}}) {
    if (t->budget_bytes == 0) continue;
    w.Key(name)
        .BeginObject()
        .Key("budget_bytes")
        .Uint(t->budget_bytes)
        .Key("record_budget_bytes")
        .Uint(t->record_budget_bytes)
        .Key("records")
        .Uint(t->records)
        .Key("bytes")
        .Uint(t->bytes)
        .Key("chunks")
        .Uint(t->chunks)
        .Key("score_share")
        .Double(f.Share(*t))
        .EndObject();
  }
  w.EndObject().EndObject();
  return EmitJson(o.json, w);
}

void PrintStatsText(const StatsOptions& o, const StoreFigures& f) {
  const EngineStats& stats = f.stats;
  const ScoreSpread& spread = f.spread;
  std::printf("store %s: %llu chunks, %llu prefix%s, %llu segment%s\n", o.store.c_str(),
              static_cast<unsigned long long>(stats.chunks),
              static_cast<unsigned long long>(stats.prefixes), stats.prefixes == 1 ? "" : "es",
              static_cast<unsigned long long>(stats.segments), stats.segments == 1 ? "" : "s");
  std::printf(
      "  index memory   %s (%.0f B per chunk), %s\n", FormatBytes(stats.index_memory_bytes).c_str(),
      stats.chunks == 0
          ? 0.0
          : static_cast<double>(stats.index_memory_bytes) / static_cast<double>(stats.chunks),
      stats.index_from_snapshot ? "loaded from the snapshot of the last close"
                                : "built from the catalog");
  if (stats.max_disk_bytes == 0) {
    std::printf("  disk used      %s, cap unlimited\n", FormatBytes(stats.disk_bytes_used).c_str());
  } else {
    std::printf("  disk used      %s of cap %s (%.1f%% full)\n",
                FormatBytes(stats.disk_bytes_used).c_str(),
                FormatBytes(stats.max_disk_bytes).c_str(), f.fill * 100);
  }
  std::printf(
      "  since created  %llu puts, %llu chunks written (%s), %llu deduplicated, "
      "%llu evicted (%s), %llu deleted\n",
      static_cast<unsigned long long>(stats.puts),
      static_cast<unsigned long long>(stats.chunks_written),
      FormatBytes(stats.bytes_written).c_str(),
      static_cast<unsigned long long>(stats.chunks_deduplicated),
      static_cast<unsigned long long>(stats.chunks_evicted),
      FormatBytes(stats.bytes_evicted).c_str(),
      static_cast<unsigned long long>(stats.chunks_deleted));
  if (stats.orphan_bytes_reclaimed > 0) {
    std::printf("  on this open   %s of orphaned segment space reclaimed\n",
                FormatBytes(stats.orphan_bytes_reclaimed).c_str());
  }
  if (stats.reclaim_margin_bytes > 0) {
    std::printf(
        "  reclaimer      keeps %s free under the cap; since this open %llu rounds "
        "evicted %llu chunks (%s), %llu Puts evicted inline; %s free but kept for Puts "
        "to write over\n",
        FormatBytes(stats.reclaim_margin_bytes).c_str(),
        static_cast<unsigned long long>(stats.reclaim_rounds),
        static_cast<unsigned long long>(stats.reclaim_chunks),
        FormatBytes(stats.reclaim_bytes).c_str(),
        static_cast<unsigned long long>(stats.inline_evictions),
        FormatBytes(stats.free_kept_bytes).c_str());
  }
  // Put latency is kept in memory since Open: a kvctl process that only reads shows none.
  if (stats.put_latency_window == 0) {
    std::printf("  put latency    none: no Put since this open (kept in memory per process)\n");
  } else {
    std::printf(
        "  put latency    p50 %.3f ms, p99 %.3f ms, max %.3f ms over the last %llu puts; "
        "%llu waited for staging\n",
        static_cast<double>(stats.put_latency_p50_us) / 1e3,
        static_cast<double>(stats.put_latency_p99_us) / 1e3,
        static_cast<double>(stats.put_latency_max_us) / 1e3,
        static_cast<unsigned long long>(stats.put_latency_window),
        static_cast<unsigned long long>(stats.put_staging_waits));
  }
  std::printf(
      "  S = I x F      %llu chunks, %llu with S = 0; min %.4g, q1 %.4g, median %.4g, "
      "q3 %.4g, max %.4g\n",
      static_cast<unsigned long long>(spread.chunks), static_cast<unsigned long long>(spread.zero),
      spread.min, spread.q1, spread.median, spread.q3, spread.max);
  for (const auto& [name, t] : {std::pair<const char*, const TierFill*>{"gpu", &f.gpu},
                                std::pair<const char*, const TierFill*>{"cpu", &f.cpu}}) {
    if (t->budget_bytes == 0) continue;
    std::printf("  %s tier %-9s would hold %llu records (%llu whole chunks), %.1f%% of S\n", name,
                FormatBytes(t->budget_bytes).c_str(), static_cast<unsigned long long>(t->records),
                static_cast<unsigned long long>(t->chunks), f.Share(*t) * 100);
  }
  std::printf(
      "session figures (tier hits, bubbles) belong to a serving process: see "
      "'kvctl stats --help'\n");
}

// The at-rest families (engine/metrics.h, StoreMetrics: the names Engine::Metrics() gives
// them), each sample labelled with the store, for node_exporter's textfile collector.
int PrintStatsProm(const StatsOptions& o, const EngineStats& stats) {
  engine::MetricsText out({{"store", o.store}});
  engine::StoreMetrics(stats, out);
  std::fputs(out.text().c_str(), stdout);
  return std::fflush(stdout) == 0 ? kExitOk
                                  : StoreError("stats", absl::InternalError("cannot write stdout"));
}

int RunStats(StatsOptions o) {
  if (o.format == "json") {
    if (o.json.enabled && !o.json.ToStdout()) {
      return UsageError("stats", "--format json writes stdout; --json " + o.json.path +
                                     " writes a file: give one of them");
    }
    o.json.enabled = true;
    o.json.path.clear();
  } else if (o.format == "prom" && o.json.ToStdout()) {
    return UsageError("stats", "--format prom and --json both write stdout: give --json a PATH");
  }
  if (o.format == "prom") {
    auto engine = OpenToRead(o.store);
    if (!engine.ok()) return StoreError("open " + o.store, engine.status());
    const EngineStats stats = (*engine)->Stats();
    if (o.json.enabled) {  // to its PATH
      tools::JsonWriter w;
      w.BeginObject().Key("store").String(o.store).Key("stats");
      WriteStatsJson(w, stats);
      w.EndObject();
      if (const int rc = EmitJson(o.json, w); rc != kExitOk) return rc;
    }
    return PrintStatsProm(o, stats);
  }
  StoreFigures f;
  f.gpu.budget_bytes = o.gpu_tier_bytes;
  f.cpu.budget_bytes = o.cpu_tier_bytes;
  f.gpu.record_budget_bytes = f.gpu.budget_bytes;
  f.cpu.record_budget_bytes =
      f.cpu.budget_bytes -
      static_cast<uint64_t>(static_cast<double>(f.cpu.budget_bytes) * engine::kSummaryShare);
  auto engine = OpenToRead(o.store);
  if (!engine.ok()) return StoreError("open " + o.store, engine.status());

  f.stats = (*engine)->Stats();
  std::vector<Ranked> ranked;
  ranked.reserve(f.stats.chunks);
  absl::flat_hash_set<ChunkKey> seen;  // prefixes share chunks: each is ranked once
  seen.reserve(f.stats.chunks);
  for (const PrefixInfo& p : (*engine)->ListPrefixes()) {
    auto d = (*engine)->DescribePrefix(p.id);
    if (!d.ok()) return StoreError("stats " + p.id.ToHex(), d.status());
    const uint64_t slot = (d->spec.RecordBytes() + 255) / 256 * 256;
    for (const ChunkPlacement& c : d->chunks) {
      if (seen.insert(c.key).second) ranked.push_back({c.key, c.score(), d->spec.layers, slot});
    }
  }
  Spread(ranked, &f);
  // The ranking sorts every chunk: only when a tier budget asks for it.
  if (f.gpu.budget_bytes > 0 || f.cpu.budget_bytes > 0) {
    FillTiers(std::move(ranked), &f.gpu, &f.cpu);
  }
  f.fill = f.stats.max_disk_bytes == 0 ? 0
                                       : static_cast<double>(f.stats.disk_bytes_used) /
                                             static_cast<double>(f.stats.max_disk_bytes);
  if (o.json.enabled) {
    if (const int rc = PrintStatsJson(o, f); rc != kExitOk || o.json.ToStdout()) return rc;
  }
  PrintStatsText(o, f);
  return kExitOk;
}

}  // namespace

Command AddStats(CLI::App& kvctl) {
  auto o = std::make_shared<StatsOptions>();
  CLI::App* cmd = kvctl.add_subcommand(
      "stats", "Show the store's figures, the spread of S = I x F, and what the tiers would hold.");
  cmd->footer(
      "The store: chunks, prefixes, segments, disk used against the cap, and the counters kept in\n"
      "the catalog (puts, chunks written, deduplicated, evicted, deleted). The score S = I x F of\n"
      "each chunk (I and F are what Re-Prefill sessions added): how many have S = 0, and its\n"
      "quartiles. With --gpu-tier-bytes and/or --cpu-tier-bytes, the ranking at rest: how many\n"
      "records (a record is one chunk at one layer) and chunks the tiers would keep, and their\n"
      "share of the total S, if they held the top-S records as docs/tiers.md's policy does\n"
      "(records take the whole GPU budget and three quarters of the CPU budget, the rest being\n"
      "the summary cache; slots are rounded up to 256 bytes; ties in S are broken by chunk key,\n"
      "where a serving process breaks them by last use).\n"
      "A store at rest has no running tiers: the figures of sessions (tier hits, bytes read,\n"
      "prefetch use, time blocked on I/O, bubbles) live in the serving process that ran them\n"
      "(Engine::Stats() there; 'kvctl replay' prints them for its own run).\n"
      "--format prom prints the store's figures at rest in the Prometheus text format, each\n"
      "sample labelled store=\"STORE\", for node_exporter's textfile collector: ckv_chunks,\n"
      "ckv_prefixes, ckv_segments, ckv_disk_used_bytes, ckv_disk_cap_bytes (0 = unlimited),\n"
      "ckv_free_kept_bytes, ckv_index_memory_bytes, and the counters since creation\n"
      "ckv_puts_total, ckv_chunks_written_total, ckv_chunks_deduplicated_total,\n"
      "ckv_written_bytes_total, ckv_chunks_evicted_total, ckv_evicted_bytes_total,\n"
      "ckv_chunks_deleted_total (the names a serving process's Engine::Metrics() gives them).\n"
      "Example: kvctl stats ./store --gpu-tier-bytes 1G --cpu-tier-bytes 4G\n"
      "Example: kvctl stats ./store --format prom > /var/lib/node_exporter/ckv.prom.tmp");
  AddStoreArg(*cmd, &o->store);
  cli::AddBytes(*cmd, "--gpu-tier-bytes", &o->gpu_tier_bytes,
                "GPU tier budget to rank against (default 0: not shown)");
  cli::AddBytes(*cmd, "--cpu-tier-bytes", &o->cpu_tier_bytes,
                "CPU tier budget to rank against (default 0: not shown)");
  cli::AddJson(*cmd, &o->json);
  cli::AddChoice(*cmd, "--format", &o->format, {"table", "json", "prom"},
                 "output: table (default), json (as --json), prom (Prometheus text, the figures "
                 "at rest)");
  return {cmd, [o] { return RunStats(*o); }};
}

}  // namespace ckv::kvctl
