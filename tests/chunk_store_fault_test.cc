// SPDX-License-Identifier: Apache-2.0
// Faults beneath the store, injected through the fault-injecting file system: a failed Put leaves
// nothing visible and no space held; a disk that lies is caught by the checksums.
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <string>

#include "ckv/engine.h"
#include "ckv/status.h"
#include "gmock/gmock.h"
#include "storage/fault_file_system.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

using ::ckv::storage::FaultInjectingFileSystem;
using ::ckv::storage::FaultRule;
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
  FaultInjectingFileSystem fs_{storage::PosixFileSystem(), /*seed=*/7};
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

TEST_F(StoreFaultTest, ADiskThatStaysFullFailsThePutAfterEvictingOnceAndLeavesNothingOfIt) {
  // Every segment write fails with ENOSPC: the Put gives back room (evicting every chunk it can,
  // as it needed more than the store held), tries once more, fails again, and says so. The store
  // is consistent: nothing of the Put, and the evicted chunks gone from disk as from the index.
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
                               ::testing::HasSubstr("4 chunks were evicted to make room")));
  EXPECT_TRUE(IsNoSpace(put.status())) << put.status();
  const EngineStats stats = engine_->Stats();
  EXPECT_EQ(stats.no_space_puts, 1u);
  EXPECT_EQ(stats.no_space_recovered, 0u);
  EXPECT_EQ(stats.no_space_evictions, 4u);
  EXPECT_EQ(stats.chunks, 0u);
  EXPECT_EQ(stats.disk_bytes_used, 0u);
  EXPECT_EQ(SegmentBlocksBytes(dir_.path()), 0u);
  EXPECT_EQ(*engine_->Lookup(spec_, tokens), 0u);
  EXPECT_EQ(*engine_->Lookup(spec_, base_), 0u);
  auto report = engine_->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok());
  auto again = PutSynthetic(*engine_, spec_, tokens);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(CountBadRecords(*engine_, spec_, tokens, 8), 0);
}

TEST_F(StoreFaultTest, AFileSystemFullBelowTheCapEvictsInEvictionOrderAndTheRetryStores) {
  // The file system fills below the cap (the first segment write of the Put fails with ENOSPC,
  // as a disk shared with something else would): the store evicts what the Put needs, in its
  // eviction order (least recently used leaves first), and the one retry stores the prefix.
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
  EXPECT_EQ(put->chunks_evicted, 8u);
  const EngineStats stats = engine_->Stats();
  EXPECT_EQ(stats.no_space_puts, 1u);
  EXPECT_EQ(stats.no_space_recovered, 1u);
  EXPECT_EQ(stats.no_space_evictions, 8u);
  const std::string metrics = engine_->Metrics();
  EXPECT_THAT(metrics, ::testing::HasSubstr("\nckv_no_space_puts_total 1\n"));
  EXPECT_THAT(metrics, ::testing::HasSubstr("\nckv_no_space_recovered_total 1\n"));
  EXPECT_THAT(metrics, ::testing::HasSubstr("\nckv_no_space_evictions_total 8\n"));
  EXPECT_EQ(stats.chunks, 4u + 12u);
  EXPECT_EQ(stats.disk_bytes_used, 16 * ChunkDiskBytes(spec_));
  // The last 8 chunks of `older` (its leaves, one after another) went; base_ stayed.
  EXPECT_EQ(*engine_->Lookup(spec_, older), 4u);
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
  // Verify also checks each chunk's two summary records ("<key>/aux<n>"), torn like the rest.
  int layer_problems = 0;
  for (const std::string& p : report->problems) layer_problems += p.find("/L") != std::string::npos;
  EXPECT_EQ(layer_problems, data_loss);
  EXPECT_GE(report->checksum_failures, static_cast<uint64_t>(data_loss));
  EXPECT_LE(report->checksum_failures, static_cast<uint64_t>(data_loss) + 2 * keys.size());
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
  FaultInjectingFileSystem fs(storage::PosixFileSystem(), /*seed=*/11);
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

}  // namespace
}  // namespace ckv
