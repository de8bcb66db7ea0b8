// SPDX-License-Identifier: Apache-2.0
// What a Re-Prefill session does when the reads of one layer fail (the fault-injecting file
// system's op hook fails every device read of that layer's records, on whichever backend the
// I/O layer uses: io_uring where the kernel allows it): AwaitLayer of that layer fails with
// DataLoss naming the record, and the other layers are still served bit-exact, so a caller can
// recompute the failed layer from its tokens and carry on (ckv/session.h).
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "ckv/engine.h"
#include "engine/internal.h"
#include "io/fault_file_system.h"
#include "storage/chunk_store.h"
#include "tests/served_bytes.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

using ::ckv::testing::ServedEquals;

using ::ckv::testing::PutSynthetic;
using ::ckv::testing::TempDir;
using ::ckv::testing::Watchdog;

struct LayerFaultCase {
  Selector selector;
  uint32_t bad_layer;  // every read of this layer's records fails with EIO
  // The layers whose AwaitLayer must fail: the bad one, or a failed period head's whole period.
  uint32_t first_failed, last_failed;
};

class SessionLayerFaultTest : public ::testing::TestWithParam<LayerFaultCase> {};

TEST_P(SessionLayerFaultTest, OnlyTheFailedLayersFailNamingTheRecordAndTheRestAreExact) {
  const LayerFaultCase& c = GetParam();
  Watchdog watchdog("SessionLayerFaultTest", absl::Seconds(120));
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const auto tokens = synth::Tokens(41, 16 * spec.chunk_tokens);
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  TempDir dir;
  io::FaultInjectingFileSystem fs(io::PosixFileSystem());
  EngineOptions eo;
  eo.layout =
      RecordLayout::kLayerMajor;  // one layer's records are one band: reads never mix layers
  const engine::Seams seams{.file_system = &fs};
  auto opened = engine::OpenWithSeams(eo, dir.path(), seams);
  ASSERT_TRUE(opened.ok()) << opened.status();
  Engine& engine = **opened;
  ASSERT_TRUE(PutSynthetic(engine, spec, tokens).ok());
  // Where the bad layer's records are.
  std::vector<std::pair<uint64_t, uint64_t>> bad;  // [offset, end)
  std::string bad_path;
  for (const ChunkKey& key : keys) {
    auto where = engine::HostOf(engine).store().LocateRecord(key, c.bad_layer);
    ASSERT_TRUE(where.ok()) << where.status();
    bad.emplace_back(where->offset, where->offset + where->length);
    bad_path = where->segment_path;
  }
  std::atomic<bool> on{true};
  std::atomic<uint64_t> injected{0};
  fs.SetOpHook([&](const io::FaultInjectingFileSystem::OpInfo& op) {
    const uint64_t offset = op.offset;
    const size_t length = op.length;
    io::FaultInjectingFileSystem::OpFault f;
    if (!on || !op.read || op.path != bad_path) return f;
    for (const auto& [lo, hi] : bad) {
      if (offset < hi && lo < offset + length) {
        f.error = EIO;
        injected++;
        break;
      }
    }
    return f;
  });

  for (int pass = 0; pass < 2; ++pass) {  // under the fault, then without it
    ReprefillOptions o;
    o.selector = c.selector;
    o.budget_fraction = 0.25;
    o.period_layers = 4;
    o.window = 4;
    auto session = engine.BeginReprefill(spec, tokens, o);
    ASSERT_TRUE(session.ok()) << session.status();
    std::vector<float> q(size_t{o.window} * spec.q_heads * spec.head_dim);
    std::vector<std::byte> want(spec.RecordBytes());
    uint32_t served = 0;
    for (uint32_t l = 0; l < spec.layers; ++l) {
      for (size_t i = 0; i < q.size(); ++i) {
        q[i] = static_cast<float>(synth::Mix64(l * 131 + i) % 4000) / 1000.0f - 2.0f;
      }
      const bool fails = pass == 0 && l >= c.first_failed && l <= c.last_failed;
      const absl::Status submitted = (*session)->SubmitQueries(l, q);
      if (fails && l == c.bad_layer && l == c.first_failed && c.first_failed != c.last_failed) {
        // A period head reads its whole layer to score it: the read error surfaces here.
        EXPECT_EQ(submitted.code(), absl::StatusCode::kDataLoss) << submitted;
      } else {
        CKV_EXPECT_OK(submitted);
      }
      auto view = (*session)->AwaitLayer(l);
      if (fails) {
        ASSERT_FALSE(view.ok()) << "layer " << l << " was served although its reads failed";
        EXPECT_EQ(view.status().code(), absl::StatusCode::kDataLoss) << view.status();
        EXPECT_TRUE(absl::StrContains(view.status().message(), absl::StrCat("/L", c.bad_layer)))
            << "the error names the failed record: " << view.status();
        EXPECT_TRUE(absl::StrContains(view.status().message(), "record ")) << view.status();
        if (l != c.bad_layer) {
          EXPECT_TRUE(absl::StrContains(view.status().message(), absl::StrCat("layer ", l)))
              << "the error names the layer asked for: " << view.status();
        }
        continue;
      }
      ASSERT_TRUE(view.ok()) << "layer " << l << ": " << view.status();
      EXPECT_EQ(view->records().size(), 4u);
      for (const auto& r : view->records()) {
        synth::FillRecord(spec, keys[r.chunk], l, want);
        ASSERT_TRUE(ServedEquals(r, want.data(), want.size()))
            << "chunk " << r.chunk << " layer " << l;
      }
      ++served;
    }
    auto finished = (*session)->Finish();
    ASSERT_TRUE(finished.ok()) << finished.status();
    const uint32_t failed = pass == 0 ? c.last_failed - c.first_failed + 1 : 0;
    EXPECT_EQ(served, spec.layers - failed);
    EXPECT_EQ(finished->layers_served, spec.layers - failed);
    if (pass == 0) {
      EXPECT_GT(injected.load(), 0u);
    }
    on = false;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layers, SessionLayerFaultTest,
    ::testing::Values(
        // A period head (layer 4 of period 4..7): its period fails, the next one is served.
        LayerFaultCase{Selector::kPeriodExact, 4, 4, 7},
        // A layer inside a period: only it fails.
        LayerFaultCase{Selector::kPeriodExact, 6, 6, 6},
        // Per-layer selectors: only the layer fails; the next one's speculation is unaffected.
        LayerFaultCase{Selector::kQuest, 5, 5, 5}, LayerFaultCase{Selector::kMeanKey, 9, 9, 9}),
    [](const ::testing::TestParamInfo<LayerFaultCase>& info) {
      // Regression: a failed period head's layers were served as OK, empty views (a caller
      // would attend over no prefix at all) instead of failing.
      if (info.index == 0) return std::string("PeriodHead_L4_RegressionFailedHeadServedEmptyViews");
      return absl::StrCat(std::string(SelectorName(info.param.selector)) == "period-exact"
                              ? "PeriodExact"
                          : std::string(SelectorName(info.param.selector)) == "quest" ? "Quest"
                                                                                      : "MeanKey",
                          "_L", info.param.bad_layer);
    });

// Regression: a speculative read that failed (a transient EIO) failed the layer that then needed
// the record, although a demand read of it would have succeeded: the session never read it again.
TEST(SessionPrefetchFaultTest, RegressionAFailedSpeculativeReadFailedTheLayerThatNeededIt) {
  Watchdog watchdog("SessionPrefetchFaultTest", absl::Seconds(120));
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const auto tokens = synth::Tokens(43, 16 * spec.chunk_tokens);
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  TempDir dir;
  io::FaultInjectingFileSystem fs(io::PosixFileSystem());
  EngineOptions eo;
  eo.layout = RecordLayout::kLayerMajor;
  const engine::Seams seams{.file_system = &fs};
  auto opened = engine::OpenWithSeams(eo, dir.path(), seams);
  ASSERT_TRUE(opened.ok()) << opened.status();
  Engine& engine = **opened;
  ASSERT_TRUE(PutSynthetic(engine, spec, tokens).ok());
  // The sink chunk's layer-1 record: every selection keeps it, so quest speculates on it for
  // layer 1 while serving layer 0. Its first read fails; later ones succeed.
  auto where = engine::HostOf(engine).store().LocateRecord(keys[0], 1);
  ASSERT_TRUE(where.ok()) << where.status();
  std::atomic<int> reads_of_it{0};
  absl::Notification failed_once;
  fs.SetOpHook([&](const io::FaultInjectingFileSystem::OpInfo& op) {
    io::FaultInjectingFileSystem::OpFault f;
    if (op.read && op.path == where->segment_path && op.offset <= where->offset &&
        where->offset < op.offset + op.length && reads_of_it++ == 0) {
      f.error = EIO;
      failed_once.Notify();
    }
    return f;
  });
  ReprefillOptions o;
  o.selector = Selector::kQuest;
  o.budget_fraction = 0.25;
  o.window = 4;
  auto session = engine.BeginReprefill(spec, tokens, o);
  ASSERT_TRUE(session.ok()) << session.status();
  std::vector<float> q(size_t{o.window} * spec.q_heads * spec.head_dim, 0.5f);
  std::vector<std::byte> want(spec.RecordBytes());
  for (uint32_t l = 0; l < spec.layers; ++l) {
    CKV_ASSERT_OK((*session)->SubmitQueries(l, q));
    auto view = (*session)->AwaitLayer(l);
    ASSERT_TRUE(view.ok()) << "layer " << l << ": " << view.status();
    for (const auto& r : view->records()) {
      synth::FillRecord(spec, keys[r.chunk], l, want);
      ASSERT_TRUE(ServedEquals(r, want.data(), want.size()));
    }
    // The speculative read of layer 1 has been tried (and failed) before layer 1 needs it.
    if (l == 0) {
      ASSERT_TRUE(failed_once.WaitForNotificationWithTimeout(absl::Seconds(30)));
    }
  }
  EXPECT_EQ(reads_of_it.load(), 2) << "one failed speculative read, one demand read";
  // The fault reached the session's reads through the I/O layer's io_uring queue where the kernel
  // allows it (the engine no longer falls back to threads for a caller's file system).
  EXPECT_EQ(fs.queue_faults(io::UringAvailable() ? "io_uring" : "threads").reads, 1u);
  ASSERT_TRUE((*session)->Finish().ok());
}

}  // namespace
}  // namespace ckv
