// SPDX-License-Identifier: Apache-2.0
// bench/reprefill/report.h: the benchmark's rows, the equal-error (the headline),
// baseline-anchored and equal-recall comparisons, the table, the JSON and the plot.
#ifndef CKV_BENCH_REPREFILL_REPORT_H_
#define CKV_BENCH_REPREFILL_REPORT_H_

#include <optional>
#include <string>
#include <vector>

#include "bench/reprefill/workload.h"

namespace ckv::bench {

// One system at one budget under one tier configuration, over every round.
struct Row {
  std::string tiers;
  std::string system;
  std::string config;
  double budget = 0;
  size_t requests = 0;                         // measured requests per round
  double mean_ms = 0, p50_ms = 0, p95_ms = 0;  // over every request of every round
  std::vector<double> round_mean_ms;           // each round's mean latency
  double wall_ms = 0, scoring_ms = 0, bubble_ms = 0;
  uint64_t bytes_needed = 0, bytes_read = 0, h2d_bytes = 0;  // per round
  double read_amplification = 0;
  double device_mb_s = 0, fio_mb_s = 0, fio_full_depth_mb_s = 0;
  uint64_t dominant_io_bytes = 0;
  double busy_queue_depth = 0;
  // Fidelity over the distinct measured requests (quality_requests of them): recall and the
  // output error as means over requests, the error's p95 over requests, and the layer whose
  // mean error is the worst.
  size_t quality_requests = 0;
  std::optional<double> recall, recall_loaded, rel_error, rel_error_p95, worst_layer_error;
  int worst_layer = -1;
  double gpu_hit_rate = 0, cpu_hit_rate = 0;
  uint64_t wasted_prefetch_bytes = 0;
  double fallback_layers = 0;  // impress: layers per request whose probes disagreed
  // impress: the most warm-up passes a round took for its reordering to converge, and whether
  // every round's did within --impress-reorder-passes.
  uint32_t reorder_passes = 0;
  bool reorder_converged = true;
  bool modelled = false;  // recompute: no I/O, the modelled GPU alone

  double MedianRoundMs() const;
  double MinRoundMs() const;
  double MaxRoundMs() const;
};

// ckv against a baseline at the recall the baseline reaches at its reference budget.
struct EqualRecall {
  std::string tiers;
  std::string baseline;
  std::string ckv_system;
  double baseline_budget = 0;  // 0 for "at recall 0.95" (full)
  double recall = 0;
  double baseline_latency_ms = 0;    // median over rounds
  std::optional<double> ckv_budget;  // interpolated budget at that recall
  std::optional<double> ckv_latency_ms;
  // The ratio of the medians over rounds; beside it the median and range of per-round ratios.
  std::optional<double> speedup, speedup_round_median, speedup_min, speedup_max;
  std::string note;
};

// The p-quantile of `v` (nearest rank; 0 when empty).
double Percentile(std::vector<double> v, double p);

// The output errors the headline compares systems at (issue "Re-Prefill speed at a quality
// people deploy"): what a serving engineer would accept, from near-exact to lenient.
inline constexpr double kEqualErrors[] = {0.05, 0.1, 0.2};
// The baseline budgets the baseline-anchored comparison takes.
inline constexpr double kAnchorBudgets[] = {0.02, 0.05, 0.10, 0.25};

// One system's point on its own error-latency curve at a given output error.
struct CurvePoint {
  bool reached = false;              // some budget run has a mean error <= the error asked
  bool at_smallest = false;          // reached already at the smallest budget run: an upper bound
  std::optional<double> budget;      // interpolated (reached), or the closest point's (not reached)
  std::optional<double> error;       // the closest point's mean error (not reached)
  std::optional<double> latency_ms;  // median over rounds of the interpolated latency, or the
                                     // closest point's median (not reached)
};

// ckv against a baseline at one output error (the mean over requests of the per-layer relative
// L2 error of the attention output): each system's latency interpolated linearly in budget
// between the adjacent budgets whose mean errors bracket it, taking the lowest such budget where
// the curve is not monotonic; never extrapolated.
struct EqualError {
  std::string tiers;
  std::string baseline;
  std::string ckv_system;
  double error = 0;
  std::optional<double>
      anchor_budget;  // baseline-anchored: the baseline's budget, `error` its error
  CurvePoint base, ckv;
  // The headline: the ratio of the medians over rounds. Beside it the median and range of the
  // per-round ratios. Only where both systems reach the error.
  std::optional<double> speedup, speedup_round_median, speedup_min, speedup_max;
  std::string note;
};

// The equal-error entries of `rows` for the ckv system `ckv` against every other system run
// (full and recompute included), at each of `errors`.
std::vector<EqualError> EqualErrorOf(const std::vector<Row>& rows, const std::string& ckv,
                                     const std::vector<double>& errors);
// The baseline-anchored entries: each token- or chunk-selecting baseline at each of `budgets`
// it ran, and ckv at the error the baseline reaches there.
std::vector<EqualError> BaselineAnchoredOf(const std::vector<Row>& rows, const std::string& ckv,
                                           const std::vector<double>& budgets);

// The equal-recall entries of `rows` for the ckv system `ckv` (see docs/baselines.md): against
// impress, ckv-paper and h2o at the recall each reaches at `reference_budget`, and against full
// at recall 0.95.
std::vector<EqualRecall> EqualRecallOf(const std::vector<Row>& rows, const std::string& ckv,
                                       double reference_budget);

// IMPRESS's published relations to full loading, which do not involve ckv (docs/
// baselines.md, "impress"): at each budget both ran with the same tiers, impress's bytes read
// and its median latency against full's. Published: fewer bytes than full up to 50%, read
// amplification 8-16x at 5%, and about 1.6x faster than full at 5% (ContiguousKV's
// measurement of IMPRESS).
struct ImpressAnchor {
  std::string tiers;
  double budget = 0;
  double bytes_vs_full = 0;       // impress's bytes read / full's, same requests
  double read_amplification = 0;  // impress's bytes read / bytes its selection needs
  double speedup_vs_full = 0;     // full's median latency / impress's (modelled timeline)
};
std::vector<ImpressAnchor> ImpressAnchorsOf(const std::vector<Row>& rows);

// What the report compares: equal output error (the headline), baseline-anchored, equal recall,
// and impress's own anchors against full.
struct Comparisons {
  std::vector<EqualError> equal_error, anchored;
  std::vector<EqualRecall> equal_recall;
  std::vector<ImpressAnchor> impress_anchors;
};

void PrintTable(const std::vector<Row>& rows, const Comparisons& c);
std::string ToJson(const Workload& w, const std::vector<Row>& rows, const Comparisons& c);
// Latency against output error, one curve per system, the errors of kEqualErrors marked; a panel
// per tier configuration.
void Plot(const Workload& w, const std::vector<Row>& rows, const std::string& path);

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_REPORT_H_
