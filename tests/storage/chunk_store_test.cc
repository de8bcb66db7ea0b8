// SPDX-License-Identifier: Apache-2.0
// Tests of the ContiguousChunk store through the public Engine API (and ChunkStore where a test
// needs to know where bytes live).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "ckv/engine.h"
#include "engine/internal.h"
#include "rocksdb/db.h"
#include "storage/catalog.h"
#include "storage/catalog_format.h"
#include "storage/chunk_store.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

using ::ckv::testing::ChunkDiskBytes;
using ::ckv::testing::CountBadRecords;
using ::ckv::testing::PutSynthetic;
using ::ckv::testing::RecordsPerChunk;
using ::ckv::testing::SegmentBlocksBytes;
using ::ckv::testing::TempDir;

std::unique_ptr<Engine> OpenOrDie(const std::string& path, EngineOptions options = {}) {
  auto engine = Engine::Open(options, path);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Blocks an ext4 extent tree may add to segment files holding `data` bytes: see DataCapLocked.
uint64_t FsMetadataSlack(uint64_t data) { return 64 * 1024 + data / 256; }

uint64_t ChunkBytes(const ModelSpec& spec) { return ChunkDiskBytes(spec); }

struct RoundTripCase {
  std::string preset;
  DType dtype;
  RecordLayout layout;
};

class RoundTripTest : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(RoundTripTest, EveryRecordComesBackBitExactAfterReopen) {
  const RoundTripCase& p = GetParam();
  auto spec = ModelSpec::Preset(p.preset, p.dtype);
  ASSERT_TRUE(spec.ok()) << spec.status();
  TempDir dir;
  EngineOptions options;
  options.layout = p.layout;
  // 3 whole chunks and a 5-token tail.
  const auto tokens = synth::Tokens(7, 3 * spec->chunk_tokens + 5);
  {
    auto engine = OpenOrDie(dir.path(), options);
    ASSERT_NE(engine, nullptr);
    auto put = PutSynthetic(*engine, *spec, tokens);
    ASSERT_TRUE(put.ok()) << put.status();
    EXPECT_EQ(put->chunks, 3u);
    EXPECT_EQ(put->chunks_written, 3u);
    EXPECT_EQ(put->tail_tokens, 5u);
    EXPECT_EQ(put->bytes_written, 3 * ChunkBytes(*spec));
    EXPECT_EQ(CountBadRecords(*engine, *spec, tokens, 3), 0);
  }
  auto engine = OpenOrDie(dir.path());
  ASSERT_NE(engine, nullptr);
  auto matched = engine->Lookup(*spec, tokens);
  ASSERT_TRUE(matched.ok());
  EXPECT_EQ(*matched, 3u);
  EXPECT_EQ(CountBadRecords(*engine, *spec, tokens, 3), 0);
  auto report = engine->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
  EXPECT_EQ(report->records_checked, 3u * RecordsPerChunk(*spec));
}

std::vector<RoundTripCase> AllRoundTripCases() {
  std::vector<RoundTripCase> cases;
  for (const std::string& preset : ModelSpec::PresetNames()) {
    for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
      for (RecordLayout layout : {RecordLayout::kLayerMajor, RecordLayout::kPeriodMajor}) {
        cases.push_back({preset, dtype, layout});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(PresetsDtypesLayouts, RoundTripTest,
                         ::testing::ValuesIn(AllRoundTripCases()),
                         [](const ::testing::TestParamInfo<RoundTripCase>& info) {
                           std::string name =
                               info.param.preset + "_" + std::string(DTypeName(info.param.dtype)) +
                               (info.param.layout == RecordLayout::kLayerMajor ? "_layer"
                                                                               : "_period");
                           for (char& ch : name) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

TEST(ChunkStoreTest, SharedLeadingChunksAreWrittenOnce) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  auto engine = OpenOrDie(dir.path());
  const size_t c = spec.chunk_tokens;
  const auto a = synth::TokensWithSharedPrefix(1, 12 * c, 2, 16 * c);
  const auto b = synth::TokensWithSharedPrefix(1, 12 * c, 3, 16 * c);  // 75% shared with a
  auto put_a = PutSynthetic(*engine, spec, a);
  ASSERT_TRUE(put_a.ok()) << put_a.status();
  EXPECT_EQ(put_a->bytes_written, 16 * ChunkBytes(spec));
  const uint64_t before = engine->Stats().bytes_written;
  auto put_b = PutSynthetic(*engine, spec, b);
  ASSERT_TRUE(put_b.ok()) << put_b.status();
  EXPECT_EQ(put_b->chunks_existing, 12u);
  EXPECT_EQ(put_b->chunks_written, 4u);
  EXPECT_EQ(put_b->bytes_written, 4 * ChunkBytes(spec));
  EXPECT_EQ(engine->Stats().bytes_written - before, 4 * ChunkBytes(spec));
  EXPECT_EQ(engine->Stats().chunks, 20u);
  EXPECT_EQ(engine->Stats().disk_bytes_used, 20 * ChunkBytes(spec));
  EXPECT_GE(SegmentBlocksBytes(dir.path()), 20 * ChunkBytes(spec));
  EXPECT_LE(SegmentBlocksBytes(dir.path()),
            20 * ChunkBytes(spec) + FsMetadataSlack(20 * ChunkBytes(spec)));
  // A Put of a stored prefix writes nothing.
  auto again = PutSynthetic(*engine, spec, a);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->bytes_written, 0u);
  EXPECT_EQ(CountBadRecords(*engine, spec, a, 16), 0);
  EXPECT_EQ(CountBadRecords(*engine, spec, b, 16), 0);
}

TEST(ChunkStoreTest, ConcurrentPutsOfOnePrefixWriteItOnce) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  auto engine = OpenOrDie(dir.path());
  const auto tokens = synth::Tokens(5, 32 * spec.chunk_tokens);
  synth::SyntheticKv kv(spec, tokens);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      if (!engine->Put(spec, tokens, kv.tensors()).ok()) failures++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(engine->Stats().chunks_written, 32u);
  EXPECT_EQ(engine->Stats().bytes_written, 32 * ChunkBytes(spec));
  EXPECT_EQ(CountBadRecords(*engine, spec, tokens, 32), 0);
}

TEST(ChunkStoreTest, FlippedByteFailsExactlyThatRecordWithDataLoss) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  const auto tokens = synth::Tokens(11, 4 * spec.chunk_tokens);
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  const uint32_t bad_chunk = 2, bad_layer = 5;
  {
    storage::StoreOptions options;
    auto store = storage::ChunkStore::Open(options, dir.path());
    ASSERT_TRUE(store.ok()) << store.status();
    synth::SyntheticKv kv(spec, tokens);
    ASSERT_TRUE((*store)->Put(spec, tokens, kv.tensors()).ok());
    auto loc = (*store)->LocateRecord(keys[bad_chunk], bad_layer);
    ASSERT_TRUE(loc.ok()) << loc.status();
    // Flip one byte in the middle of the record, through the page cache.
    std::fstream f(loc->segment_path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    const uint64_t at = loc->offset + loc->length / 2;
    f.seekg(at);
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x40;
    f.seekp(at);
    f.write(&byte, 1);
    f.close();
  }
  auto engine = OpenOrDie(dir.path());
  std::vector<std::byte> out(spec.RecordBytes()), want(spec.RecordBytes());
  for (uint32_t i = 0; i < keys.size(); ++i) {
    for (uint32_t l = 0; l < spec.layers; ++l) {
      std::fill(out.begin(), out.end(), std::byte{0x5a});
      absl::Status s = engine->ReadRecord(spec, keys[i], l, out);
      if (i == bad_chunk && l == bad_layer) {
        EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
        EXPECT_NE(s.message().find("checksum"), absl::string_view::npos) << s;
        // Nothing of the corrupt record reached the caller.
        EXPECT_TRUE(
            std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0x5a}; }));
      } else {
        ASSERT_TRUE(s.ok()) << "chunk " << i << " layer " << l << ": " << s;
        synth::FillRecord(spec, keys[i], l, want);
        EXPECT_EQ(out, want);
      }
    }
  }
  EXPECT_EQ(engine->Stats().checksum_failures, 1u);
  auto report = engine->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->checksum_failures, 1u);
  ASSERT_EQ(report->problems.size(), 1u);
  const VerifyProblem& p = report->problems[0];
  EXPECT_EQ(p.kind, VerifyProblem::Kind::kChecksum) << p;
  EXPECT_EQ(p.chunk, keys[bad_chunk]) << p;
  EXPECT_EQ(p.layer, 5u) << p;
  EXPECT_NE(p.message.find(keys[bad_chunk].ToHex().substr(0, 16) + "/L5"), std::string::npos) << p;
}

