// SPDX-License-Identifier: Apache-2.0
#include "bench/reprefill/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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

// Round `round`'s mean latency of `r`, or its median over rounds when it has no such round.
double LatencyIn(const Row& r, size_t round) {
  return round < r.round_mean_ms.size() ? r.round_mean_ms[round] : r.MedianRoundMs();
}

// A system's rows under one tier configuration, at rising budgets, those with an output error.
std::vector<const Row*> ErrorCurve(const std::vector<Row>& rows, const std::string& tiers,
                                   const std::string& system) {
  std::vector<const Row*> curve;
  for (const Row& r : rows) {
    if (r.tiers == tiers && r.system == system && r.rel_error) curve.push_back(&r);
  }
  std::sort(curve.begin(), curve.end(),
            [](const Row* a, const Row* b) { return a->budget < b->budget; });
  return curve;
}

// Where `curve` first reaches `error`: between curve[hi - 1] and curve[hi] at weight t (hi == 0:
// at the smallest budget itself).
struct Reach {
  bool reached = false;
  size_t hi = 0;
  double t = 1;
};
Reach ReachOf(const std::vector<const Row*>& curve, double error) {
  for (size_t i = 0; i < curve.size(); ++i) {
    const double e = *curve[i]->rel_error;
    if (e > error + 1e-12) continue;
    if (i == 0) return {true, 0, 1};
    const double lo = *curve[i - 1]->rel_error;  // > error: i is the first to reach it
    const double span = lo - e;
    return {true, i, span > 0 ? (lo - error) / span : 1};
  }
  return {};
}

double Lerp(double a, double b, double t) { return a + t * (b - a); }

// The curve's point at `error`, and its per-round latencies there (empty when not reached).
CurvePoint PointOf(const std::vector<const Row*>& curve, double error, size_t rounds,
                   std::vector<double>* per_round) {
  CurvePoint p;
  per_round->clear();
  if (curve.empty()) return p;
  const Reach reach = ReachOf(curve, error);
  if (!reach.reached) {
    const Row* closest =
        *std::min_element(curve.begin(), curve.end(),
                          [](const Row* a, const Row* b) { return *a->rel_error < *b->rel_error; });
    p.budget = closest->budget;
    p.error = *closest->rel_error;
    p.latency_ms = closest->MedianRoundMs();
    return p;
  }
  p.reached = true;
  // full and recompute run once, whatever the budget: their rows are copies, and no budget is
  // theirs.
  const bool budget_free = curve.front()->round_mean_ms == curve.back()->round_mean_ms &&
                           *curve.front()->rel_error == *curve.back()->rel_error &&
                           curve.front()->bytes_read == curve.back()->bytes_read;
  p.at_smallest = reach.hi == 0 && !budget_free && curve.size() > 1;
  const Row& hi = *curve[reach.hi];
  const Row& lo = *curve[reach.hi == 0 ? 0 : reach.hi - 1];
  if (!budget_free) p.budget = Lerp(lo.budget, hi.budget, reach.t);
  for (size_t r = 0; r < rounds; ++r) {
    per_round->push_back(Lerp(LatencyIn(lo, r), LatencyIn(hi, r), reach.t));
  }
  p.latency_ms = Median(*per_round);
  return p;
}

std::string Percent(double budget) { return absl::StrFormat("%.1f%%", budget * 100); }

// Why a point has no ratio, or what bounds it.
std::string NoteOf(const std::string& system, const CurvePoint& p, double error) {
  if (!p.reached) {
    return absl::StrFormat(
        "%s does not reach error %.3f at any budget run (closest: %.3f at %s, "
        "%.1f ms)",
        system, error, p.error.value_or(0), Percent(p.budget.value_or(0)),
        p.latency_ms.value_or(0));
  }
  if (p.at_smallest) {
    return absl::StrFormat(
        "%s reaches error %.3f at its smallest budget run (%s): its latency "
        "there is an upper bound",
        system, error, Percent(p.budget.value_or(0)));
  }
  return "";
}

