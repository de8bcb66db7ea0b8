// SPDX-License-Identifier: Apache-2.0
// The capacity-policy benchmark (bench/replay_bench) on a tiny synthetic trace: its JSON has the
// documented fields, the store's eviction matches the simulated LRU it is measured against, and
// no policy beats the infinite cache.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tools/json_reader.h"

namespace ckv {
namespace {

#ifdef CKV_REPLAY_BENCH_PATH

using Ran = ::ckv::testing::ProgramRun;

Ran RunReplayBench(const std::string& args) {
  return ::ckv::testing::RunProgram(CKV_REPLAY_BENCH_PATH, args);
}

double Rate(const tools::JsonValue& cap, const char* policy) {
  const tools::JsonValue* p = cap.Find(policy);
  const tools::JsonValue* v = p == nullptr ? nullptr : p->Find("token_hit_rate");
  if (v == nullptr || (v->AsDouble() == nullptr && v->AsInt() == nullptr)) {
    ADD_FAILURE() << policy << ".token_hit_rate missing";
    return -1;
  }
  return v->AsDouble() != nullptr ? *v->AsDouble() : static_cast<double>(*v->AsInt());
}

TEST(ReplayBenchTest, StoreEvictionMatchesSimulatedLruAndStaysUnderTheInfiniteCache) {
  // The stores go to tmpfs where there is one: this test checks hit rates, not durability, and
  // 160 synced Puts take over a minute on a slow virtual disk.
  const char* tmpdir = std::getenv("TMPDIR");
  const std::string saved = tmpdir != nullptr ? tmpdir : "";
  if (std::filesystem::is_directory("/dev/shm")) setenv("TMPDIR", "/dev/shm", 1);
  ckv::testing::TempDir dir;
  if (tmpdir != nullptr) {
    setenv("TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  const std::string trace = dir.Sub("synthetic.jsonl");
  Ran r = RunReplayBench("--synthetic 80 --write-trace " + trace);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunReplayBench(
      "--store " + dir.Sub("stores") + " --trace " + trace +
      " --block-tokens 16 --caps 0.1,0.5 --selector mean-key --reclaim-margin 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto json = tools::ParseJson(r.output.substr(r.output.find('{')));
  ASSERT_TRUE(json.ok()) << json.status() << r.output;
  EXPECT_EQ(*json->Find("format")->AsString(), "mooncake");
  EXPECT_EQ(*json->Find("requests")->AsInt(), 80);
  const tools::JsonValue::Array* caps = json->Find("caps")->AsArray();
  ASSERT_NE(caps, nullptr);
  ASSERT_EQ(caps->size(), 2u);
  for (const tools::JsonValue& cap : *caps) {
    const double ckv = Rate(cap, "ckv"), lru = Rate(cap, "lru"), inf = Rate(cap, "infinite");
    EXPECT_GT(inf, 0.2) << "the synthetic trace shares prefixes";
    EXPECT_LE(ckv, inf + 1e-9);
    EXPECT_LE(lru, inf + 1e-9);
    // Recency first (storage/eviction_policy.h): the store is the LRU the simulation models, up
    // to the simulation's slightly larger capacity (no metadata reserve). Without a reclaimer:
    // its margin is space the simulation does not leave free (about a point at 10%). Score first
    // was 3 points off here (16.6% against 13.4% at 10%, 46.9% against 44.0% at 50%).
    EXPECT_NEAR(ckv, lru, 0.005);
    EXPECT_GT(*cap.Find("put_latency")->Find("max_seconds")->AsDouble(), 0);
  }
  EXPECT_LT(Rate((*caps)[0], "lru"), Rate((*caps)[1], "lru")) << "a larger cap holds more";
  EXPECT_GT(*(*caps)[0].Find("chunks_evicted")->AsInt(), 0) << "the 10% cap never evicted";

  r = RunReplayBench("--store " + dir.Sub("stores") + " --synthetic 5 --trace " + trace);
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

#endif  // CKV_REPLAY_BENCH_PATH

}  // namespace
}  // namespace ckv