// Pins read the chunks' checksums from the catalog after the store's lock is released: a chunk
// deleted in that window, or deleted and stored again elsewhere, was removed, not damaged.
TEST(ChunkStoreTest, AChunkRemovedWhileBeingPinnedIsNotFoundNeverDataLoss) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  auto engine = OpenOrDie(dir.path());
  storage::ChunkStore& store = engine::HostOf(*engine).store();
  const auto tokens = synth::Tokens(41, 6 * spec.chunk_tokens);
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  const auto head = synth::Tokens(41, 3 * spec.chunk_tokens);  // its first 3 chunks
  ASSERT_TRUE(PutSynthetic(*engine, spec, tokens).ok());
  ASSERT_TRUE(PutSynthetic(*engine, spec, head).ok());  // a prefix ends at chunk 3 too
  for (const bool put_again : {false, true}) {
    SCOPED_TRACE(put_again ? "deleted and stored again" : "deleted");
    bool fired = false;
    store.SetPinWindowHookForTesting([&] {
      if (fired) return;
      fired = true;
      // Chunks 4-6 go (the shorter prefix keeps 1-3); their slots stay pinned, so a Put of them
      // again takes other slots.
      EXPECT_TRUE(engine->Delete(spec, tokens).ok());
      if (put_again) {
        EXPECT_TRUE(PutSynthetic(*engine, spec, tokens).ok());
      }
    });
    auto all = store.Pin(spec, keys);
    EXPECT_TRUE(absl::IsNotFound(all.status())) << all.status();
    EXPECT_NE(all.status().message().find("removed while being pinned"), std::string_view::npos)
        << all.status();
    if (!put_again) {
      ASSERT_TRUE(PutSynthetic(*engine, spec, tokens).ok());
    }
    fired = false;
    auto leading = store.PinLeading(spec, keys);  // ends where the removed chunks begin
    ASSERT_TRUE(leading.ok()) << leading.status();
    EXPECT_EQ((*leading)->chunks().size(), 3u);
    for (const auto& c : (*leading)->chunks()) EXPECT_EQ(c.checksums.size(), c.segment->records());
    leading->reset();
    store.SetPinWindowHookForTesting(nullptr);
    if (!put_again) {
      ASSERT_TRUE(PutSynthetic(*engine, spec, tokens).ok());
    }
  }
  EXPECT_EQ(CountBadRecords(*engine, spec, tokens, 6), 0);
  auto report = engine->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