// The baseline's curve against ckv's at `error`; `anchor_budget` set: the baseline's curve is
// its one row at that budget, whose own error `error` is.
EqualError Compare(const std::string& tiers, const std::string& baseline, const std::string& ckv,
                   const std::vector<const Row*>& base_curve,
                   const std::vector<const Row*>& ckv_curve, double error,
                   std::optional<double> anchor_budget) {
  EqualError e;
  e.tiers = tiers;
  e.baseline = baseline;
  e.ckv_system = ckv;
  e.error = error;
  e.anchor_budget = anchor_budget;
  size_t rounds = 1;
  for (const Row* r : base_curve) rounds = std::max(rounds, r->round_mean_ms.size());
  for (const Row* r : ckv_curve) rounds = std::max(rounds, r->round_mean_ms.size());
  std::vector<double> base_rounds, ckv_rounds;
  e.base = PointOf(base_curve, error, rounds, &base_rounds);
  if (anchor_budget) {
    // The anchored row itself: not a bound, and at its own budget (a one-row curve reads as
    // budget-free).
    e.base.at_smallest = false;
    e.base.budget = anchor_budget;
  }
  e.ckv = PointOf(ckv_curve, error, rounds, &ckv_rounds);
  std::vector<std::string> notes;
  for (const auto& [name, p] : {std::pair<std::string, const CurvePoint&>{baseline, e.base},
                                std::pair<std::string, const CurvePoint&>{ckv, e.ckv}}) {
    if (std::string n = NoteOf(name, p, error); !n.empty()) notes.push_back(n);
  }
  e.note = absl::StrJoin(notes, "; ");
  if (!e.base.reached || !e.ckv.reached || !(*e.ckv.latency_ms > 0)) return e;
  e.speedup = *e.base.latency_ms / *e.ckv.latency_ms;
  std::vector<double> ratios;
  for (size_t r = 0; r < rounds; ++r) {
    if (ckv_rounds[r] > 0) ratios.push_back(base_rounds[r] / ckv_rounds[r]);
  }
  if (!ratios.empty()) {
    e.speedup_round_median = Median(ratios);
    e.speedup_min = *std::min_element(ratios.begin(), ratios.end());
    e.speedup_max = *std::max_element(ratios.begin(), ratios.end());
  }
  return e;
}

// Tier configurations in the order the rows first name them.
std::vector<std::string> TiersOf(const std::vector<Row>& rows) {
  std::vector<std::string> tiers;
  for (const Row& r : rows) {
    if (std::find(tiers.begin(), tiers.end(), r.tiers) == tiers.end()) tiers.push_back(r.tiers);
  }
  return tiers;
}

// Every system but `ckv` under `tiers`: the published baselines first, then any other run.
std::vector<std::string> BaselinesOf(const std::vector<Row>& rows, const std::string& tiers,
                                     const std::string& ckv) {
  std::vector<std::string> out;
  for (const char* known : {"impress", "ckv-paper", "h2o", "full", "recompute"}) {
    for (const Row& r : rows) {
      if (r.tiers == tiers && r.system == known && r.system != ckv) {
        out.push_back(known);
        break;
      }
    }
  }
  for (const Row& r : rows) {
    if (r.tiers == tiers && r.system != ckv &&
        std::find(out.begin(), out.end(), r.system) == out.end()) {
      out.push_back(r.system);
    }
  }
  return out;
}

}  // namespace

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::ceil(p * v.size())) - (p > 0 ? 1 : 0);
  return v[std::min(i, v.size() - 1)];
}

double Row::MedianRoundMs() const {
  return round_mean_ms.empty() ? mean_ms : Median(round_mean_ms);
}
double Row::MinRoundMs() const {
  return round_mean_ms.empty() ? mean_ms
                               : *std::min_element(round_mean_ms.begin(), round_mean_ms.end());
}
double Row::MaxRoundMs() const {
  return round_mean_ms.empty() ? mean_ms
                               : *std::max_element(round_mean_ms.begin(), round_mean_ms.end());
}

