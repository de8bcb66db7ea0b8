// SPDX-License-Identifier: Apache-2.0
// The remote tier (EngineOptions::remote, engine/remote_tier.h) against a real Redis Cluster on
// loopback (tests/redis_cluster.h). Two Engines on two directories play two machines: what A
// stores, B re-prefills bit-exact from the cluster and then serves locally. A value corrupted
// with SETRANGE, or one of another model, is DataLoss and never served; an unreachable or
// stopped cluster is a miss within the timeout; a full publish queue drops, counted, without
// failing the Put. Skipped, saying why, where redis-server or redis-cli is absent.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckv/engine.h"
#include "engine/internal.h"
#include "gtest/gtest.h"
#include "remote/chunk_value.h"
#include "remote/cluster_client.h"
#include "tests/redis_cluster.h"
#include "tests/served_bytes.h"
#include "tests/test_util.h"
#include "tools/synthetic_kv.h"

namespace ckv {
namespace {

using ckv::testing::CountBadRecords;
using ckv::testing::RedisCluster;
using ckv::testing::ServedEquals;
using ckv::testing::TempDir;

class RemoteTierTest : public ckv::testing::SuiteClusterTest {
 protected:
  static void SetUpTestSuite() {
    RedisCluster::Options o;
    o.masters = 3;
    o.replicas_per_master = 0;
    o.node_timeout_ms = 5000;
    StartSuiteCluster(o);
  }
  void SetUp() override {
    SuiteClusterTest::SetUp();  // skips or fails the test when there is no cluster
    // Each test its own key prefix: tests do not see each other's chunks.
    prefix_ = absl::StrCat("t", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    spec_ = *ModelSpec::Preset("qwen2.5-0.5b");
  }

  EngineOptions RemoteOptions() const {
    EngineOptions eo;
    eo.remote.seeds = {cluster_->endpoint(0).ToString()};
    eo.remote.key_prefix = prefix_;
    eo.remote.call_timeout_ms = 1000;
    eo.logger = NullLogger();
    return eo;
  }
  std::unique_ptr<Engine> OpenEngine(const std::string& path, const EngineOptions& eo) {
    auto engine = Engine::Open(eo, path);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }
  std::string ClusterKey(const ModelSpec& spec, const std::vector<int32_t>& tokens, size_t chunk) {
    const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
    return remote::ChunkValueKey(prefix_, spec.Fingerprint(), keys[chunk]);
  }
  // redis-cli -c (following redirections) on any node.
  std::string Cli(const std::string& args) { return cluster_->Cli(0, "-c " + args); }

  std::string prefix_;
  ModelSpec spec_;
};

TEST_F(RemoteTierTest, SecondMachineReprefillsBitExactFromTheClusterThenLocally) {
  TempDir dir;
  // 40 chunks: two fetch calls of the fill (32 chunks each at most), and a 5-token tail.
  const std::vector<int32_t> tokens = synth::Tokens(7, 40 * spec_.chunk_tokens + 5);
  const size_t chunks = 40;
  auto a = OpenEngine(dir.Sub("a"), RemoteOptions());
  ASSERT_NE(a, nullptr);
  auto put = ckv::testing::PutSynthetic(*a, spec_, tokens);
  ASSERT_TRUE(put.ok()) << put.status();
  ASSERT_TRUE(engine::WaitUntilRemotePublished(*a, absl::Seconds(10)));
  EXPECT_EQ(a->Stats().remote_published_chunks, chunks);
  EXPECT_EQ(a->Stats().remote_publish_failures, 0u);

  auto b = OpenEngine(dir.Sub("b"), RemoteOptions());
  ASSERT_NE(b, nullptr);
  ReprefillOptions o;
  o.budget_fraction = 1.0;  // every record served, so every one is checked
  o.selector = Selector::kOracle;
  auto session = b->BeginReprefill(spec_, tokens, o);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->matched_chunks(), chunks);
  const auto keys = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, tokens);
  std::vector<float> queries(size_t{o.window} * spec_.q_heads * spec_.head_dim, 0.25f);
  std::vector<std::byte> want(spec_.RecordBytes());
  size_t served = 0;
  for (uint32_t l = 0; l < spec_.layers; ++l) {
    ASSERT_TRUE((*session)->SubmitQueries(l, queries).ok());
    auto view = (*session)->AwaitLayer(l);
    ASSERT_TRUE(view.ok()) << view.status();
    for (const auto& r : view->records()) {
      synth::FillRecord(spec_, keys[r.chunk], l, want);
      ASSERT_TRUE(ServedEquals(r, want.data(), want.size()))
          << "layer " << l << " chunk " << r.chunk;
      ++served;
    }
  }
  EXPECT_EQ(served, chunks * spec_.layers);
  ASSERT_TRUE((*session)->Finish().ok());
  session->reset();
  EngineStats st = b->Stats();
  EXPECT_EQ(st.remote_fetched_chunks, chunks);
  EXPECT_EQ(st.remote_corrupt_chunks, 0u);
  EXPECT_EQ(st.chunks, chunks);  // written into B's own store
  EXPECT_EQ(CountBadRecords(*b, spec_, tokens, chunks), 0);