TEST(ChunkStoreTest, AStaleCatalogEntryNamingAReusedSlotIsDataLossNeverTheOtherChunksBytes) {
  // Chunk a's catalog entry is rewritten by hand to name the slot chunk b holds, and b's entry is
  // removed: the state a slot reused under a stale entry would leave. The slot's bytes are b's,
  // checked against a's checksums, so reading a is DataLoss.
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  const auto a_tokens = synth::Tokens(21, spec.chunk_tokens);
  const auto b_tokens = synth::Tokens(22, spec.chunk_tokens);
  const ChunkKey a = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, a_tokens)[0];
  const ChunkKey b = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, b_tokens)[0];
  {
    auto engine = OpenOrDie(dir.path());
    ASSERT_TRUE(PutSynthetic(*engine, spec, a_tokens).ok());
    ASSERT_TRUE(PutSynthetic(*engine, spec, b_tokens).ok());
  }
  {
    storage::Catalog::Contents contents;
    auto catalog = storage::Catalog::Open(dir.path() + "/catalog", false, false, &contents);
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    auto ra = (*catalog)->GetChunk(a);
    auto rb = (*catalog)->GetChunk(b);
    ASSERT_TRUE(ra.ok() && rb.ok());
    ASSERT_FALSE(ra->segment == rb->segment && ra->slot == rb->slot);
    ra->segment = rb->segment;
    ra->slot = rb->slot;
    storage::Catalog::Batch batch = (*catalog)->NewBatch();
    batch.PutChunk(a, *ra);
    batch.DeleteChunk(b);
    batch.DeletePrefix(b);
    CKV_ASSERT_OK((*catalog)->Commit(batch));
  }
  auto engine = OpenOrDie(dir.path());
  std::vector<std::byte> out(spec.RecordBytes(), std::byte{0x5a});
  for (uint32_t l = 0; l < spec.layers; ++l) {
    const absl::Status s = engine->ReadRecord(spec, a, l, out);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "layer " << l << ": " << s;
  }
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](std::byte x) { return x == std::byte{0x5a}; }))
      << "no byte of b's record reached the caller";
  EXPECT_EQ(engine->ReadRecord(spec, b, 0, out).code(), absl::StatusCode::kNotFound);
  // Verify, which reads through the batched read path, fails every record of a: its layers' and
  // its summaries'.
  auto report = engine->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->checksum_failures, RecordsPerChunk(spec));
}

