// SPDX-License-Identifier: Apache-2.0
// kvctl's --remote (put, lookup, verify) and remote-stats against a real Redis Cluster on
// loopback (tests/redis_cluster.h): a store filled on one "machine" is published, another store
// is filled from the cluster, verify --remote finds a value corrupted in the cluster, and
// remote-stats reports the masters. Skipped, saying why, where redis-server is absent.

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "remote/chunk_value.h"
#include "tests/redis_cluster.h"
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
using ckv::testing::RunProgram;
using ckv::testing::TempDir;

// kvctl's stdout alone (--json goes there), progress off.
ProgramRun Kvctl(const std::string& args) {
  return RunProgram("KVCTL_PROGRESS=off " + std::string(CKV_KVCTL_PATH), args,
                    /*merge_stderr=*/false);
}

int64_t IntAt(const tools::JsonValue& v, std::string_view object, std::string_view key) {
  const tools::JsonValue* o = object.empty() ? &v : v.Find(object);
  if (o == nullptr) return -1;
  const tools::JsonValue* x = o->Find(key);
  return x != nullptr && x->AsInt() != nullptr ? *x->AsInt() : -1;
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
  ASSERT_EQ(Kvctl("init " + a).exit_code, 0);
  ASSERT_EQ(Kvctl("init " + b).exit_code, 0);

  ProgramRun put = Kvctl(
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
  ProgramRun lookup = Kvctl(absl::StrCat("lookup ", b, " --model qwen2.5-0.5b --tokens-file ",
                                  tokens_file, " ", remote, " --json"));
  ASSERT_EQ(lookup.exit_code, 0) << lookup.output;
  auto lookup_json = tools::ParseJson(lookup.output);
  ASSERT_TRUE(lookup_json.ok()) << lookup.output;
  EXPECT_EQ(IntAt(*lookup_json, "", "stored_chunks"), 16);
  EXPECT_EQ(IntAt(*lookup_json, "remote", "fetched_chunks"), 16);
  // What b now holds is bit-exact: the generator's records.
  ProgramRun verify_b = Kvctl("verify " + b + " --synthetic");
  EXPECT_EQ(verify_b.exit_code, 0) << verify_b.output;

  ProgramRun verify_a = Kvctl(absl::StrCat("verify ", a, " ", remote, " --json"));
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
  ProgramRun verify_bad = Kvctl(absl::StrCat("verify ", a, " ", remote, " --json"));
  EXPECT_EQ(verify_bad.exit_code, 1) << verify_bad.output;
  auto vb = tools::ParseJson(verify_bad.output);
  ASSERT_TRUE(vb.ok()) << verify_bad.output;
  EXPECT_EQ(IntAt(*vb, "remote", "corrupt"), 1);
  EXPECT_EQ(IntAt(*vb, "remote", "present"), 15);

  ProgramRun stats = Kvctl(absl::StrCat("remote-stats ", remote, " --json"));
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  auto sj = tools::ParseJson(stats.output);
  ASSERT_TRUE(sj.ok()) << stats.output;
  EXPECT_EQ(IntAt(*sj, "", "keys"), 16);
  const tools::JsonValue* masters = sj->Find("masters");
  ASSERT_NE(masters, nullptr);
  ASSERT_NE(masters->AsArray(), nullptr);
  EXPECT_EQ(masters->AsArray()->size(), 3u);
  ProgramRun text = Kvctl(absl::StrCat("remote-stats ", remote));
  EXPECT_NE(text.output.find("3 masters, 16 keys"), std::string::npos) << text.output;

  // A cluster that does not answer: remote-stats says so (exit 3), and a bad --remote is usage.
  EXPECT_EQ(Kvctl("remote-stats --remote 127.0.0.1:1 2>/dev/null").exit_code, 3);
  EXPECT_EQ(Kvctl("remote-stats --remote nonsense 2>/dev/null").exit_code, 2);
}

}  // namespace
}  // namespace ckv
