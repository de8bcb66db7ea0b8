// Tests of the store's background reclaimer (issue 20, storage/chunk_store_reclaim.cc): the
// margin it keeps, its batched punches, what it must not evict, closing while it works, and the
// cap under concurrent Puts.
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
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "ckv/log.h"
#include "storage/chunk_store.h"
#include "storage/fault_file_system.h"
#include "tests/test_util.h"
#include "tools/synthetic_kv.h"

namespace ckv {
namespace {

using ::ckv::storage::ChunkStore;
using ::ckv::storage::FaultInjectingFileSystem;
using ::ckv::storage::FaultKind;
using ::ckv::storage::FaultRule;
using ::ckv::storage::StoreOptions;
using ::ckv::testing::TempDir;

// 8 layers of 8 KiB records: a 64 KiB chunk, one band per layer (layer-major).
ModelSpec SmallSpec() {
  ModelSpec spec;
  spec.model_id = "reclaim-test-model";
  spec.layers = 8;
  spec.q_heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.dtype = DType::kFp16;
  spec.chunk_tokens = 16;
  return spec;
}
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
  // Puts prefix `seed` of `chunks` chunks (no shared chunks).
  absl::StatusOr<PutResult> Put(ChunkStore& store, uint64_t seed, uint64_t chunks) {
    const auto tokens = synth::Tokens(seed, chunks * spec_.chunk_tokens);
    synth::SyntheticKv kv(spec_, tokens);
    return store.Put(spec_, tokens, kv.tensors());
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

  TempDir dir_;
  FaultInjectingFileSystem fs_{storage::PosixFileSystem(), 11};
  const ModelSpec spec_ = SmallSpec();
  std::unique_ptr<ChunkStore> store_;
};

TEST_F(ReclaimTest, TheMarginIsKeptAfterPutsSoThatNoPutEvictsInline) {
  StoreOptions options;
  options.max_disk_bytes = CapFor(64);
  options.reclaim_margin_bytes = 16 * kChunk;  // woken below 8 chunks free
  Open(options);
  for (uint64_t i = 0; i < 60; ++i) {
    ASSERT_TRUE(Put(*store_, 100 + i, 4).ok()) << "put " << i;
    store_->WaitForReclaimIdle();
    const storage::StoreStats st = store_->Stats();
    EXPECT_EQ(st.reclaim_margin_bytes, 16 * kChunk);
    ASSERT_LE(st.disk_bytes_used + 8 * kChunk, 64 * kChunk) << "after put " << i;
  }
  const storage::StoreStats st = store_->Stats();
  EXPECT_EQ(st.inline_evictions, 0u) << "a Put evicted inline although the margin was kept";
  EXPECT_GT(st.reclaim_rounds, 0u);
  EXPECT_EQ(st.chunks_evicted, st.reclaim_chunks);
  EXPECT_EQ(st.reclaim_bytes, st.reclaim_chunks * kChunk);
  // Rounds are batched: each takes back at least half the margin (8 chunks), so there are far
  // fewer rounds than Puts.
  EXPECT_LE(st.reclaim_rounds * 8, st.reclaim_chunks);
  EXPECT_EQ(st.disk_bytes_used, st.chunks * kChunk);

  // Without a margin, the same stream evicts inline.
  store_.reset();
  options.reclaim_margin_bytes = 0;
  Open(options);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(Put(*store_, 900 + i, 4).ok());
  EXPECT_GT(store_->Stats().inline_evictions, 0u);
  EXPECT_EQ(store_->Stats().reclaim_rounds, 0u);
  EXPECT_EQ(store_->Stats().reclaim_margin_bytes, 0u);
}

TEST_F(ReclaimTest, EvictionPunchesOncePerContiguousRunOfSlots) {
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
  // A Delete is batched too: prefix 1's slots 4..7 are one run.
  const auto tokens1 = synth::Tokens(1, 4 * spec_.chunk_tokens);
  ASSERT_TRUE(store_->Delete(spec_, tokens1).ok());
  EXPECT_EQ(Punches(), 1u) << "a Delete of 4 consecutive slots punched per chunk";
  // 36 chunks in use, 28 wanted: the 8 oldest go, prefixes 0 and 2 (slots 0..3 and 8..11), one
  // synced batch and two runs.
  fs_.ResetCounters();
  auto reclaimed = store_->ReclaimNow();
  ASSERT_TRUE(reclaimed.ok()) << reclaimed.status();
  EXPECT_EQ(*reclaimed, 8 * kChunk);
  EXPECT_EQ(Punches(), 2u) << "expected one PunchSlots per run of slots";
  EXPECT_EQ(Stored(0, 4), 0u);
  EXPECT_EQ(Stored(2, 4), 0u);
  EXPECT_EQ(Stored(3, 4), 4u);
  const storage::StoreStats st = store_->Stats();
  EXPECT_EQ(st.reclaim_rounds, 1u);
  EXPECT_EQ(st.reclaim_chunks, 8u);
  EXPECT_EQ(st.disk_bytes_used, 28 * kChunk);
  // Nothing more to do under the margin.
  ASSERT_EQ(*store_->ReclaimNow(), 0u);
  EXPECT_EQ(store_->Stats().reclaim_rounds, 1u);
}

TEST_F(ReclaimTest, InlineEvictionIsBatchedToo) {
  StoreOptions options;
  options.max_disk_bytes = CapFor(40);
  options.reclaim_margin_bytes = 0;
  Open(options);
  for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(Put(*store_, i, 4).ok());
  CountPunches();
  auto put = Put(*store_, 50, 8);  // evicts prefixes 0 and 1: slots 0..7, one run
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->chunks_evicted, 8u);
  EXPECT_EQ(Punches(), 1u) << "inline eviction punched per chunk, not per run";
  EXPECT_EQ(store_->Stats().inline_evictions, 1u);
  EXPECT_LE(store_->Stats().disk_bytes_used, 40 * kChunk);
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
  std::vector<std::byte> got(spec_.RecordBytes()), want(spec_.RecordBytes());
  for (uint32_t l = 0; l < spec_.layers; ++l) {
    ASSERT_TRUE(store_->ReadRecord(spec_, keys0[3], l, got).ok());
    synth::FillRecord(spec_, keys0[3], l, want);
    EXPECT_EQ(got, want) << "layer " << l;
  }
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

TEST_F(ReclaimTest, ClosingWhileARoundPunchesJoinsItAndLeavesAConsistentStore) {
  StoreOptions options;
  options.max_disk_bytes = CapFor(40);
  options.reclaim_margin_bytes = 8 * kChunk;  // woken below 4 chunks free
  Open(options);
  for (uint64_t i = 0; i < 9; ++i) ASSERT_TRUE(Put(*store_, i, 4).ok());
  store_->WaitForReclaimIdle();
  ASSERT_EQ(store_->Stats().reclaim_rounds, 0u);
  // From here, an op on another thread than this one is the reclaimer's punch: hold it there.
  const std::thread::id test_thread = std::this_thread::get_id();
  absl::Mutex mu;
  bool punching = false, release = false;
  fs_.SetSleeper([&](uint64_t) {
    if (std::this_thread::get_id() == test_thread) return;
    absl::MutexLock lock(&mu);
    punching = true;
    mu.Await(absl::Condition(&release));
  });
  FaultRule slow;
  slow.path_substring = "seg-";
  slow.latency_us = 1;
  fs_.AddRule(slow);
  ASSERT_TRUE(Put(*store_, 9, 4).ok());  // 40 of 40 chunks: wakes the reclaimer
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&punching));
  }
  // The round committed its batch and is punching outside the store's lock: the store serves.
  EXPECT_EQ(Stored(9, 4), 4u);
  EXPECT_EQ(Stored(0, 4), 0u) << "the round's removal is committed before it punches";
  std::thread closer([&] { store_.reset(); });
  {
    absl::MutexLock lock(&mu);
    release = true;
  }
  closer.join();
  fs_.ClearRules();
  fs_.SetSleeper(nullptr);
  // Reopened without a reclaimer: what the closed store left is exactly what it committed.
  options.reclaim_margin_bytes = 0;
  Open(options);
  const storage::StoreStats st = store_->Stats();
  EXPECT_EQ(st.chunks, 32u);
  EXPECT_EQ(st.disk_bytes_used, 32 * kChunk);
  EXPECT_EQ(st.orphan_bytes_reclaimed, 0u) << "the round's punches were not finished at close";
  EXPECT_LE(testing::SegmentBlocksBytes(dir_.path()), *options.max_disk_bytes);
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
  EXPECT_EQ(st.disk_bytes_used, st.chunks * kChunk);
  EXPECT_LE(testing::SegmentBlocksBytes(dir_.path()), *options.max_disk_bytes);
  auto report = store_->Verify(nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

}  // namespace
}  // namespace ckv
