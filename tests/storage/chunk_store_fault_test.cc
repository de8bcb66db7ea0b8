// SPDX-License-Identifier: Apache-2.0
// Faults beneath the store, injected through the fault-injecting file system: a failed Put leaves
// nothing visible and no space held; a disk that lies is caught by the checksums.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"
#include "ckv/engine.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "engine/internal.h"
#include "gmock/gmock.h"
#include "io/fault_file_system.h"
#include "io/mem_file_system.h"
#include "tests/test_util.h"
#include "tools/kvctl/open_to_free.h"

namespace ckv {
namespace {

using ::ckv::io::FaultInjectingFileSystem;
using ::ckv::io::FaultRule;
using ::ckv::testing::ChunkDiskBytes;
using ::ckv::testing::CountBadRecords;
using ::ckv::testing::PutSynthetic;
using ::ckv::testing::SegmentBlocksBytes;
using ::ckv::testing::TempDir;

class StoreFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = *ModelSpec::Preset("qwen2.5-0.5b");
    auto engine = engine::OpenWithSeams(EngineOptions{}, dir_.path(), {.file_system = &fs_});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    base_ = synth::Tokens(1, 4 * spec_.chunk_tokens);
    ASSERT_TRUE(PutSynthetic(*engine_, spec_, base_).ok());
    base_blocks_ = SegmentBlocksBytes(dir_.path());
  }

  // A failed Put: the given code, nothing new visible, no space held, the rest intact; and once
  // the fault is gone the same Put succeeds.
  void ExpectPutFailsCleanly(const FaultRule& rule, absl::StatusCode code) {
    const auto tokens = synth::Tokens(2, 8 * spec_.chunk_tokens);
    fs_.AddRule(rule);
    auto put = PutSynthetic(*engine_, spec_, tokens);
    fs_.ClearRules();
    EXPECT_EQ(put.status().code(), code) << put.status();
    EXPECT_GT(fs_.total_injected(), 0u);
    EXPECT_EQ(*engine_->Lookup(spec_, tokens), 0u);
    const EngineStats stats = engine_->Stats();
    EXPECT_EQ(stats.chunks, 4u);
    EXPECT_EQ(stats.prefixes, 1u);
    EXPECT_EQ(stats.disk_bytes_used, 4 * ChunkDiskBytes(spec_));
    EXPECT_EQ(SegmentBlocksBytes(dir_.path()), base_blocks_);
    EXPECT_EQ(CountBadRecords(*engine_, spec_, base_, 4), 0);
    // And the store reopened from disk says the same: the failed Put left nothing in the
    // catalog, and its space is not held.
    engine_.reset();
    auto reopened = engine::OpenWithSeams(EngineOptions{}, dir_.path(), {.file_system = &fs_});
    ASSERT_TRUE(reopened.ok()) << reopened.status();
    engine_ = std::move(*reopened);
    EXPECT_EQ(*engine_->Lookup(spec_, tokens), 0u) << "after reopening";
    EXPECT_EQ(engine_->Stats().chunks, 4u) << "after reopening";
    EXPECT_EQ(engine_->Stats().disk_bytes_used, 4 * ChunkDiskBytes(spec_)) << "after reopening";
    EXPECT_EQ(SegmentBlocksBytes(dir_.path()), base_blocks_) << "after reopening";
    EXPECT_EQ(CountBadRecords(*engine_, spec_, base_, 4), 0) << "after reopening";
    auto again = PutSynthetic(*engine_, spec_, tokens);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(CountBadRecords(*engine_, spec_, tokens, 8), 0);
  }

  TempDir dir_;
  FaultInjectingFileSystem fs_{io::PosixFileSystem(), /*seed=*/7};
  ModelSpec spec_;
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> base_;
  uint64_t base_blocks_ = 0;
};

