// SPDX-License-Identifier: Apache-2.0
// Tests of the store's background reclaimer (storage/chunk_store_reclaim.cc): the
// margin it keeps, its batched rounds, the slots it frees without punching and the Puts that
// write over them, what it must not evict, closing after it, and the cap under concurrent Puts.
//
// Punches are counted through the fault file system: a rule that fails every PunchHole of the
// segments with EOPNOTSUPP counts each call (injected(kPunchHoleFail)), and the store takes
// Unimplemented as "given back", so its accounting goes on as on a file system without holes.
// Segment::PunchSlots stops at its run's first band when that fails, so the count is the number
// of runs punched (one PunchHole per band per run otherwise).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "ckv/log.h"
#include "io/fault_file_system.h"
#include "storage/chunk_store.h"
#include "tests/shaped_spec.h"
#include "tests/test_util.h"
#include "tools/synthetic_kv.h"

namespace ckv {
namespace {

using ::ckv::io::FaultInjectingFileSystem;
using ::ckv::io::FaultKind;
using ::ckv::io::FaultRule;
using ::ckv::storage::ChunkStore;
using ::ckv::storage::StoreOptions;
using ::ckv::testing::TempDir;

// 8 layers of 8 KiB records: a 64 KiB chunk, one band per layer (layer-major).
ModelSpec SmallSpec() { return ::ckv::testing::ShapedSpec("reclaim-test-model", 8, 4, 2, 64); }
constexpr uint64_t kChunk = 8 * 8192;

// max_disk_bytes whose data cap (DataCapLocked, docs/format.md) is exactly `chunks` chunks once
// the store has one segment.
uint64_t CapFor(uint64_t chunks) { return chunks * kChunk / 256 * 257 + 2 * 4096; }

class ReclaimTest : public ::testing::Test {
 protected:
  void Open(StoreOptions options) {
    store_.reset();
    options.file_system = &fs_;
    options.logger = NullLogger();
    auto store = ChunkStore::Open(options, dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  // Puts prefix `seed` of `chunks` chunks (no shared chunks): of spec_, or of `spec`.
  absl::StatusOr<PutResult> Put(ChunkStore& store, uint64_t seed, uint64_t chunks) {
    return PutAs(store, spec_, seed, chunks);
  }
  absl::StatusOr<PutResult> PutAs(ChunkStore& store, const ModelSpec& spec, uint64_t seed,
                                  uint64_t chunks) {
    const auto tokens = synth::Tokens(seed, chunks * spec.chunk_tokens);
    synth::SyntheticKv kv(spec, tokens);
    return store.Put(spec, tokens, kv.tensors());
  }
  uint64_t Stored(uint64_t seed, uint64_t chunks) {
    auto n = store_->Lookup(spec_, synth::Tokens(seed, chunks * spec_.chunk_tokens));
    EXPECT_TRUE(n.ok()) << n.status();
    return n.ok() ? *n : 0;
  }
  // Counts punches from now on (see the top of this file).
  void CountPunches() {
    fs_.ClearRules();
    FaultRule rule;
    rule.path_substring = "seg-";
    rule.punch_hole_fail = 1;
    rule.punch_hole_errno = EOPNOTSUPP;
    fs_.AddRule(rule);
    fs_.ResetCounters();
  }
  uint64_t Punches() const { return fs_.injected(FaultKind::kPunchHoleFail); }
  // Records of `keys` that do not read back bit-exact (or fail to read).
  int BadRecords(std::span<const ChunkKey> keys) {
    int bad = 0;
    std::vector<std::byte> got(spec_.RecordBytes()), want(spec_.RecordBytes());
    for (const ChunkKey& key : keys) {
      for (uint32_t l = 0; l < spec_.layers; ++l) {
        synth::FillRecord(spec_, key, l, want);
        if (!store_->ReadRecord(spec_, key, l, got).ok() || got != want) ++bad;
      }
    }
    return bad;
  }

  TempDir dir_;
  FaultInjectingFileSystem fs_{io::PosixFileSystem(), 11};
  const ModelSpec spec_ = SmallSpec();
  // The same chunk size as spec_, another fingerprint: its chunks go to segments of their own.
  const ModelSpec other_ = [this] {
    ModelSpec other = spec_;
    other.model_id = "reclaim-test-other-model";
    return other;
  }();
  std::unique_ptr<ChunkStore> store_;
};

TEST_F(ReclaimTest, TheMarginIsKeptAfterPutsSoThatNoPutEvictsInline) {
  StoreOptions options;
  options.max_disk_bytes = CapFor(64);
  options.reclaim_margin_bytes = 16 * kChunk;  // woken below 8 chunks free
  Open(options);
  CountPunches();
  for (uint64_t i = 0; i < 60; ++i) {
    ASSERT_TRUE(Put(*store_, 100 + i, 4).ok()) << "put " << i;
    store_->WaitForReclaimIdle();
    const storage::StoreStats st = store_->Stats();
    EXPECT_EQ(st.reclaim_margin_bytes, 16 * kChunk);
    ASSERT_LE(st.disk_bytes_used, 64 * kChunk) << "after put " << i;
    // Free slots that still hold blocks are free for the next Put: the margin counts them.
    ASSERT_LE(st.disk_bytes_used - st.free_kept_bytes + 8 * kChunk, 64 * kChunk)
        << "after put " << i;
  }
  const storage::StoreStats st = store_->Stats();
  EXPECT_EQ(st.inline_evictions, 0u) << "a Put evicted inline although the margin was kept";
  EXPECT_GT(st.reclaim_rounds, 0u);
  EXPECT_EQ(st.chunks_evicted, st.reclaim_chunks);
  EXPECT_EQ(st.reclaim_bytes, st.reclaim_chunks * kChunk);
  // Rounds are batched: each takes back at least half the margin (8 chunks), so there are far
  // fewer rounds than Puts.
  EXPECT_LE(st.reclaim_rounds * 8, st.reclaim_chunks);
  EXPECT_EQ(st.disk_bytes_used, st.chunks * kChunk + st.free_kept_bytes);
  // Every Put of the same model wrote over slots the reclaimer had freed: nothing was punched,
  // and no second segment was needed.
  EXPECT_EQ(Punches(), 0u);
  EXPECT_EQ(st.segments, 1u);
  EXPECT_GT(st.free_kept_bytes, 0u);
  EXPECT_LE(st.free_kept_bytes, 16 * kChunk);

  // Without a margin, the same stream evicts inline.
  store_.reset();
  options.reclaim_margin_bytes = 0;
  Open(options);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(Put(*store_, 900 + i, 4).ok());
  EXPECT_GT(store_->Stats().inline_evictions, 0u);
  EXPECT_EQ(store_->Stats().reclaim_rounds, 0u);
  EXPECT_EQ(store_->Stats().reclaim_margin_bytes, 0u);
}

TEST_F(ReclaimTest, ARoundIsOneBatchAndTheNextPutWritesOverItsSlotsWithoutPunching) {
  StoreOptions options;
  options.max_disk_bytes = CapFor(40);
  options.reclaim_margin_bytes = 12 * kChunk;
  options.reclaim_in_background = false;  // rounds run when the test says
  Open(options);
  // Ten prefixes of four chunks fill slots 0..39 of one segment, oldest first.
  for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(Put(*store_, i, 4).ok());
  ASSERT_EQ(store_->Stats().disk_bytes_used, 40 * kChunk);
  ASSERT_EQ(store_->Stats().segments, 1u);
  CountPunches();
  // A Delete punches, batched: prefix 1's slots 4..7 are one run.
  const auto tokens1 = synth::Tokens(1, 4 * spec_.chunk_tokens);
  ASSERT_TRUE(store_->Delete(spec_, tokens1).ok());
  EXPECT_EQ(Punches(), 1u) << "a Delete of 4 consecutive slots punched per chunk";
  // 36 chunks in use, 28 wanted: the 8 oldest go, prefixes 0 and 2 (slots 0..3 and 8..11), in
  // one synced batch. Their slots are freed without a punch and stay counted.
  fs_.ResetCounters();
  auto reclaimed = store_->ReclaimNow();
  ASSERT_TRUE(reclaimed.ok()) << reclaimed.status();
  EXPECT_EQ(*reclaimed, 8 * kChunk);
  EXPECT_EQ(Punches(), 0u) << "the round punched the slots it freed";
  EXPECT_EQ(Stored(0, 4), 0u);
  EXPECT_EQ(Stored(2, 4), 0u);
  EXPECT_EQ(Stored(3, 4), 4u);
  storage::StoreStats st = store_->Stats();
  EXPECT_EQ(st.reclaim_rounds, 1u);
  EXPECT_EQ(st.reclaim_chunks, 8u);
  EXPECT_EQ(st.free_kept_bytes, 8 * kChunk);
  EXPECT_EQ(st.disk_bytes_used, 36 * kChunk);
  // Nothing more to do under the margin: the kept slots count as free.
  ASSERT_EQ(*store_->ReclaimNow(), 0u);
  EXPECT_EQ(store_->Stats().reclaim_rounds, 1u);
  // A Put of 12 chunks writes over the 8 kept slots and takes 4 of the free ones (slots 4..7):
  // no punch, no eviction, and it reads back bit-exact.
  auto put = Put(*store_, 60, 12);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->chunks_evicted, 0u);
  EXPECT_EQ(Punches(), 0u);
  st = store_->Stats();
  EXPECT_EQ(st.free_kept_bytes, 0u);
  EXPECT_EQ(st.disk_bytes_used, 40 * kChunk);
  EXPECT_EQ(st.segments, 1u);
  EXPECT_LE(testing::SegmentBlocksBytes(dir_.path()), *options.max_disk_bytes);
  const auto keys60 = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens,
                                     synth::Tokens(60, 12 * spec_.chunk_tokens));
  EXPECT_EQ(BadRecords(keys60), 0);
  // Gc gives back what is kept (now with real punches): prefixes 3, 4 and 5 (slots 12..23).
  ASSERT_EQ(*store_->ReclaimNow(), 12 * kChunk);
  EXPECT_EQ(store_->Stats().free_kept_bytes, 12 * kChunk);
  fs_.ClearRules();
  auto gc = store_->Gc();
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_GE(gc->bytes_reclaimed, 12 * kChunk);
  st = store_->Stats();
  EXPECT_EQ(st.free_kept_bytes, 0u);
  EXPECT_EQ(st.disk_bytes_used, 28 * kChunk);
  EXPECT_LE(testing::SegmentBlocksBytes(dir_.path()), 28 * kChunk + 64 * 1024);
  auto report = store_->Verify(nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

TEST_F(ReclaimTest, APutOfAnotherModelPunchesTheKeptSlotsItNeedsRoomFor) {
  StoreOptions options;
  options.max_disk_bytes = CapFor(40);
  options.reclaim_margin_bytes = 12 * kChunk;
  options.reclaim_in_background = false;
  Open(options);
  for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(Put(*store_, i, 4).ok());
  ASSERT_EQ(*store_->ReclaimNow(), 12 * kChunk);  // prefixes 0..2: slots 0..11, kept
  CountPunches();
  // 28 live + 12 kept; the other model's 8 chunks need the room of 8: the kept run is punched
  // (once), and no live chunk is evicted.
  auto put = PutAs(*store_, other_, 70, 8);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->chunks_evicted, 0u);
  EXPECT_EQ(Punches(), 1u);
  const storage::StoreStats st = store_->Stats();
  EXPECT_EQ(st.free_kept_bytes, 0u);
  EXPECT_EQ(st.chunks, 36u);
  EXPECT_EQ(st.disk_bytes_used, 36 * kChunk);
  EXPECT_EQ(st.inline_evictions, 0u);
  for (uint64_t i = 3; i < 10; ++i) EXPECT_EQ(Stored(i, 4), 4u) << "prefix " << i;
  // (The blocks on disk are not checked here: the counting rule fails punches without punching.)
}

TEST_F(ReclaimTest, InlineEvictionWritesOverWhatItFreesOrPunchesItOncePerRun) {
  StoreOptions options;
  options.max_disk_bytes = CapFor(40);
  options.reclaim_margin_bytes = 0;
  Open(options);
  for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(Put(*store_, i, 4).ok());
  CountPunches();
  // The same model: evicts prefixes 0 and 1 (slots 0..7) and writes over them, unpunched.
  auto put = Put(*store_, 50, 8);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->chunks_evicted, 8u);
  EXPECT_EQ(Punches(), 0u) << "inline eviction punched slots its own Put writes over";
  storage::StoreStats st = store_->Stats();
  EXPECT_EQ(st.inline_evictions, 1u);
  EXPECT_EQ(st.free_kept_bytes, 0u);
  EXPECT_EQ(st.disk_bytes_used, 40 * kChunk);
  EXPECT_EQ(st.segments, 1u);
  EXPECT_EQ(Stored(50, 8), 8u);
  // Another model (a segment of its own): 8 chunks evict prefixes 2 and 3 (slots 8..15),
  // punched in one run.
  auto put_other = PutAs(*store_, other_, 70, 8);
  ASSERT_TRUE(put_other.ok()) << put_other.status();
  EXPECT_EQ(put_other->chunks_evicted, 8u);
  EXPECT_EQ(Punches(), 1u) << "inline eviction punched per chunk, not per run";
  st = store_->Stats();
  EXPECT_EQ(st.inline_evictions, 2u);
  EXPECT_EQ(st.free_kept_bytes, 0u);
  EXPECT_EQ(st.disk_bytes_used, 40 * kChunk);
  EXPECT_EQ(Stored(70, 8), 0u) << "looked up as the first model";
  EXPECT_EQ(*store_->Lookup(other_, synth::Tokens(70, 8 * other_.chunk_tokens)), 8u);
  // The second segment lowered the data cap below the 40 chunks in use (its metadata allowance),
  // so the next Put of the first model evicts one chunk more than it writes: it keeps the 8 slots
  // it writes over and punches the ninth, and fits.
  fs_.ResetCounters();
  auto again = Put(*store_, 51, 8);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->chunks_evicted, 9u);
  EXPECT_EQ(Punches(), 1u);
  st = store_->Stats();
  EXPECT_EQ(st.free_kept_bytes, 0u);
  EXPECT_EQ(st.disk_bytes_used, 39 * kChunk);
  EXPECT_EQ(Stored(51, 8), 8u);
}

// A Put larger than the kept slots: it writes over them, evicts inline for the rest and writes
// over what it evicted too. Then the failure paths: a Put that cannot make room gives the kept
// slots it had taken back, and a Put whose writes fail leaves the store consistent.
TEST_F(ReclaimTest, APutWritesOverKeptSlotsAndWhatItEvictsAndItsFailuresGiveThemBack) {
  StoreOptions options;
  options.max_disk_bytes = CapFor(40);
  options.reclaim_margin_bytes = 12 * kChunk;
  options.reclaim_in_background = false;
  Open(options);
  for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(Put(*store_, i, 4).ok());
  ASSERT_EQ(*store_->ReclaimNow(), 12 * kChunk);  // prefixes 0..2 kept
  CountPunches();
  // 20 chunks: the 12 kept slots, then 8 more evicted inline (prefixes 3 and 4), kept and
  // written over as well.
  auto put = Put(*store_, 80, 20);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->chunks_evicted, 8u);
  EXPECT_EQ(Punches(), 0u);
  storage::StoreStats st = store_->Stats();
  EXPECT_EQ(st.free_kept_bytes, 0u);
  EXPECT_EQ(st.disk_bytes_used, 40 * kChunk);
  EXPECT_EQ(st.segments, 1u);
  EXPECT_EQ(Stored(4, 4), 0u);
  EXPECT_EQ(Stored(5, 4), 4u);
  const auto keys80 = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens,
                                     synth::Tokens(80, 20 * spec_.chunk_tokens));
  EXPECT_EQ(BadRecords(keys80), 0);

  // 12 kept again (prefixes 5..7); every live prefix pinned, so a Put of 20 takes the 12 and
  // cannot evict for the other 8: refused, and the 12 are kept as they were.
  ASSERT_EQ(*store_->ReclaimNow(), 12 * kChunk);
  std::vector<std::unique_ptr<storage::PinnedChunks>> pins;
  for (uint64_t i = 5; i < 10; ++i) {  // the two of these still stored (a Lookup made 5 recent)
    auto p = store_->Pin(spec_, ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens,
                                               synth::Tokens(i, 4 * spec_.chunk_tokens)));
    if (p.ok()) pins.push_back(std::move(*p));
  }
  ASSERT_EQ(pins.size(), 2u);
  auto p80 = store_->Pin(spec_, keys80);
  ASSERT_TRUE(p80.ok()) << p80.status();
  auto refused = Put(*store_, 81, 20);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  st = store_->Stats();
  EXPECT_EQ(st.free_kept_bytes, 12 * kChunk);
  EXPECT_EQ(st.disk_bytes_used, 40 * kChunk);
  EXPECT_EQ(Punches(), 0u);
  pins.clear();
  p80->reset();

  // Writes fail while a Put writes over the kept slots: the Put fails, its slots are punched,
  // and the next Put succeeds.
  FaultRule eio;
  eio.path_substring = "seg-";
  eio.write_eio = 1;
  fs_.ClearRules();  // the first rule that matches a file applies
  fs_.AddRule(eio);
  auto failed = Put(*store_, 82, 8);
  EXPECT_FALSE(failed.ok());
  fs_.ClearRules();
  CountPunches();
  st = store_->Stats();
  EXPECT_EQ(st.free_kept_bytes, 4 * kChunk) << "the 8 written over were released, 4 stay kept";
  EXPECT_EQ(st.disk_bytes_used, st.chunks * kChunk + st.free_kept_bytes);
  EXPECT_EQ(Stored(82, 8), 0u);
  auto again = Put(*store_, 82, 8);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Stored(82, 8), 8u);
  st = store_->Stats();
  EXPECT_EQ(st.disk_bytes_used, st.chunks * kChunk + st.free_kept_bytes);
  EXPECT_LE(st.disk_bytes_used, 40 * kChunk);
  auto report = store_->Verify(nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

TEST_F(ReclaimTest, PinnedChunksAreNeverReclaimed) {
  StoreOptions options;
  options.max_disk_bytes = CapFor(40);
  options.reclaim_margin_bytes = 8 * kChunk;
  options.reclaim_in_background = false;
  Open(options);
  for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(Put(*store_, i, 4).ok());
  // Prefix 0 is the first to go, but a reader holds it.
  const auto keys0 = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens,
                                    synth::Tokens(0, 4 * spec_.chunk_tokens));
  auto pinned = store_->Pin(spec_, keys0);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  ASSERT_EQ(*store_->ReclaimNow(), 8 * kChunk);
  EXPECT_EQ(Stored(0, 4), 4u) << "a pinned prefix was reclaimed";
  EXPECT_EQ(Stored(1, 4), 0u);
  EXPECT_EQ(Stored(2, 4), 0u);
  EXPECT_EQ(Stored(3, 4), 4u);
  EXPECT_EQ(BadRecords(keys0), 0);
  // Every other prefix pinned as well: only a new one can go, then nothing can.
  std::vector<std::unique_ptr<storage::PinnedChunks>> pins;
  for (uint64_t i = 3; i < 10; ++i) {
    auto p = store_->Pin(spec_, ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens,
                                               synth::Tokens(i, 4 * spec_.chunk_tokens)));
    ASSERT_TRUE(p.ok());
    pins.push_back(std::move(*p));
  }
  ASSERT_TRUE(Put(*store_, 77, 8).ok());  // fills the 8 free chunks
  ASSERT_EQ(*store_->ReclaimNow(), 8 * kChunk) << "the new prefix is the only unpinned one";
  EXPECT_EQ(Stored(77, 8), 0u);
  ASSERT_TRUE(Put(*store_, 78, 8).ok());
  auto p78 = store_->Pin(spec_, ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens,
                                               synth::Tokens(78, 8 * spec_.chunk_tokens)));
  ASSERT_TRUE(p78.ok());
  EXPECT_EQ(*store_->ReclaimNow(), 0u) << "every leaf is pinned";
  EXPECT_EQ(store_->Stats().disk_bytes_used, 40 * kChunk);
  EXPECT_EQ(Stored(78, 8), 8u);
  for (uint64_t i : {0, 3, 4, 5, 6, 7, 8, 9}) EXPECT_EQ(Stored(i, 4), 4u) << "prefix " << i;
}