// Verify's problems carry their kind, chunk and layer as fields: a chunk whose parent's entry is
// gone is damaged (it is not served), a flipped byte is a checksum failure of its record's layer.
TEST(ChunkStoreTest, VerifyNamesTheKindChunkAndLayerOfEachProblem) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  const auto tokens = synth::Tokens(31, 3 * spec.chunk_tokens);
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  {
    auto engine = OpenOrDie(dir.path());
    ASSERT_TRUE(PutSynthetic(*engine, spec, tokens).ok());
  }
  {
    storage::Catalog::Contents contents;
    auto catalog = storage::Catalog::Open(dir.path() + "/catalog", false, false, &contents);
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    storage::Catalog::Batch batch = (*catalog)->NewBatch();
    batch.DeleteChunk(keys[1]);
    CKV_ASSERT_OK((*catalog)->Commit(batch));
  }
  auto engine = OpenOrDie(dir.path());
  auto report = engine->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->checksum_failures, 0u);
  bool damaged = false;
  for (const VerifyProblem& p : report->problems) {
    EXPECT_NE(p.kind, VerifyProblem::Kind::kChecksum) << p;
    EXPECT_EQ(p.layer, VerifyProblem::kNoLayer) << p;
    if (p.kind == VerifyProblem::Kind::kDamaged && p.chunk == keys[2]) {
      damaged = true;
      EXPECT_NE(p.message.find("has no stored parent"), std::string::npos) << p;
      EXPECT_STREQ(VerifyProblemKindName(p.kind), "damaged");
    }
  }
  EXPECT_TRUE(damaged) << "no problem names chunk 2 as damaged; " << report->problems.size()
                       << " problems";
}

TEST(ChunkStoreTest, CapHoldsUnderAStreamOfPutsFiveTimesLarger) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  const uint64_t chunk = ChunkBytes(spec);
  EngineOptions options;
  options.max_disk_bytes = 40 * chunk;
  auto engine = OpenOrDie(dir.path(), options);
  uint64_t put_bytes = 0;
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; put_bytes < 5 * *options.max_disk_bytes; ++i) {
    // Prefixes of 3..10 chunks, some sharing a system prompt of 2 chunks.
    const size_t chunks = 3 + (i * 7) % 8;
    auto tokens = (i % 3 == 0) ? synth::TokensWithSharedPrefix(99, 2 * spec.chunk_tokens, 1000 + i,
                                                               chunks * spec.chunk_tokens)
                               : synth::Tokens(1000 + i, chunks * spec.chunk_tokens);
    auto put = PutSynthetic(*engine, spec, tokens);
    ASSERT_TRUE(put.ok()) << "put " << i << ": " << put.status();
    put_bytes += put->bytes_written;
    const EngineStats stats = engine->Stats();
    ASSERT_LE(stats.disk_bytes_used, *options.max_disk_bytes) << "after put " << i;
    ASSERT_LE(SegmentBlocksBytes(dir.path()), *options.max_disk_bytes) << "after put " << i;
    // The newest prefix is whole: eviction takes the least recently used first.
    ASSERT_EQ(*engine->Lookup(spec, tokens), chunks);
    prefixes.push_back(std::move(tokens));
  }
  ::ckv::testing::WaitForReclaim(*engine);
  const EngineStats stats = engine->Stats();
  EXPECT_GT(stats.chunks_evicted, 0u);
  EXPECT_EQ(stats.disk_bytes_used, stats.chunks * chunk + stats.free_kept_bytes);
  // What is still listed is whole and bit-exact.
  for (const PrefixInfo& p : engine->ListPrefixes()) {
    ModelSpec got_spec;
    auto keys = engine->PrefixChunks(p.id, &got_spec);
    ASSERT_TRUE(keys.ok());
    EXPECT_EQ(keys->size(), p.chunks);
  }
  auto report = engine->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
  // A prefix larger than the whole cap is refused, and the store is left as it was.
  const auto huge = synth::Tokens(5, 41 * spec.chunk_tokens);
  const uint64_t chunks_before = engine->Stats().chunks;
  auto put = PutSynthetic(*engine, spec, huge);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kResourceExhausted) << put.status();
  EXPECT_EQ(engine->Stats().chunks, chunks_before);
  EXPECT_EQ(*engine->Lookup(spec, huge), 0u);
}

// Options whose cap leaves room for 6.5 chunks of `spec`'s data once the metadata allowance of
// one segment is set aside.
EngineOptions RoomForSixAndAHalfChunks(const ModelSpec& spec) {
  EngineOptions options;
  options.max_disk_bytes = (13 * ChunkBytes(spec) / 2) * 257 / 256 + 2 * 4096 + 257;
  return options;
}