std::vector<EqualError> EqualErrorOf(const std::vector<Row>& rows, const std::string& ckv,
                                     const std::vector<double>& errors) {
  std::vector<EqualError> out;
  for (const std::string& t : TiersOf(rows)) {
    const std::vector<const Row*> ckv_curve = ErrorCurve(rows, t, ckv);
    if (ckv_curve.empty()) continue;
    for (const std::string& base : BaselinesOf(rows, t, ckv)) {
      const std::vector<const Row*> base_curve = ErrorCurve(rows, t, base);
      if (base_curve.empty()) continue;
      for (double error : errors) {
        out.push_back(Compare(t, base, ckv, base_curve, ckv_curve, error, std::nullopt));
      }
    }
  }
  return out;
}

std::vector<EqualError> BaselineAnchoredOf(const std::vector<Row>& rows, const std::string& ckv,
                                           const std::vector<double>& budgets) {
  std::vector<EqualError> out;
  for (const std::string& t : TiersOf(rows)) {
    const std::vector<const Row*> ckv_curve = ErrorCurve(rows, t, ckv);
    if (ckv_curve.empty()) continue;
    for (const std::string& base : BaselinesOf(rows, t, ckv)) {
      // One point, already in equal_error (full at any codec: full@int8).
      if (base == "full" || base.starts_with("full@") || base == "recompute") continue;
      for (const Row* r : ErrorCurve(rows, t, base)) {
        const bool anchored = std::any_of(budgets.begin(), budgets.end(),
                                          [&](double b) { return std::abs(b - r->budget) < 1e-9; });
        if (!anchored) continue;
        out.push_back(Compare(t, base, ckv, {r}, ckv_curve, *r->rel_error, r->budget));
      }
    }
  }
  return out;
}

