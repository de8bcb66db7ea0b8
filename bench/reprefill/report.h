// SPDX-License-Identifier: Apache-2.0
// bench/reprefill/report.h: the benchmark's rows, the equal-recall comparison, the table, the
// JSON and the plot.
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
  size_t requests = 0;          // measured requests per round
  double mean_ms = 0, p50_ms = 0, p95_ms = 0;  // over every request of every round
  std::vector<double> round_mean_ms;           // each round's mean latency
  double wall_ms = 0, scoring_ms = 0, bubble_ms = 0;
  uint64_t bytes_needed = 0, bytes_read = 0, h2d_bytes = 0;  // per round
  double read_amplification = 0;
  double device_mb_s = 0, fio_mb_s = 0, fio_full_depth_mb_s = 0;
  uint64_t dominant_io_bytes = 0;
  double busy_queue_depth = 0;
  std::optional<double> recall, recall_loaded, rel_error;
  double gpu_hit_rate = 0, cpu_hit_rate = 0;
  uint64_t wasted_prefetch_bytes = 0;
  double fallback_layers = 0;  // impress: layers per request whose probes disagreed
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
  double baseline_latency_ms = 0;  // median over rounds
  std::optional<double> ckv_budget;  // interpolated budget at that recall
  std::optional<double> ckv_latency_ms;
  std::optional<double> speedup, speedup_min, speedup_max;  // median and range over rounds
  std::string note;
};

// The equal-recall entries of `rows` for the ckv system `ckv` (see docs/baselines.md): against
// impress, ckv-paper and h2o at the recall each reaches at `reference_budget`, and against full
// at recall 0.95.
std::vector<EqualRecall> EqualRecallOf(const std::vector<Row>& rows, const std::string& ckv,
                                       double reference_budget);

void PrintTable(const std::vector<Row>& rows, const std::vector<EqualRecall>& eq);
std::string ToJson(const Workload& w, const std::vector<Row>& rows,
                   const std::vector<EqualRecall>& eq);
// Latency against recall, one curve per system, a panel per tier configuration.
void Plot(const Workload& w, const std::vector<Row>& rows, const std::string& path);

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_REPORT_H_