// Regression: evicting two levels of a chain (D, then C of A<-B<-C<-D) lost the prefix end
// instead of moving it to B, leaving chunks that no listed prefix reached.
TEST(ChunkStoreTest, EvictingSeveralLevelsOfAChainMovesItsEndToTheSurvivor) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  auto engine = OpenOrDie(dir.path(), RoomForSixAndAHalfChunks(spec));
  const auto p = synth::Tokens(1, 4 * spec.chunk_tokens);
  const auto q = synth::Tokens(2, 4 * spec.chunk_tokens);
  ASSERT_TRUE(PutSynthetic(*engine, spec, p).ok());
  auto put_q = PutSynthetic(*engine, spec, q);
  ASSERT_TRUE(put_q.ok()) << put_q.status();
  EXPECT_EQ(put_q->chunks_evicted, 2u);
  EXPECT_EQ(*engine->Lookup(spec, p), 2u);
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, p);
  bool found = false;
  for (const PrefixInfo& info : engine->ListPrefixes()) {
    if (info.id == keys[1]) {
      found = true;
      EXPECT_EQ(info.chunks, 2u);
    }
  }
  EXPECT_TRUE(found) << "the trimmed prefix is not listed";
  // It can be deleted like any prefix, which frees its chunks.
  CKV_EXPECT_OK(engine->DeletePrefix(keys[1]));
  EXPECT_EQ(engine->Stats().chunks, 4u);
}

// The index keeps 32-bit use stamps and moves their base on as the use clock runs: recency must
// still order eviction after the base moved past every stamp the store held.
TEST(ChunkStoreTest, RecencyOrdersEvictionAcrossARebaseOfTheUseClock) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  auto engine = OpenOrDie(dir.path(), RoomForSixAndAHalfChunks(spec));
  const auto p = synth::Tokens(1, 3 * spec.chunk_tokens);
  const auto q = synth::Tokens(2, 3 * spec.chunk_tokens);
  const auto r = synth::Tokens(3, 3 * spec.chunk_tokens);
  ASSERT_TRUE(PutSynthetic(*engine, spec, q).ok());
  ASSERT_TRUE(PutSynthetic(*engine, spec, p).ok());
  // Past two rebases: every stamp so far is older than the base. Then p is used, q is not.
  engine::HostOf(*engine).store().SkipUseTicksForTesting((uint64_t{1} << 32) + (uint64_t{1} << 31));
  EXPECT_EQ(*engine->Lookup(spec, q), 3u);
  engine::HostOf(*engine).store().SkipUseTicksForTesting((uint64_t{1} << 32) - 7);
  EXPECT_EQ(*engine->Lookup(spec, p), 3u);
  auto put = PutSynthetic(*engine, spec, r);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->chunks_evicted, 3u);
  EXPECT_EQ(*engine->Lookup(spec, p), 3u);  // used last
  EXPECT_EQ(*engine->Lookup(spec, q), 0u);  // used 2^32 uses before p
  auto report = engine->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

// Lookup marks what it finds used; Probe, which a scheduler calls for requests it may never
// admit, leaves recency (and so the eviction order) as it was.
TEST(ChunkStoreTest, ProbeLeavesTheEvictionOrderAsItWasLookupDoesNot) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  for (bool probe : {true, false}) {
    SCOPED_TRACE(probe ? "probe" : "lookup");
    TempDir dir;
    auto engine = OpenOrDie(dir.path(), RoomForSixAndAHalfChunks(spec));
    const auto p = synth::Tokens(1, 3 * spec.chunk_tokens);
    const auto q = synth::Tokens(2, 3 * spec.chunk_tokens);
    const auto r = synth::Tokens(3, 3 * spec.chunk_tokens);
    ASSERT_TRUE(PutSynthetic(*engine, spec, p).ok());
    ASSERT_TRUE(PutSynthetic(*engine, spec, q).ok());
    if (probe) {
      auto extent = engine->Probe(spec, p);
      ASSERT_TRUE(extent.ok()) << extent.status();
      EXPECT_EQ(extent->local_chunks, 3u);
    } else {
      EXPECT_EQ(*engine->Lookup(spec, p), 3u);
    }
    auto put = PutSynthetic(*engine, spec, r);
    ASSERT_TRUE(put.ok()) << put.status();
    EXPECT_EQ(put->chunks_evicted, 3u);
    // Probed, p is still the least recently used and goes; looked up, q goes instead.
    EXPECT_EQ(engine->Probe(spec, p)->local_chunks, probe ? 0u : 3u);
    EXPECT_EQ(engine->Probe(spec, q)->local_chunks, probe ? 3u : 0u);
  }
}