std::vector<ImpressAnchor> ImpressAnchorsOf(const std::vector<Row>& rows) {
  std::vector<ImpressAnchor> out;
  for (const Row& imp : rows) {
    if (imp.system != "impress") continue;
    for (const Row& full : rows) {
      if (full.system != "full" || full.tiers != imp.tiers ||
          std::abs(full.budget - imp.budget) > 1e-9) {
        continue;
      }
      ImpressAnchor a;
      a.tiers = imp.tiers;
      a.budget = imp.budget;
      a.bytes_vs_full = full.bytes_read > 0 ? double(imp.bytes_read) / double(full.bytes_read) : 0;
      a.read_amplification = imp.read_amplification;
      a.speedup_vs_full = imp.MedianRoundMs() > 0 ? full.MedianRoundMs() / imp.MedianRoundMs() : 0;
      out.push_back(a);
    }
  }
  return out;
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
    std::sort(curve.begin(), curve.end(),
              [](const Row* a, const Row* b) { return a->budget < b->budget; });
    if (curve.empty()) continue;
    for (const char* base : {"impress", "ckv-paper", "h2o", "full"}) {
      const bool full = std::string(base) == "full";
      // The baseline's row at the reference budget (the closest budget run), or full's.
      const Row* b = nullptr;
      for (const Row& r : rows) {
        if (r.tiers != t || r.system != base) continue;
        if (b == nullptr ||
            std::abs(r.budget - reference_budget) < std::abs(b->budget - reference_budget))
          b = &r;
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
      std::vector<double> base_lat;
      for (size_t r = 0; r < rounds; ++r) {
        base_lat.push_back(b->round_mean_ms.empty() ? b->mean_ms : b->round_mean_ms[r]);
      }
      e.speedup = Median(base_lat) / *e.ckv_latency_ms;  // the ratio of the medians
      e.speedup_round_median = Median(speed);
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

namespace {

std::string Ms(const std::optional<double>& v) {
  return v ? absl::StrFormat("%.1f", *v) : std::string("-");
}

// The equal-error entries as a table (anchored: the baseline's budget in front).
void PrintEqualError(const std::vector<EqualError>& entries, bool anchored) {
  std::printf("%-8s %-10s %8s %7s %12s %9s %10s %9s %8s %22s\n", "tiers", "baseline",
              anchored ? "at" : "", "error", "baseline ms", "budget", "ckv ms", "budget", "speedup",
              "rounds: median [range]");
  for (const EqualError& e : entries) {
    const auto budget = [](const CurvePoint& p) {
      if (!p.reached) return std::string("not reached");
      if (!p.budget) return std::string("any");
      return (p.at_smallest ? "<=" : "") + Percent(*p.budget);
    };
    std::printf(
        "%-8s %-10s %8s %7.3f %12s %9s %10s %9s %8s %22s\n", e.tiers.c_str(), e.baseline.c_str(),
        e.anchor_budget ? Percent(*e.anchor_budget).c_str() : "", e.error,
        e.base.reached ? Ms(e.base.latency_ms).c_str() : "-", budget(e.base).c_str(),
        e.ckv.reached ? Ms(e.ckv.latency_ms).c_str() : "-", budget(e.ckv).c_str(),
        e.speedup ? absl::StrFormat("%.2fx", *e.speedup).c_str() : "-",
        e.speedup_round_median ? absl::StrFormat("%.2f [%.2f, %.2f]", *e.speedup_round_median,
                                                 *e.speedup_min, *e.speedup_max)
                                     .c_str()
                               : "-");
    if (!e.note.empty()) std::printf("         note: %s\n", e.note.c_str());
  }
}

}  // namespace

void PrintTable(const std::vector<Row>& rows, const Comparisons& c) {
  const std::vector<EqualRecall>& eq = c.equal_recall;
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
      std::printf(
          "\ntiers: %s (latency: median of the rounds' means [min, max]; vs imp and vs full: "
          "at equal budget)\n",
          tiers.c_str());
      std::printf("%-30s %6s %20s %8s %7s %7s %8s %8s %8s %8s %7s %7s %8s %7s %7s %6s %6s %7s\n",
                  "system", "budget", "latency ms", "p95 ms", "vs imp", "vs full", "MB read",
                  "read amp", "dev MB/s", "fio MB/s", "error", "err p95", "worst l", "recall",
                  "rec.blk", "gpu %", "cpu %", "cpu sc");
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
        const std::string lat =
            absl::StrFormat("%.1f [%.1f, %.1f]", x.MedianRoundMs(), x.MinRoundMs(), x.MaxRoundMs());
        const std::string worst =
            x.worst_layer >= 0 && x.worst_layer_error
                ? absl::StrFormat("%.2f@%d", *x.worst_layer_error, x.worst_layer)
                : std::string("-");
        std::printf(
            "%-30s %5.0f%% %20s %8.1f %7s %7s %8.1f %8.2f %8.0f %8.0f %7s %7s %8s %7s %7s %6.1f "
            "%6.1f %7.1f\n",
            x.system.c_str(), x.budget * 100, lat.c_str(), x.p95_ms, ratio(impress).c_str(),
            ratio(full).c_str(), x.bytes_read / 1e6 / std::max<size_t>(1, x.requests),
            x.read_amplification, x.device_mb_s, x.fio_mb_s, opt(x.rel_error).c_str(),
            opt(x.rel_error_p95).c_str(), worst.c_str(), opt(x.recall).c_str(),
            opt(x.recall_loaded).c_str(), x.gpu_hit_rate * 100, x.cpu_hit_rate * 100, x.scoring_ms);
      }
    }
  }
  if (!c.equal_error.empty()) {
    std::printf(
        "\nequal output error (the headline): each system's latency interpolated on its "
        "own error-latency curve at error e (mean over requests of the per-layer "
        "relative L2 error of the attention output), never extrapolated; speedup: the "
        "ratio of the medians over rounds, then the per-round ratios\n");
    PrintEqualError(c.equal_error, /*anchored=*/false);
  }
  if (!c.anchored.empty()) {
    std::printf(
        "\nbaseline-anchored: each baseline at its budget, ckv at the error the baseline "
        "reaches there\n");
    PrintEqualError(c.anchored, /*anchored=*/true);
  }
  if (!c.impress_anchors.empty()) {
    std::printf(
        "\nimpress against full, same requests and tiers (published: fewer bytes up to "
        "50%%, read amplification 8-16x and about 1.6x faster at 5%%)\n");
    std::printf("%-8s %7s %14s %9s %16s\n", "tiers", "budget", "bytes vs full", "read amp",
                "speed vs full");
    for (const ImpressAnchor& a : c.impress_anchors) {
      std::printf("%-8s %7s %13.2fx %8.1fx %15.2fx\n", a.tiers.c_str(), Percent(a.budget).c_str(),
                  a.bytes_vs_full, a.read_amplification, a.speedup_vs_full);
    }
  }
  if (eq.empty()) return;
  std::printf(
      "\nequal recall: ckv's latency interpolated at the recall each baseline reaches at its "
      "reference budget (full: 0.95); speedup: the ratio of the medians over rounds "
      "[min, max of the per-round ratios]\n");
  std::printf("%-8s %-10s %-30s %7s %7s %12s %10s %10s %24s\n", "tiers", "baseline", "ckv system",
              "budget", "recall", "baseline ms", "ckv ms", "ckv budget", "speedup");
  for (const EqualRecall& e : eq) {
    const std::string budget =
        e.baseline == "full" ? "-" : absl::StrFormat("%.0f%%", e.baseline_budget * 100);
    std::printf(
        "%-8s %-10s %-30s %7s %7.3f %12.1f %10s %10s %24s\n", e.tiers.c_str(), e.baseline.c_str(),
        e.ckv_system.c_str(), budget.c_str(), e.recall, e.baseline_latency_ms,
        e.ckv_latency_ms ? absl::StrFormat("%.1f", *e.ckv_latency_ms).c_str() : "-",
        e.ckv_budget ? absl::StrFormat("%.1f%%", *e.ckv_budget * 100).c_str() : "-",
        e.speedup
            ? absl::StrFormat("%.2fx [%.2f, %.2f]", *e.speedup, *e.speedup_min, *e.speedup_max)
                  .c_str()
            : "not reached");
    if (!e.note.empty()) std::printf("         note: %s\n", e.note.c_str());
  }
}

