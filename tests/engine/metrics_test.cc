// SPDX-License-Identifier: Apache-2.0
// Tests of engine/metrics.h: the latency histogram's buckets, the failure counters, and the
// Prometheus text the writer produces (read back with the strict reader of tests/prom_text.h).
#include "engine/metrics.h"

#include <cmath>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/prom_text.h"

namespace ckv::engine {
namespace {

using ::ckv::testing::ParsePromText;
using ::ckv::testing::PromText;

TEST(LatencyHistogramTest, BucketsAreLogSpacedMicrosecondsWithInclusiveUpperBounds) {
  EXPECT_EQ(LatencyHistogram::BucketOf(-5), 0u);
  EXPECT_EQ(LatencyHistogram::BucketOf(0), 0u);
  EXPECT_EQ(LatencyHistogram::BucketOf(1000), 0u);  // 1 us <= le 1e-06
  EXPECT_EQ(LatencyHistogram::BucketOf(1001), 1u);  // just over 1 us: le 2e-06
  EXPECT_EQ(LatencyHistogram::BucketOf(2000), 1u);
  EXPECT_EQ(LatencyHistogram::BucketOf(2001), 2u);
  EXPECT_EQ(LatencyHistogram::BucketOf(4000), 2u);
  EXPECT_EQ(LatencyHistogram::BucketOf(1'000'000), 10u);  // 1 ms <= 1024 us
  EXPECT_EQ(LatencyHistogram::BucketOf(1'024'000), 10u);
  EXPECT_EQ(LatencyHistogram::BucketOf(1'024'001), 11u);
  const int64_t last_ns = int64_t{1000} << (LatencyHistogram::kBounds - 1);  // 33.55 s
  EXPECT_EQ(LatencyHistogram::BucketOf(last_ns), LatencyHistogram::kBounds - 1);
  EXPECT_EQ(LatencyHistogram::BucketOf(last_ns + 1), LatencyHistogram::kBounds);  // +Inf
  EXPECT_EQ(LatencyHistogram::BucketOf(int64_t{3600} * 1'000'000'000), LatencyHistogram::kBounds);
  EXPECT_DOUBLE_EQ(LatencyHistogram::BoundSeconds(0), 1e-6);
  EXPECT_DOUBLE_EQ(LatencyHistogram::BoundSeconds(10), 1.024e-3);
  EXPECT_DOUBLE_EQ(LatencyHistogram::BoundSeconds(LatencyHistogram::kBounds - 1), 33.554432);
  // Every observation lands in the first bucket whose bound holds it.
  for (int64_t ns : {1, 999, 1500, 7'000, 123'456, 9'999'999, 2'000'000'000}) {
    const size_t b = LatencyHistogram::BucketOf(ns);
    ASSERT_LT(b, LatencyHistogram::kBounds) << ns;
    EXPECT_LE(ns * 1e-9, LatencyHistogram::BoundSeconds(b) * (1 + 1e-12)) << ns;
    if (b > 0) {
      EXPECT_GT(ns * 1e-9, LatencyHistogram::BoundSeconds(b - 1)) << ns;
    }
  }
}

TEST(LatencyHistogramTest, SnapshotCountsEachObservationOnceAcrossThreads) {
  LatencyHistogram h;
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < kEach; ++i) h.Observe(int64_t{1000} << (t * 3));  // 1, 8, 64, 512 us
    });
  }
  for (auto& th : threads) th.join();
  const LatencyHistogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.count, uint64_t{kThreads} * kEach);
  EXPECT_EQ(s.buckets[0], uint64_t{kEach});
  EXPECT_EQ(s.buckets[3], uint64_t{kEach});
  EXPECT_EQ(s.buckets[6], uint64_t{kEach});
  EXPECT_EQ(s.buckets[9], uint64_t{kEach});
  EXPECT_NEAR(s.sum_seconds, kEach * (1 + 8 + 64 + 512) * 1e-6, 1e-9);
}

TEST(FailureCountersTest, CountsErrorsByOperationAndCodeAndIgnoresOk) {
  FailureCounters f;
  f.Record(Op::kPut, absl::OkStatus());
  f.Record(Op::kPut, absl::ResourceExhaustedError("cap"));
  f.Record(Op::kPut, absl::ResourceExhaustedError("cap"));
  f.Record(Op::kAwaitLayer, absl::DataLossError("record 1/L2"));
  EXPECT_EQ(f.count(Op::kPut, absl::StatusCode::kResourceExhausted), 2u);
  EXPECT_EQ(f.count(Op::kPut, absl::StatusCode::kOk), 0u);
  EXPECT_EQ(f.count(Op::kAwaitLayer, absl::StatusCode::kDataLoss), 1u);
  EXPECT_EQ(f.count(Op::kLookup, absl::StatusCode::kDataLoss), 0u);
  EXPECT_STREQ(OpName(Op::kBeginReprefill), "begin_reprefill");
  EXPECT_STREQ(OpName(Op::kFinish), "finish");
  EXPECT_STREQ(OpName(Op::kProbe), "probe");
}

