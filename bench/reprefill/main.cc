// SPDX-License-Identifier: Apache-2.0
// bench/reprefill: Re-Prefill latency of ckv against the published baselines, at equal output
// quality, on one store, with one I/O engine and the same tier budgets (docs/baselines.md says
// how each baseline follows its original, docs/results.md holds the measured tables).
//
// Every system runs every budget, under every tier configuration, in each of `rounds` rounds;
// within a round the (system, budget) runs come in a shuffled order, so that drift of the disk
// spreads over all systems alike. Each run replays the workload (workload.h): warm-up turns, then
// the measured ones, closed-loop, `concurrency` at a time; then fio replays the run's own mix of
// read sizes at its queue depth. The headline compares ckv with each other system at equal
// output error (0.05, 0.1, 0.2), each interpolated on its own curve; baseline-anchored and
// equal-recall comparisons stand beside it (report.h).
//
// Per request and layer: the system's identification and loads, the modelled PCIe transfer of
// what it loaded, then the layer's modelled compute (gpu_model.h), spent as timed waits on one
// shared modelled GPU, so that I/O and compute overlap as they would. Selection scoring runs for
// real on this CPU; its time is taken out of the latency and its FLOPs spent on the modelled
// GPU.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/reprefill/fidelity.h"
#include "bench/reprefill/fio.h"
#include "bench/reprefill/flags.h"
#include "bench/reprefill/gpu_model.h"
#include "bench/reprefill/report.h"
#include "bench/reprefill/store.h"
#include "bench/reprefill/systems.h"
#include "bench/reprefill/workload.h"
#include "ckv/engine.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "engine/internal.h"
#include "tools/attention_profile_file.h"
#include "tools/cli.h"
#include "tools/synthetic_attention.h"