std::string ToJson(const Workload& w, const std::vector<Row>& rows, const Comparisons& c) {
  const std::vector<EqualRecall>& eq = c.equal_recall;
  const Flags& f = w.flags();
  tools::JsonWriter j;
  j.BeginObject();
  j.Key("workload").BeginObject().Key("model").String(f.model);
  j.Key("prefix_tokens").Uint(f.prefix_tokens).Key("suffix_tokens").Uint(f.suffix_tokens);
  j.Key("conversations").Uint(f.conversations).Key("turns").Uint(f.turns);
  j.Key("warmup_turns")
      .Uint(f.warmup_turns)
      .Key("system_prompt_share")
      .Double(f.system_prompt_share);
  j.Key("concurrency").Uint(f.concurrency).Key("window").Uint(f.window);
  j.Key("gpu_tier_bytes").Uint(f.gpu_tier_bytes).Key("cpu_tier_bytes").Uint(f.cpu_tier_bytes);
  j.Key("gpu_tflops").Double(f.gpu_tflops).Key("hbm_gb_s").Double(f.hbm_gb_s);
  j.Key("launch_us").Double(f.launch_us).Key("pcie_gb_s").Double(f.pcie_gb_s);
  j.Key("seed").Uint(f.seed).Key("rounds").Uint(f.rounds);
  j.Key("attention_profile").String(f.attention_profile);
  // A profile file's queries are the network's: the generator's shift does not apply.
  if (w.file() != nullptr)
    j.Key("profile_file").String(w.file()->path());
  else
    j.Key("request_shift").Double(w.Params(Request{}).request_shift);
  if (!w.file()) j.Key("head_agreement").Double(w.Params(Request{}).calibrated.head_agreement);
  j.Key("impress_probes").String(f.impress_probes).Key("impress_gate").String(f.impress_gate);
  j.Key("store_bytes").Uint(w.store_bytes());
  j.EndObject();
  j.Key("results").BeginArray();
  for (const Row& r : rows) {
    j.BeginObject().Key("tiers").String(r.tiers).Key("system").String(r.system);
    j.Key("config")
        .String(r.config)
        .Key("budget")
        .Double(r.budget)
        .Key("requests")
        .Uint(r.requests);
    j.Key("modelled").Bool(r.modelled);
    j.Key("latency_ms").BeginObject().Key("mean").Double(r.mean_ms).Key("p50").Double(r.p50_ms);
    j.Key("p95").Double(r.p95_ms).Key("round_median").Double(r.MedianRoundMs());
    j.Key("round_min").Double(r.MinRoundMs()).Key("round_max").Double(r.MaxRoundMs());
    j.Key("rounds").BeginArray();
    for (double m : r.round_mean_ms) j.Double(m);
    j.EndArray().EndObject();
    j.Key("wall_ms")
        .Double(r.wall_ms)
        .Key("scoring_cpu_ms")
        .Double(r.scoring_ms)
        .Key("bubble_ms")
        .Double(r.bubble_ms);
    j.Key("bytes_needed").Uint(r.bytes_needed).Key("bytes_read").Uint(r.bytes_read);
    j.Key("h2d_bytes").Uint(r.h2d_bytes);
    j.Key("read_amplification").Double(r.read_amplification);
    j.Key("device_mb_s").Double(r.device_mb_s).Key("fio_mb_s").Double(r.fio_mb_s);
    j.Key("fio_engine_depth_mb_s").Double(r.fio_full_depth_mb_s);
    j.Key("dominant_io_bytes").Uint(r.dominant_io_bytes);
    j.Key("queue_depth").Double(r.busy_queue_depth);
    const auto opt = [&](const char* key, const std::optional<double>& v) {
      j.Key(key);
      if (v)
        j.Double(*v);
      else
        j.Null();
    };
    opt("attention_recall", r.recall);
    opt("attention_recall_loaded", r.recall_loaded);
    opt("output_rel_error", r.rel_error);
    opt("output_rel_error_p95", r.rel_error_p95);
    opt("worst_layer_error", r.worst_layer_error);
    j.Key("worst_layer").Int(r.worst_layer);
    j.Key("quality_requests").Uint(r.quality_requests);
    j.Key("hit_rate")
        .BeginObject()
        .Key("gpu")
        .Double(r.gpu_hit_rate)
        .Key("cpu")
        .Double(r.cpu_hit_rate);
    j.EndObject();
    j.Key("wasted_prefetch_bytes").Uint(r.wasted_prefetch_bytes);
    j.Key("fallback_layers").Double(r.fallback_layers);
    j.Key("reorder_passes")
        .Uint(r.reorder_passes)
        .Key("reorder_converged")
        .Bool(r.reorder_converged);
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
      if (v)
        j.Double(*v);
      else
        j.Null();
    };
    opt("ckv_budget", e.ckv_budget);
    opt("ckv_latency_ms", e.ckv_latency_ms);
    opt("speedup", e.speedup);
    opt("speedup_round_median", e.speedup_round_median);
    opt("speedup_min", e.speedup_min);
    opt("speedup_max", e.speedup_max);
    j.Key("note").String(e.note);
    j.EndObject();
  }
  j.EndArray();
  const auto opt = [&](const char* key, const std::optional<double>& v) {
    j.Key(key);
    if (v)
      j.Double(*v);
    else
      j.Null();
  };
  const auto point = [&](const char* key, const CurvePoint& p) {
    j.Key(key)
        .BeginObject()
        .Key("reached")
        .Bool(p.reached)
        .Key("at_smallest_budget")
        .Bool(p.at_smallest);
    opt("budget", p.budget);
    opt("closest_error", p.error);
    opt("latency_ms", p.latency_ms);
    j.EndObject();
  };
  j.Key("impress_anchors").BeginArray();
  for (const ImpressAnchor& a : c.impress_anchors) {
    j.BeginObject().Key("tiers").String(a.tiers).Key("budget").Double(a.budget);
    j.Key("bytes_vs_full").Double(a.bytes_vs_full);
    j.Key("read_amplification").Double(a.read_amplification);
    j.Key("speedup_vs_full").Double(a.speedup_vs_full).EndObject();
  }
  j.EndArray();
  for (const auto& [key, list] :
       {std::pair<const char*, const std::vector<EqualError>&>{"equal_error", c.equal_error},
        std::pair<const char*, const std::vector<EqualError>&>{"baseline_anchored", c.anchored}}) {
    j.Key(key).BeginArray();
    for (const EqualError& e : list) {
      j.BeginObject().Key("tiers").String(e.tiers).Key("baseline").String(e.baseline);
      j.Key("ckv_system").String(e.ckv_system).Key("error").Double(e.error);
      opt("anchor_budget", e.anchor_budget);
      // Null where the system does not reach the error (its closest point is under "points").
      opt("baseline_latency_ms", e.base.reached ? e.base.latency_ms : std::nullopt);
      opt("ckv_latency_ms", e.ckv.reached ? e.ckv.latency_ms : std::nullopt);
      opt("speedup", e.speedup);
      opt("speedup_round_median", e.speedup_round_median);
      opt("speedup_min", e.speedup_min);
      opt("speedup_max", e.speedup_max);
      j.Key("points").BeginObject();
      point("baseline", e.base);
      point("ckv", e.ckv);
      j.EndObject();
      j.Key("note").String(e.note);
      j.EndObject();
    }
    j.EndArray();
  }
  j.EndObject();
  return j.str();
}

