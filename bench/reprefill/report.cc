// SPDX-License-Identifier: Apache-2.0
#include "bench/reprefill/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "absl/strings/str_format.h"
#include "bench/reprefill/flags.h"
#include "tools/json_writer.h"

namespace ckv::bench {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// The latency at `recall` on a curve of (recall, latency) points taken at rising budgets: linear
// between the two budgets around it; the smallest budget's latency when even that reaches it;
// none when no budget does.
struct Interp {
  std::optional<double> latency, budget;
};
Interp AtRecall(const std::vector<const Row*>& curve, double recall, size_t round) {
  for (size_t i = 0; i < curve.size(); ++i) {
    const Row& hi = *curve[i];
    if (!hi.recall || *hi.recall + 1e-12 < recall) continue;
    const double lat_hi = round < hi.round_mean_ms.size() ? hi.round_mean_ms[round] : hi.mean_ms;
    if (i == 0) return {lat_hi, hi.budget};
    const Row& lo = *curve[i - 1];
    const double lat_lo = round < lo.round_mean_ms.size() ? lo.round_mean_ms[round] : lo.mean_ms;
    const double span = *hi.recall - *lo.recall;
    const double t = span > 0 ? (recall - *lo.recall) / span : 1;
    return {lat_lo + t * (lat_hi - lat_lo), lo.budget + t * (hi.budget - lo.budget)};
  }
  return {};
}

}  // namespace

double Row::MedianRoundMs() const { return round_mean_ms.empty() ? mean_ms : Median(round_mean_ms); }
double Row::MinRoundMs() const {
  return round_mean_ms.empty() ? mean_ms : *std::min_element(round_mean_ms.begin(), round_mean_ms.end());
}
double Row::MaxRoundMs() const {
  return round_mean_ms.empty() ? mean_ms : *std::max_element(round_mean_ms.begin(), round_mean_ms.end());
}

std::vector<EqualRecall> EqualRecallOf(const std::vector<Row>& rows, const std::string& ckv,
                                       double reference_budget) {
  std::vector<EqualRecall> out;
  std::set<std::string> tiers;
  for (const Row& r : rows) tiers.insert(r.tiers);
  for (const std::string& t : tiers) {
    std::vector<const Row*> curve;
    for (const Row& r : rows) {
      if (r.tiers == t && r.system == ckv) curve.push_back(&r);
    }
    std::sort(curve.begin(), curve.end(), [](const Row* a, const Row* b) { return a->budget < b->budget; });
    if (curve.empty()) continue;
    for (const char* base : {"impress", "ckv-paper", "h2o", "full"}) {
      const bool full = std::string(base) == "full";
      // The baseline's row at the reference budget (the closest budget run), or full's.
      const Row* b = nullptr;
      for (const Row& r : rows) {
        if (r.tiers != t || r.system != base) continue;
        if (b == nullptr || std::abs(r.budget - reference_budget) < std::abs(b->budget - reference_budget)) b = &r;
      }
      if (b == nullptr || !b->recall) continue;
      EqualRecall e;
      e.tiers = t;
      e.baseline = base;
      e.ckv_system = ckv;
      e.baseline_budget = full ? 0 : b->budget;
      e.recall = full ? 0.95 : *b->recall;
      e.baseline_latency_ms = b->MedianRoundMs();
      const Interp mid = AtRecall(curve, e.recall, ~size_t{0});
      if (!mid.latency) {
        e.note = absl::StrFormat("%s does not reach recall %.3f at any budget run", ckv, e.recall);
        out.push_back(e);
        continue;
      }
      e.ckv_budget = mid.budget;
      std::vector<double> lat, speed;
      const size_t rounds = std::max<size_t>(1, b->round_mean_ms.size());
      for (size_t r = 0; r < rounds; ++r) {
        const Interp at = AtRecall(curve, e.recall, b->round_mean_ms.empty() ? ~size_t{0} : r);
        const double base_ms = b->round_mean_ms.empty() ? b->mean_ms : b->round_mean_ms[r];
        lat.push_back(*at.latency);
        speed.push_back(base_ms / *at.latency);
      }
      e.ckv_latency_ms = Median(lat);
      e.speedup = Median(speed);
      e.speedup_min = *std::min_element(speed.begin(), speed.end());
      e.speedup_max = *std::max_element(speed.begin(), speed.end());
      if (curve.front()->recall && *curve.front()->recall >= e.recall) {
        e.note = "ckv reaches it at its smallest budget run: its latency there is an upper bound";
      }
      out.push_back(e);
    }
  }
  return out;
}