TEST_F(ReclaimTest, KeptSlotsAreOrphanSpaceThatTheNextOpenGivesBack) {
  StoreOptions options;
  options.max_disk_bytes = CapFor(40);
  options.reclaim_margin_bytes = 8 * kChunk;  // woken below 4 chunks free
  Open(options);
  for (uint64_t i = 0; i < 9; ++i) ASSERT_TRUE(Put(*store_, i, 4).ok());
  store_->WaitForReclaimIdle();
  ASSERT_EQ(store_->Stats().reclaim_rounds, 0u);
  ASSERT_TRUE(Put(*store_, 9, 4).ok());  // 40 of 40 chunks: wakes the reclaimer
  store_->WaitForReclaimIdle();
  ASSERT_EQ(store_->Stats().free_kept_bytes, 8 * kChunk);
  EXPECT_EQ(Stored(9, 4), 4u);
  EXPECT_EQ(Stored(0, 4), 0u);
  store_.reset();  // closed with 8 slots kept
  // Reopened without a reclaimer: the kept slots hold no committed chunk, so Open punches them.
  options.reclaim_margin_bytes = 0;
  Open(options);
  const storage::StoreStats st = store_->Stats();
  EXPECT_EQ(st.chunks, 32u);
  EXPECT_EQ(st.disk_bytes_used, 32 * kChunk);
  EXPECT_EQ(st.free_kept_bytes, 0u);
  EXPECT_EQ(st.orphan_bytes_reclaimed, 8 * kChunk);
  EXPECT_LE(testing::SegmentBlocksBytes(dir_.path()), 32 * kChunk + 64 * 1024);
  auto report = store_->Verify(nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

TEST_F(ReclaimTest, TheCapHoldsUnderConcurrentPuts) {
  StoreOptions options;
  options.max_disk_bytes = CapFor(48);
  options.reclaim_margin_bytes = 12 * kChunk;
  Open(options);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 25; ++i) {
        auto put = Put(*store_, 1000 * (t + 1) + i, 1 + (i % 4));
        if (!put.ok()) {
          ADD_FAILURE() << "thread " << t << " put " << i << ": " << put.status();
          ++failures;
          return;
        }
        const storage::StoreStats st = store_->Stats();
        if (st.disk_bytes_used > 48 * kChunk) {
          ADD_FAILURE() << "thread " << t << " put " << i << ": " << st.disk_bytes_used
                        << " bytes in use, over the data cap";
          ++failures;
          return;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  store_->WaitForReclaimIdle();
  const storage::StoreStats st = store_->Stats();
  EXPECT_GT(st.reclaim_rounds, 0u);
  EXPECT_EQ(st.disk_bytes_used, st.chunks * kChunk + st.free_kept_bytes);
  EXPECT_LE(testing::SegmentBlocksBytes(dir_.path()), *options.max_disk_bytes);
  auto report = store_->Verify(nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

}  // namespace
}  // namespace ckv