namespace ckv::bench {
namespace {

// One run's figures: one system, one budget, one tier configuration, one round.
struct RunResult {
  std::vector<RequestResult> requests;
  std::vector<Request> measured;
  prefetch::ReadEngineStats before, after;
  uint32_t reorder_passes = 0;  // impress: warm-up passes run (the last one rewrote nothing
                                // when reorder_converged)
  bool reorder_converged = false;
};

// `measured_round`: the round whose requests the fidelity measures (round 1).
absl::StatusOr<RunResult> RunOnce(const Workload& w, const System& sys, double budget,
                                  const TierConfig& tiers, const Arch& arch, bool measured_round) {
  const Flags& f = w.flags();
  EngineOptions o;
  o.create_if_missing = false;
  if (sys.kind == Kind::kCkv) {
    o.gpu_tier_bytes = tiers.gpu_bytes;
    o.cpu_tier_bytes = tiers.cpu_bytes;
  }
  CKV_ASSIGN_OR_RETURN(auto engine, Engine::Open(o, StorePath(f, sys.store())));
  engine::SessionHost& host = engine::HostOf(*engine);
  CKV_RETURN_IF_ERROR(host.store().ResetUsage().status());  // every system starts from no history
  CKV_ASSIGN_OR_RETURN(prefetch::ReadEngine * reads, host.reads());
  BaselineState state;
  if (sys.kind != Kind::kCkv && (tiers.gpu_bytes > 0 || tiers.cpu_bytes > 0)) {
    // The baselines' tiers: the same budgets, the original's policy, and no share kept for
    // summaries they never use.
    state.tiers = std::make_unique<engine::TierManager>(tiers.gpu_bytes, tiers.cpu_bytes, nullptr,
                                                        nullptr, /*summary_share=*/0.0);
  }
  // The system's own files, each registered with the read engine with its checksums.
  const size_t tokens = w.stored_tokens();
  const size_t half_sums = HalfFile(w.spec(), tokens, f.conversations).sums();
  OwnFile key_file, impress_file, scoring_file, value_file;
  if (NeedsKeyFile(sys.kind)) {
    CKV_RETURN_IF_ERROR(key_file.Open(*reads, KeyFilePath(f), KeySumPath(f),
                                      KeyFile(w.spec(), tokens, f.conversations).sums()));
  }
  if (sys.kind == Kind::kImpress) {
    CKV_RETURN_IF_ERROR(impress_file.Open(*reads, ImpressFilePath(f), ImpressSumPath(f),
                                          ImpressFile(w.spec(), tokens, f.conversations).sums()));
  }
  if (sys.kind == Kind::kH2o) {
    CKV_RETURN_IF_ERROR(value_file.Open(*reads, ValueFilePath(f), ValueSumPath(f), half_sums));
  }
  std::unique_ptr<engine::ScoringKeys> scoring_keys;
  if (ScoresFromKeys(sys)) {
    CKV_RETURN_IF_ERROR(
        scoring_file.Open(*reads, ScoringKeyPath(f), ScoringKeySumPath(f), half_sums));
    scoring_keys = MakeScoringKeys(w, scoring_file.id, &scoring_file.sums);
    engine::SetScoringKeys(*engine, scoring_keys.get());
  }
  absl::Cleanup unset_scoring_keys = [&] { engine::SetScoringKeys(*engine, nullptr); };
  ModelledGpu gpu(GpuParams::Of(f));
  ScoringClock clock(reads, &gpu, /*hold_reads=*/f.concurrency == 1);
  engine::SetSelectorClock(*engine, &clock);
  RunContext ctx;
  ctx.w = &w;
  ctx.sys = &sys;
  ctx.spec = WithCodec(w.spec(), sys.codec);
  ctx.budget = budget;
  ctx.check_served = measured_round && f.fidelity;
  ctx.engine = engine.get();
  ctx.reads = reads;
  ctx.key_file = key_file.id;
  ctx.impress_file = impress_file.id;
  ctx.impress_io = impress_file.file.get();
  ctx.value_file = value_file.id;
  ctx.key_sums = &key_file.sums;
  ctx.impress_sums = &impress_file.sums;
  ctx.value_sums = &value_file.sums;
  ctx.gpu = &gpu;
  ctx.clock = &clock;
  ctx.state = &state;
  ctx.arch = arch;

  RunResult out;
  std::vector<Request> warm;
  for (const Request& r : w.requests()) (r.warmup ? warm : out.measured).push_back(r);
  out.requests.resize(out.measured.size());
  // Runners (and their buffers) and every request's queries exist before timing starts.
  std::vector<std::unique_ptr<SystemRunner>> runners;
  for (uint32_t t = 0; t < f.concurrency; ++t) runners.push_back(MakeRunner(ctx));
  // Closed loop: `concurrency` workers take the next request as they finish one.
  auto run_all = [&](const std::vector<Request>& reqs,
                     std::vector<RequestResult>* into) -> absl::Status {
    std::vector<std::vector<std::vector<float>>> queries;
    for (const Request& r : reqs) queries.push_back(w.Queries(r));
    std::atomic<size_t> next{0};
    absl::Mutex mu;
    absl::Status first;
    auto worker = [&](SystemRunner* runner) {
      for (;;) {
        const size_t i = next.fetch_add(1);
        if (i >= reqs.size()) return;
        ScoringClock::Take();
        auto res = runner->Run(reqs[i], queries[i]);
        if (res.ok()) {
          res->scoring_s = ScoringClock::Take();
          res->wall_s = res->latency_s;
          res->latency_s -= res->scoring_s;
          // Between turns, off the request's clock (impress reorders its blocks here).
          if (absl::Status st = runner->AfterRequest(reqs[i], *res); !st.ok()) res = st;
        }
        absl::MutexLock lock(&mu);
        if (!res.ok()) {
          if (first.ok()) first = res.status();
          continue;
        }
        if (into != nullptr) (*into)[i] = std::move(*res);
      }
    };
    std::vector<std::thread> threads;
    for (auto& runner : runners) threads.emplace_back(worker, runner.get());
    for (auto& t : threads) t.join();
    return first;
  };
  absl::Status st = [&]() -> absl::Status {
    CKV_RETURN_IF_ERROR(run_all(warm, nullptr));
    if (sys.kind == Kind::kImpress && !warm.empty()) {
      // IMPRESS reorders offline from the history it has seen: the warm-up requests again until a
      // pass rewrites nothing, so that the measured requests meet a converged layout.
      uint32_t passes = 1;
      bool converged = false;
      while (!converged && passes < f.impress_reorder_passes) {
        const uint64_t before = [&] {
          absl::MutexLock lock(&state.mu);
          return state.reordered_bytes;
        }();
        CKV_RETURN_IF_ERROR(run_all(warm, nullptr));
        ++passes;
        absl::MutexLock lock(&state.mu);
        converged = state.reordered_bytes == before;
      }
      out.reorder_passes = passes;
      out.reorder_converged = converged;
    }
    out.before = reads->stats();
    CKV_RETURN_IF_ERROR(run_all(out.measured, &out.requests));
    out.after = reads->stats();
    return absl::OkStatus();
  }();
  // What the runners changed (impress's reordered blocks) is put back after a failed request
  // too, so that a failed run leaves the store as it found it.
  for (auto& runner : runners) {
    absl::Status fin = runner->Finish();
    if (st.ok()) st = std::move(fin);
  }
  CKV_RETURN_IF_ERROR(st);
  runners.clear();
  for (OwnFile* own : {&key_file, &impress_file, &scoring_file, &value_file}) {
    CKV_RETURN_IF_ERROR(own->Close());
  }
  engine::SetSelectorClock(*engine, nullptr);
  return out;
}

// Adds one run to its row.
void Accumulate(const RunResult& run, Row& row) {
  const prefetch::ReadEngineStats& a = run.after;
  const prefetch::ReadEngineStats& b = run.before;
  std::vector<double> lat;
  double sum = 0;
  uint64_t hits_gpu = 0, hits_cpu = 0, records = 0;
  const double nreq = std::max<size_t>(1, run.requests.size());
  for (const RequestResult& r : run.requests) {
    lat.push_back(r.latency_s * 1e3);
    sum += r.latency_s * 1e3;
    row.scoring_ms += r.scoring_s * 1e3 / nreq;
    row.wall_ms += r.wall_s * 1e3 / nreq;
    row.bubble_ms += r.blocked_s * 1e3 / nreq;
    row.bytes_needed += r.bytes_needed;
    row.bytes_read += r.bytes_read;
    row.h2d_bytes += r.h2d_bytes;
    row.wasted_prefetch_bytes += r.wasted_prefetch_bytes;
    row.fallback_layers += double(r.fallback_layers) / nreq;
    hits_gpu += r.gpu_hits;
    hits_cpu += r.cpu_hits;
    records += r.gpu_hits + r.cpu_hits + r.nvme_records;
  }
  row.requests = run.requests.size();
  row.reorder_passes = std::max(row.reorder_passes, run.reorder_passes);
  if (run.reorder_passes > 0 && !run.reorder_converged) row.reorder_converged = false;
  row.round_mean_ms.push_back(sum / nreq);
  row.gpu_hit_rate += records ? double(hits_gpu) / records : 0;
  row.cpu_hit_rate += records ? double(hits_cpu) / records : 0;
  const double busy = a.busy_seconds - b.busy_seconds;
  const uint64_t dev_bytes = a.bytes_read - b.bytes_read;
  row.device_mb_s += busy > 0 ? dev_bytes / busy / 1e6 : 0;
  const double area =
      a.mean_queue_depth * a.elapsed_seconds - b.mean_queue_depth * b.elapsed_seconds;
  row.busy_queue_depth += busy > 0 ? area / busy : 0;
}

// Per-round sums into per-round means, and the request percentiles over every round.
void Finalise(Row& row, const std::vector<double>& all_latencies) {
  const double rounds = std::max<size_t>(1, row.round_mean_ms.size());
  row.scoring_ms /= rounds;
  row.wall_ms /= rounds;
  row.bubble_ms /= rounds;
  row.read_amplification = row.bytes_needed ? double(row.bytes_read) / row.bytes_needed : 0;
  row.bytes_needed = static_cast<uint64_t>(row.bytes_needed / rounds);
  row.bytes_read = static_cast<uint64_t>(row.bytes_read / rounds);
  row.h2d_bytes = static_cast<uint64_t>(row.h2d_bytes / rounds);
  row.wasted_prefetch_bytes = static_cast<uint64_t>(row.wasted_prefetch_bytes / rounds);
  row.fallback_layers /= rounds;
  row.gpu_hit_rate /= rounds;
  row.cpu_hit_rate /= rounds;
  row.device_mb_s /= rounds;
  row.busy_queue_depth /= rounds;
  row.mean_ms = std::accumulate(all_latencies.begin(), all_latencies.end(), 0.0) /
                std::max<size_t>(1, all_latencies.size());
  row.p50_ms = Percentile(all_latencies, 0.5);
  row.p95_ms = Percentile(all_latencies, 0.95);
}

// The systems the flags name, and what the store must hold for them. Prints the error and
// returns false on a bad name.
struct SystemSet {
  std::vector<System> systems;
  std::set<StoreId> stores;
  StoreFiles files;
};

bool ParseSystems(const Flags& f, SystemSet* set) {
  const absl::StatusOr<KvCodec> default_codec = ParseKvCodec(f.codec);
  if (!default_codec.ok()) {
    std::fprintf(stderr, "%s: --codec: %s\n", kProg, default_codec.status().ToString().c_str());
    return false;
  }
  for (const std::string& name : f.systems) {
    auto s = ParseSystem(name, *default_codec);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProg, s.status().ToString().c_str());
      return false;
    }
    set->stores.insert(s->store());
    set->files.keys |= NeedsKeyFile(s->kind);
    set->files.impress |= s->kind == Kind::kImpress;
    set->files.scoring_keys |= ScoresFromKeys(*s);
    set->files.values |= s->kind == Kind::kH2o;
    set->systems.push_back(*s);
  }
  if (!f.compare.empty() &&
      std::find(f.systems.begin(), f.systems.end(), f.compare) == f.systems.end()) {
    std::fprintf(stderr, "%s: --compare %s: not one of --systems\n", kProg, f.compare.c_str());
    return false;
  }
  return true;
}