void PrintTable(const std::vector<Row>& rows, const std::vector<EqualRecall>& eq) {
  std::string tiers;
  for (const Row& r : rows) {
    if (r.tiers != tiers) {
      tiers = r.tiers;
      std::map<double, double> impress, full;
      for (const Row& x : rows) {
        if (x.tiers != tiers) continue;
        if (x.system == "impress") impress[x.budget] = x.MedianRoundMs();
        if (x.system == "full") full[x.budget] = x.MedianRoundMs();
      }
      std::printf("\ntiers: %s (latency: median of the rounds' means [min, max]; vs imp and vs full: "
                  "at equal budget)\n", tiers.c_str());
      std::printf("%-30s %6s %20s %8s %7s %7s %8s %8s %8s %8s %7s %7s %6s %6s %7s\n", "system",
                  "budget", "latency ms", "p95 ms", "vs imp", "vs full", "MB read", "read amp",
                  "dev MB/s", "fio MB/s", "recall", "rec.blk", "gpu %", "cpu %", "cpu sc");
      for (const Row& x : rows) {
        if (x.tiers != tiers) continue;
        const auto ratio = [&](const std::map<double, double>& base) {
          auto it = base.find(x.budget);
          return it == base.end() || x.MedianRoundMs() <= 0
                     ? std::string("-")
                     : absl::StrFormat("%.2fx", it->second / x.MedianRoundMs());
        };
        const auto opt = [](const std::optional<double>& v) {
          return v ? absl::StrFormat("%.3f", *v) : std::string("-");
        };
        const std::string lat = absl::StrFormat("%.1f [%.1f, %.1f]", x.MedianRoundMs(),
                                                x.MinRoundMs(), x.MaxRoundMs());
        std::printf("%-30s %5.0f%% %20s %8.1f %7s %7s %8.1f %8.2f %8.0f %8.0f %7s %7s %6.1f %6.1f %7.1f\n",
                    x.system.c_str(), x.budget * 100, lat.c_str(), x.p95_ms,
                    ratio(impress).c_str(), ratio(full).c_str(),
                    x.bytes_read / 1e6 / std::max<size_t>(1, x.requests), x.read_amplification,
                    x.device_mb_s, x.fio_mb_s, opt(x.recall).c_str(), opt(x.recall_loaded).c_str(),
                    x.gpu_hit_rate * 100, x.cpu_hit_rate * 100, x.scoring_ms);
      }
    }
  }
  if (eq.empty()) return;
  std::printf("\nequal recall: ckv's latency interpolated at the recall each baseline reaches at its "
              "reference budget (full: 0.95); speedup median [min, max] over rounds\n");
  std::printf("%-8s %-10s %-30s %7s %7s %12s %10s %10s %24s\n", "tiers", "baseline", "ckv system",
              "budget", "recall", "baseline ms", "ckv ms", "ckv budget", "speedup");
  for (const EqualRecall& e : eq) {
    const std::string budget = e.baseline == "full" ? "-" : absl::StrFormat("%.0f%%", e.baseline_budget * 100);
    std::printf("%-8s %-10s %-30s %7s %7.3f %12.1f %10s %10s %24s\n", e.tiers.c_str(),
                e.baseline.c_str(), e.ckv_system.c_str(), budget.c_str(), e.recall,
                e.baseline_latency_ms,
                e.ckv_latency_ms ? absl::StrFormat("%.1f", *e.ckv_latency_ms).c_str() : "-",
                e.ckv_budget ? absl::StrFormat("%.1f%%", *e.ckv_budget * 100).c_str() : "-",
                e.speedup ? absl::StrFormat("%.2fx [%.2f, %.2f]", *e.speedup, *e.speedup_min,
                                            *e.speedup_max).c_str()
                          : "not reached");
    if (!e.note.empty()) std::printf("         note: %s\n", e.note.c_str());
  }
}