  // Served locally now: the cluster is not asked again.
  const uint64_t fills = st.remote_fills;
  auto found = b->Lookup(spec_, tokens);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, chunks);
  auto again = b->BeginReprefill(spec_, tokens, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->matched_chunks(), chunks);
  again->reset();
  EXPECT_EQ(b->Stats().remote_fills, fills);
  // B fetched the chunks from the cluster: it does not publish them back.
  ASSERT_TRUE(engine::WaitUntilRemotePublished(*b, absl::Seconds(10)));
  EXPECT_EQ(b->Stats().remote_published_chunks, 0u);
}

TEST_F(RemoteTierTest, LocalChunksContinueFromTheCluster) {
  TempDir dir;
  // Turn 1 (8 chunks), then turn 2 extends it to 20 chunks. A stores both; B has turn 1 only.
  const std::vector<int32_t> turn2 = synth::Tokens(11, 20 * spec_.chunk_tokens);
  const std::vector<int32_t> turn1(turn2.begin(), turn2.begin() + 8 * spec_.chunk_tokens);
  auto a = OpenEngine(dir.Sub("a"), RemoteOptions());
  ASSERT_TRUE(ckv::testing::PutSynthetic(*a, spec_, turn2).ok());
  ASSERT_TRUE(engine::WaitUntilRemotePublished(*a, absl::Seconds(10)));
  EngineOptions local_only;
  local_only.logger = NullLogger();
  {
    auto b = OpenEngine(dir.Sub("b"), local_only);
    ASSERT_TRUE(ckv::testing::PutSynthetic(*b, spec_, turn1).ok());
  }
  auto b = OpenEngine(dir.Sub("b"), RemoteOptions());
  auto found = b->Lookup(spec_, turn2);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, 20u);
  EXPECT_EQ(b->Stats().remote_fetched_chunks, 12u);
  EXPECT_EQ(CountBadRecords(*b, spec_, turn2, 20), 0);
}

TEST_F(RemoteTierTest, CorruptedValueIsDataLossAndNeverServed) {
  TempDir dir;
  const std::vector<int32_t> tokens = synth::Tokens(21, 10 * spec_.chunk_tokens);
  auto a = OpenEngine(dir.Sub("a"), RemoteOptions());
  ASSERT_TRUE(ckv::testing::PutSynthetic(*a, spec_, tokens).ok());
  ASSERT_TRUE(engine::WaitUntilRemotePublished(*a, absl::Seconds(10)));
  // One byte of chunk 6's layer-3 record, in the cluster.
  const std::string key = ClusterKey(spec_, tokens, 6);
  const size_t offset = 56 + 8 * spec_.layers + 3 * spec_.RecordBytes() + 100;
  ASSERT_NE(Cli(absl::StrCat("SETRANGE ", key, " ", offset, " Z")).find(
                std::to_string(remote::ChunkValueBytes(spec_))),
            std::string::npos);
  auto b = OpenEngine(dir.Sub("b"), RemoteOptions());
  auto found = b->Lookup(spec_, tokens);
  ASSERT_TRUE(found.ok()) << found.status();
  // The chain ends before the corrupt chunk: chunks 0..5 fetched and stored, 6 never served.
  EXPECT_EQ(*found, 6u);
  const EngineStats st = b->Stats();
  EXPECT_EQ(st.remote_corrupt_chunks, 1u);
  EXPECT_EQ(st.remote_fetched_chunks, 6u);
  EXPECT_EQ(st.chunks, 6u);
  EXPECT_EQ(CountBadRecords(*b, spec_, tokens, 6), 0);
  std::vector<std::byte> out(spec_.RecordBytes());
  const auto keys = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, tokens);
  EXPECT_EQ(b->ReadRecord(spec_, keys[6], 3, out).code(), absl::StatusCode::kNotFound);
}

