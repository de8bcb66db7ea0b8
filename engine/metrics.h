// SPDX-License-Identifier: Apache-2.0
// engine/metrics.h: latency histograms and failure counters cheap enough for the hot path, and
// the Prometheus text exposition format (version 0.0.4) that Engine::Metrics() writes.
//
// LatencyHistogram: fixed log-spaced buckets, upper bounds 1 us x 2^i (i = 0..kBounds-1: 1 us to
// about 33.5 s) and +Inf. Observe is a handful of relaxed atomic adds: no lock, no allocation.
// A Snapshot taken while others observe is not one instant: each bucket is exact, and `count` is
// the sum of the buckets (so _count always equals the +Inf bucket), but `sum` may include an
// observation a bucket does not yet show, or miss one it does.
//
// FailureCounters: calls that returned an error, by operation and absl::StatusCode.
//
// MetricsText: writes families (# HELP, # TYPE, samples) in the text format, escaping HELP text
// and label values as the format requires; optional constant labels go on every sample (kvctl
// names the store so). Families are written in the order they are started; a family's name is
// given once.
//
// StoreMetrics writes the families of what a store holds at rest (chunks, prefixes, segments,
// disk bytes, cap, persisted counters, index memory): Engine::Metrics() starts with them, and
// 'kvctl stats --format prom' prints only them, so both name them alike. StoreMetricsSinceOpen
// writes the rest of the store's families (read counters, reclaimer, ENOSPC, staging), which
// only a process that opened the store has. Both write the entries of CKV_STORE_STATS_FIELDS
// (ckv/stats.h) of their scope, by the names and help texts listed there.
//
// Thread-safety: LatencyHistogram and FailureCounters are thread-safe; MetricsText is not
// (one writer per string).
#ifndef CKV_ENGINE_METRICS_H_
#define CKV_ENGINE_METRICS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ckv/stats.h"

namespace ckv::engine {

class LatencyHistogram {
 public:
  // Finite upper bounds: 1 us << i for i in [0, kBounds).
  static constexpr size_t kBounds = 26;
  // The upper bound of bucket `i` (< kBounds) in seconds.
  static double BoundSeconds(size_t i);
  // The bucket an observation of `nanos` falls in: the first i whose bound is >= it, kBounds
  // (+Inf) past the last. Negative durations count as 0.
  static size_t BucketOf(int64_t nanos);

  struct Snapshot {
    std::array<uint64_t, kBounds + 1> buckets{};  // per bucket, not cumulative; [kBounds] = +Inf
    uint64_t count = 0;                           // sum of buckets
    double sum_seconds = 0;
  };

  void Observe(int64_t nanos);
  Snapshot snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kBounds + 1> buckets_{};
  std::atomic<uint64_t> sum_nanos_{0};
};

// The public operations whose failures are counted. Do not renumber (they index the counters).
enum class Op : uint8_t {
  kPut = 0,
  kLookup,
  kReadRecord,
  kDelete,
  kDeletePrefix,
  kPrefixChunks,
  kDescribePrefix,
  kVerify,
  kRepair,
  kGc,
  kBeginReprefill,
  kSubmitQueries,
  kAwaitLayer,
  kFinish,
  kProbe,
};
inline constexpr size_t kNumOps = 15;
// "put", "lookup", "read_record", ..., the `op` label.
const char* OpName(Op op);

class FailureCounters {
 public:
  // Counts `status` against `op` when it is not OK.
  void Record(Op op, const absl::Status& status) {
    if (status.ok()) return;
    const size_t code = static_cast<size_t>(status.code());
    counts_[static_cast<size_t>(op)][code < kCodes ? code : kCodes - 1].fetch_add(
        1, std::memory_order_relaxed);
  }
  uint64_t count(Op op, absl::StatusCode code) const;

 private:
  friend class MetricsText;
  // absl::StatusCode values 0..16 (kUnauthenticated); an unknown value counts as the last.
  static constexpr size_t kCodes = 17;
  std::array<std::array<std::atomic<uint64_t>, kCodes>, kNumOps> counts_{};
};

class MetricsText {
 public:
  using Labels = std::initializer_list<std::pair<std::string_view, std::string_view>>;

  // `constant_labels` go first on every sample.
  explicit MetricsText(std::vector<std::pair<std::string, std::string>> constant_labels = {});

  // Starts family `name` of `type` ("counter", "gauge", "histogram", "untyped"): its # HELP and
  // # TYPE lines.
  void Family(std::string_view name, std::string_view type, std::string_view help);
  // One sample line `name{labels} value` (name: the family's, or with _bucket/_sum/_count).
  void Sample(std::string_view name, Labels labels, double value);
  void Sample(std::string_view name, Labels labels, uint64_t value);

  // A family with one unlabelled sample.
  void Counter(std::string_view name, std::string_view help, uint64_t value);
  void Counter(std::string_view name, std::string_view help, double value);
  void Gauge(std::string_view name, std::string_view help, uint64_t value);
  void Gauge(std::string_view name, std::string_view help, double value);
  // Counter or Gauge as `kind` says: a floating-point value as it is, any other (a count, a
  // bool) as an integer.
  template <typename T>
  void Single(StatKind kind, std::string_view name, std::string_view help, T value) {
    using V = std::conditional_t<std::is_floating_point_v<T>, double, uint64_t>;
    if (kind == StatKind::kCounter) {
      Counter(name, help, static_cast<V>(value));
    } else {
      Gauge(name, help, static_cast<V>(value));
    }
  }
  // A histogram family: cumulative _bucket{le=...} lines, _sum and _count.
  void Histogram(std::string_view name, std::string_view help,
                 const LatencyHistogram::Snapshot& snapshot);
  // The counter family `name` with a sample {op, code} for each count that is not 0.
  void Failures(std::string_view name, std::string_view help, const FailureCounters& failures);

  const std::string& text() const { return out_; }
  std::string Take() { return std::move(out_); }

  // Escapes for the format: HELP text (\ and newline), label values (\, " and newline).
  static std::string EscapeHelp(std::string_view text);
  static std::string EscapeLabelValue(std::string_view value);
  // A sample value: shortest round-trip decimal, or +Inf, -Inf, NaN.
  static std::string FormatValue(double value);

 private:
  void SampleText(std::string_view name, Labels labels, std::string_view value);

  std::vector<std::pair<std::string, std::string>> constant_labels_;
  std::string out_;
};

// The at-rest families of `stats` (see the banner), into `out`.
void StoreMetrics(const StoreStats& stats, MetricsText& out);
// The store's since-Open families of `stats` (see the banner), into `out`.
void StoreMetricsSinceOpen(const StoreStats& stats, MetricsText& out);
// The families of the engine's own figures (CKV_ENGINE_STATS_FIELDS, in its order), into `out`.
void EngineMetricsSinceOpen(const EngineStats& stats, MetricsText& out);

}  // namespace ckv::engine

#endif  // CKV_ENGINE_METRICS_H_