std::string ToJson(const Workload& w, const std::vector<Row>& rows,
                   const std::vector<EqualRecall>& eq) {
  const Flags& f = w.flags();
  tools::JsonWriter j;
  j.BeginObject();
  j.Key("workload").BeginObject().Key("model").String(f.model);
  j.Key("prefix_tokens").Uint(f.prefix_tokens).Key("suffix_tokens").Uint(f.suffix_tokens);
  j.Key("conversations").Uint(f.conversations).Key("turns").Uint(f.turns);
  j.Key("warmup_turns").Uint(f.warmup_turns).Key("system_prompt_share").Double(f.system_prompt_share);
  j.Key("concurrency").Uint(f.concurrency).Key("window").Uint(f.window);
  j.Key("gpu_tier_bytes").Uint(f.gpu_tier_bytes).Key("cpu_tier_bytes").Uint(f.cpu_tier_bytes);
  j.Key("gpu_tflops").Double(f.gpu_tflops).Key("hbm_gb_s").Double(f.hbm_gb_s);
  j.Key("launch_us").Double(f.launch_us).Key("pcie_gb_s").Double(f.pcie_gb_s);
  j.Key("seed").Uint(f.seed).Key("rounds").Uint(f.rounds);
  j.Key("attention_profile").String(f.attention_profile);
  // A profile file's queries are the network's: the generator's shift does not apply.
  if (w.file() != nullptr) j.Key("profile_file").String(w.file()->path());
  else j.Key("request_shift").Double(w.Params(Request{}).request_shift);
  j.Key("impress_probes").String(f.impress_probes);
  j.Key("store_bytes").Uint(w.store_bytes());
  j.EndObject();
  j.Key("results").BeginArray();
  for (const Row& r : rows) {
    j.BeginObject().Key("tiers").String(r.tiers).Key("system").String(r.system);
    j.Key("config").String(r.config).Key("budget").Double(r.budget).Key("requests").Uint(r.requests);
    j.Key("modelled").Bool(r.modelled);
    j.Key("latency_ms").BeginObject().Key("mean").Double(r.mean_ms).Key("p50").Double(r.p50_ms);
    j.Key("p95").Double(r.p95_ms).Key("round_median").Double(r.MedianRoundMs());
    j.Key("round_min").Double(r.MinRoundMs()).Key("round_max").Double(r.MaxRoundMs());
    j.Key("rounds").BeginArray();
    for (double m : r.round_mean_ms) j.Double(m);
    j.EndArray().EndObject();
    j.Key("wall_ms").Double(r.wall_ms).Key("scoring_cpu_ms").Double(r.scoring_ms).Key("bubble_ms").Double(r.bubble_ms);
    j.Key("bytes_needed").Uint(r.bytes_needed).Key("bytes_read").Uint(r.bytes_read);
    j.Key("h2d_bytes").Uint(r.h2d_bytes);
    j.Key("read_amplification").Double(r.read_amplification);
    j.Key("device_mb_s").Double(r.device_mb_s).Key("fio_mb_s").Double(r.fio_mb_s);
    j.Key("fio_engine_depth_mb_s").Double(r.fio_full_depth_mb_s);
    j.Key("dominant_io_bytes").Uint(r.dominant_io_bytes);
    j.Key("queue_depth").Double(r.busy_queue_depth);
    const auto opt = [&](const char* key, const std::optional<double>& v) {
      j.Key(key);
      if (v) j.Double(*v); else j.Null();
    };
    opt("attention_recall", r.recall);
    opt("attention_recall_loaded", r.recall_loaded);
    opt("output_rel_error", r.rel_error);
    j.Key("hit_rate").BeginObject().Key("gpu").Double(r.gpu_hit_rate).Key("cpu").Double(r.cpu_hit_rate);
    j.EndObject();
    j.Key("wasted_prefetch_bytes").Uint(r.wasted_prefetch_bytes);
    j.Key("fallback_layers").Double(r.fallback_layers);
    j.EndObject();
  }
  j.EndArray();
  j.Key("equal_recall").BeginArray();
  for (const EqualRecall& e : eq) {
    j.BeginObject().Key("tiers").String(e.tiers).Key("baseline").String(e.baseline);
    j.Key("ckv_system").String(e.ckv_system).Key("baseline_budget").Double(e.baseline_budget);
    j.Key("recall").Double(e.recall).Key("baseline_latency_ms").Double(e.baseline_latency_ms);
    const auto opt = [&](const char* key, const std::optional<double>& v) {
      j.Key(key);
      if (v) j.Double(*v); else j.Null();
    };
    opt("ckv_budget", e.ckv_budget);
    opt("ckv_latency_ms", e.ckv_latency_ms);
    opt("speedup", e.speedup);
    opt("speedup_min", e.speedup_min);
    opt("speedup_max", e.speedup_max);
    j.Key("note").String(e.note);
    j.EndObject();
  }
  j.EndArray().EndObject();
  return j.str();
}

