// SPDX-License-Identifier: Apache-2.0
// kvctl's --remote (put, lookup, replay, verify) and remote-stats against a real Redis Cluster on
// loopback (tests/remote/redis_cluster.h): a store filled on one "machine" is published, another
// store is filled from the cluster, verify --remote finds a value corrupted in the cluster, and
// remote-stats reports the masters; a trace replayed on one store is replayed on an empty one
// from the cluster. Skipped, saying why, where redis-server is absent.

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "remote/chunk_value.h"
#include "tests/json_test_util.h"
#include "tests/remote/redis_cluster.h"
#include "tests/test_util.h"
#include "tools/json_reader.h"
#include "tools/synthetic_kv.h"

#ifndef CKV_KVCTL_PATH
#error "CKV_KVCTL_PATH must name the kvctl binary"
#endif

namespace ckv {
namespace {

using ckv::testing::ProgramRun;
using ckv::testing::RedisCluster;
using ckv::testing::TempDir;

using ::ckv::testing::KvctlStdout;

int64_t IntAt(const tools::JsonValue& v, std::string_view object, std::string_view key) {
  const tools::JsonValue* o = object.empty() ? &v : v.Find(object);
  return o == nullptr ? -1 : ::ckv::testing::JsonInt(*o, key);
}

TEST(KvctlRemoteTest, PutPublishesLookupFillsVerifyFindsCorruption) {
  RedisCluster::Options o;
  o.masters = 3;
  auto cluster = RedisCluster::Start(o);
  CKV_SKIP_OR_FAIL_WITHOUT_CLUSTER(cluster.status());
  const std::string remote = absl::StrCat("--remote ", (*cluster)->endpoint(0).ToString(), ",",
                                          (*cluster)->endpoint(1).ToString());
  TempDir dir;
  const std::string a = dir.Sub("a"), b = dir.Sub("b");
  ASSERT_EQ(KvctlStdout("init " + a).exit_code, 0);
  ASSERT_EQ(KvctlStdout("init " + b).exit_code, 0);

  ProgramRun put = KvctlStdout(
      absl::StrCat("put ", a, " --model qwen2.5-0.5b --tokens 256 --seed 9 ", remote, " --json"));
  ASSERT_EQ(put.exit_code, 0) << put.output;
  auto put_json = tools::ParseJson(put.output);
  ASSERT_TRUE(put_json.ok()) << put.output;
  EXPECT_EQ(IntAt(*put_json, "remote", "published_chunks"), 16);
  EXPECT_EQ(IntAt(*put_json, "remote", "publish_failures"), 0);

  // The same tokens, looked up in the empty store b: filled from the cluster.
  const std::vector<int32_t> tokens = synth::Tokens(9, 256);
  const std::string tokens_file = dir.Sub("tokens.json");
  std::ofstream(tokens_file) << "[" << absl::StrJoin(tokens, ",") << "]";
  ProgramRun lookup = KvctlStdout(absl::StrCat("lookup ", b, " --model qwen2.5-0.5b --tokens-file ",
                                               tokens_file, " ", remote, " --json"));
  ASSERT_EQ(lookup.exit_code, 0) << lookup.output;
  auto lookup_json = tools::ParseJson(lookup.output);
  ASSERT_TRUE(lookup_json.ok()) << lookup.output;
  EXPECT_EQ(IntAt(*lookup_json, "", "stored_chunks"), 16);
  EXPECT_EQ(IntAt(*lookup_json, "remote", "fetched_chunks"), 16);
  // What b now holds is bit-exact: the generator's records.
  ProgramRun verify_b = KvctlStdout("verify " + b + " --synthetic");
  EXPECT_EQ(verify_b.exit_code, 0) << verify_b.output;

  ProgramRun verify_a = KvctlStdout(absl::StrCat("verify ", a, " ", remote, " --json"));
  ASSERT_EQ(verify_a.exit_code, 0) << verify_a.output;
  auto va = tools::ParseJson(verify_a.output);
  ASSERT_TRUE(va.ok()) << verify_a.output;
  EXPECT_EQ(IntAt(*va, "remote", "present"), 16);
  EXPECT_EQ(IntAt(*va, "remote", "corrupt"), 0);

  // One byte of chunk 3 changed in the cluster: verify --remote reports it (exit 1).
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  const std::string key = remote::ChunkValueKey("ckv", spec.Fingerprint(), keys[3]);
  (*cluster)->Cli(0, absl::StrCat("-c SETRANGE ", key, " 5000 X"));
  ProgramRun verify_bad = KvctlStdout(absl::StrCat("verify ", a, " ", remote, " --json"));
  EXPECT_EQ(verify_bad.exit_code, 1) << verify_bad.output;
  auto vb = tools::ParseJson(verify_bad.output);
  ASSERT_TRUE(vb.ok()) << verify_bad.output;
  EXPECT_EQ(IntAt(*vb, "remote", "corrupt"), 1);
  EXPECT_EQ(IntAt(*vb, "remote", "present"), 15);

  ProgramRun stats = KvctlStdout(absl::StrCat("remote-stats ", remote, " --json"));
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  auto sj = tools::ParseJson(stats.output);
  ASSERT_TRUE(sj.ok()) << stats.output;
  EXPECT_EQ(IntAt(*sj, "", "keys"), 16);
  const tools::JsonValue* masters = sj->Find("masters");
  ASSERT_NE(masters, nullptr);
  ASSERT_NE(masters->AsArray(), nullptr);
  EXPECT_EQ(masters->AsArray()->size(), 3u);
  ProgramRun text = KvctlStdout(absl::StrCat("remote-stats ", remote));
  EXPECT_NE(text.output.find("3 masters, 16 keys"), std::string::npos) << text.output;

  // A cluster that does not answer: remote-stats says so (exit 3), and a bad --remote is usage.
  EXPECT_EQ(KvctlStdout("remote-stats --remote 127.0.0.1:1 2>/dev/null").exit_code, 3);
  EXPECT_EQ(KvctlStdout("remote-stats --remote nonsense 2>/dev/null").exit_code, 2);
}

// One store replays a trace and publishes what it stores; a second, empty store replays the same
// trace and finds every turn's context in the cluster: each turn matches its whole prompt,
// writes nothing itself, and what it fetched is the generator's bytes.
TEST(KvctlRemoteTest, ReplayPublishesThenAnEmptyStoreReplaysFromTheCluster) {
  RedisCluster::Options o;
  o.masters = 3;
  auto cluster = RedisCluster::Start(o);
  CKV_SKIP_OR_FAIL_WITHOUT_CLUSTER(cluster.status());
  const std::string remote = absl::StrCat("--remote ", (*cluster)->endpoint(2).ToString());
  TempDir dir;
  const std::string a = dir.Sub("a"), b = dir.Sub("b");
  ASSERT_EQ(KvctlStdout("init " + a).exit_code, 0);
  ASSERT_EQ(KvctlStdout("init " + b).exit_code, 0);
  const std::string trace = dir.Sub("trace.jsonl");
  // Turn 1: 256 tokens (16 chunks); turn 2 adds 136 (8 more whole chunks, and a tail).
  std::ofstream(trace)
      << "{\"conversation\": \"c\", \"turn\": 1, \"generate\": {\"seed\": 4, \"tokens\": 256}}\n"
         "{\"conversation\": \"c\", \"turn\": 2, \"generate\": {\"seed\": 5, \"tokens\": 136}}\n";
  const std::string replay = " --model qwen2.5-0.5b " + remote + " --json";

  ProgramRun first = KvctlStdout("replay " + a + " " + trace + replay);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto fj = tools::ParseJson(first.output);
  ASSERT_TRUE(fj.ok()) << first.output;
  EXPECT_EQ(IntAt(*fj, "", "matched_chunks"), 16);  // turn 2 matched turn 1's chunks
  EXPECT_EQ(IntAt(*fj, "", "chunks_written"), 24);
  EXPECT_EQ(IntAt(*fj, "remote", "published_chunks"), 24);
  EXPECT_EQ(IntAt(*fj, "remote", "publish_failures"), 0);
  EXPECT_EQ(IntAt(*fj, "remote", "fetched_chunks"), 0);

  ProgramRun second = KvctlStdout("replay " + b + " " + trace + replay);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  auto sj = tools::ParseJson(second.output);
  ASSERT_TRUE(sj.ok()) << second.output;
  const tools::JsonValue* turns = sj->Find("turns");
  ASSERT_NE(turns, nullptr);
  ASSERT_NE(turns->AsArray(), nullptr);
  ASSERT_EQ(turns->AsArray()->size(), 2u);
  // {prompt chunks, matched chunks} per turn: the whole prompt each time, none written.
  const int64_t want[2][2] = {{16, 16}, {24, 24}};
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    const tools::JsonValue& t = (*turns->AsArray())[i];
    EXPECT_EQ(IntAt(t, "", "prompt_chunks"), want[i][0]);
    EXPECT_EQ(IntAt(t, "", "matched_chunks"), want[i][1]);
    EXPECT_EQ(IntAt(t, "", "chunks_written"), 0);
    EXPECT_GT(IntAt(t, "", "records_served"), 0);
  }
  EXPECT_EQ(IntAt(*sj, "remote", "fetched_chunks"), 24);
  EXPECT_EQ(IntAt(*sj, "remote", "fetched_bytes"),
            24 * static_cast<int64_t>(remote::ChunkValueBytes(*ModelSpec::Preset("qwen2.5-0.5b"))));
  EXPECT_EQ(IntAt(*sj, "remote", "corrupt_chunks"), 0);
  EXPECT_EQ(IntAt(*sj, "remote", "errors"), 0);
  EXPECT_EQ(IntAt(*sj->Find("engine"), "", "chunks"), 24);
  // b now holds the generator's bytes for every chunk, and serves the trace without the cluster.
  ProgramRun verify_b = KvctlStdout("verify " + b + " --synthetic");
  EXPECT_EQ(verify_b.exit_code, 0) << verify_b.output;
  ProgramRun local =
      KvctlStdout("replay " + b + " " + trace + " --model qwen2.5-0.5b --no-put --json");
  ASSERT_EQ(local.exit_code, 0) << local.output;
  auto lj = tools::ParseJson(local.output);
  ASSERT_TRUE(lj.ok()) << local.output;
  EXPECT_EQ(IntAt(*lj, "", "matched_chunks"), 40);
}

}  // namespace
}  // namespace ckv