TEST(ChunkStoreTest, CapHoldsWhenPutsCreateManySmallSegments) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  const uint64_t chunk = ChunkBytes(spec);
  EngineOptions options;
  options.segment_bytes = chunk;  // one chunk per segment: a Put makes several segments
  options.max_disk_bytes = 12 * chunk;
  auto engine = OpenOrDie(dir.path(), options);
  for (int i = 0; i < 15; ++i) {
    auto put = PutSynthetic(*engine, spec, synth::Tokens(500 + i, 8 * spec.chunk_tokens));
    ASSERT_TRUE(put.ok()) << "put " << i << ": " << put.status();
    const EngineStats stats = engine->Stats();
    // The data stays within the bound docs/format.md states (the metadata allowance of every
    // segment set aside)...
    ASSERT_LE(stats.disk_bytes_used,
              (*options.max_disk_bytes - (stats.segments + 1) * 4096) / 257 * 256)
        << "after put " << i << " with " << stats.segments << " segments";
    // ...and so do the blocks the files really occupy.
    ASSERT_LE(SegmentBlocksBytes(dir.path()), *options.max_disk_bytes) << "after put " << i;
  }
  EXPECT_GT(engine->Stats().segments, 2u);
}

TEST(ChunkStoreTest, LoweringTheCapOnOpenEvictsDownToIt) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  const uint64_t chunk = ChunkBytes(spec);
  {
    auto engine = OpenOrDie(dir.path());
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(PutSynthetic(*engine, spec, synth::Tokens(i, 4 * spec.chunk_tokens)).ok());
    }
  }
  EngineOptions options;
  options.max_disk_bytes = 10 * chunk;
  auto engine = OpenOrDie(dir.path(), options);
  EXPECT_LE(engine->Stats().disk_bytes_used, 10 * chunk);
  EXPECT_LE(SegmentBlocksBytes(dir.path()), 10 * chunk);
  engine.reset();
  // The cap persists.
  engine = OpenOrDie(dir.path());
  EXPECT_EQ(engine->Stats().max_disk_bytes, 10 * chunk);
}

TEST(ChunkStoreTest, DeleteFreesOnlyWhatNoOtherPrefixUses) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  auto engine = OpenOrDie(dir.path());
  const size_t c = spec.chunk_tokens;
  const auto a = synth::TokensWithSharedPrefix(1, 4 * c, 2, 6 * c);
  const auto b = synth::TokensWithSharedPrefix(1, 4 * c, 3, 8 * c);
  ASSERT_TRUE(PutSynthetic(*engine, spec, a).ok());
  ASSERT_TRUE(PutSynthetic(*engine, spec, b).ok());
  EXPECT_EQ(engine->Stats().chunks, 10u);
  CKV_EXPECT_OK(engine->Delete(spec, b));
  EXPECT_EQ(engine->Stats().chunks, 6u);
  EXPECT_EQ(*engine->Lookup(spec, b), 4u);
  EXPECT_EQ(*engine->Lookup(spec, a), 6u);
  EXPECT_GE(SegmentBlocksBytes(dir.path()), 6 * ChunkBytes(spec));
  EXPECT_LE(SegmentBlocksBytes(dir.path()),
            6 * ChunkBytes(spec) + FsMetadataSlack(6 * ChunkBytes(spec)));
  EXPECT_EQ(engine->Delete(spec, b).code(), absl::StatusCode::kNotFound);
  CKV_EXPECT_OK(engine->Delete(spec, a));
  EXPECT_EQ(engine->Stats().chunks, 0u);
  EXPECT_EQ(engine->Stats().disk_bytes_used, 0u);
  EXPECT_TRUE(engine->ListPrefixes().empty());
}

// --- Bad input: a clear error, and the store as it was. ---

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = *ModelSpec::Preset("qwen2.5-0.5b");
    tokens_ = synth::Tokens(3, 4 * spec_.chunk_tokens);
    engine_ = OpenOrDie(dir_.path());
    ASSERT_NE(engine_, nullptr);
    ASSERT_TRUE(PutSynthetic(*engine_, spec_, tokens_).ok());
  }
  void ExpectIntact() {
    EXPECT_EQ(engine_->Stats().chunks, 4u);
    EXPECT_EQ(engine_->ListPrefixes().size(), 1u);
    EXPECT_EQ(CountBadRecords(*engine_, spec_, tokens_, 4), 0);
    auto report = engine_->Verify();
    ASSERT_TRUE(report.ok());
    EXPECT_TRUE(report->ok());
  }
  TempDir dir_;
  ModelSpec spec_;
  std::vector<int32_t> tokens_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(BadInputTest, WrongShapesAreInvalidArgument) {
  const auto other = synth::Tokens(4, 2 * spec_.chunk_tokens);
  synth::SyntheticKv kv(spec_, other);
  KvTensors t = kv.tensors();
  t.k.pop_back();  // a layer short
  auto put = engine_->Put(spec_, other, t);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(put.status().message().find("24 layers"), absl::string_view::npos) << put.status();

  t = kv.tensors();
  t.v[3] = t.v[3].subspan(0, t.v[3].size() - 2);  // one element short
  put = engine_->Put(spec_, other, t);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(put.status().message().find("V tensor of layer 3"), absl::string_view::npos)
      << put.status();

  t = kv.tensors();
  t.tokens = other.size() + 1;
  EXPECT_EQ(engine_->Put(spec_, other, t).status().code(), absl::StatusCode::kInvalidArgument);

  ModelSpec bad = spec_;
  bad.kv_heads = 0;
  EXPECT_EQ(engine_->Put(bad, other, kv.tensors()).status().code(),
            absl::StatusCode::kInvalidArgument);
  ExpectIntact();
}