void Plot(const Workload& w, const std::vector<Row>& rows, const std::string& path) {
  const Flags& f = w.flags();
  std::vector<std::string> tiers, systems;
  for (const Row& r : rows) {
    if (std::find(tiers.begin(), tiers.end(), r.tiers) == tiers.end()) tiers.push_back(r.tiers);
    if (std::find(systems.begin(), systems.end(), r.system) == systems.end()) systems.push_back(r.system);
  }
  std::string s = absl::StrFormat("set terminal png size %d,560\nset output '%s'\n",
                                  480 + 520 * int(tiers.size()), path);
  s += absl::StrFormat(
      "set multiplot layout 1,%d title 'Re-Prefill latency against attention recall, %s, "
      "%u-token prefixes, %u-token suffixes, %s attention'\n",
      int(tiers.size()), f.model, f.prefix_tokens, f.suffix_tokens, f.attention_profile);
  s += "set xlabel 'attention recall'\nset ylabel 'Re-Prefill latency (ms, median of rounds)'\n"
       "set key below\nset grid\nset logscale y\n";
  for (const std::string& t : tiers) {
    s += "set title 'tiers: " + t + "'\nplot ";
    bool first = true;
    std::string data;
    for (const std::string& name : systems) {
      std::string pts;
      for (const Row& r : rows) {
        if (r.tiers == t && r.system == name && r.recall) {
          pts += absl::StrFormat("%g %g\n", *r.recall, r.MedianRoundMs());
        }
      }
      if (pts.empty()) continue;
      s += std::string(first ? "" : ", ") + "'-' with linespoints lw 2 title '" + name + "'";
      first = false;
      data += pts + "e\n";
    }
    if (first) s += "1/0 notitle";
    s += "\n" + data;
  }
  s += "unset multiplot\n";
  FILE* gp = popen("gnuplot", "w");
  if (gp == nullptr || std::fwrite(s.data(), 1, s.size(), gp) != s.size() || pclose(gp) != 0) {
    std::fprintf(stderr, "%s: gnuplot failed; no plot drawn\n", kProg);
    return;
  }
  // On stderr: stdout holds the table, or the JSON with --json.
  std::fprintf(stderr, "%s: plot: %s\n", kProg, path.c_str());
}

}  // namespace ckv::bench
