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

void StoreMetrics(const EngineStats& s, MetricsText& out) {
  out.Gauge("ckv_chunks", "Chunks the store holds.", s.chunks);
  out.Gauge("ckv_prefixes", "Prefixes the store holds.", s.prefixes);
  out.Gauge("ckv_segments", "Segment files of the store.", s.segments);
  out.Gauge("ckv_disk_used_bytes",
            "Allocated segment bytes: live chunks, Puts in flight and free slots that still hold "
            "blocks (ckv_free_kept_bytes).",
            s.disk_bytes_used);
  out.Gauge("ckv_disk_cap_bytes", "The cap on segment bytes (max_disk_bytes); 0 = unlimited.",
            s.max_disk_bytes);
  out.Gauge("ckv_free_kept_bytes",
            "Free segment slots that still hold their blocks, kept for Puts to write over.",
            s.free_kept_bytes);
  out.Gauge("ckv_index_memory_bytes",
            "Memory of the in-RAM chunk index (chunk table, checksums, leaves, fingerprints).",
            s.index_memory_bytes);
  out.Counter("ckv_puts_total", "Put calls that returned OK, since the store was created.", s.puts);
  out.Counter("ckv_chunks_written_total",
              "Chunks whose records a Put wrote, since the store was created.", s.chunks_written);
  out.Counter("ckv_chunks_deduplicated_total",
              "Chunks a Put found already stored and did not write, since the store was created.",
              s.chunks_deduplicated);
  out.Counter("ckv_written_bytes_total",
              "Segment bytes Puts wrote (records with padding), since the store was created.",
              s.bytes_written);
  out.Counter("ckv_chunks_evicted_total",
              "Chunks removed to keep the store under its cap, since the store was created.",
              s.chunks_evicted);
  out.Counter("ckv_evicted_bytes_total",
              "Segment bytes evictions freed, since the store was created.", s.bytes_evicted);
  out.Counter("ckv_chunks_deleted_total", "Chunks removed by Delete, since the store was created.",
              s.chunks_deleted);
}

}  // namespace ckv::engine