TEST_F(BadInputTest, AForeignSpecIsNeverServed) {
  ModelSpec foreign = spec_;
  foreign.model_id = "another-finetune";  // same shape, other weights
  EXPECT_EQ(*engine_->Lookup(foreign, tokens_), 0u);
  const auto keys = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, tokens_);
  std::vector<std::byte> out(foreign.RecordBytes());
  absl::Status s = engine_->ReadRecord(foreign, keys[0], 0, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("qwen2.5-0.5b"), absl::string_view::npos) << s;
  ModelSpec fp32 = spec_;
  fp32.dtype = DType::kFp32;
  std::vector<std::byte> out32(fp32.RecordBytes());
  EXPECT_EQ(engine_->ReadRecord(fp32, keys[0], 0, out32).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine_->ReadRecord(spec_, keys[0], spec_.layers, out).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<std::byte> small(spec_.RecordBytes() - 1);
  EXPECT_EQ(engine_->ReadRecord(spec_, keys[0], 0, small).code(),
            absl::StatusCode::kInvalidArgument);
  ExpectIntact();
}

TEST_F(BadInputTest, TokenCountsThatAreNotWholeChunks) {
  // Fewer tokens than one chunk: nothing to store.
  const auto short_tokens = synth::Tokens(9, spec_.chunk_tokens - 1);
  synth::SyntheticKv kv(spec_, short_tokens);
  auto put = engine_->Put(spec_, short_tokens, kv.tensors());
  EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument);
  // A prefix to delete is a whole number of chunks.
  std::vector<int32_t> partial(tokens_.begin(), tokens_.end() - 3);
  absl::Status s = engine_->Delete(spec_, partial);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("whole number of chunks"), absl::string_view::npos) << s;
  ExpectIntact();
}

TEST(OpenTest, MissingDirectoryIsNotFound) {
  TempDir dir;
  auto engine = Engine::Open(EngineOptions{}, dir.Sub("no/such/parent/store"));
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kNotFound) << engine.status();
  EXPECT_NE(engine.status().message().find("does not exist"), absl::string_view::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("no")));
  EngineOptions no_create;
  no_create.create_if_missing = false;
  engine = Engine::Open(no_create, dir.Sub("store"));
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kNotFound) << engine.status();
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("store")));
}

TEST(OpenTest, UnwritableDirectoryIsPermissionDenied) {
  TempDir dir;
  std::string path;
  if (geteuid() == 0) {
    // root ignores mode bits; sysfs refuses new directories even to root.
    if (!std::filesystem::exists("/sys/kernel")) GTEST_SKIP() << "no /sys to test against";
    path = "/sys/kernel/ckv-test-store";
  } else {
    std::filesystem::create_directory(dir.Sub("ro"));
    ::chmod(dir.Sub("ro").c_str(), 0500);
    path = dir.Sub("ro/store");
  }
  auto engine = Engine::Open(EngineOptions{}, path);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kPermissionDenied) << engine.status();
  EXPECT_NE(engine.status().message().find(path), absl::string_view::npos) << engine.status();
}

// Opens the catalog of the closed store in `store` with RocksDB itself and lets `edit` change it
// (handles in the order default, chunks, prefixes, segments, statistics, meta).
void EditCatalog(
    const TempDir& store,
    const std::function<void(rocksdb::DB*, const std::vector<rocksdb::ColumnFamilyHandle*>&)>&
        edit) {
  rocksdb::DBOptions db_options;
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
  for (const char* name : {"default", storage::kCfChunks, storage::kCfPrefixes,
                           storage::kCfSegments, storage::kCfStatistics, storage::kCfMeta}) {
    cfs.emplace_back(name, rocksdb::ColumnFamilyOptions());
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(db_options, store.Sub("catalog"), cfs, &handles, &db).ok());
  edit(db, handles);
  for (auto* h : handles) ASSERT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
  delete db;
}

