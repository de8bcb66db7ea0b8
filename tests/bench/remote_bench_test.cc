// SPDX-License-Identifier: Apache-2.0
// bench/remote_bench, run as a user would, on a small prefix against a real Redis Cluster on
// loopback (tests/remote/redis_cluster.h): it completes and reports figures that make sense, for
// the whole-prefix fill (period-exact) and for a session that selects (quest). Skipped, saying why,
// where redis-server is absent or the benchmarks are not built.
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/json_test_util.h"
#include "tests/remote/redis_cluster.h"
#include "tests/test_util.h"
#include "tools/json_reader.h"

namespace ckv {
namespace {

using ckv::testing::RedisCluster;
using ckv::testing::TempDir;

using ::ckv::testing::JsonNumber;

TEST(RemoteBenchTest, ReportsReprefillAndThroughputFigures) {
#ifndef CKV_REMOTE_BENCH_PATH
  GTEST_SKIP() << "remote_bench is not built (CKV_BUILD_BENCH=OFF)";
#else
  RedisCluster::Options o;
  auto cluster = RedisCluster::Start(o);
  CKV_SKIP_OR_FAIL_WITHOUT_CLUSTER(cluster.status());
  TempDir dir;
  const std::string out =
      ckv::testing::RunProgram(
          CKV_REMOTE_BENCH_PATH,
          absl::StrCat("--remote ", (*cluster)->endpoint(0).ToString(), " --dir ",
                       dir.Sub("stores"), " --tokens 128 --runs 1 --seconds 0.2 --json"))
          .output;
  auto json = tools::ParseJson(out.substr(out.find('{')));
  ASSERT_TRUE(json.ok()) << out;
  EXPECT_EQ(JsonNumber(*json, "chunks"), 8);
  EXPECT_EQ(JsonNumber(*json, "masters"), 3);
  EXPECT_EQ(JsonNumber(*json, "value_bytes"), 206376);  // qwen2.5-0.5b: head 9,768 + 24 x 8 KiB
  EXPECT_GT(JsonNumber(*json, "reprefill_local_s"), 0);
  EXPECT_GT(JsonNumber(*json, "reprefill_cold_remote_s"), JsonNumber(*json, "cold_fill_s"));
  EXPECT_EQ(JsonNumber(*json, "fetched_bytes"), 8 * 206376);
  EXPECT_GT(JsonNumber(*json, "ckv_gets_per_s"), 0);
  EXPECT_GT(JsonNumber(*json, "ckv_fresh_gets_per_s"), 0);
  if (!ckv::testing::FindOnPath("redis-benchmark").empty()) {
    EXPECT_GT(JsonNumber(*json, "redis_benchmark_gets_per_s"), 0);
    EXPECT_GT(JsonNumber(*json, "ratio"), 0);
    EXPECT_GT(JsonNumber(*json, "fresh_ratio"), 0);
  }
  // quest selects: the cold session takes the 8 heads (9,768 bytes each) and its selected
  // records from the cluster (budget 0.25: 2 chunks of 8 per layer, 24 layers of 8 KiB, and
  // what it reads ahead for the next layer: at most as much again), not the 8 whole values.
  const std::string quest =
      ckv::testing::RunProgram(
          CKV_REMOTE_BENCH_PATH,
          absl::StrCat("--remote ", (*cluster)->endpoint(0).ToString(), " --dir ", dir.Sub("quest"),
                       " --tokens 128 --runs 1 --seconds 0.2 --selector quest --budget 0.25",
                       " --json"))
          .output;
  auto q = tools::ParseJson(quest.substr(quest.find('{')));
  ASSERT_TRUE(q.ok()) << quest;
  const tools::JsonValue* selecting = q->Find("selecting");
  ASSERT_TRUE(selecting != nullptr && selecting->AsBool() != nullptr) << quest;
  EXPECT_TRUE(*selecting->AsBool());
  EXPECT_EQ(JsonNumber(*q, "cold_fill_s"), 0);
  EXPECT_GE(JsonNumber(*q, "fetched_bytes"), 8 * 9768 + 2 * 24 * 8192);
  EXPECT_LE(JsonNumber(*q, "fetched_bytes"), 8 * 9768 + 2 * 2 * 24 * 8192);
#endif
}

}  // namespace
}  // namespace ckv