TEST_F(RemoteTierTest, ValueOfAnotherModelIsNeverServed) {
  TempDir dir;
  ModelSpec other = spec_;
  other.model_id = "qwen2.5-0.5b-finetune";  // same shape, other weights
  const std::vector<int32_t> tokens = synth::Tokens(31, 4 * spec_.chunk_tokens);
  auto a = OpenEngine(dir.Sub("a"), RemoteOptions());
  ASSERT_TRUE(ckv::testing::PutSynthetic(*a, spec_, tokens).ok());
  ASSERT_TRUE(engine::WaitUntilRemotePublished(*a, absl::Seconds(10)));
  // Model A's chunk 0 copied under model B's key for the same tokens (as a buggy or hostile
  // writer could).
  remote::ClusterOptions co;
  co.seeds = {cluster_->endpoint(0)};
  auto client = remote::ClusterClient::Create(co);
  ASSERT_TRUE(client.ok());
  auto value = (*client)->MultiGet({ClusterKey(spec_, tokens, 0)});
  ASSERT_TRUE(value[0].ok() && value[0]->has_value());
  ASSERT_TRUE((*client)->MultiSet({{ClusterKey(other, tokens, 0), **value[0]}})[0].ok());
  auto b = OpenEngine(dir.Sub("b"), RemoteOptions());
  auto found = b->Lookup(other, tokens);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, 0u);
  EXPECT_EQ(b->Stats().remote_corrupt_chunks, 1u);
  EXPECT_EQ(b->Stats().chunks, 0u);
}

TEST_F(RemoteTierTest, EvictingClusterIsAMissNeverAnError) {
  for (int i = 0; i < cluster_->size(); ++i) {
    cluster_->Cli(i, "CONFIG SET maxmemory-policy allkeys-lru");
    cluster_->Cli(i, "CONFIG SET maxmemory 3mb");
  }
  TempDir dir;
  // 48 chunks of 196,856-byte values (9.4 MB) into 3 x 3 MB: most are evicted.
  const std::vector<int32_t> tokens = synth::Tokens(51, 48 * spec_.chunk_tokens);
  auto a = OpenEngine(dir.Sub("a"), RemoteOptions());
  ASSERT_TRUE(ckv::testing::PutSynthetic(*a, spec_, tokens).ok());
  ASSERT_TRUE(engine::WaitUntilRemotePublished(*a, absl::Seconds(10)));
  auto b = OpenEngine(dir.Sub("b"), RemoteOptions());
  auto found = b->Lookup(spec_, tokens);
  for (int i = 0; i < cluster_->size(); ++i) cluster_->Cli(i, "CONFIG SET maxmemory 0");
  ASSERT_TRUE(found.ok()) << found.status();
  const EngineStats st = b->Stats();
  // The chain ends at the first evicted chunk; what came before it is served, exact.
  EXPECT_LT(*found, 48u);
  EXPECT_EQ(st.remote_fetched_chunks, *found);
  EXPECT_EQ(st.remote_corrupt_chunks, 0u);
  EXPECT_EQ(st.remote_errors, 0u);
  EXPECT_EQ(CountBadRecords(*b, spec_, tokens, *found), 0);
}