// Every (tier configuration, system, budget) is a row; full loads everything whatever the
// budget, so it runs once per round and is reported at each budget.
struct Job {
  size_t tiers, system;
  double budget;
};

std::vector<Job> Jobs(const Flags& f, const std::vector<System>& systems, size_t tier_configs) {
  std::vector<Job> jobs;
  for (size_t t = 0; t < tier_configs; ++t) {
    for (size_t s = 0; s < systems.size(); ++s) {
      for (double b : f.budgets) {
        jobs.push_back({t, s, b});
        if (systems[s].kind == Kind::kFull) break;
      }
    }
  }
  return jobs;
}

// What the rounds collect per job.
struct JobFigures {
  Row row;
  std::vector<double> latencies_ms;
  IoSizeMix mix{};
};

// f.rounds rounds of every job, in a shuffled order per round. Prints the error and returns
// false when a run fails.
bool RunRounds(const Flags& f, const Workload& w, const std::vector<System>& systems,
               const std::vector<TierConfig>& tier_configs, const std::vector<Job>& jobs,
               const Arch& arch, Fidelity* fidelity, std::vector<JobFigures>* figures) {
  std::mt19937_64 rng(f.seed);
  for (uint32_t round = 0; round < f.rounds; ++round) {
    std::vector<size_t> order(jobs.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      const Job& job = jobs[i];
      const System& sys = systems[job.system];
      const TierConfig& tc = tier_configs[job.tiers];
      std::fprintf(stderr, "%s: round %u/%u: %s at %.0f%%, %s tiers ...\n", kProg, round + 1,
                   f.rounds, sys.name.c_str(), job.budget * 100, tc.name.c_str());
      auto run = RunOnce(w, sys, job.budget, tc, arch, /*measured_round=*/round == 0);
      if (!run.ok()) {
        std::fprintf(stderr, "%s: %s at %.0f%%: %s\n", kProg, sys.name.c_str(), job.budget * 100,
                     run.status().ToString().c_str());
        return false;
      }
      JobFigures& fig = (*figures)[i];
      Row& row = fig.row;
      row.tiers = tc.name;
      row.system = sys.name;
      row.budget = job.budget;
      row.config = sys.Config(f);
      Accumulate(*run, row);
      for (const RequestResult& r : run->requests) fig.latencies_ms.push_back(r.latency_s * 1e3);
      for (size_t k = 0; k < fig.mix.size(); ++k) {
        fig.mix[k] += run->after.io_size_histogram[k] - run->before.io_size_histogram[k];
      }
      if (round == 0 && fidelity != nullptr) {
        if (absl::Status st = fidelity->MeasureRow(sys.codec, run->measured, run->requests,
                                                   f.fidelity_requests, &row);
            !st.ok()) {
          std::fprintf(stderr, "%s: fidelity: %s\n", kProg, st.ToString().c_str());
          return false;
        }
      }
    }
  }
  return true;
}