rocksdb::WriteOptions SyncedWrite() {
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return wo;
}

void SetFormatVersion(const TempDir& store, uint32_t version) {
  EditCatalog(store, [&](rocksdb::DB* db, const auto& handles) {
    ASSERT_TRUE(
        db->Put(SyncedWrite(), handles[5], storage::kMetaFormatVersion, storage::EncodeU32(version))
            .ok());
  });
}

TEST(OpenTest, ACatalogOfANewerFormatIsRefusedAndLeftIntact) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  const auto tokens = synth::Tokens(1, 2 * spec.chunk_tokens);
  {
    auto engine = OpenOrDie(dir.path());
    ASSERT_TRUE(PutSynthetic(*engine, spec, tokens).ok());
  }
  SetFormatVersion(dir, storage::kCatalogFormatVersion + 1);
  auto engine = Engine::Open(EngineOptions{}, dir.path());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition) << engine.status();
  EXPECT_NE(engine.status().message().find("newer"), absl::string_view::npos);
  // Nothing was touched: with the version restored, everything is there.
  SetFormatVersion(dir, storage::kCatalogFormatVersion);
  auto reopened = OpenOrDie(dir.path());
  EXPECT_EQ(CountBadRecords(*reopened, spec, tokens, 2), 0);
}

TEST(OpenTest, AVersion1StoreIsReadAndUpgradedOnOpen) {
  // Version 1 had no summaries: its segment records are the version 1 encoding (no auxiliary
  // records) and its chunks have one checksum per layer.
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  const auto tokens = synth::Tokens(1, 3 * spec.chunk_tokens);
  {
    auto store = storage::ChunkStore::Open(storage::StoreOptions{}, dir.path());
    ASSERT_TRUE(store.ok()) << store.status();
    synth::SyntheticKv kv(spec, tokens);
    ASSERT_TRUE((*store)->Put(spec, tokens, kv.tensors()).ok());
  }
  EditCatalog(dir, [&](rocksdb::DB* db, const auto& handles) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[3]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto g = storage::DecodeSegmentRecord(it->value().ToString(), "segment");
      ASSERT_TRUE(g.ok()) << g.status();
      std::string v1 = storage::EncodeSegmentRecord(*g);
      v1[0] = 1;                 // encoding version 1...
      v1.resize(v1.size() - 4);  // ...without the auxiliary record count
      ASSERT_TRUE(db->Put(SyncedWrite(), handles[3], it->key(), v1).ok());
    }
    ASSERT_TRUE(
        db->Put(SyncedWrite(), handles[5], storage::kMetaFormatVersion, storage::EncodeU32(1))
            .ok());
  });
  {
    auto engine = OpenOrDie(dir.path());
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(CountBadRecords(*engine, spec, tokens, 3), 0);
    // New Puts get summaries, in a segment of their own.
    ASSERT_TRUE(PutSynthetic(*engine, spec, synth::Tokens(2, 2 * spec.chunk_tokens)).ok());
    EXPECT_EQ(engine->Stats().segments, 2u);
    auto report = engine->Verify();
    ASSERT_TRUE(report.ok());
    EXPECT_TRUE(report->ok()) << report->problems.front();
  }
  EditCatalog(dir, [&](rocksdb::DB* db, const auto& handles) {
    std::string v;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), handles[5], storage::kMetaFormatVersion, &v).ok());
    EXPECT_EQ(*storage::DecodeU32(v, "version"), storage::kCatalogFormatVersion);
  });
}

TEST(OpenTest, ASecondOpenOfAnOpenStoreIsUnavailable) {
  TempDir dir;
  auto first = OpenOrDie(dir.path());
  auto second = Engine::Open(EngineOptions{}, dir.path());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

TEST(OpenTest, OrphanSegmentFilesAreReclaimed) {
  auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
  TempDir dir;
  const auto tokens = synth::Tokens(1, 2 * spec.chunk_tokens);
  {
    auto engine = OpenOrDie(dir.path());
    ASSERT_TRUE(PutSynthetic(*engine, spec, tokens).ok());
  }
  {
    std::ofstream orphan(dir.Sub("segments/seg-00000099.ckv"), std::ios::binary);
    std::string junk(1 << 20, 'x');
    orphan.write(junk.data(), junk.size());
  }
  auto engine = OpenOrDie(dir.path());
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("segments/seg-00000099.ckv")));
  EXPECT_GE(engine->Stats().orphan_bytes_reclaimed, 1u << 20);
  EXPECT_EQ(CountBadRecords(*engine, spec, tokens, 2), 0);
}

}  // namespace
}  // namespace ckv
