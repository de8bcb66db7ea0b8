// SPDX-License-Identifier: Apache-2.0
// put_bench --steady-state (bench/put_bench.cc) on a tiny configuration: its JSON has the
// documented schema, with the latency fields, and every Put after the warm-up evicted. Nothing
// here is timed: the figures are checked only for the relations that hold by construction.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/json_test_util.h"
#include "tests/test_util.h"
#include "tools/json_reader.h"

namespace ckv {
namespace {

using ::ckv::testing::TempDir;
using tools::JsonValue;

#ifdef CKV_PUT_BENCH_PATH

using Ran = ::ckv::testing::ProgramRun;

Ran RunPutBench(const std::string& args) {
  return ::ckv::testing::RunProgram(CKV_PUT_BENCH_PATH, args);
}

using ::ckv::testing::JsonNumber;

TEST(PutBenchTest, SteadyStateTinyRunEvictsOnEveryPutAndReportsLatency) {
  TempDir dir;
  const std::string json = dir.path() + "/out.json";
  // 64 tokens of qwen2.5-0.5b: 4 chunks a Put; the cap holds 2 prefixes and a half. Without the
  // background reclaimer each Put after the warm-up must evict inline.
  const Ran r = RunPutBench(
      "--steady-state --store " + dir.path() +
      "/stores --model qwen2.5-0.5b --tokens 64 --puts 7 --cap-puts 2 --reclaim-margin 0 "
      "--json " +
      json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(json);
  ASSERT_TRUE(in.good()) << json << " not written; output: " << r.output;
  std::stringstream text;
  text << in.rdbuf();
  auto v = tools::ParseJson(text.str());
  ASSERT_TRUE(v.ok()) << v.status() << text.str();
  ASSERT_NE(v->Find("mode"), nullptr);
  EXPECT_EQ(*v->Find("mode")->AsString(), "steady-state");
  EXPECT_EQ(JsonNumber(*v, "puts"), 7);
  EXPECT_EQ(JsonNumber(*v, "warmup_puts"), 2);
  EXPECT_EQ(JsonNumber(*v, "measured_puts"), 5);
  EXPECT_EQ(JsonNumber(*v, "puts_evicting"), 5);
  ASSERT_NE(v->Find("every_put_evicted"), nullptr);
  ASSERT_NE(v->Find("every_put_evicted")->AsBool(), nullptr);
  EXPECT_TRUE(*v->Find("every_put_evicted")->AsBool());
  const JsonValue::Array* runs = v->Find("runs")->AsArray();
  ASSERT_NE(runs, nullptr);
  ASSERT_EQ(runs->size(), 7u);
  for (size_t i = 0; i < runs->size(); ++i) {
    const JsonValue& run = (*runs)[i];
    EXPECT_EQ(*run.Find("warmup")->AsBool(), i < 2) << i;
    EXPECT_GT(JsonNumber(run, "bytes_written"), 0) << i;
    // The warm-up fills the store; each Put after it must make room.
    if (i >= 2) {
      EXPECT_GT(JsonNumber(run, "chunks_evicted"), 0) << i;
    } else {
      EXPECT_EQ(JsonNumber(run, "chunks_evicted"), 0) << i;
    }
  }
  const double p50 = JsonNumber(*v, "latency_p50_ms");
  const double p99 = JsonNumber(*v, "latency_p99_ms");
  const double max = JsonNumber(*v, "latency_max_ms");
  EXPECT_GT(p50, 0);
  EXPECT_LE(p50, p99);
  EXPECT_LE(p99, max);
  EXPECT_GT(JsonNumber(*v, "median_gbps"), 0);
  EXPECT_LE(JsonNumber(*v, "min_gbps"), JsonNumber(*v, "median_gbps"));
  EXPECT_GT(JsonNumber(*v->Find("uncapped"), "median_gbps"), 0);
  // The store's own figures (EngineStats) cover all 7 Puts of the capped store.
  const JsonValue* st = v->Find("store_stats");
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(JsonNumber(*st, "put_latency_window"), 7);
  EXPECT_GT(JsonNumber(*st, "put_latency_p50_us"), 0);
  EXPECT_LE(JsonNumber(*st, "put_latency_p50_us"), JsonNumber(*st, "put_latency_p99_us"));
  EXPECT_LE(JsonNumber(*st, "put_latency_p99_us"), JsonNumber(*st, "put_latency_max_us"));
  EXPECT_LE(JsonNumber(*st, "disk_bytes_used"), JsonNumber(*v, "cap_bytes"));
}

TEST(PutBenchTest, SteadyStateRefusesAWarmupAsLongAsTheRun) {
  TempDir dir;
  const Ran r = RunPutBench("--steady-state --store " + dir.path() + " --puts 4 --cap-puts 4");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("need 1 <= K < N"), std::string::npos) << r.output;
}

#else

TEST(PutBenchTest, SteadyStateTinyRunEvictsOnEveryPutAndReportsLatency) {
  GTEST_SKIP() << "built without the benchmarks (CKV_BUILD_BENCH=OFF)";
}

#endif

}  // namespace
}  // namespace ckv