// The table's rows: each job's, finalised, with fio's figures beside it; full's row repeated at
// every budget.
std::vector<Row> CollectRows(const Flags& f, const std::vector<System>& systems,
                             const std::vector<Job>& jobs, std::vector<JobFigures>& figures,
                             Fio* fio) {
  std::vector<Row> out;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Row& row = figures[i].row;
    const IoSizeMix& mix = figures[i].mix;
    Finalise(row, figures[i].latencies_ms);
    if (fio != nullptr && row.busy_queue_depth > 0) {
      const std::string dir = StorePath(f, systems[jobs[i].system].store());
      row.fio_mb_s =
          fio->MbPerS(mix, static_cast<uint32_t>(std::lround(row.busy_queue_depth)), dir);
      row.fio_full_depth_mb_s = fio->MbPerS(mix, prefetch::ReadEngineOptions{}.queue_depth, dir);
    }
    uint64_t ios = 0;
    uint64_t bytes = 0;
    for (size_t k = 0; k < mix.size(); ++k) {
      ios += mix[k];
      bytes += mix[k] * (uint64_t{4096} << k);
    }
    row.dominant_io_bytes = ios ? bytes / ios : 0;
    out.push_back(row);
    if (systems[jobs[i].system].kind == Kind::kFull) {
      for (double b : f.budgets) {
        if (b == row.budget) continue;
        Row copy = row;
        copy.budget = b;
        out.push_back(copy);
      }
    }
  }
  return out;
}

