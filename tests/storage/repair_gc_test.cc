// SPDX-License-Identifier: Apache-2.0
// Tests of Engine::Repair (what `kvctl verify --repair` runs) and Engine::Gc.
#include <fstream>

#include "ckv/engine.h"
#include "io/fault_file_system.h"
#include "storage/chunk_store.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

using ::ckv::testing::CountBadRecords;
using ::ckv::testing::PutSynthetic;
using ::ckv::testing::SegmentBlocksBytes;
using ::ckv::testing::TempDir;

ModelSpec Spec() { return *ModelSpec::Preset("qwen2.5-0.5b"); }

std::unique_ptr<Engine> Open(const std::string& dir, EngineOptions options = {},
                             io::FileSystem* fs = nullptr) {
  auto engine = engine::OpenWithSeams(options, dir, {.file_system = fs});
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Flips a byte of record `layer` of `key` in place (the engine must be closed).
void Corrupt(const std::string& dir, const ChunkKey& key, uint32_t layer) {
  auto store = storage::ChunkStore::Open(storage::StoreOptions{}, dir);
  ASSERT_TRUE(store.ok());
  auto where = (*store)->LocateRecord(key, layer);
  ASSERT_TRUE(where.ok());
  std::fstream f(where->segment_path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(where->offset + 100));
  const char c = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(where->offset + 100));
  f.put(static_cast<char>(c ^ 0x01));
}

TEST(RepairTest, RemovesACorruptChunkAndWhatFollowsItAndKeepsTheRest) {
  const ModelSpec spec = Spec();
  const uint32_t c = spec.chunk_tokens;
  TempDir dir;
  const auto a = synth::Tokens(1, 10 * c);
  // b shares a's first 3 chunks, then diverges: it must survive a's repair whole.
  const auto b = synth::TokensWithSharedPrefix(1, 3 * c, 2, 8 * c);
  {
    auto engine = Open(dir.path());
    ASSERT_TRUE(PutSynthetic(*engine, spec, a).ok());
    ASSERT_TRUE(PutSynthetic(*engine, spec, b).ok());
  }
  const auto keys = ChainChunkKeys(spec.Fingerprint(), c, a);
  Corrupt(dir.path(), keys[5], 7);
  auto engine = Open(dir.path());
  auto report = engine->Repair();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->verify.checksum_failures, 1u);
  EXPECT_EQ(report->chunks_removed, 5u) << "chunk 5 and the 4 after it";
  EXPECT_TRUE(report->remaining.empty());
  EXPECT_EQ(*engine->Lookup(spec, a), 5u);
  EXPECT_EQ(CountBadRecords(*engine, spec, a, 5), 0);
  EXPECT_EQ(*engine->Lookup(spec, b), 8u);
  EXPECT_EQ(CountBadRecords(*engine, spec, b, 8), 0);
  // a's prefix now ends at its last good chunk.
  bool found = false;
  for (const PrefixInfo& p : engine->ListPrefixes()) found |= p.id == keys[4];
  EXPECT_TRUE(found);
  auto verify = engine->Verify();
  ASSERT_TRUE(verify.ok());
  EXPECT_TRUE(verify->ok()) << verify->problems.front();
  // And it stays so across a reopen.
  engine.reset();
  engine = Open(dir.path());
  EXPECT_EQ(*engine->Lookup(spec, a), 5u);
  EXPECT_TRUE(engine->Verify()->ok());
}

TEST(RepairTest, ACleanStoreIsLeftAlone) {
  TempDir dir;
  auto engine = Open(dir.path());
  const auto tokens = synth::Tokens(3, 4 * Spec().chunk_tokens);
  ASSERT_TRUE(PutSynthetic(*engine, Spec(), tokens).ok());
  auto report = engine->Repair();
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->chunks_removed, 0u);
  EXPECT_TRUE(report->removed.empty());
  EXPECT_EQ(*engine->Lookup(Spec(), tokens), 4u);
}

TEST(GcTest, DeletesSegmentsThatHoldNothingAndTheStoreGoesOn) {
  TempDir dir;
  EngineOptions o;
  o.segment_bytes = 8ull << 20;  // a few chunks per segment: several segments
  auto engine = Open(dir.path(), o);
  const auto a = synth::Tokens(4, 64 * Spec().chunk_tokens);
  ASSERT_TRUE(PutSynthetic(*engine, Spec(), a).ok());
  const uint64_t segments = engine->Stats().segments;
  ASSERT_GT(segments, 1u);
  ASSERT_TRUE(engine->Delete(Spec(), a).ok());
  auto gc = engine->Gc();
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->segments_removed, segments);
  EXPECT_EQ(engine->Stats().segments, 0u);
  EXPECT_EQ(SegmentBlocksBytes(dir.path()), 0u);
  const auto b = synth::Tokens(5, 8 * Spec().chunk_tokens);
  ASSERT_TRUE(PutSynthetic(*engine, Spec(), b).ok());
  engine.reset();
  engine = Open(dir.path(), o);
  EXPECT_EQ(CountBadRecords(*engine, Spec(), b, 8), 0);
  EXPECT_TRUE(engine->Verify()->ok());
}

TEST(GcTest, ReclaimsBlocksAFailedPunchLeftBehind) {
  TempDir dir;
  io::FaultInjectingFileSystem fs(io::PosixFileSystem(IoBackend::kThreads));
  auto engine = Open(dir.path(), {}, &fs);
  const auto keep = synth::Tokens(6, 4 * Spec().chunk_tokens);
  const auto drop = synth::Tokens(7, 8 * Spec().chunk_tokens);
  ASSERT_TRUE(PutSynthetic(*engine, Spec(), keep).ok());
  ASSERT_TRUE(PutSynthetic(*engine, Spec(), drop).ok());
  const uint64_t full = SegmentBlocksBytes(dir.path());
  io::FaultRule rule;
  rule.punch_hole_fail = 1;
  fs.AddRule(rule);
  ASSERT_TRUE(engine->Delete(Spec(), drop).ok());  // the slots are free; their blocks are not
  fs.ClearRules();
  EXPECT_EQ(SegmentBlocksBytes(dir.path()), full);
  auto gc = engine->Gc();
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_GT(gc->bytes_reclaimed, 0u);
  EXPECT_LT(SegmentBlocksBytes(dir.path()), full);
  EXPECT_EQ(gc->segments_removed, 0u);
  EXPECT_EQ(CountBadRecords(*engine, Spec(), keep, 4), 0);
}

}  // namespace
}  // namespace ckv