TEST_F(StoreFaultTest, WriteEioFailsThePutAndLeavesNothing) {
  FaultRule rule;
  rule.path_substring = "seg-";
  rule.write_eio = 0.3;
  ExpectPutFailsCleanly(rule, absl::StatusCode::kInternal);
}

TEST_F(StoreFaultTest, ADiskThatStaysFullFailsThePutWithoutEvictingWhatCannotMakeRoom) {
  // Regression: every segment write and allocation fails with ENOSPC. The Put
  // needs 8 chunks' room and the store holds 4: evicting them all could not make that room, so
  // nothing is evicted (it used to empty the store, then fail). The failure says why, and the
  // store is as it was.
  FaultRule rule;
  rule.path_substring = "seg-";
  rule.write_enospc = 1;
  const auto tokens = synth::Tokens(2, 8 * spec_.chunk_tokens);
  fs_.AddRule(rule);
  auto put = PutSynthetic(*engine_, spec_, tokens);
  fs_.ClearRules();
  ASSERT_EQ(put.status().code(), absl::StatusCode::kResourceExhausted) << put.status();
  EXPECT_THAT(std::string(put.status().message()),
              ::testing::AllOf(::testing::HasSubstr("No space left on device"),
                               ::testing::HasSubstr(absl::StrCat(
                                   "it still needs ", 8 * ChunkDiskBytes(spec_), " bytes")),
                               ::testing::HasSubstr("nothing was evicted")));
  const EngineStats stats = engine_->Stats();
  EXPECT_EQ(stats.no_space_puts, 1u);
  EXPECT_EQ(stats.no_space_recovered, 0u);
  EXPECT_EQ(stats.no_space_evictions, 0u);
  EXPECT_EQ(stats.chunks, 4u);
  EXPECT_EQ(stats.disk_bytes_used, 4 * ChunkDiskBytes(spec_));
  EXPECT_EQ(SegmentBlocksBytes(dir_.path()), base_blocks_);
  EXPECT_EQ(*engine_->Lookup(spec_, tokens), 0u);
  EXPECT_EQ(CountBadRecords(*engine_, spec_, base_, 4), 0);
  auto report = engine_->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok());
  auto again = PutSynthetic(*engine_, spec_, tokens);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(CountBadRecords(*engine_, spec_, tokens, 8), 0);
}

TEST_F(StoreFaultTest, AFileSystemFullBelowTheCapEvictsInEvictionOrderAndTheRetryStores) {
  // The file system fills below the cap (the first segment write of the Put fails with ENOSPC,
  // as a disk shared with something else would): the store evicts what the Put needs (its 8
  // chunks, all of them: the failure came after the block reservation, which therefore reserved
  // nothing for sure) and the margin for the file system's and the catalog's blocks (one chunk
  // more), in its eviction order (least recently used leaves first), and the one retry stores
  // the prefix.
  const auto older = synth::Tokens(5, 12 * spec_.chunk_tokens);
  ASSERT_TRUE(PutSynthetic(*engine_, spec_, older).ok());
  ASSERT_EQ(*engine_->Lookup(spec_, base_), 4u);  // base_ is used again: `older` is the LRU now
  std::atomic<int> enospc{1};
  fs_.SetOpHook([&](const FaultInjectingFileSystem::OpInfo& op) {
    FaultInjectingFileSystem::OpFault fault;
    if (!op.read && op.path.find("seg-") != std::string::npos && enospc.fetch_sub(1) > 0) {
      fault.error = ENOSPC;
    }
    return fault;
  });
  const auto tokens = synth::Tokens(2, 8 * spec_.chunk_tokens);
  auto put = PutSynthetic(*engine_, spec_, tokens);
  fs_.SetOpHook(nullptr);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->chunks_written, 8u);
  EXPECT_EQ(put->chunks_evicted, 9u);
  const EngineStats stats = engine_->Stats();
  EXPECT_EQ(stats.no_space_puts, 1u);
  EXPECT_EQ(stats.no_space_recovered, 1u);
  EXPECT_EQ(stats.no_space_evictions, 9u);
  const std::string metrics = engine_->Metrics();
  EXPECT_THAT(metrics, ::testing::HasSubstr("\nckv_no_space_puts_total 1\n"));
  EXPECT_THAT(metrics, ::testing::HasSubstr("\nckv_no_space_recovered_total 1\n"));
  EXPECT_THAT(metrics, ::testing::HasSubstr("\nckv_no_space_evictions_total 9\n"));
  EXPECT_EQ(stats.chunks, 4u + 3u + 8u);
  EXPECT_EQ(stats.disk_bytes_used, 15 * ChunkDiskBytes(spec_));
  // The last 9 chunks of `older` (its leaves, one after another) went; base_ stayed.
  EXPECT_EQ(*engine_->Lookup(spec_, older), 3u);
  EXPECT_EQ(*engine_->Lookup(spec_, base_), 4u);
  EXPECT_EQ(*engine_->Lookup(spec_, tokens), 8u);
  EXPECT_EQ(CountBadRecords(*engine_, spec_, tokens, 8), 0);
  EXPECT_EQ(CountBadRecords(*engine_, spec_, base_, 4), 0);
  auto report = engine_->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok());
}

TEST_F(StoreFaultTest, AFailedSyncFailsThePutAndLeavesNothing) {
  FaultRule rule;
  rule.path_substring = "seg-";
  rule.sync_fail = 1;
  ExpectPutFailsCleanly(rule, absl::StatusCode::kInternal);
}

TEST_F(StoreFaultTest, ATornWriteTheDiskCalledGoodIsCaughtOnRead) {
  // The device acknowledges writes it only partly did: the Put succeeds, but no read may return
  // the torn bytes.
  FaultRule rule;
  rule.path_substring = "seg-";
  rule.torn_write = 1;
  rule.torn_write_reports_ok = true;
  const auto tokens = synth::Tokens(3, 8 * spec_.chunk_tokens);
  fs_.AddRule(rule);
  auto put = PutSynthetic(*engine_, spec_, tokens);
  fs_.ClearRules();
  ASSERT_TRUE(put.ok()) << put.status();
  const auto keys = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, tokens);
  std::vector<std::byte> got(spec_.RecordBytes()), want(spec_.RecordBytes());
  int data_loss = 0, served = 0;
  for (const ChunkKey& key : keys) {
    for (uint32_t l = 0; l < spec_.layers; ++l) {
      absl::Status s = engine_->ReadRecord(spec_, key, l, got);
      if (s.ok()) {
        synth::FillRecord(spec_, key, l, want);
        ASSERT_EQ(got, want) << "wrong bytes served for " << key.ToHex() << "/L" << l;
        ++served;
      } else {
        ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
        ++data_loss;
      }
    }
  }
  // Every write was torn; a record survives only when its part was written before the tear.
  EXPECT_GT(data_loss, 0);
  EXPECT_GT(served, 0);
  EXPECT_EQ(engine_->Stats().checksum_failures, static_cast<uint64_t>(data_loss));
  auto report = engine_->Verify();
  ASSERT_TRUE(report.ok());
  // Verify also checks each chunk's three auxiliary records ("<key>/aux<n>", no layer), torn like
  // the rest.
  int layer_problems = 0;
  for (const VerifyProblem& p : report->problems) {
    EXPECT_EQ(p.kind, VerifyProblem::Kind::kChecksum) << p;
    if (p.layer != VerifyProblem::kNoLayer) {
      ++layer_problems;
      EXPECT_NE(p.message.find("/L" + std::to_string(p.layer)), std::string::npos) << p;
    }
  }
  EXPECT_EQ(layer_problems, data_loss);
  EXPECT_GE(report->checksum_failures, static_cast<uint64_t>(data_loss));
  EXPECT_LE(report->checksum_failures, static_cast<uint64_t>(data_loss) + 3 * keys.size());
  std::printf("torn writes: %d records refused, %d intact records served\n", data_loss, served);
}

TEST_F(StoreFaultTest, AReadErrorIsAnErrorNotData) {
  FaultRule rule;
  rule.path_substring = "seg-";
  rule.read_eio = 1;
  fs_.AddRule(rule);
  const auto keys = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, base_);
  std::vector<std::byte> got(spec_.RecordBytes());
  absl::Status s = engine_->ReadRecord(spec_, keys[0], 0, got);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("seg-"), absl::string_view::npos) << s;
  rule.read_eio = 0;
  rule.short_read = 1;
  fs_.ClearRules();
  fs_.AddRule(rule);
  s = engine_->ReadRecord(spec_, keys[1], 3, got);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  fs_.ClearRules();
  EXPECT_EQ(CountBadRecords(*engine_, spec_, base_, 4), 0);
}

// Regression: when the punches of an eviction failed, the evicted slots stopped counting against
// the cap while their blocks stayed allocated, so the Put that evicted them wrote past the cap
// (found by the fault matrix, Eio_1pct_Eviction).
TEST(StoreCapFaultTest, RegressionEvictionWhosePunchFailsPassedTheCap) {
  TempDir dir;
  FaultInjectingFileSystem fs(io::PosixFileSystem(), /*seed=*/11);
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  EngineOptions options;
  options.max_disk_bytes = 6 * ChunkDiskBytes(spec);
  auto engine = engine::OpenWithSeams(options, dir.path(), {.file_system = &fs});
  ASSERT_TRUE(engine.ok()) << engine.status();
  // B is of another model (the same chunk size), so that a Put of B cannot write over A's
  // evicted slots and must punch them.
  ModelSpec other = spec;
  other.model_id += "-other";
  const auto a = synth::Tokens(1, 4 * spec.chunk_tokens);
  const auto b = synth::Tokens(2, 4 * spec.chunk_tokens);
  ASSERT_TRUE(PutSynthetic(**engine, spec, a).ok());
  FaultRule rule;
  rule.path_substring = "seg-";
  rule.punch_hole_fail = 1;
  fs.AddRule(rule);
  // B needs A's space: A's chunks are evicted, but their blocks cannot be given back.
  auto put = PutSynthetic(**engine, other, b);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kResourceExhausted) << put.status();
  EXPECT_NE(put.status().message().find("could not give back"), absl::string_view::npos)
      << put.status();
  EXPECT_LE(SegmentBlocksBytes(dir.path()), *options.max_disk_bytes);
  EXPECT_EQ(*(*engine)->Lookup(other, b), 0u);
  const EngineStats held = (*engine)->Stats();
  EXPECT_LT(held.chunks, 4u) << "the eviction itself is committed";
  EXPECT_EQ(held.disk_bytes_used, 4 * ChunkDiskBytes(spec)) << "the unpunched slots still count";
  // Once punching works again the next Put gives the blocks back first, and fits.
  fs.ClearRules();
  auto again = PutSynthetic(**engine, other, b);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_LE(SegmentBlocksBytes(dir.path()), *options.max_disk_bytes);
  EXPECT_EQ(CountBadRecords(**engine, other, b, 4), 0);
  auto gc = (*engine)->Gc();
  ASSERT_TRUE(gc.ok()) << gc.status();
  const EngineStats st = (*engine)->Stats();
  EXPECT_EQ(st.disk_bytes_used, st.chunks * ChunkDiskBytes(spec));
  auto report = (*engine)->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok());
}

// A store without a cap on a small disk of its own: an in-memory file system of 8 MiB (it says
// ENOSPC as a full disk does, and states its size as statvfs would), behind the fault-injecting
// one. Nothing here depends on the machine's disks, so these tests cannot skip.
class SmallDiskTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kDiskBytes = 8ull << 20;

  void SetUp() override {
    spec_ = *ModelSpec::Preset("qwen2.5-0.5b");
    ASSERT_TRUE(mem_.CreateDirs(dir_.path()).ok());
    auto engine = engine::OpenWithSeams(EngineOptions{}, dir_.path(), {.file_system = &fs_});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  // Puts prefixes of 4 chunks (seeds from 100) until the next would not fit the disk; returns
  // their tokens.
  std::vector<std::vector<int32_t>> FillDisk() {
    std::vector<std::vector<int32_t>> prefixes;
    while (mem_.used_bytes() + 5 * ChunkDiskBytes(spec_) <= kDiskBytes) {
      prefixes.push_back(synth::Tokens(100 + prefixes.size(), 4 * spec_.chunk_tokens));
      auto put = PutSynthetic(*engine_, spec_, prefixes.back());
      EXPECT_TRUE(put.ok()) << put.status();
      if (!put.ok()) break;
    }
    return prefixes;
  }

  TempDir dir_;
  io::MemFileSystem mem_{kDiskBytes};
  FaultInjectingFileSystem fs_{&mem_, /*seed=*/11};
  ModelSpec spec_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(SmallDiskTest, APutLargerThanTheDiskIsRefusedBeforeAnythingIsEvicted) {
  // Regression: a Put larger than the file system could ever hold used to
  // evict every chunk on ENOSPC, then fail. It is refused up front, naming its bytes and the
  // disk's size, and every earlier chunk stays readable.
  const auto prefixes = FillDisk();
  ASSERT_GE(prefixes.size(), 5u);
  const uint64_t chunks_before = engine_->Stats().chunks;
  const uint64_t big_chunks = kDiskBytes / ChunkDiskBytes(spec_) + 8;  // more than the disk
  const auto big = synth::Tokens(7, big_chunks * spec_.chunk_tokens);
  auto put = PutSynthetic(*engine_, spec_, big);
  ASSERT_EQ(put.status().code(), absl::StatusCode::kResourceExhausted) << put.status();
  EXPECT_FALSE(IsNoSpace(put.status())) << "refused by size, not by a full disk";
  EXPECT_THAT(std::string(put.status().message()),
              ::testing::AllOf(
                  ::testing::HasSubstr(absl::StrCat(big_chunks, " new chunks (",
                                                    big_chunks * ChunkDiskBytes(spec_), " bytes)")),
                  ::testing::HasSubstr(absl::StrCat("can never fit the file system holding ",
                                                    dir_.path(), ": it is ", kDiskBytes, " bytes")),
                  ::testing::HasSubstr("nothing was evicted")));
  const EngineStats stats = engine_->Stats();
  EXPECT_EQ(stats.chunks_evicted, 0u);
  EXPECT_EQ(stats.no_space_evictions, 0u);
  EXPECT_EQ(stats.chunks, chunks_before);
  for (const auto& tokens : prefixes) {
    EXPECT_EQ(*engine_->Lookup(spec_, tokens), 4u);
    EXPECT_EQ(CountBadRecords(*engine_, spec_, tokens, 4), 0);
  }
  EXPECT_EQ(*engine_->Lookup(spec_, big), 0u);
  // Where the file system states a larger size (the wrapper's SetSpace), the store goes by it:
  // the same Put now meets the full disk, and the ENOSPC retry still evicts nothing, as
  // eviction could not make the room.
  fs_.SetSpace(io::FileSystemSpace{64ull << 20, 60ull << 20});
  put = PutSynthetic(*engine_, spec_, big);
  ASSERT_EQ(put.status().code(), absl::StatusCode::kResourceExhausted) << put.status();
  EXPECT_THAT(std::string(put.status().message()),
              ::testing::AllOf(::testing::Not(::testing::HasSubstr("can never fit")),
                               ::testing::HasSubstr("nothing was evicted")));
  EXPECT_EQ(engine_->Stats().chunks, chunks_before);
  EXPECT_EQ(engine_->Stats().no_space_evictions, 0u);
}

TEST_F(SmallDiskTest, AnEnospcMidPutEvictsAboutWhatThePutStillNeedsNotEverything) {
  // Regression: the disk fills part way through a Put's block reservation.
  // The retry evicts about the bytes the Put still had to place (plus a small margin), not the
  // Put's whole size, and certainly not the store.
  const auto prefixes = FillDisk();
  ASSERT_GE(prefixes.size(), 5u);
  const uint64_t chunk = ChunkDiskBytes(spec_);
  const uint64_t free_before = kDiskBytes - mem_.used_bytes();
  const uint64_t new_chunks = 12;
  ASSERT_GT(new_chunks * chunk, free_before + 4 * chunk) << "the Put must not fit as it is";
  const uint64_t short_by = new_chunks * chunk - free_before;
  const auto tokens = synth::Tokens(9, new_chunks * spec_.chunk_tokens);
  auto put = PutSynthetic(*engine_, spec_, tokens);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->chunks_written, new_chunks);
  const EngineStats stats = engine_->Stats();
  EXPECT_EQ(stats.no_space_puts, 1u);
  EXPECT_EQ(stats.no_space_recovered, 1u);
  // What the Put was short of, in whole chunks, and at most the margin's chunk and a segment's
  // blocks more: never the Put's whole size (which the store used to evict).
  const uint64_t short_chunks = (short_by + chunk - 1) / chunk;
  EXPECT_GE(stats.no_space_evictions, short_chunks);
  EXPECT_LE(stats.no_space_evictions, short_chunks + 2);
  EXPECT_LT(stats.no_space_evictions, new_chunks);
  EXPECT_EQ(CountBadRecords(*engine_, spec_, tokens, new_chunks), 0);
  // The most recent prefixes were not touched: eviction took the least recently used.
  EXPECT_EQ(*engine_->Lookup(spec_, prefixes.back()), 4u);
  auto report = engine_->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok());
}

TEST_F(SmallDiskTest, RegressionAnEnospcRetryKeepsTheChunksThePutFoundStored) {
  // Regression: a Put extending a stored prefix found the disk full; the
  // retry's eviction took the chunks the Put had counted as stored (it had unpinned them), and
  // the retry wrote them again from the caller's tensors, which a caller such as kvctl replay
  // leaves unfilled for stored chunks: wrong bytes with valid checksums. The Put's chain stays
  // pinned across the retries: the eviction takes the other prefix, and every record read back
  // is what was put.
  const size_t c = spec_.chunk_tokens;
  const auto stored = synth::Tokens(20, 4 * c);
  ASSERT_TRUE(PutSynthetic(*engine_, spec_, stored).ok());
  const auto other = synth::Tokens(21, 4 * c);
  ASSERT_TRUE(PutSynthetic(*engine_, spec_, other).ok());
  std::vector<int32_t> tokens = stored;
  const auto more = synth::Tokens(22, 4 * c);
  tokens.insert(tokens.end(), more.begin(), more.end());
  // The KV of the 4 new chunks; the 4 stored ones are left zero, as a replay leaves them.
  synth::SyntheticKv full(spec_, tokens);
  const size_t stored_bytes = 4 * c * spec_.TokenBytesPerLayer();
  std::vector<std::vector<std::byte>> k(spec_.layers), v(spec_.layers);
  KvTensors kv;
  kv.tokens = tokens.size();
  for (uint32_t l = 0; l < spec_.layers; ++l) {
    k[l].assign(full.tensors().k[l].begin(), full.tensors().k[l].end());
    v[l].assign(full.tensors().v[l].begin(), full.tensors().v[l].end());
    std::fill_n(k[l].begin(), stored_bytes, std::byte{0});
    std::fill_n(v[l].begin(), stored_bytes, std::byte{0});
    kv.k.emplace_back(k[l]);
    kv.v.emplace_back(v[l]);
  }
  // The first segment write of the Put fails with ENOSPC: the retry evicts the 4 chunks the
  // Put still needs and a margin, least recently used first: `other`, then (were it not held)
  // the leaf of `stored`.
  std::atomic<int> enospc{1};
  fs_.SetOpHook([&](const FaultInjectingFileSystem::OpInfo& op) {
    FaultInjectingFileSystem::OpFault fault;
    if (!op.read && op.path.find("seg-") != std::string::npos && enospc.fetch_sub(1) > 0) {
      fault.error = ENOSPC;
    }
    return fault;
  });
  auto put = engine_->Put(spec_, tokens, kv);
  fs_.SetOpHook(nullptr);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->chunks_existing, 4u);
  EXPECT_EQ(put->chunks_written, 4u);
  EXPECT_EQ(engine_->Stats().no_space_recovered, 1u);
  EXPECT_EQ(engine_->Stats().no_space_evictions, 4u);
  EXPECT_EQ(*engine_->Lookup(spec_, other), 0u);
  EXPECT_EQ(*engine_->Lookup(spec_, tokens), 8u);
  EXPECT_EQ(CountBadRecords(*engine_, spec_, tokens, 8), 0);
  auto report = engine_->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok());
}

// Regression: on a file system with no byte free, the tools that would free
// space (kvctl rm and gc) could not open the store: RocksDB writes files when it opens. They
// first give back blocks without writing (engine::FreeSpaceToOpen), then open.
class FullDiskOpenTest : public SmallDiskTest {
 protected:
  // Closes the engine, fills what is left of the disk with a file of someone else's, and makes
  // the catalog's appends fail while less than 512 KiB is free (the catalog shares the disk).
  void FillTheRestAndClose() {
    engine_.reset();
    auto filler = mem_.Open(dir_.path() + "/filler", io::FileSystem::OpenMode::kCreateReadWrite);
    ASSERT_TRUE(filler.ok()) << filler.status();
    const uint64_t left = mem_.Space(dir_.path())->available_bytes;
    ASSERT_TRUE((*filler)->Allocate(0, left).ok());
    ASSERT_EQ(mem_.Space(dir_.path())->available_bytes, 0u);
    fs_.AddRule({.write_enospc = 1, .catalog_writes = true, .applies = [this] {
                   return mem_.Space(dir_.path())->available_bytes < (512u << 10);
                 }});
    options_.create_if_missing = false;
    auto blocked = engine::OpenWithSeams(options_, dir_.path(), {.file_system = &fs_});
    ASSERT_FALSE(blocked.ok()) << "a full disk must keep a plain open from writing";
    ASSERT_TRUE(IsNoSpace(blocked.status())) << blocked.status();
  }
  EngineOptions options_;
};

TEST_F(FullDiskOpenTest, RmFreesThePrefixsBlocksBeforeOpeningThenRemovesIt) {
  const auto prefixes = FillDisk();
  ASSERT_GE(prefixes.size(), 3u);
  FillTheRestAndClose();
  const ChunkKey victim =
      ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, prefixes[0]).back();
  auto freed = engine::FreeSpaceToOpen(options_, dir_.path(), std::span<const ChunkKey>(&victim, 1),
                                       {.file_system = &fs_});
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_GE(*freed, 4 * ChunkDiskBytes(spec_));
  auto opened = engine::OpenWithSeams(options_, dir_.path(), {.file_system = &fs_});
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_TRUE((*opened)->DeletePrefix(victim).ok());
  EXPECT_EQ(*(*opened)->Lookup(spec_, prefixes[0]), 0u);
  for (size_t i = 1; i < prefixes.size(); ++i) {
    EXPECT_EQ(*(*opened)->Lookup(spec_, prefixes[i]), 4u);
    EXPECT_EQ(CountBadRecords(**opened, spec_, prefixes[i], 4), 0);
  }
  auto report = (*opened)->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok());
}

TEST_F(FullDiskOpenTest, RegressionRmPunchesNoPrefixBeforeCommitWhenFreeSlotsAreEnough) {
  // Regression: kvctl rm gave back the prefix's blocks at once, before its
  // delete committed; had the open then failed, the prefix stayed catalogued with zeroed blocks.
  // It first gives back free slots and the snapshot only (kvctl::OpenToFree): here that is
  // enough, and the prefix goes through the ordinary DeletePrefix.
  const auto prefixes = FillDisk();
  ASSERT_GE(prefixes.size(), 3u);
  // A removal whose punches failed: its slots are free but still hold their blocks.
  fs_.AddRule({.path_substring = "seg-", .punch_hole_fail = 1});
  ASSERT_TRUE(engine_->Delete(spec_, prefixes[1]).ok());
  fs_.ClearRules();
  FillTheRestAndClose();
  const ChunkKey victim =
      ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, prefixes[0]).back();
  std::vector<size_t> freed_prefixes;  // the prefixes each FreeSpaceToOpen was given
  auto opened = kvctl::OpenToFree(
      NoSpaceError("the store's open found the disk full"), std::span<const ChunkKey>(&victim, 1),
      [&] { return engine::OpenWithSeams(options_, dir_.path(), {.file_system = &fs_}); },
      [&](std::span<const ChunkKey> delete_prefixes) {
        freed_prefixes.push_back(delete_prefixes.size());
        return engine::FreeSpaceToOpen(options_, dir_.path(), delete_prefixes,
                                       {.file_system = &fs_});
      },
      [](uint64_t, bool) {});
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(freed_prefixes, std::vector<size_t>{0}) << "the prefix was punched before commit";
  // Every chunk of the victim still reads back: nothing of it was punched.
  EXPECT_EQ(*(*opened)->Lookup(spec_, prefixes[0]), 4u);
  EXPECT_EQ(CountBadRecords(**opened, spec_, prefixes[0], 4), 0);
  const uint64_t deleted_before = (*opened)->Stats().chunks_deleted;
  ASSERT_TRUE((*opened)->DeletePrefix(victim).ok());
  EXPECT_EQ((*opened)->Stats().chunks_deleted, deleted_before + 4);
  EXPECT_EQ(*(*opened)->Lookup(spec_, prefixes[0]), 0u);
  for (size_t i = 2; i < prefixes.size(); ++i) {
    EXPECT_EQ(*(*opened)->Lookup(spec_, prefixes[i]), 4u);
    EXPECT_EQ(CountBadRecords(**opened, spec_, prefixes[i], 4), 0);
  }
  auto report = (*opened)->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok());
}

TEST_F(FullDiskOpenTest, GcFreesTheBlocksOfFreeSlotsBeforeOpening) {
  const auto prefixes = FillDisk();
  ASSERT_GE(prefixes.size(), 3u);
  // A removal whose punches failed: its slots are free but still hold their blocks.
  fs_.AddRule({.path_substring = "seg-", .punch_hole_fail = 1});
  ASSERT_TRUE(engine_->Delete(spec_, prefixes[0]).ok());
  fs_.ClearRules();
  FillTheRestAndClose();
  auto freed = engine::FreeSpaceToOpen(options_, dir_.path(), {}, {.file_system = &fs_});
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_GE(*freed, 4 * ChunkDiskBytes(spec_));
  auto opened = engine::OpenWithSeams(options_, dir_.path(), {.file_system = &fs_});
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto gc = (*opened)->Gc();
  ASSERT_TRUE(gc.ok()) << gc.status();
  for (size_t i = 1; i < prefixes.size(); ++i) {
    EXPECT_EQ(CountBadRecords(**opened, spec_, prefixes[i], 4), 0);
  }
}

}  // namespace
}  // namespace ckv
