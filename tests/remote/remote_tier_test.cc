// SPDX-License-Identifier: Apache-2.0
// The remote tier (EngineOptions::remote, engine/remote_tier.h) against a real Redis Cluster on
// loopback (tests/remote/redis_cluster.h). Two Engines on two directories play two machines: what A
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
#include "tests/remote/redis_cluster.h"
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
  // Probe says how far the chain goes, here and in the cluster, and changes nothing.
  auto extent = b->Probe(spec_, turn2);
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->local_chunks, 8u);
  EXPECT_EQ(extent->remote_chunks, 12u);
  EXPECT_EQ(b->Stats().chunks, 8u);
  EXPECT_EQ(b->Stats().remote_fills, 0u);
  EXPECT_EQ(b->Stats().remote_fetched_chunks, 0u);
  // A chain that is not in the cluster at all, and one whose whole chunks are all local.
  extent = b->Probe(spec_, synth::Tokens(12, 4 * spec_.chunk_tokens));
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->chunks(), 0u);
  extent = b->Probe(spec_, turn1);
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->local_chunks, 8u);
  EXPECT_EQ(extent->remote_chunks, 0u);
  // Lookup fills: the chunks come from the cluster and are stored here.
  auto found = b->Lookup(spec_, turn2);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, 20u);
  EXPECT_EQ(b->Stats().remote_fetched_chunks, 12u);
  extent = b->Probe(spec_, turn2);
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->local_chunks, 20u);
  EXPECT_EQ(extent->remote_chunks, 0u);
  EXPECT_EQ(CountBadRecords(*b, spec_, turn2, 20), 0);
}

// Queries of one layer that differ from layer to layer (so do the selections).
std::vector<float> LayerQueries(const ModelSpec& spec, const ReprefillOptions& o, uint32_t layer) {
  std::vector<float> q(size_t{o.window} * spec.q_heads * spec.head_dim);
  uint32_t x = 2654435761u * (layer + 1);
  for (float& v : q) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(x >> 8) % 2001 - 1000) / 1000.0f;
  }
  return q;
}

// What a session served: per layer, the chunks and whether each record's bytes were the stored
// ones. Fails the test on any error.
struct SessionRun {
  std::vector<std::vector<uint32_t>> chunks;  // per layer
  SessionStats stats;
};
SessionRun RunSession(Engine& e, const ModelSpec& spec, const std::vector<int32_t>& tokens,
                      const ReprefillOptions& o) {
  SessionRun run;
  auto session = e.BeginReprefill(spec, tokens, o);
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return run;
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  std::vector<std::byte> want(spec.RecordBytes());
  for (uint32_t l = 0; l < spec.layers; ++l) {
    EXPECT_TRUE((*session)->SubmitQueries(l, LayerQueries(spec, o, l)).ok());
    auto view = (*session)->AwaitLayer(l);
    EXPECT_TRUE(view.ok()) << view.status();
    if (!view.ok()) return run;
    run.chunks.emplace_back();
    for (const auto& r : view->records()) {
      synth::FillRecord(spec, keys[r.chunk], l, want);
      EXPECT_TRUE(ServedEquals(r, want.data(), want.size()))
          << "layer " << l << " chunk " << r.chunk;
      run.chunks.back().push_back(r.chunk);
    }
  }
  auto stats = (*session)->Finish();
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (stats.ok()) run.stats = *stats;
  return run;
}