TEST_F(RemoteTierTest, StoppedClusterIsAMissWithinTheTimeout) {
  TempDir dir;
  const std::vector<int32_t> tokens = synth::Tokens(41, 6 * spec_.chunk_tokens);
  EngineOptions eo = RemoteOptions();
  eo.remote.call_timeout_ms = 200;
  auto b = OpenEngine(dir.Sub("b"), eo);
  ASSERT_TRUE(b->Lookup(spec_, synth::Tokens(1, 16)).ok());  // the slot map, fetched
  for (int i = 0; i < cluster_->size(); ++i) cluster_->Signal(i, SIGSTOP);
  const absl::Time start = absl::Now();
  auto found = b->Lookup(spec_, tokens);
  const absl::Duration took = absl::Now() - start;
  for (int i = 0; i < cluster_->size(); ++i) cluster_->Signal(i, SIGCONT);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, 0u);
  EXPECT_LT(took, absl::Milliseconds(2 * 200 + 300));
  EXPECT_GE(b->Stats().remote_timeouts, 1u);
  EXPECT_EQ(b->Stats().remote_fill_misses, 2u);
}

TEST(RemoteTierNoClusterTest, UnreachableClusterIsAMissAndPutsStillCommit) {
  TempDir dir;
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  EngineOptions eo;
  eo.remote.seeds = {"127.0.0.1:1"};  // refused
  eo.remote.call_timeout_ms = 200;
  eo.logger = NullLogger();
  auto engine = Engine::Open(eo, dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> tokens = synth::Tokens(3, 4 * spec.chunk_tokens);
  auto put = ckv::testing::PutSynthetic(**engine, spec, tokens);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->chunks_written, 4u);
  ASSERT_TRUE(engine::WaitUntilRemotePublished(**engine, absl::Seconds(10)));
  EngineStats st = (*engine)->Stats();
  EXPECT_EQ(st.remote_publish_failures, 4u);
  EXPECT_EQ(st.remote_published_chunks, 0u);
  const absl::Time start = absl::Now();
  auto found = (*engine)->Lookup(spec, synth::Tokens(4, 4 * spec.chunk_tokens));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, 0u);
  st = (*engine)->Stats();
  EXPECT_GE(st.remote_errors, 2u);
  EXPECT_EQ(st.remote_fill_misses, 1u);
  // The local store still serves what it holds.
  auto local = (*engine)->Lookup(spec, tokens);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(*local, 4u);
}

TEST(RemoteTierNoClusterTest, FullPublishQueueDropsAndCounts) {
  TempDir dir;
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  EngineOptions eo;
  eo.remote.seeds = {"127.0.0.1:1"};
  eo.remote.publish_queue_chunks = 2;
  eo.logger = NullLogger();
  auto engine = Engine::Open(eo, dir.path());
  ASSERT_TRUE(engine.ok());
  auto put = ckv::testing::PutSynthetic(**engine, spec, synth::Tokens(5, 10 * spec.chunk_tokens));
  ASSERT_TRUE(put.ok()) << put.status();
  const EngineStats st = (*engine)->Stats();
  EXPECT_EQ(st.remote_publish_queued, 2u);
  EXPECT_EQ(st.remote_publish_dropped, 8u);
  // The same figures in the Prometheus text.
  const std::string metrics = (*engine)->Metrics();
  EXPECT_NE(metrics.find("\nckv_remote_enabled 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("\nckv_remote_publish_dropped_total 8\n"), std::string::npos);
  EXPECT_NE(metrics.find("\nckv_remote_publish_queued_total 2\n"), std::string::npos);
}

TEST(RemoteTierNoClusterTest, BadOptionsAreRejectedAtOpen) {
  TempDir dir;
  EngineOptions eo;
  eo.remote.seeds = {"no-port"};
  EXPECT_EQ(Engine::Open(eo, dir.Sub("a")).status().code(), absl::StatusCode::kInvalidArgument);
  eo.remote.seeds = {"127.0.0.1:7000"};
  eo.remote.key_prefix = "{ckv}";
  EXPECT_EQ(Engine::Open(eo, dir.Sub("b")).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckv
