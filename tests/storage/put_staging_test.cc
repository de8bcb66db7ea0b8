// SPDX-License-Identifier: Apache-2.0
// Put's staging pool and latency figures (io/staging_pool.h, common/latency_window.h):
// Puts larger than the pool stream through it and come back bit-exact, concurrent Puts share a
// pool of one lane by waiting, and the store's p50/p99/max of Put latency are the nearest-rank
// figures of the Puts' durations on the store's clock.
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/latency_window.h"
#include "io/fault_file_system.h"
#include "io/io_op_narrow.h"
#include "io/mem_file_system.h"
#include "io/staging_pool.h"
#include "storage/chunk_store.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

using ::ckv::testing::TempDir;

TEST(LatencyWindowTest, NearestRankOverTheLatestPutsAndMaxOverAll) {
  LatencyWindow w;
  EXPECT_EQ(w.Summarize().window, 0u);
  EXPECT_EQ(w.Summarize().p99_us, 0u);
  for (uint64_t v = 100; v >= 1; --v) w.Record(v);  // out of order on purpose
  LatencyWindow::Summary s = w.Summarize();
  EXPECT_EQ(s.count, 100u);
  EXPECT_EQ(s.window, 100u);
  EXPECT_EQ(s.p50_us, 50u);
  EXPECT_EQ(s.p99_us, 99u);
  EXPECT_EQ(s.max_us, 100u);
  // A huge one, then enough small ones to push it out of the window: max keeps it.
  w.Record(1'000'000);
  for (size_t i = 0; i < LatencyWindow::kWindow; ++i) w.Record(7);
  s = w.Summarize();
  EXPECT_EQ(s.window, LatencyWindow::kWindow);
  EXPECT_EQ(s.p50_us, 7u);
  EXPECT_EQ(s.p99_us, 7u);
  EXPECT_EQ(s.max_us, 1'000'000u);
}

class PutStagingTest : public ::testing::Test {
 protected:
  void SetUp() override { CKV_ASSERT_OK(mem_.CreateDirs(dir_.path())); }

  // A store on the fault-injecting wrapper over memory (the thread queue under the wrapper, as
  // the fault tests use it), with a small staging pool: `staging` bytes of `write`-byte buffers.
  std::unique_ptr<storage::ChunkStore> Open(uint64_t staging, uint32_t write,
                                            Clock* clock = nullptr, bool direct = false) {
    storage::StoreOptions options;
    options.put_direct_writes = direct;
    options.file_system = &fault_;
    options.put_staging_bytes = staging;
    options.max_write_bytes = write;
    if (clock != nullptr) options.clock = clock;
    auto store = storage::ChunkStore::Open(options, dir_.path());
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  // Every layer record of `tokens`' chunks reads back as the generator made it.
  int BadRecords(storage::ChunkStore& store, const std::vector<int32_t>& tokens) {
    const auto keys = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, tokens);
    std::vector<std::byte> got(spec_.RecordBytes()), want(spec_.RecordBytes());
    int bad = 0;
    for (const ChunkKey& key : keys) {
      for (uint32_t l = 0; l < spec_.layers; ++l) {
        synth::FillRecord(spec_, key, l, want);
        if (!store.ReadRecord(spec_, key, l, got).ok() || got != want) ++bad;
      }
    }
    return bad;
  }

  TempDir dir_;
  io::MemFileSystem mem_;
  io::FaultInjectingFileSystem fault_{&mem_};
  ModelSpec spec_ = *ModelSpec::Preset("qwen2.5-0.5b");
};