TEST(MetricsTextTest, WritesFamiliesThatParseWithCumulativeHistogramsAndEscapedLabels) {
  LatencyHistogram h;
  h.Observe(500);                           // bucket 0
  h.Observe(3'000);                         // 4 us
  h.Observe(3'500);                         // 4 us
  h.Observe(900'000'000);                   // 0.9 s: le 1.048576
  h.Observe(int64_t{100} * 1'000'000'000);  // +Inf
  FailureCounters f;
  f.Record(Op::kPut, absl::ResourceExhaustedError("cap"));
  f.Record(Op::kLookup, absl::FailedPreconditionError("foreign spec"));

  MetricsText out(
      std::vector<std::pair<std::string, std::string>>{{"store", "/srv/a \"b\"\\c\nd"}});
  out.Counter("ckv_things_total", "Things.\nWith a second line and a \\ backslash.", uint64_t{7});
  out.Gauge("ckv_ratio", "A ratio.", 0.25);
  out.Histogram("ckv_op_latency_seconds", "Latency.", h.snapshot());
  out.Failures("ckv_failures_total", "Failures.", f);
  out.Family("ckv_io_backend_info", "gauge", "Backend.");
  out.Sample("ckv_io_backend_info", {{"backend", "io_uring"}}, uint64_t{1});
  const std::string text = out.Take();

  PromText p;
  std::string error;
  ASSERT_TRUE(ParsePromText(text, &p, &error)) << error << "\n" << text;
  EXPECT_EQ(p.type["ckv_things_total"], "counter");
  EXPECT_EQ(p.type["ckv_ratio"], "gauge");
  EXPECT_EQ(p.type["ckv_op_latency_seconds"], "histogram");
  EXPECT_EQ(p.help["ckv_things_total"], "Things.\nWith a second line and a \\ backslash.");
  const std::map<std::string, std::string> store{{"store", "/srv/a \"b\"\\c\nd"}};
  EXPECT_EQ(p.Value("ckv_things_total", store), 7);
  EXPECT_EQ(p.Value("ckv_ratio", store), 0.25);
  // Cumulative: 1 at le=1e-06, 3 from le=4e-06 on, 4 from le=1.048576, 5 at +Inf.
  EXPECT_EQ(p.Count("ckv_op_latency_seconds_bucket"), LatencyHistogram::kBounds + 1);
  EXPECT_EQ(p.Value("ckv_op_latency_seconds_bucket", {{"le", "1e-06"}}), 1);
  EXPECT_EQ(p.Value("ckv_op_latency_seconds_bucket", {{"le", "2e-06"}}), 1);
  EXPECT_EQ(p.Value("ckv_op_latency_seconds_bucket", {{"le", "4e-06"}}), 3);
  EXPECT_EQ(p.Value("ckv_op_latency_seconds_bucket", {{"le", "0.524288"}}), 3);
  EXPECT_EQ(p.Value("ckv_op_latency_seconds_bucket", {{"le", "1.048576"}}), 4);
  EXPECT_EQ(p.Value("ckv_op_latency_seconds_bucket", {{"le", "33.554432"}}), 4);
  EXPECT_EQ(p.Value("ckv_op_latency_seconds_bucket", {{"le", "+Inf"}}), 5);
  EXPECT_EQ(p.Value("ckv_op_latency_seconds_count"), 5);
  EXPECT_NEAR(p.Value("ckv_op_latency_seconds_sum"), 100.9000070, 1e-9);
  // Failures: only the counts that are not 0, with the status code's canonical name.
  EXPECT_EQ(p.Count("ckv_failures_total"), 2u);
  EXPECT_EQ(p.Value("ckv_failures_total", {{"op", "put"}, {"code", "RESOURCE_EXHAUSTED"}}), 1);
  EXPECT_EQ(p.Value("ckv_failures_total", {{"op", "lookup"}, {"code", "FAILED_PRECONDITION"}}), 1);
  EXPECT_EQ(p.Value("ckv_io_backend_info", {{"backend", "io_uring"}}), 1);
  // The escapes as written.
  EXPECT_NE(text.find("store=\"/srv/a \\\"b\\\"\\\\c\\nd\""), std::string::npos) << text;
  EXPECT_NE(
      text.find("# HELP ckv_things_total Things.\\nWith a second line and a \\\\ backslash.\n"),
      std::string::npos)
      << text;
}

TEST(MetricsTextTest, FormatsSpecialValues) {
  EXPECT_EQ(MetricsText::FormatValue(INFINITY), "+Inf");
  EXPECT_EQ(MetricsText::FormatValue(-INFINITY), "-Inf");
  EXPECT_EQ(MetricsText::FormatValue(NAN), "NaN");
  EXPECT_EQ(MetricsText::FormatValue(0.5), "0.5");
  EXPECT_EQ(MetricsText::FormatValue(3.0), "3");
  EXPECT_EQ(MetricsText::EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(MetricsText::EscapeHelp("a\"b\\c\nd"), "a\"b\\\\c\\nd");
}

TEST(MetricsTextTest, TheReaderRejectsBrokenText) {
  PromText p;
  std::string error;
  EXPECT_FALSE(ParsePromText("ckv_x 1\n", &p, &error));  // no HELP/TYPE
  EXPECT_FALSE(ParsePromText("# HELP ckv_x X.\n# TYPE ckv_x counter\nckv_x 1\n", &p, &error))
      << "a counter must end in _total";
  EXPECT_FALSE(ParsePromText("# HELP ckv_x X.\n# TYPE ckv_x gauge\nckv_x{a=\"1} 1\n", &p, &error));
  EXPECT_FALSE(ParsePromText(
      "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
      "h_sum 1\nh_count 1\n",
      &p, &error))
      << "buckets must be cumulative";
  EXPECT_FALSE(ParsePromText(
      "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\n"
      "h_sum 1\nh_count 3\n",
      &p, &error))
      << "_count must equal the +Inf bucket";
  EXPECT_TRUE(ParsePromText(
      "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\n"
      "h_sum 1\nh_count 2\n",
      &p, &error))
      << error;
}

// The at-rest families: exactly the store's figures, by the names kvctl prints.
TEST(StoreMetricsTest, WritesTheAtRestFiguresOfEngineStats) {
  EngineStats s;
  s.chunks = 42;
  s.prefixes = 3;
  s.segments = 2;
  s.disk_bytes_used = 1 << 20;
  s.max_disk_bytes = 8 << 20;
  s.free_kept_bytes = 4096;
  s.index_memory_bytes = 9000;
  s.puts = 5;
  s.chunks_written = 40;
  s.chunks_deduplicated = 2;
  s.bytes_written = 123456;
  s.chunks_evicted = 7;
  s.bytes_evicted = 7777;
  s.chunks_deleted = 1;
  s.records_read = 99;  // since Open: not at rest
  MetricsText out;
  StoreMetrics(s, out);
  PromText p;
  std::string error;
  ASSERT_TRUE(ParsePromText(out.text(), &p, &error)) << error;
  EXPECT_EQ(p.Value("ckv_chunks"), 42);
  EXPECT_EQ(p.Value("ckv_prefixes"), 3);
  EXPECT_EQ(p.Value("ckv_segments"), 2);
  EXPECT_EQ(p.Value("ckv_disk_used_bytes"), 1 << 20);
  EXPECT_EQ(p.Value("ckv_disk_cap_bytes"), 8 << 20);
  EXPECT_EQ(p.Value("ckv_free_kept_bytes"), 4096);
  EXPECT_EQ(p.Value("ckv_index_memory_bytes"), 9000);
  EXPECT_EQ(p.Value("ckv_puts_total"), 5);
  EXPECT_EQ(p.Value("ckv_chunks_written_total"), 40);
  EXPECT_EQ(p.Value("ckv_chunks_deduplicated_total"), 2);
  EXPECT_EQ(p.Value("ckv_written_bytes_total"), 123456);
  EXPECT_EQ(p.Value("ckv_chunks_evicted_total"), 7);
  EXPECT_EQ(p.Value("ckv_evicted_bytes_total"), 7777);
  EXPECT_EQ(p.Value("ckv_chunks_deleted_total"), 1);
  EXPECT_EQ(p.samples.size(), 14u) << out.text();
  EXPECT_EQ(p.Count("ckv_records_read_total"), 0u);
}

}  // namespace
}  // namespace ckv::engine