// recompute: the modelled prefill of the whole prompt with no cache, per tier configuration.
void AddRecomputeRows(const Flags& f, const Workload& w, const Arch& arch,
                      const std::vector<TierConfig>& tier_configs, std::vector<Row>* out) {
  for (const TierConfig& tc : tier_configs) {
    const double ms = 1e3 * RecomputeSeconds(w.spec(), arch, GpuParams::Of(f),
                                             double(f.prefix_tokens + f.suffix_tokens));
    for (double b : f.budgets) {
      Row r;
      r.tiers = tc.name;
      r.system = "recompute";
      r.config = "prefill of the whole prompt on the modelled GPU, no cache (modelled)";
      r.budget = b;
      r.modelled = true;
      r.mean_ms = r.p50_ms = r.p95_ms = ms;
      r.round_mean_ms.assign(f.rounds, ms);
      if (f.fidelity) {
        r.recall = r.recall_loaded = 1.0;
        r.rel_error = r.rel_error_p95 = r.worst_layer_error = 0.0;
      }
      out->push_back(r);
    }
  }
}

// The table (unless --json takes its place), the JSON and the plot.
int Report(const Flags& f, const Workload& w, const std::vector<System>& systems,
           std::vector<Row>& out) {
  std::stable_sort(out.begin(), out.end(), [&](const Row& a, const Row& b) {
    if (a.tiers != b.tiers) {
      return std::find(f.tiers.begin(), f.tiers.end(), a.tiers) <
             std::find(f.tiers.begin(), f.tiers.end(), b.tiers);
    }
    return false;
  });
  std::string ckv_name = f.compare;
  for (const System& s : systems) {
    if (!f.compare.empty()) break;
    if (s.kind == Kind::kCkv && s.name != "ckv-paper" && (ckv_name.empty() || s.name == "ckv"))
      ckv_name = s.name;
  }
  Comparisons c;
  if (!ckv_name.empty()) {
    c.equal_error = EqualErrorOf(
        out, ckv_name, std::vector<double>(std::begin(kEqualErrors), std::end(kEqualErrors)));
    c.anchored = BaselineAnchoredOf(
        out, ckv_name, std::vector<double>(std::begin(kAnchorBudgets), std::end(kAnchorBudgets)));
    c.equal_recall = EqualRecallOf(out, ckv_name, 0.05);
  }
  c.impress_anchors = ImpressAnchorsOf(out);
  if (!f.json.ToStdout()) PrintTable(out, c);
  if (f.json.enabled) {
    if (absl::Status st = f.json.Write(ToJson(w, out, c)); !st.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProg, st.ToString().c_str());
      return 1;
    }
  }
  if (!f.plot.empty()) Plot(w, out, f.plot);
  return 0;
}