TEST_F(PutStagingTest, PutLargerThanThePoolStreamsThroughItBitExact) {
  // 1 MiB of staging in 64 KiB buffers; the Put writes 128 chunks x 24 layers x 8 KiB = 24 MiB.
  auto store = Open(1 << 20, 64 << 10);
  ASSERT_NE(store, nullptr);
  const auto tokens = synth::Tokens(11, 128 * spec_.chunk_tokens);
  synth::SyntheticKv kv(spec_, tokens);
  auto put = store->Put(spec_, tokens, kv.tensors());
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->chunks_written, 128u);
  EXPECT_GT(put->bytes_written, uint64_t{16} << 20);
  EXPECT_EQ(BadRecords(*store, tokens), 0);
  auto report = store->Verify(nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

TEST_F(PutStagingTest, ConcurrentPutsShareOneLaneByWaiting) {
  // 2 buffers of 512 KiB: one lane, so the Puts take turns.
  auto store = Open(1 << 20, 512 << 10);
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 4;
  std::vector<std::vector<int32_t>> tokens;
  for (int t = 0; t < kThreads; ++t) tokens.push_back(synth::Tokens(100 + t, 40 * 16));
  std::vector<absl::Status> results(kThreads);
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        synth::SyntheticKv kv(spec_, tokens[t]);
        results[t] = store->Put(spec_, tokens[t], kv.tensors()).status();
      });
    }
    for (std::thread& th : threads) th.join();
  }
  for (int t = 0; t < kThreads; ++t) {
    CKV_EXPECT_OK(results[t]);
    EXPECT_EQ(BadRecords(*store, tokens[t]), 0) << t;
  }
  const storage::StoreStats stats = store->Stats();
  EXPECT_EQ(stats.put_latency_window, static_cast<uint64_t>(kThreads));
  EXPECT_LE(stats.put_staging_waits, static_cast<uint64_t>(kThreads - 1));
}

TEST_F(PutStagingTest, FailedWriteLeavesTheLaneUsableForTheNextPut) {
  auto store = Open(1 << 20, 512 << 10);
  ASSERT_NE(store, nullptr);
  io::FaultRule rule;
  rule.path_substring = "seg-";
  rule.write_eio = 1;
  fault_.AddRule(rule);
  const auto failed = synth::Tokens(21, 8 * 16);
  synth::SyntheticKv kv1(spec_, failed);
  auto put = store->Put(spec_, failed, kv1.tensors());
  EXPECT_FALSE(put.ok());
  fault_.ClearRules();
  const auto tokens = synth::Tokens(22, 8 * 16);
  synth::SyntheticKv kv2(spec_, tokens);
  auto again = store->Put(spec_, tokens, kv2.tensors());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(BadRecords(*store, tokens), 0);
  // Only the Put that returned OK is in the latency figures.
  EXPECT_EQ(store->Stats().put_latency_window, 1u);
}

TEST_F(PutStagingTest, LatencyFiguresAreTheNearestRankOfThePutsOnTheStoreClock) {
  // Injected latency on the segment files sleeps on the fake clock, so each Put takes a
  // deterministic time that the test reads off the same clock.
  FakeClock clock;
  io::FaultInjectingFileSystem timed(&mem_, /*seed=*/1, &clock);
  storage::StoreOptions options;
  options.file_system = &timed;
  options.clock = &clock;
  options.max_write_bytes = 4096;  // one write per chunk and band: Puts of more chunks take longer
  auto opened = storage::ChunkStore::Open(options, dir_.path());
  ASSERT_TRUE(opened.ok()) << opened.status();
  storage::ChunkStore& store = **opened;
  io::FaultRule rule;
  rule.path_substring = "seg-";
  rule.latency_us = 250;
  timed.AddRule(rule);
  std::vector<uint64_t> us;
  for (int i = 0; i < 5; ++i) {
    // Puts of 2, 4, 6, 8 and 10 chunks: more writes, longer Puts.
    const auto tokens = synth::Tokens(300 + i, (2 + 2 * i) * 16);
    synth::SyntheticKv kv(spec_, tokens);
    const int64_t before = clock.MonotonicNanos();
    ASSERT_TRUE(store.Put(spec_, tokens, kv.tensors()).ok());
    us.push_back(static_cast<uint64_t>(clock.MonotonicNanos() - before) / 1000);
  }
  for (size_t i = 1; i < us.size(); ++i) EXPECT_GT(us[i], us[i - 1]) << i;
  const storage::StoreStats stats = store.Stats();
  EXPECT_EQ(stats.put_latency_window, 5u);
  EXPECT_EQ(stats.put_latency_p50_us, us[2]);  // nearest rank: the 3rd of 5
  EXPECT_EQ(stats.put_latency_p99_us, us[4]);
  EXPECT_EQ(stats.put_latency_max_us, us[4]);
}

