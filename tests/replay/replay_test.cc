// SPDX-License-Identifier: Apache-2.0
// Multi-turn replay tests (docs/reliability.md "Replay tests"): traces of the three
// shapes of tests/replay/trace.h replayed through an Engine with small tiers, every step checked
// by tests/replay/replayer.h. CKV_REPLAY_SCALE=N replays traces N times larger;
// CKV_REPLAY_VERBOSE=1 prints one line per session and per Put.
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "ckv/engine.h"
#include "gtest/gtest.h"
#include "tests/replay/replayer.h"
#include "tests/replay/trace.h"
#include "tests/test_util.h"

namespace ckv::replay {
namespace {

using ::ckv::testing::ChunkDiskBytes;
using ::ckv::testing::TempDir;

uint32_t Scale() {
  const char* s = std::getenv("CKV_REPLAY_SCALE");
  const long v = s != nullptr ? std::strtol(s, nullptr, 10) : 1;
  return v >= 1 ? static_cast<uint32_t>(v) : 1;
}

bool Verbose() {
  const char* s = std::getenv("CKV_REPLAY_VERBOSE");
  return s != nullptr && *s != '\0' && *s != '0';
}

ModelSpec Spec() { return *ModelSpec::Preset("qwen2.5-0.5b"); }  // c = 16, 24 layers

// Tiers far smaller than one session's selected records (a 25% budget of ~70 chunks over 24
// layers is ~400 records), so every session displaces records from the GPU tier into the CPU
// tier and drops some from there.
EngineOptions SmallTiers(const ModelSpec& spec) {
  EngineOptions eo;
  eo.gpu_tier_bytes = 48 * spec.RecordBytes();
  eo.cpu_tier_bytes = 160 * spec.RecordBytes();  // 120 records + the summary share
  return eo;
}

struct ReplayRun {
  Trace trace;
  ReplaySummary summary;
  EngineStats stats;
};

// Replays `trace` into a fresh store opened with `eo`.
ReplayRun Replay(const Trace& trace, const EngineOptions& eo, const ReprefillOptions& ro) {
  ReplayRun run;
  run.trace = trace;
  TempDir dir;
  auto engine = Engine::Open(eo, dir.path());
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return run;
  ReplayConfig config;
  config.spec = Spec();
  config.reprefill = ro;
  config.max_disk_bytes = eo.max_disk_bytes.value_or(0);
  config.verbose = Verbose();
  Replayer replayer(**engine, config);
  const auto start = std::chrono::steady_clock::now();
  replayer.Run(trace);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.summary = replayer.summary();
  run.stats = (*engine)->Stats();
  const ReplaySummary& s = run.summary;
  std::printf(
      "replay %s x%u (%s): %llu turns, %llu records checked (gpu %llu cpu %llu session "
      "%llu), %llu selections, %llu chunks written, %llu deduplicated, %llu evicted, "
      "%llu shorter matches, %.2f s\n",
      std::string(TraceShapeName(trace.shape)).c_str(), Scale(),
      std::string(SelectorName(ro.selector)).c_str(), static_cast<unsigned long long>(s.turns),
      static_cast<unsigned long long>(s.records_checked),
      static_cast<unsigned long long>(s.records_by_tier[0]),
      static_cast<unsigned long long>(s.records_by_tier[1]),
      static_cast<unsigned long long>(s.records_by_tier[2]),
      static_cast<unsigned long long>(s.selections_checked),
      static_cast<unsigned long long>(s.chunks_written),
      static_cast<unsigned long long>(s.chunks_existing),
      static_cast<unsigned long long>(s.chunks_evicted),
      static_cast<unsigned long long>(s.shorter_matches), seconds);
  return run;
}

// First turns whose shared source (system prompt, document) an earlier conversation used.
uint64_t ExpectedCrossConversationMatches(const Trace& trace) {
  uint64_t n = 0;
  std::vector<bool> seen(64, false);
  for (const Turn& t : trace.turns) {
    if (t.turn != 0 || t.shared_tokens < 16) continue;
    if (t.shared_source < seen.size() && seen[t.shared_source]) ++n;
    if (t.shared_source < seen.size()) seen[t.shared_source] = true;
  }
  return n;
}

// The checks every replay without a cap must pass, beyond those of the Replayer.
void ExpectUncappedReplay(const ReplayRun& run) {
  const ReplaySummary& s = run.summary;
  EXPECT_EQ(s.turns, run.trace.turns.size()) << "the replay stopped early";
  EXPECT_EQ(s.chunks_evicted, 0u);
  EXPECT_EQ(s.shorter_matches, 0u);
  // Every turn after a conversation's first one re-prefilled something and checked it.
  EXPECT_GT(s.records_checked, 0u);
  EXPECT_EQ(s.selections_checked,
            (run.trace.turns.size() - (run.trace.conversations - s.cross_conversation_matches)) *
                Spec().layers)
      << "a session that matched chunks served no selection, or one that matched none did";
  // The tiers were used and overflowed: records served from both, the GPU tier filled.
  EXPECT_GT(s.records_by_tier[0], 0u) << "no record served from the GPU tier";
  EXPECT_GT(s.records_by_tier[1], 0u) << "no record served from the CPU tier (no demotion)";
  EXPECT_GE(s.max_gpu_resident_bytes, run.stats.gpu_tier_budget_bytes - Spec().RecordBytes())
      << "the GPU tier never filled, so nothing was displaced";
  // The store deduplicated what turns share: chunks written = distinct chunks stored.
  EXPECT_EQ(run.stats.chunks, s.chunks_written);
  EXPECT_EQ(run.stats.chunks_deduplicated, s.chunks_existing);
  EXPECT_EQ(run.stats.sessions, run.trace.turns.size());
}

TEST(ReplayTest, SharedSystemPromptAcrossConversations) {
  const Trace trace = GenerateTrace(TraceShape::kSharedSystemPrompt, 11, Scale());
  ReprefillOptions ro;
  ro.selector = Selector::kPeriodExact;
  ro.period_layers = 4;
  ro.budget_fraction = 0.25;
  // The period-major layout, banded by the sessions' period: the others run layer-major.
  EngineOptions eo = SmallTiers(Spec());
  eo.layout = RecordLayout::kPeriodMajor;
  eo.period_layers = ro.period_layers;
  const ReplayRun run = Replay(trace, eo, ro);
  ASSERT_FALSE(HasFatalFailure());
  ExpectUncappedReplay(run);
  // Every conversation but the first matched the system prompt's whole chunks on its first turn.
  EXPECT_EQ(run.summary.cross_conversation_matches, trace.conversations - 1);
  const uint64_t prompt_chunks = trace.turns[0].shared_tokens / Spec().chunk_tokens;
  ASSERT_GE(prompt_chunks, 40u);
  // The system prompt was written once: each later conversation found its chunks stored.
  EXPECT_GE(run.summary.chunks_existing, (trace.conversations - 1) * prompt_chunks);
}

TEST(ReplayTest, SharedRagDocumentsAcrossUsers) {
  const Trace trace = GenerateTrace(TraceShape::kSharedDocuments, 12, Scale());
  // The trace reuses documents across users (otherwise this test checks nothing shared).
  const uint64_t cross = ExpectedCrossConversationMatches(trace);
  ASSERT_GE(cross, 3u);
  ReprefillOptions ro;
  ro.selector = Selector::kQuest;
  ro.budget_fraction = 0.2;
  const ReplayRun run = Replay(trace, SmallTiers(Spec()), ro);
  ASSERT_FALSE(HasFatalFailure());
  ExpectUncappedReplay(run);
  EXPECT_EQ(run.summary.cross_conversation_matches, cross);
  EXPECT_GT(run.stats.summary_cache_hits, 0u) << "quest reread every summary from NVMe";
}

TEST(ReplayTest, DeepConversations) {
  const Trace trace = GenerateTrace(TraceShape::kDeepConversations, 13, Scale());
  ASSERT_GE(trace.turns.size() / trace.conversations, 20u);
  ReprefillOptions ro;
  ro.selector = Selector::kMeanKey;
  ro.budget_fraction = 0.15;
  const ReplayRun run = Replay(trace, SmallTiers(Spec()), ro);
  ASSERT_FALSE(HasFatalFailure());
  ExpectUncappedReplay(run);
  EXPECT_EQ(run.summary.cross_conversation_matches, 0u) << "deep conversations share nothing";
  EXPECT_GE(trace.max_prompt_tokens(), 1200u);
}

// A store cap of 1.5 of the largest prompt: two interleaved conversations cannot both stay, so
// Puts evict the other conversation's leaves mid-replay. Its next turn must match shorter (what
// is left), be served bit-exact from that, and store its prompt again.
TEST(ReplayTest, DeepConversationsUnderAStoreCapEvictAndMatchShorter) {
  const Trace trace = GenerateTrace(TraceShape::kDeepConversations, 14, Scale());
  const ModelSpec spec = Spec();
  EngineOptions eo = SmallTiers(spec);
  const uint64_t max_chunks = trace.max_prompt_tokens() / spec.chunk_tokens;
  eo.max_disk_bytes = max_chunks * 3 / 2 * ChunkDiskBytes(spec);
  // The replayer checks each Put's own evictions against the catalog: no background reclaimer.
  eo.reclaim_margin_bytes = 0;
  ReprefillOptions ro;
  ro.selector = Selector::kOracle;
  ro.budget_fraction = 0.2;
  const ReplayRun run = Replay(trace, eo, ro);
  ASSERT_FALSE(HasFatalFailure());
  const ReplaySummary& s = run.summary;
  EXPECT_EQ(s.turns, trace.turns.size()) << "a Put failed or the replay stopped early";
  EXPECT_GT(s.chunks_evicted, 0u) << "the cap never forced an eviction";
  EXPECT_GT(s.shorter_matches, 0u) << "no turn lost part of its prefix to eviction";
  EXPECT_EQ(run.stats.chunks_evicted, s.chunks_evicted);
  EXPECT_LE(run.stats.disk_bytes_used, *eo.max_disk_bytes);
  EXPECT_EQ(run.stats.checksum_failures, 0u);
  EXPECT_GT(s.records_checked, 0u);
}

}  // namespace
}  // namespace ckv::replay