// A trained network's attention (--attention-profile trained-tiny): opens f->profile_file and
// takes the model and the workload's shape from it into *f, *spec and *arch. A flag given on the
// command line that contradicts the file is a usage error; the others are overridden, and a note
// says what the file set. Prints the error and returns the exit code on failure.
std::optional<int> ApplyProfileFile(Flags* f, std::unique_ptr<synth::AttentionProfileFile>* file,
                                    ModelSpec* spec, Arch* arch) {
  if (f->profile_file.empty()) {
    return cli::UsageError(
        kProg, absl::StrCat("--attention-profile ", kTrainedProfile, " needs --profile-file PATH"));
  }
  auto opened = synth::AttentionProfileFile::Open(f->profile_file);
  if (!opened.ok()) {
    std::fprintf(stderr, "%s: --profile-file: %s\n", kProg, opened.status().ToString().c_str());
    return kExitUsage;
  }
  const synth::AttentionProfileFile& p = **opened;
  for (const char* name : {"--system-prompt-share", "--request-shift", "--head-agreement"}) {
    if (f->given.contains(name)) {
      return cli::UsageError(kProg, absl::StrCat(name,
                                                 " is the synthetic generator's; the "
                                                 "profile file ",
                                                 p.path(),
                                                 " fixes the tokens "
                                                 "and the queries"));
    }
  }
  struct Field {
    const char* flag;
    uint32_t* value;
    uint32_t from_file;
  };
  for (const Field& x :
       {Field{"--prefix-tokens", &f->prefix_tokens, p.prefix_tokens()},
        Field{"--suffix-tokens", &f->suffix_tokens, p.suffix_tokens()},
        Field{"--conversations", &f->conversations, p.conversations()},
        Field{"--turns", &f->turns, p.turns()}, Field{"--window", &f->window, p.window()}}) {
    if (f->given.contains(x.flag) && *x.value != x.from_file) {
      return cli::UsageError(kProg, absl::StrCat(x.flag, " ", *x.value,
                                                 " contradicts the profile "
                                                 "file ",
                                                 p.path(), ", which has ", x.from_file,
                                                 " (leave the flag out: the file sets it)"));
    }
    *x.value = x.from_file;
  }
  if (f->given.contains("--model") && f->model != p.spec().model_id) {
    return cli::UsageError(kProg, absl::StrCat("--model ", f->model,
                                               " contradicts the profile "
                                               "file ",
                                               p.path(), ", whose model is ", p.spec().model_id));
  }
  f->model = p.spec().model_id;
  if (!f->given.contains("--warmup-turns")) {
    f->warmup_turns = std::min(f->warmup_turns, f->turns - 1);
  }
  if (f->warmup_turns >= f->turns || f->prefix_tokens < 16) {
    return cli::UsageError(kProg, absl::StrCat("the profile file ", p.path(), " has ", f->turns,
                                               " turns and a prefix of ", f->prefix_tokens,
                                               " tokens: need warmup-turns (", f->warmup_turns,
                                               ") < turns and prefix-tokens >= 16"));
  }
  *spec = p.spec();
  if (auto known = ArchOf(f->model); known.ok()) {
    *arch = *known;
  } else if (p.hidden() != 0 && p.intermediate() != 0) {
    arch->hidden = p.hidden();  // the file says
    arch->intermediate = p.intermediate();
  } else {
    // A model without preset figures: hidden = q_heads * head_dim (as in most decoders) and a
    // 4x MLP, for the modelled compute alone.
    arch->hidden = spec->q_heads * spec->head_dim;
    arch->intermediate = 4 * arch->hidden;
  }
  std::fprintf(stderr,
               "%s: attention profile %s: %s (%u layers, %u q heads, %u kv heads, head_dim %u, "
               "%u-token chunks, fp16), %u conversations, a %u-token prefix, %u turns of %u "
               "tokens, window %u, warm-up turns %u; modelled compute as hidden %u, MLP %u\n",
               kProg, p.path().c_str(), spec->model_id.c_str(), spec->layers, spec->q_heads,
               spec->kv_heads, spec->head_dim, spec->chunk_tokens, f->conversations,
               f->prefix_tokens, f->turns, f->suffix_tokens, f->window, f->warmup_turns,
               arch->hidden, arch->intermediate);
  *file = *std::move(opened);
  return std::nullopt;
}