// A session that selects (quest and mean-key below budget 1) reads from the cluster only the
// heads of the chunks it lacks and the records it selects: the same selection, bit-exact, as on
// the machine that stored the prefix, without a byte from B's NVMe. Its Finish fills the prefix
// into B's store; the next session there is local.
TEST_F(RemoteTierTest, SessionReadsOnlyTheRecordsItSelectsFromTheCluster) {
  TempDir dir;
  const size_t chunks = 24;
  const std::vector<int32_t> tokens = synth::Tokens(17, chunks * spec_.chunk_tokens + 3);
  auto a = OpenEngine(dir.Sub("a"), RemoteOptions());
  ASSERT_TRUE(ckv::testing::PutSynthetic(*a, spec_, tokens).ok());
  ASSERT_TRUE(engine::WaitUntilRemotePublished(*a, absl::Seconds(10)));
  int round = 0;
  for (Selector selector : {Selector::kQuest, Selector::kMeanKey}) {
    SCOPED_TRACE(SelectorName(selector));
    ReprefillOptions o;
    o.selector = selector;
    o.budget_fraction = 0.25;  // 6 of 24 chunks per layer
    const SessionRun local = RunSession(*a, spec_, tokens, o);
    auto b = OpenEngine(dir.Sub(absl::StrCat("b", round++)), RemoteOptions());
    // What a scheduler asks first: Probe, which leaves the session its selecting path.
    auto extent = b->Probe(spec_, tokens);
    ASSERT_TRUE(extent.ok()) << extent.status();
    EXPECT_EQ(extent->local_chunks, 0u);
    EXPECT_EQ(extent->remote_chunks, chunks);
    const SessionRun cold = RunSession(*b, spec_, tokens, o);
    ASSERT_EQ(cold.chunks.size(), spec_.layers);
    EXPECT_EQ(cold.chunks, local.chunks);  // the same summaries select the same chunks
    EXPECT_EQ(cold.stats.matched_chunks, chunks);
    EXPECT_EQ(cold.stats.remote_chunks, chunks);
    EXPECT_EQ(cold.stats.bytes_read, 0u);  // nothing from B's NVMe: it had nothing
    EXPECT_EQ(cold.stats.records_served, 6u * spec_.layers);
    // Each served record read once; speculation (layer l's selection for l + 1) adds at most one
    // selection per layer, never the whole prefix.
    EXPECT_GE(cold.stats.remote_records, cold.stats.records_served);
    EXPECT_LE(cold.stats.remote_records, 2 * cold.stats.records_served);
    EXPECT_EQ(cold.stats.remote_bytes_read, chunks * remote::LayoutOfChunkValue(spec_).head_bytes +
                                                cold.stats.remote_records * spec_.RecordBytes());
    EXPECT_GT(cold.stats.read_amplification(), 1.0);
    EngineStats st = b->Stats();
    EXPECT_EQ(st.remote_head_reads, 1u);
    EXPECT_EQ(st.remote_head_chunks, chunks);
    EXPECT_EQ(st.remote_session_records, cold.stats.remote_records);
    EXPECT_EQ(st.remote_corrupt_chunks, 0u);
    EXPECT_EQ(st.remote_fills_queued, 1u);
    // Finish queued the fill of the whole prefix: then B serves it from its own store.
    ASSERT_TRUE(engine::WaitUntilRemotePublished(*b, absl::Seconds(10)));
    st = b->Stats();
    EXPECT_EQ(st.remote_fills, 1u);  // the fill after Finish, only
    EXPECT_EQ(st.remote_fetched_chunks, chunks);
    EXPECT_EQ(st.chunks, chunks);
    EXPECT_EQ(CountBadRecords(*b, spec_, tokens, chunks), 0);
    const SessionRun warm = RunSession(*b, spec_, tokens, o);
    EXPECT_EQ(warm.chunks, local.chunks);
    EXPECT_EQ(warm.stats.remote_chunks, 0u);
    EXPECT_EQ(warm.stats.remote_records, 0u);
    EXPECT_GT(warm.stats.bytes_read, 0u);
    EXPECT_EQ(b->Stats().remote_head_chunks, chunks);  // the cluster was not asked again
  }
}