// K and V tensors copied into page-aligned memory: what a caller does to let Put write them
// straight from its memory (EngineOptions::put_direct_writes).
struct AlignedKv {
  explicit AlignedKv(const KvTensors& from) {
    tensors.tokens = from.tokens;
    for (const auto* side : {&from.k, &from.v}) {
      for (std::span<const std::byte> t : *side) {
        io::AlignedBuffer& b = memory.emplace_back(t.size(), 4096);
        std::memcpy(b.data(), t.data(), t.size());
        (side == &from.k ? tensors.k : tensors.v).emplace_back(b.data(), t.size());
      }
    }
  }
  std::vector<io::AlignedBuffer> memory;
  KvTensors tensors;
};

struct DirectCase {
  const char* name;
  // nullptr: the fault-injecting wrapper over memory; else the POSIX file system's backend.
  std::optional<IoBackend> posix;
};

class PutDirectTest : public ::testing::TestWithParam<DirectCase> {};

// Aligned tensors are written straight from the caller's memory, gathered (io_uring WRITEV,
// pwritev, or WriteAt piece by piece under the wrapper), and read back bit-exact with the
// checksums of exactly those bytes; unaligned ones are staged.
TEST_P(PutDirectTest, AlignedTensorsAreWrittenWithoutStagingAndReadBackBitExact) {
  if (GetParam().posix == IoBackend::kUring && !io::UringAvailable()) {
    GTEST_SKIP() << "io_uring unavailable: " << io::UringUnavailableReason();
  }
  TempDir dir;
  io::MemFileSystem mem;
  CKV_ASSERT_OK(mem.CreateDirs(dir.path()));
  io::FaultInjectingFileSystem fault(&mem);
  storage::StoreOptions options;
  options.put_direct_writes = true;
  options.file_system = GetParam().posix ? io::PosixFileSystem(*GetParam().posix) : &fault;
  auto store = storage::ChunkStore::Open(options, dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const auto tokens = synth::Tokens(41, 300 * spec.chunk_tokens);  // 300 chunks: 2 writes a layer
  synth::SyntheticKv kv(spec, tokens);
  AlignedKv aligned(kv.tensors());
  auto put = (*store)->Put(spec, tokens, aligned.tensors);
  ASSERT_TRUE(put.ok()) << put.status();
  // Every layer record (24 x 8 KiB per chunk) went straight from the tensors.
  EXPECT_EQ((*store)->Stats().put_direct_bytes, uint64_t{300} * spec.layers * spec.RecordBytes());
  // Unaligned tensors (std::vector's) of another prefix are staged.
  const auto staged_tokens = synth::Tokens(42, 3 * spec.chunk_tokens + 1);
  synth::SyntheticKv staged(spec, staged_tokens);
  ASSERT_TRUE((*store)->Put(spec, staged_tokens, staged.tensors()).ok());
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  std::vector<std::byte> got(spec.RecordBytes()), want(spec.RecordBytes());
  int bad = 0;
  for (const ChunkKey& key : keys) {
    for (uint32_t l = 0; l < spec.layers; ++l) {
      synth::FillRecord(spec, key, l, want);
      if (!(*store)->ReadRecord(spec, key, l, got).ok() || got != want) ++bad;
    }
  }
  EXPECT_EQ(bad, 0);
  auto report = (*store)->Verify(nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

INSTANTIATE_TEST_SUITE_P(Backends, PutDirectTest,
                         ::testing::Values(DirectCase{"FaultOverMemory", std::nullopt},
                                           DirectCase{"Uring", IoBackend::kUring},
                                           DirectCase{"Threads", IoBackend::kThreads}),
                         [](const auto& info) { return std::string(info.param.name); });

// Faults in the middle of gathered writes (an injected short transfer, a torn write, EIO) fail the
// Put and leave nothing of it visible; the next Put writes and reads back as usual.
TEST_F(PutStagingTest, FaultsInGatheredWritesFailThePutCleanly) {
  auto store = Open(32 << 20, 2 << 20, nullptr, /*direct=*/true);
  ASSERT_NE(store, nullptr);
  int round = 0;
  for (double io::FaultRule::*fault : {&io::FaultRule::torn_write, &io::FaultRule::write_eio}) {
    io::FaultRule rule;
    rule.path_substring = "seg-";
    rule.*fault = 1;
    fault_.AddRule(rule);
    const auto tokens = synth::Tokens(500 + round++, 20 * 16);
    synth::SyntheticKv kv(spec_, tokens);
    AlignedKv aligned(kv.tensors());
    auto put = store->Put(spec_, tokens, aligned.tensors);
    EXPECT_FALSE(put.ok());
    fault_.ClearRules();
    auto matched = store->Lookup(spec_, tokens);
    ASSERT_TRUE(matched.ok());
    EXPECT_EQ(*matched, 0u);
  }
  const auto tokens = synth::Tokens(600, 20 * 16);
  synth::SyntheticKv kv(spec_, tokens);
  AlignedKv aligned(kv.tensors());
  ASSERT_TRUE(store->Put(spec_, tokens, aligned.tensors).ok());
  EXPECT_EQ(BadRecords(*store, tokens), 0);
  EXPECT_GT(store->Stats().put_direct_bytes, 0u);
}

TEST(NarrowIoOpTest, CutsAGatheredWriteInsideItsPieces) {
  std::vector<std::byte> a(4096), b(4096), c(4096);
  const std::vector<io::IoPiece> pieces = {{a.data(), 4096}, {b.data(), 4096}, {c.data(), 4096}};
  io::IoOp op;
  op.kind = io::IoOp::Kind::kWrite;
  op.offset = 1 << 20;
  op.length = 3 * 4096;
  op.gather = pieces;
  std::vector<io::IoPiece> cut;
  // The middle 8 KiB: the second half of a, all of b, the first half of c.
  const io::IoOp mid = io::NarrowIoOp(op, 2048, 8192, &cut);
  EXPECT_EQ(mid.offset, (1u << 20) + 2048);
  EXPECT_EQ(mid.length, 8192u);
  ASSERT_EQ(mid.gather.size(), 3u);
  EXPECT_EQ(mid.gather[0].data, a.data() + 2048);
  EXPECT_EQ(mid.gather[0].length, 2048u);
  EXPECT_EQ(mid.gather[1].data, b.data());
  EXPECT_EQ(mid.gather[1].length, 4096u);
  EXPECT_EQ(mid.gather[2].data, c.data());
  EXPECT_EQ(mid.gather[2].length, 2048u);
  // The rest after 2 pieces: c alone. A plain op's buffer advances instead.
  const io::IoOp rest = io::NarrowIoOp(op, 8192, 4096, &cut);
  ASSERT_EQ(rest.gather.size(), 1u);
  EXPECT_EQ(rest.gather[0].data, c.data());
  io::IoOp plain;
  plain.buffer = a.data();
  plain.length = 4096;
  EXPECT_EQ(io::NarrowIoOp(plain, 1024, 512, &cut).buffer, a.data() + 1024);
}

TEST(StagingPoolTest, LanesAreBoundedByThePoolAndTheQueueDepth) {
  io::MemFileSystem fs;
  // 32 MiB of 2 MiB buffers at depth 16: 16 buffers in 2 lanes of 8.
  io::StagingPool pool(&fs, 32 << 20, 2 << 20, 16);
  EXPECT_EQ(pool.pool_bytes(), uint64_t{32} << 20);
  EXPECT_EQ(pool.lanes(), 2u);
  auto a = pool.LeaseLane();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->buffers().size(), 8u);
  for (std::byte* b : a->buffers()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % io::StagingPool::kBufferAlignment, 0u);
  }
  // Less than two buffers' worth still makes one lane of two.
  io::StagingPool tiny(&fs, 1 << 20, 2 << 20, 16);
  EXPECT_EQ(tiny.lanes(), 1u);
  EXPECT_EQ(tiny.pool_bytes(), uint64_t{4} << 20);
}

}  // namespace
}  // namespace ckv
