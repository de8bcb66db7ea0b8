// SPDX-License-Identifier: Apache-2.0
#include "engine/metrics.h"

#include <bit>
#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ckv::engine {

double LatencyHistogram::BoundSeconds(size_t i) {
  return static_cast<double>(uint64_t{1} << i) * 1e-6;
}

size_t LatencyHistogram::BucketOf(int64_t nanos) {
  if (nanos <= 1000) return 0;
  // Whole microseconds, rounded up: x <= 2^i us exactly when ceil(x) <= 2^i, i.e. when
  // ceil(x) - 1 < 2^i, whose least such i is the bit width of ceil(x) - 1.
  const uint64_t micros = (static_cast<uint64_t>(nanos) + 999) / 1000;
  const size_t i = static_cast<size_t>(std::bit_width(micros - 1));
  return i < kBounds ? i : kBounds;
}

void LatencyHistogram::Observe(int64_t nanos) {
  buckets_[BucketOf(nanos)].fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(nanos > 0 ? static_cast<uint64_t>(nanos) : 0, std::memory_order_relaxed);
}

LatencyHistogram::Snapshot LatencyHistogram::snapshot() const {
  Snapshot s;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    s.count += s.buckets[i];
  }
  s.sum_seconds = static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kPut:
      return "put";
    case Op::kLookup:
      return "lookup";
    case Op::kReadRecord:
      return "read_record";
    case Op::kDelete:
      return "delete";
    case Op::kDeletePrefix:
      return "delete_prefix";
    case Op::kPrefixChunks:
      return "prefix_chunks";
    case Op::kDescribePrefix:
      return "describe_prefix";
    case Op::kVerify:
      return "verify";
    case Op::kRepair:
      return "repair";
    case Op::kGc:
      return "gc";
    case Op::kBeginReprefill:
      return "begin_reprefill";
    case Op::kSubmitQueries:
      return "submit_queries";
    case Op::kAwaitLayer:
      return "await_layer";
    case Op::kFinish:
      return "finish";
    case Op::kProbe:
      return "probe";
  }
  return "?";
}

uint64_t FailureCounters::count(Op op, absl::StatusCode code) const {
  const size_t c = static_cast<size_t>(code);
  return counts_[static_cast<size_t>(op)][c < kCodes ? c : kCodes - 1].load(
      std::memory_order_relaxed);
}

MetricsText::MetricsText(std::vector<std::pair<std::string, std::string>> constant_labels)
    : constant_labels_(std::move(constant_labels)) {}

std::string MetricsText::EscapeHelp(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string MetricsText::EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string MetricsText::FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, r.ptr);
}

void MetricsText::Family(std::string_view name, std::string_view type, std::string_view help) {
  out_.append("# HELP ").append(name).append(" ").append(EscapeHelp(help));
  out_.append("\n# TYPE ").append(name).append(" ").append(type).append("\n");
}

void MetricsText::SampleText(std::string_view name, Labels labels, std::string_view value) {
  out_ += name;
  if (!constant_labels_.empty() || labels.size() > 0) {
    out_ += '{';
    bool first = true;
    auto add = [&](std::string_view k, std::string_view v) {
      out_.append(first ? "" : ",")
          .append(k)
          .append("=\"")
          .append(EscapeLabelValue(v))
          .append("\"");
      first = false;
    };
    for (const auto& [k, v] : constant_labels_) add(k, v);
    for (const auto& [k, v] : labels) add(k, v);
    out_ += '}';
  }
  out_.append(" ").append(value).append("\n");
}

void MetricsText::Sample(std::string_view name, Labels labels, double value) {
  SampleText(name, labels, FormatValue(value));
}
void MetricsText::Sample(std::string_view name, Labels labels, uint64_t value) {
  SampleText(name, labels, std::to_string(value));
}

void MetricsText::Counter(std::string_view name, std::string_view help, uint64_t value) {
  Family(name, "counter", help);
  Sample(name, {}, value);
}
void MetricsText::Counter(std::string_view name, std::string_view help, double value) {
  Family(name, "counter", help);
  Sample(name, {}, value);
}
void MetricsText::Gauge(std::string_view name, std::string_view help, uint64_t value) {
  Family(name, "gauge", help);
  Sample(name, {}, value);
}
void MetricsText::Gauge(std::string_view name, std::string_view help, double value) {
  Family(name, "gauge", help);
  Sample(name, {}, value);
}

void MetricsText::Histogram(std::string_view name, std::string_view help,
                            const LatencyHistogram::Snapshot& snapshot) {
  Family(name, "histogram", help);
  const std::string bucket = std::string(name) + "_bucket";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < LatencyHistogram::kBounds; ++i) {
    cumulative += snapshot.buckets[i];
    Sample(bucket, {{"le", FormatValue(LatencyHistogram::BoundSeconds(i))}}, cumulative);
  }
  cumulative += snapshot.buckets[LatencyHistogram::kBounds];
  Sample(bucket, {{"le", "+Inf"}}, cumulative);
  Sample(std::string(name) + "_sum", {}, snapshot.sum_seconds);
  Sample(std::string(name) + "_count", {}, snapshot.count);
}

void MetricsText::Failures(std::string_view name, std::string_view help,
                           const FailureCounters& failures) {
  Family(name, "counter", help);
  for (size_t op = 0; op < kNumOps; ++op) {
    for (size_t code = 1; code < FailureCounters::kCodes; ++code) {
      const uint64_t n = failures.count(static_cast<Op>(op), static_cast<absl::StatusCode>(code));
      if (n == 0) continue;
      Sample(name,
             {{"op", OpName(static_cast<Op>(op))},
              {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(code))}},
             n);
    }
  }
}

namespace {

// One family of a stats field, when its scope is `scope`: a double as it is, a count or a bool
// (1/0) as an integer.
template <typename T>
void FieldFamily(MetricsText& out, StatScope scope, StatKind kind, StatScope of,
                 std::string_view name, std::string_view help, T value) {
  if (of == scope) out.Single(kind, name, help, value);
}

// The families of the CKV_STORE_STATS_FIELDS entries of scope `scope`, in their order.
void StoreFamilies(const StoreStats& s, StatScope scope, MetricsText& out) {
#define CKV_STORE_FAMILY_(type, name, kind, of, metric, help) \
  FieldFamily(out, scope, StatKind::kind, StatScope::of, metric, help, s.name);
  CKV_STORE_STATS_FIELDS(CKV_STORE_FAMILY_)
#undef CKV_STORE_FAMILY_
}

}  // namespace

void StoreMetrics(const StoreStats& s, MetricsText& out) {
  StoreFamilies(s, StatScope::kAtRest, out);
}

void StoreMetricsSinceOpen(const StoreStats& s, MetricsText& out) {
  StoreFamilies(s, StatScope::kSinceOpen, out);
}

void EngineMetricsSinceOpen(const EngineStats& s, MetricsText& out) {
#define CKV_ENGINE_FAMILY_(type, name, kind, of, metric, help) \
  FieldFamily(out, StatScope::kSinceOpen, StatKind::kind, StatScope::of, metric, help, s.name);
  CKV_ENGINE_STATS_FIELDS(CKV_ENGINE_FAMILY_)
#undef CKV_ENGINE_FAMILY_
}

}  // namespace ckv::engine