// A record damaged in the cluster (SETRANGE) fails the layers that select it with DataLoss and
// is never served; a damaged head ends the chain before its chunk; a record gone from the cluster
// after the session read its head fails the layer that needs it with Unavailable, promptly.
TEST_F(RemoteTierTest, SessionNeverServesADamagedOrMissingRecord) {
  TempDir dir;
  const size_t chunks = 8;
  const std::vector<int32_t> tokens = synth::Tokens(19, chunks * spec_.chunk_tokens);
  auto a = OpenEngine(dir.Sub("a"), RemoteOptions());
  ASSERT_TRUE(ckv::testing::PutSynthetic(*a, spec_, tokens).ok());
  ASSERT_TRUE(engine::WaitUntilRemotePublished(*a, absl::Seconds(10)));
  const remote::ChunkValueLayout layout = remote::LayoutOfChunkValue(spec_);
  // Layer 2's record of every chunk, one byte each: whatever layer 2 selects is damaged.
  for (size_t j = 0; j < chunks; ++j) {
    Cli(absl::StrCat("SETRANGE ", ClusterKey(spec_, tokens, j), " ", layout.RecordOffset(2) + 1000,
                     " Z"));
  }
  ReprefillOptions o;
  o.selector = Selector::kQuest;
  o.budget_fraction = 0.25;
  o.prefetch = false;  // each layer reads its own selection, so layer 1 reads no layer-2 record
  auto b = OpenEngine(dir.Sub("b"), RemoteOptions());
  {
    auto session = b->BeginReprefill(spec_, tokens, o);
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_EQ((*session)->matched_chunks(), chunks);
    for (uint32_t l = 0; l < 3; ++l) {
      ASSERT_TRUE((*session)->SubmitQueries(l, LayerQueries(spec_, o, l)).ok());
      auto view = (*session)->AwaitLayer(l);
      if (l < 2) {
        ASSERT_TRUE(view.ok()) << view.status();
        EXPECT_EQ(view->records().size(), 2u);
      } else {
        ASSERT_EQ(view.status().code(), absl::StatusCode::kDataLoss) << view.status();
        EXPECT_NE(view.status().message().find("record L2"), absl::string_view::npos)
            << view.status();
      }
    }
  }
  EXPECT_GE(b->Stats().remote_corrupt_chunks, 1u);

  // A damaged head (chunk 5's summaries): the chain ends before it.
  Cli(absl::StrCat("SETRANGE ", ClusterKey(spec_, tokens, 5), " ", layout.mean_offset + 3, " Z"));
  auto c = OpenEngine(dir.Sub("c"), RemoteOptions());
  {
    auto session = c->BeginReprefill(spec_, tokens, o);
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_EQ((*session)->matched_chunks(), 5u);
  }
  EXPECT_EQ(c->Stats().remote_corrupt_chunks, 1u);

  // Every value deleted after the heads were read: the first layer fails, Unavailable, at once.
  auto d = OpenEngine(dir.Sub("d"), RemoteOptions());
  auto session = d->BeginReprefill(spec_, tokens, o);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_EQ((*session)->matched_chunks(), 5u);
  for (size_t j = 0; j < chunks; ++j) Cli(absl::StrCat("DEL ", ClusterKey(spec_, tokens, j)));
  ASSERT_TRUE((*session)->SubmitQueries(0, LayerQueries(spec_, o, 0)).ok());
  const absl::Time start = absl::Now();
  auto view = (*session)->AwaitLayer(0);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1000));
  ASSERT_EQ(view.status().code(), absl::StatusCode::kUnavailable) << view.status();
  EXPECT_NE(view.status().message().find("gone from the cluster"), absl::string_view::npos)
      << view.status();
}