int Run(const Flags& flags) {
  Flags f = flags;  // a profile file sets some of them
  std::unique_ptr<synth::AttentionProfileFile> file;
  ModelSpec spec;
  Arch arch;
  if (f.attention_profile == kTrainedProfile) {
    if (const std::optional<int> exit = ApplyProfileFile(&f, &file, &spec, &arch)) return *exit;
  } else {
    if (!f.profile_file.empty()) {
      return cli::UsageError(
          kProg, absl::StrCat("--profile-file needs --attention-profile ", kTrainedProfile));
    }
    auto preset = ModelSpec::Preset(f.model);
    if (!preset.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProg, preset.status().ToString().c_str());
      return kExitUsage;
    }
    spec = *preset;
    auto known = ArchOf(f.model);
    if (!known.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProg, known.status().ToString().c_str());
      return kExitUsage;
    }
    arch = *known;
    if (auto p = synth::ParseAttentionProfile(f.attention_profile); !p.ok()) {
      std::fprintf(stderr, "%s: --attention-profile: %s, or %s (with --profile-file)\n", kProg,
                   p.status().ToString().c_str(), kTrainedProfile);
      return kExitUsage;
    }
  }
  SystemSet set;
  if (!ParseSystems(f, &set)) return kExitUsage;
  const Workload w(f, spec, file.get());
  if (absl::Status st = Populate(w, set.stores, set.files); !st.ok()) {
    std::fprintf(stderr, "%s: populating %s: %s\n", kProg, f.store.c_str(), st.ToString().c_str());
    return 1;
  }
  std::unique_ptr<Fidelity> fidelity;
  if (f.fidelity) fidelity = std::make_unique<Fidelity>(w);
  std::unique_ptr<Fio> fio;
  if (f.fio) fio = std::make_unique<Fio>(f, prefetch::ReadEngineOptions{}.queue_depth);

  const std::vector<TierConfig> tier_configs = TierConfigs(f, w.store_bytes());
  const std::vector<Job> jobs = Jobs(f, set.systems, tier_configs.size());
  std::vector<JobFigures> figures(jobs.size());
  if (!RunRounds(f, w, set.systems, tier_configs, jobs, arch, fidelity.get(), &figures)) return 1;
  std::vector<Row> out = CollectRows(f, set.systems, jobs, figures, fio.get());
  AddRecomputeRows(f, w, arch, tier_configs, &out);
  return Report(f, w, set.systems, out);
}

}  // namespace
}  // namespace ckv::bench

int main(int argc, char** argv) {
  return ckv::cli::Main(argc, argv, ckv::bench::ParseFlags, ckv::bench::Run);
}