void Plot(const Workload& w, const std::vector<Row>& rows, const std::string& path) {
  const Flags& f = w.flags();
  std::vector<std::string> tiers, systems;
  for (const Row& r : rows) {
    if (std::find(tiers.begin(), tiers.end(), r.tiers) == tiers.end()) tiers.push_back(r.tiers);
    if (std::find(systems.begin(), systems.end(), r.system) == systems.end())
      systems.push_back(r.system);
  }
  std::string s = absl::StrFormat("set terminal png size %d,560\nset output '%s'\n",
                                  640 + 560 * int(tiers.size()), path);
  s += absl::StrFormat(
      "set multiplot layout 1,%d title 'Re-Prefill latency against the attention output error, "
      "%s, %u-token prefixes, %u-token suffixes, %s attention'\n",
      int(tiers.size()), f.model, f.prefix_tokens, f.suffix_tokens, f.attention_profile);
  s += "set xlabel 'output error (relative L2, mean over requests)'\n"
       "set ylabel 'Re-Prefill latency (ms, median of rounds)'\n"
       "set key below\nset grid\nset logscale y\nset xrange [0:*]\n";
  double label_y = 0.97;  // stepped down, so that labels of close errors do not overlap
  for (double e : kEqualErrors) {
    s += absl::StrFormat(
        "set arrow from %g, graph 0 to %g, graph 1 nohead dt 2 lc rgb 'gray'\n"
        "set label 'e = %g' at %g, graph %g left offset 0.3,0 tc rgb 'gray'\n",
        e, e, e, e, label_y);
    label_y -= 0.05;
  }
  for (const std::string& t : tiers) {
    s += "set title 'tiers: " + t + "'\nplot ";
    bool first = true;
    std::string data;
    for (const std::string& name : systems) {
      std::string pts;
      for (const Row& r : rows) {
        if (r.tiers == t && r.system == name && r.rel_error) {
          pts += absl::StrFormat("%g %g\n", *r.rel_error, r.MedianRoundMs());
        }
      }
      if (pts.empty()) continue;
      // noenhanced: a name is printed as it is (full@int8's @ is markup otherwise).
      s += std::string(first ? "" : ", ") + "'-' with linespoints lw 2 title '" + name +
           "' noenhanced";
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