TEST_F(RemoteTierTest, CorruptedValueIsDataLossAndNeverServed) {
  TempDir dir;
  const std::vector<int32_t> tokens = synth::Tokens(21, 10 * spec_.chunk_tokens);
  auto a = OpenEngine(dir.Sub("a"), RemoteOptions());
  ASSERT_TRUE(ckv::testing::PutSynthetic(*a, spec_, tokens).ok());
  ASSERT_TRUE(engine::WaitUntilRemotePublished(*a, absl::Seconds(10)));
  // One byte of chunk 6's layer-3 record, in the cluster.
  const std::string key = ClusterKey(spec_, tokens, 6);
  const size_t offset = remote::LayoutOfChunkValue(spec_).RecordOffset(3) + 100;
  ASSERT_NE(Cli(absl::StrCat("SETRANGE ", key, " ", offset, " Z"))
                .find(std::to_string(remote::ChunkValueBytes(spec_))),
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
  // 48 chunks of 206,376-byte values (9.9 MB) into 3 x 3 MB: most are evicted. Then a short
  // prefix of 3 chunks, the most recently used keys, which LRU keeps.
  const std::vector<int32_t> tokens = synth::Tokens(51, 48 * spec_.chunk_tokens);
  const std::vector<int32_t> recent = synth::Tokens(52, 3 * spec_.chunk_tokens);
  auto a = OpenEngine(dir.Sub("a"), RemoteOptions());
  ASSERT_TRUE(ckv::testing::PutSynthetic(*a, spec_, tokens).ok());
  ASSERT_TRUE(engine::WaitUntilRemotePublished(*a, absl::Seconds(10)));
  ASSERT_TRUE(ckv::testing::PutSynthetic(*a, spec_, recent).ok());
  ASSERT_TRUE(engine::WaitUntilRemotePublished(*a, absl::Seconds(10)));
  auto b = OpenEngine(dir.Sub("b"), RemoteOptions());
  auto found = b->Lookup(spec_, tokens);
  auto found_recent = b->Lookup(spec_, recent);
  for (int i = 0; i < cluster_->size(); ++i) cluster_->Cli(i, "CONFIG SET maxmemory 0");
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found_recent.ok()) << found_recent.status();
  const EngineStats st = b->Stats();
  // The chain ends at the first evicted chunk; what came before it is served, exact.
  EXPECT_LT(*found, 48u);
  EXPECT_GE(*found_recent, 1u);
  EXPECT_EQ(st.remote_fetched_chunks, *found + *found_recent);
  EXPECT_EQ(st.remote_corrupt_chunks, 0u);
  EXPECT_EQ(st.remote_errors, 0u);
  EXPECT_EQ(CountBadRecords(*b, spec_, tokens, *found), 0);
  EXPECT_EQ(CountBadRecords(*b, spec_, recent, *found_recent), 0);
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

// A selecting session never waits on a stopped cluster past its call deadline: a layer whose
// records the stopped masters hold fails with DeadlineExceeded, naming the record; Finish takes
// back the reads still queued (here 24 layers x 8 records and as many read ahead: six calls'
// worth) rather than wait out a deadline for each call; a session begun while the masters are
// stopped finds nothing there (matched 0). Each within the deadline and a margin.
TEST_F(RemoteTierTest, StoppedClusterFailsASessionsLayerWithinTheTimeout) {
  TempDir dir;
  const std::vector<int32_t> tokens = synth::Tokens(43, 32 * spec_.chunk_tokens);
  auto a = OpenEngine(dir.Sub("a"), RemoteOptions());
  ASSERT_TRUE(ckv::testing::PutSynthetic(*a, spec_, tokens).ok());
  ASSERT_TRUE(engine::WaitUntilRemotePublished(*a, absl::Seconds(10)));
  EngineOptions eo = RemoteOptions();
  eo.remote.call_timeout_ms = 200;
  auto b = OpenEngine(dir.Sub("b"), eo);
  ReprefillOptions o;
  o.selector = Selector::kQuest;
  o.budget_fraction = 0.25;
  auto session = b->BeginReprefill(spec_, tokens, o);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_EQ((*session)->matched_chunks(), 32u);  // the heads, read
  struct Continue {                              // the masters run again whatever the test asserts
    RedisCluster* cluster;
    ~Continue() {
      for (int i = 0; i < cluster->size(); ++i) cluster->Signal(i, SIGCONT);
    }
  } resume{cluster_};
  for (int i = 0; i < cluster_->size(); ++i) cluster_->Signal(i, SIGSTOP);
  ASSERT_TRUE((*session)->SubmitQueries(0, LayerQueries(spec_, o, 0)).ok());
  absl::Time start = absl::Now();
  auto view = (*session)->AwaitLayer(0);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(200 + 300));
  EXPECT_EQ(view.status().code(), absl::StatusCode::kDeadlineExceeded) << view.status();
  EXPECT_NE(view.status().message().find("remote record "), absl::string_view::npos)
      << view.status();
  for (uint32_t l = 1; l < spec_.layers; ++l) {
    ASSERT_TRUE((*session)->SubmitQueries(l, LayerQueries(spec_, o, l)).ok());
  }
  start = absl::Now();
  EXPECT_TRUE((*session)->Finish().ok());
  session->reset();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(200 + 300));
  start = absl::Now();
  auto stopped = b->BeginReprefill(spec_, tokens, o);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(2 * 200 + 300));
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ((*stopped)->matched_chunks(), 0u);
  EXPECT_GE(b->Stats().remote_timeouts, 2u);
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
  // Probe: the local chunks, and none in a cluster it cannot reach, promptly, and no error.
  const absl::Time probe_start = absl::Now();
  auto extent = (*engine)->Probe(spec, synth::Tokens(4, 4 * spec.chunk_tokens));
  EXPECT_LT(absl::Now() - probe_start, absl::Seconds(1));
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->chunks(), 0u);
  extent = (*engine)->Probe(spec, tokens);
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->local_chunks, 4u);
  EXPECT_EQ(extent->remote_chunks, 0u);
  EXPECT_GT((*engine)->Stats().remote_errors, st.remote_errors);
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
