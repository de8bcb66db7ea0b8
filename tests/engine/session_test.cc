// SPDX-License-Identifier: Apache-2.0
// Tests of Re-Prefill sessions (ckv/session.h) through the public Engine API.
#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <thread>

#include "ckv/engine.h"
#include "engine/internal.h"
#include "gmock/gmock.h"
#include "io/fault_file_system.h"
#include "kernels/attention.h"
#include "kernels/estimate.h"
#include "kernels/fidelity.h"
#include "kernels/half.h"
#include "kernels/selector.h"
#include "kernels/summary.h"
#include "storage/chunk_store.h"
#include "tests/served_bytes.h"
#include "tests/test_util.h"
#include "tools/synthetic_attention.h"

namespace ckv {
namespace {

using ::ckv::testing::ServedEquals;

using ::ckv::testing::TempDir;

// A prefix from the planted-attention generator, its per-layer data kept for checking.
struct Planted {
  ModelSpec spec;
  std::vector<int32_t> tokens;
  std::vector<synth::SyntheticAttention::Layer> layers;
  std::vector<std::vector<std::byte>> records;  // per layer, chunk after chunk

  Planted(size_t n_tokens, uint64_t seed) {
    spec = *ModelSpec::Preset("qwen2.5-0.5b");
    tokens = synth::Tokens(seed, n_tokens);
    synth::AttentionParams p;
    // The selector expectations below were set on the planted-chunks data (chunk-level heavy
    // hitters); keep that profile explicitly now that the calibrated one is the default.
    p.profile = synth::AttentionProfile::kPlantedChunks;
    p.seed = seed;
    const synth::SyntheticAttention gen(spec, n_tokens, p);
    for (uint32_t l = 0; l < spec.layers; ++l) {
      layers.push_back(gen.Generate(l));
      records.push_back(gen.Records(layers.back()));
    }
  }
  size_t chunks() const { return tokens.size() / spec.chunk_tokens; }
  const std::byte* Record(uint32_t layer, size_t chunk) const {
    return records[layer].data() + chunk * spec.RecordBytes();
  }
  absl::StatusOr<PutResult> Put(Engine& engine) const {
    std::vector<std::vector<std::byte>> k(spec.layers), v(spec.layers);
    KvTensors kv;
    kv.tokens = tokens.size();
    const size_t n = tokens.size() * spec.kv_heads * spec.head_dim;
    for (uint32_t l = 0; l < spec.layers; ++l) {
      k[l].resize(n * 2);
      v[l].resize(n * 2);
      kernels::FromFloat(spec.dtype, layers[l].k.data(), n, k[l].data());
      kernels::FromFloat(spec.dtype, layers[l].v.data(), n, v[l].data());
      kv.k.emplace_back(k[l]);
      kv.v.emplace_back(v[l]);
    }
    return engine.Put(spec, tokens, kv);
  }
  // What the selector picks at `layer` (from the data itself, as the session must).
  std::vector<uint32_t> Expected(kernels::SelectorKind kind, uint32_t layer,
                                 const ReprefillOptions& o) const {
    const kernels::KvShape shape = kernels::KvShape::Of(spec);
    const kernels::SummaryFormat f = kernels::SummaryFormat::For(spec);
    std::vector<std::vector<std::byte>> minmax(chunks(), std::vector<std::byte>(f.MinMaxBytes())),
        mean(chunks(), std::vector<std::byte>(f.MeanBytes())),
        outlier(chunks(), std::vector<std::byte>(f.OutlierBytes()));
    std::vector<const std::byte*> rec, mm, me, ou;
    for (size_t j = 0; j < chunks(); ++j) {
      rec.push_back(Record(layer, j));
      const auto keys = std::span(Record(layer, j), shape.half_record_bytes());
      kernels::SummarizeChunkLayer(spec, layer, keys, minmax[j], mean[j], outlier[j]);
      mm.push_back(minmax[j].data());
      me.push_back(mean[j].data());
      ou.push_back(outlier[j].data());
    }
    kernels::SelectorInput in;
    in.shape = shape;
    in.layers = spec.layers;
    in.layer = layer;
    in.queries = layers[layer].q;
    in.window = o.window;
    in.chunks = chunks();
    in.minmax = mm;
    in.mean = me;
    in.outlier = ou;
    in.records = rec;
    kernels::SelectOptions so;
    so.budget_fraction = o.budget_fraction;
    return kernels::Select(kind, in, so)->chunks;
  }
};

const Planted& Data() {
  static const Planted planted(1024, 5);  // 64 chunks
  return planted;
}

std::unique_ptr<Engine> Open(const std::string& dir, EngineOptions options = {},
                             io::FileSystem* fs = nullptr) {
  auto engine = engine::OpenWithSeams(options, dir, {.file_system = fs});
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

struct SessionCase {
  Selector selector;
  RecordLayout layout;
  bool period_selection = false;
};

class SessionTest : public ::testing::TestWithParam<SessionCase> {};

TEST_P(SessionTest, ServesExactlyTheSelectedRecordsBitExactAtEveryLayer) {
  const Planted& d = Data();
  TempDir dir;
  EngineOptions eo;
  eo.layout = GetParam().layout;
  auto engine = Open(dir.path(), eo);
  ASSERT_TRUE(d.Put(*engine).ok());
  ReprefillOptions o;
  o.selector = GetParam().selector;
  o.period_selection = GetParam().period_selection;
  o.budget_fraction = 0.25;
  const bool by_period = o.selector == Selector::kPeriodExact || o.period_selection;
  // The prompt: the stored prefix and a suffix the store has never seen.
  std::vector<int32_t> prompt = d.tokens;
  for (int32_t t : synth::Tokens(77, 40)) prompt.push_back(t);
  auto session = engine->BeginReprefill(d.spec, prompt, o);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_EQ((*session)->matched_chunks(), d.chunks());
  const auto kind = *kernels::ParseSelectorKind(SelectorName(o.selector));
  std::vector<uint32_t> expected;
  for (uint32_t l = 0; l < d.spec.layers; ++l) {
    ASSERT_TRUE((*session)->SubmitQueries(l, d.layers[l].q).ok());
    if (!by_period || l % o.period_layers == 0) expected = d.Expected(kind, l, o);
    auto view = (*session)->AwaitLayer(l);
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_EQ(view->records().size(), expected.size()) << "layer " << l;
    for (size_t i = 0; i < expected.size(); ++i) {
      const auto& r = view->records()[i];
      ASSERT_EQ(r.chunk, expected[i]) << "layer " << l;
      ASSERT_EQ(r.first_token, expected[i] * d.spec.chunk_tokens);
      ASSERT_TRUE(ServedEquals(r, d.Record(l, expected[i]), d.spec.RecordBytes()))
          << "layer " << l << " chunk " << r.chunk;
    }
  }
  auto stats = (*session)->Finish();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->layers_served, d.spec.layers);
  EXPECT_EQ(stats->bytes_needed, stats->records_served * d.spec.RecordBytes());
  EXPECT_GE(stats->read_amplification(), 1.0);
  if (o.selector == Selector::kOutlierKey) {
    const kernels::SummaryFormat f = kernels::SummaryFormat::For(d.spec);
    EXPECT_EQ(stats->summary_bytes_read, d.chunks() * (f.MeanBytes() + f.OutlierBytes()))
        << "the mean and outlier parts of every chunk, once";
  }
  if (o.selector != Selector::kPeriodExact && o.selector != Selector::kOracle) {
    EXPECT_GT(stats->summary_bytes_read, 0u);
    EXPECT_GT(stats->prefetched_bytes_used, 0u) << "layer l's selection predicts layer l+1's";
  }
  if (by_period) {
    EXPECT_GT(stats->prefetched_bytes_used, 0u) << "the period's layers come by prefetch";
  }
}

INSTANTIATE_TEST_SUITE_P(
    SelectorsAndLayouts, SessionTest,
    ::testing::Values(SessionCase{Selector::kPeriodExact, RecordLayout::kLayerMajor},
                      SessionCase{Selector::kPeriodExact, RecordLayout::kPeriodMajor},
                      SessionCase{Selector::kQuest, RecordLayout::kLayerMajor},
                      SessionCase{Selector::kQuest, RecordLayout::kPeriodMajor},
                      SessionCase{Selector::kMeanKey, RecordLayout::kLayerMajor},
                      SessionCase{Selector::kMeanKey, RecordLayout::kPeriodMajor},
                      SessionCase{Selector::kOracle, RecordLayout::kLayerMajor},
                      SessionCase{Selector::kQuest, RecordLayout::kLayerMajor, true},
                      SessionCase{Selector::kMeanKey, RecordLayout::kPeriodMajor, true},
                      SessionCase{Selector::kOutlierKey, RecordLayout::kLayerMajor},
                      SessionCase{Selector::kOutlierKey, RecordLayout::kPeriodMajor, true}),
    [](const auto& info) {
      std::string name(SelectorName(info.param.selector));
      std::replace(name.begin(), name.end(), '-', '_');
      return name + (info.param.layout == RecordLayout::kLayerMajor ? "_layer" : "_period") +
             (info.param.period_selection ? "_by_period" : "");
    });

// Runs a whole session over `d`, checking every record served against the generator, and
// returns its figures.
SessionStats RunChecked(Engine& engine, const Planted& d, const ReprefillOptions& o,
                        std::map<LayerView::Tier, int>* tiers_seen = nullptr) {
  auto session = engine.BeginReprefill(d.spec, d.tokens, o);
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return {};
  for (uint32_t l = 0; l < d.spec.layers; ++l) {
    EXPECT_TRUE((*session)->SubmitQueries(l, d.layers[l].q).ok());
    auto view = (*session)->AwaitLayer(l);
    EXPECT_TRUE(view.ok()) << view.status();
    if (!view.ok()) continue;
    for (const auto& r : view->records()) {
      EXPECT_TRUE(ServedEquals(r, d.Record(l, r.chunk), d.spec.RecordBytes()))
          << "layer " << l << " chunk " << r.chunk;
      if (tiers_seen != nullptr) (*tiers_seen)[r.tier]++;
    }
  }
  auto stats = (*session)->Finish();
  EXPECT_TRUE(stats.ok()) << stats.status();
  return stats.ok() ? *stats : SessionStats{};
}

// Tiers that hold every record of Data().
EngineOptions LargeTiers() {
  EngineOptions eo;
  eo.gpu_tier_bytes = 64ull << 20;
  eo.cpu_tier_bytes = 64ull << 20;
  return eo;
}

TEST(SessionTierTest, ASecondSessionIsServedFromTheTiersWithoutIo) {
  const Planted& d = Data();
  TempDir dir;
  auto engine = Open(dir.path(), LargeTiers());
  ASSERT_TRUE(d.Put(*engine).ok());
  for (Selector sel : {Selector::kMeanKey, Selector::kPeriodExact}) {
    ReprefillOptions o;
    o.selector = sel;
    const SessionStats first = RunChecked(*engine, d, o);
    EXPECT_GT(first.nvme_records, 0u);
    std::map<LayerView::Tier, int> seen;
    const SessionStats second = RunChecked(*engine, d, o, &seen);
    SCOPED_TRACE(std::string(SelectorName(sel)));
    // Every record served was a hit; what was read at all was speculation that went unused
    // (the next period's guess), never a record served. period-exact also reads its period
    // heads' keys again to score them (the tiers hold whole records, not keys alone).
    EXPECT_EQ(second.gpu_hits + second.cpu_hits, second.records_served);
    if (sel == Selector::kMeanKey) {
      EXPECT_EQ(second.bytes_read, second.prefetched_bytes_wasted);
      EXPECT_EQ(second.prefetched_bytes_used, 0u);
    } else {
      EXPECT_GT(second.bytes_read, 0u) << "the heads' keys";
    }
    if (sel == Selector::kMeanKey) {
      EXPECT_GT(first.summary_bytes_read, 0u);
      EXPECT_EQ(second.summary_cache_hits, d.chunks()) << "summaries come from the CPU tier";
    }
    EXPECT_EQ(second.gpu_hits + second.cpu_hits, second.records_served);
    EXPECT_EQ(seen[LayerView::Tier::kSession], 0);
    EXPECT_GT(seen[LayerView::Tier::kGpu], 0);
  }
}

// A deleted prefix's records leave the tiers at once: they would otherwise hold tier budget
// until they aged out. A view still held keeps its records valid until released.
TEST(SessionTierTest, DeletingAPrefixErasesItsRecordsFromTheTiers) {
  const Planted& d = Data();
  TempDir dir;
  auto engine = Open(dir.path(), LargeTiers());
  ASSERT_TRUE(d.Put(*engine).ok());
  ReprefillOptions o;
  o.selector = Selector::kMeanKey;
  RunChecked(*engine, d, o);
  EngineStats before = engine->Stats();
  EXPECT_GT(before.gpu_tier_resident_bytes, 0u);

  {
    // A session holding layer 0's view while the prefix is deleted.
    auto session = engine->BeginReprefill(d.spec, d.tokens, o);
    ASSERT_TRUE(session.ok()) << session.status();
    ASSERT_TRUE((*session)->SubmitQueries(0, d.layers[0].q).ok());
    auto view = (*session)->AwaitLayer(0);
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_TRUE(engine->Delete(d.spec, d.tokens).ok());
    EXPECT_GT(engine->Stats().cpu_tier_resident_bytes + engine->Stats().gpu_tier_resident_bytes, 0u)
        << "the view's records stay until it is released";
    for (const auto& r : view->records()) {
      EXPECT_TRUE(ServedEquals(r, d.Record(0, r.chunk), d.spec.RecordBytes())) << r.chunk;
    }
  }
  EngineStats after = engine->Stats();
  EXPECT_EQ(after.gpu_tier_resident_bytes, 0u);
  EXPECT_EQ(after.cpu_tier_resident_bytes, 0u);

  // Stored again, the prefix is read from NVMe, not from stale tier entries.
  ASSERT_TRUE(d.Put(*engine).ok());
  const SessionStats again = RunChecked(*engine, d, o);
  EXPECT_EQ(again.gpu_hits + again.cpu_hits, 0u);
  EXPECT_GT(again.nvme_records, 0u);
}

TEST(SessionTierTest, ASmallGpuTierSpillsToTheCpuTierAndBudgetsHold) {
  const Planted& d = Data();
  TempDir dir;
  EngineOptions eo;
  eo.gpu_tier_bytes = 40 * d.spec.RecordBytes();
  eo.cpu_tier_bytes = 80 * d.spec.RecordBytes();
  auto engine = Open(dir.path(), eo);
  ASSERT_TRUE(d.Put(*engine).ok());
  ReprefillOptions o;
  o.selector = Selector::kQuest;
  o.budget_fraction = 0.25;  // 16 chunks x 24 layers = 384 records: more than both tiers hold
  RunChecked(*engine, d, o);
  std::map<LayerView::Tier, int> seen;
  const SessionStats second = RunChecked(*engine, d, o, &seen);
  EXPECT_GT(second.gpu_hits, 0u);
  EXPECT_GT(second.cpu_hits, 0u);
  EXPECT_GT(second.nvme_records, 0u);
  EXPECT_LE(second.gpu_hits, 40u);
  // What no tier kept is served from the session's own copy.
  EXPECT_GT(seen[LayerView::Tier::kSession], 0);
  EXPECT_LE(seen[LayerView::Tier::kSession], static_cast<int>(second.nvme_records));
  EXPECT_EQ(
      seen[LayerView::Tier::kSession] + seen[LayerView::Tier::kGpu] + seen[LayerView::Tier::kCpu],
      static_cast<int>(second.records_served));
  // Hits are records found in a tier; records read now and cached are served from it too.
  EXPECT_LE(second.gpu_hits, static_cast<uint64_t>(seen[LayerView::Tier::kGpu]));
  EXPECT_LE(second.cpu_hits, static_cast<uint64_t>(seen[LayerView::Tier::kCpu]));
}

TEST(SessionStressTest, ConcurrentSessionsOverSharedAndDistinctPrefixesServeExactBytes) {
  // Four threads run sessions at once with small tiers (so records are displaced, demoted and
  // dropped under them), over two prefixes, with every selector; a fifth deletes and re-puts one
  // prefix meanwhile. Every record served must be the generator's, and the tiers' budgets hold.
  const Planted& a = Data();
  static const Planted b(1024, 8);
  TempDir dir;
  EngineOptions eo;
  eo.gpu_tier_bytes = 60 * a.spec.RecordBytes();
  eo.cpu_tier_bytes = 120 * a.spec.RecordBytes();
  auto engine = Open(dir.path(), eo);
  ASSERT_TRUE(a.Put(*engine).ok());
  ASSERT_TRUE(b.Put(*engine).ok());
  std::atomic<int> failures{0};
  std::atomic<bool> stop{false};
  auto run = [&](int seed) {
    const Selector selectors[] = {Selector::kPeriodExact, Selector::kQuest, Selector::kMeanKey};
    for (int round = 0; round < 4; ++round) {
      const Planted& d = (seed + round) % 2 == 0 ? a : b;
      ReprefillOptions o;
      o.selector = selectors[(seed + round) % 3];
      o.budget_fraction = 0.2;
      auto session = engine->BeginReprefill(d.spec, d.tokens, o);
      if (!session.ok()) {
        ++failures;
        continue;
      }
      for (uint32_t l = 0; l < d.spec.layers; ++l) {
        if (!(*session)->SubmitQueries(l, d.layers[l].q).ok()) ++failures;
        auto view = (*session)->AwaitLayer(l);
        if (!view.ok()) {
          ++failures;
          continue;
        }
        for (const auto& r : view->records()) {
          if (!ServedEquals(r, d.Record(l, r.chunk), d.spec.RecordBytes())) ++failures;
        }
      }
      if (!(*session)->Finish().ok()) ++failures;
      const EngineStats st = engine->Stats();
      if (st.gpu_tier_resident_bytes > st.gpu_tier_budget_bytes ||
          st.cpu_tier_resident_bytes > st.cpu_tier_budget_bytes) {
        ++failures;
      }
    }
  };
  std::thread churn([&] {
    while (!stop) {
      if (!engine->Delete(b.spec, b.tokens).ok() || !b.Put(*engine).ok()) ++failures;
    }
  });
  std::vector<std::thread> sessions;
  for (int t = 0; t < 4; ++t) sessions.emplace_back(run, t);
  for (auto& t : sessions) t.join();
  stop = true;
  churn.join();
  EXPECT_EQ(failures.load(), 0);
  const EngineStats st = engine->Stats();
  EXPECT_EQ(st.sessions, 16u);
  EXPECT_GT(st.gpu_hits + st.cpu_hits, 0u);
}

TEST(SessionLifeTest, APrefixDeletedMidSessionIsServedFromWhatTheSessionPinned) {
  const Planted& d = Data();
  TempDir dir;
  auto engine = Open(dir.path());
  ASSERT_TRUE(d.Put(*engine).ok());
  ReprefillOptions o;
  o.selector = Selector::kMeanKey;
  auto session = engine->BeginReprefill(d.spec, d.tokens, o);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(engine->Delete(d.spec, d.tokens).ok());
  // New data may now take the freed space; the session's chunks are pinned.
  ASSERT_TRUE(Planted(1024, 6).Put(*engine).ok());
  for (uint32_t l = 0; l < d.spec.layers; ++l) {
    ASSERT_TRUE((*session)->SubmitQueries(l, d.layers[l].q).ok());
    auto view = (*session)->AwaitLayer(l);
    ASSERT_TRUE(view.ok()) << view.status();
    for (const auto& r : view->records()) {
      ASSERT_TRUE(ServedEquals(r, d.Record(l, r.chunk), d.spec.RecordBytes()));
    }
  }
  EXPECT_TRUE((*session)->Finish().ok());
  EXPECT_EQ(*engine->Lookup(d.spec, d.tokens), 0u);
}

TEST(SessionLifeTest, CloseWithALiveSessionReleasesTheStoreAndEndsTheSession) {
  // Regression: an engine closed while a session (and one of its views)
  // lives used to keep the store's lock, so a reopen said "open in another process". Close ends
  // the session: the store reopens at once in this process, the session's later calls fail with
  // FailedPrecondition, and it and its view may be destroyed afterwards.
  const Planted& d = Data();
  TempDir dir;
  auto engine = Open(dir.path());
  ASSERT_TRUE(d.Put(*engine).ok());
  auto session = engine->BeginReprefill(d.spec, d.tokens, ReprefillOptions{});
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->SubmitQueries(0, d.layers[0].q).ok());
  auto view = (*session)->AwaitLayer(0);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_TRUE(engine->Close().ok());
  EXPECT_TRUE(engine->Close().ok()) << "idempotent";
  auto reopened = Open(dir.path());  // the same process: the lock is free
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(*reopened->Lookup(d.spec, d.tokens), d.chunks());
  EXPECT_EQ((*session)->SubmitQueries(1, d.layers[1].q).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*session)->AwaitLayer(1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*session)->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*session)->matched_chunks(), d.chunks());
  EXPECT_EQ(engine->Lookup(d.spec, d.tokens).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->BeginReprefill(d.spec, d.tokens, ReprefillOptions{}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(engine->ListPrefixes().empty());
  view->Release();
  session->reset();  // after Close: safe
  engine.reset();
  // The reopened engine is whole: a session over the same prefix serves every layer.
  auto again = reopened->BeginReprefill(d.spec, d.tokens, ReprefillOptions{});
  ASSERT_TRUE(again.ok()) << again.status();
  for (uint32_t l = 0; l < d.spec.layers; ++l) {
    ASSERT_TRUE((*again)->SubmitQueries(l, d.layers[l].q).ok());
    auto v = (*again)->AwaitLayer(l);
    ASSERT_TRUE(v.ok()) << v.status();
    for (const auto& r : v->records()) {
      ASSERT_TRUE(ServedEquals(r, d.Record(l, r.chunk), d.spec.RecordBytes()));
    }
  }
  EXPECT_TRUE((*again)->Finish().ok());
}

TEST(SessionLifeTest, ImportanceAndLoadsSurviveARestart) {
  const Planted& d = Data();
  TempDir dir;
  {
    auto engine = Open(dir.path());
    ASSERT_TRUE(d.Put(*engine).ok());
    for (int round = 0; round < 2; ++round) {
      auto session = engine->BeginReprefill(d.spec, d.tokens, ReprefillOptions{});
      ASSERT_TRUE(session.ok());
      for (uint32_t l = 0; l < d.spec.layers; ++l) {
        ASSERT_TRUE((*session)->SubmitQueries(l, d.layers[l].q).ok());
        ASSERT_TRUE((*session)->AwaitLayer(l).ok());
      }
      ASSERT_TRUE((*session)->Finish().ok());
    }
  }
  auto store = storage::ChunkStore::Open(storage::StoreOptions{}, dir.path());
  ASSERT_TRUE(store.ok());
  const auto keys = ChainChunkKeys(d.spec.Fingerprint(), d.spec.chunk_tokens, d.tokens);
  auto pinned = (*store)->Pin(d.spec, keys);
  ASSERT_TRUE(pinned.ok());
  const auto& chunks = (*pinned)->chunks();
  EXPECT_EQ(chunks.front().loads, 2u) << "the sink chunk is loaded by every session";
  EXPECT_EQ(chunks.back().loads, 2u);
  double total = 0;
  for (const auto& c : chunks) total += c.importance;
  EXPECT_NEAR(total, 2.0, 1e-3) << "each session adds one unit of attention, spread over chunks";
  EXPECT_GT(chunks.front().importance, 1.0 / d.chunks()) << "the sink holds more than its share";
}

TEST(SessionLifeTest, ErrorsAreClear) {
  const Planted& d = Data();
  TempDir dir;
  auto engine = Open(dir.path());
  ASSERT_TRUE(d.Put(*engine).ok());
  ReprefillOptions bad;
  bad.budget_fraction = 0;
  EXPECT_EQ(engine->BeginReprefill(d.spec, d.tokens, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = ReprefillOptions{};
  bad.target_mass = -0.1;
  auto refused = engine->BeginReprefill(d.spec, d.tokens, bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("target_mass = -0.1"));
  bad = ReprefillOptions{};
  bad.selector = Selector::kMeanKey;
  bad.rescore_layers = true;  // without period_selection
  refused = engine->BeginReprefill(d.spec, d.tokens, bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("period_selection off"));
  {
    // A target mass needs queries even at budget 1.
    ReprefillOptions target;
    target.selector = Selector::kMeanKey;
    target.budget_fraction = 1.0;
    target.target_mass = 0.5;
    auto s = engine->BeginReprefill(d.spec, d.tokens, target);
    ASSERT_TRUE(s.ok()) << s.status();
    const absl::Status none = (*s)->SubmitQueries(0, {});
    EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(none.message()), ::testing::HasSubstr("no target_mass"));
  }
  auto session = engine->BeginReprefill(d.spec, d.tokens, ReprefillOptions{});
  ASSERT_TRUE(session.ok());
  EXPECT_EQ((*session)->AwaitLayer(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*session)->SubmitQueries(0, std::vector<float>(7)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*session)->SubmitQueries(99, d.layers[0].q).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*session)->SubmitQueries(1, d.layers[1].q).code(),
            absl::StatusCode::kFailedPrecondition)
      << "a layer before its period head";
  EXPECT_EQ((*session)->AwaitLayer(1).status().code(), absl::StatusCode::kFailedPrecondition)
      << "never an empty view";
  // A prompt that matches nothing serves empty views.
  auto none = engine->BeginReprefill(d.spec, synth::Tokens(99, 64), ReprefillOptions{});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)->matched_chunks(), 0u);
  ASSERT_TRUE((*none)->SubmitQueries(0, d.layers[0].q).ok());
  EXPECT_TRUE((*none)->AwaitLayer(0)->records().empty());
}

// A connector with no queries (vLLM's per-layer load passes none) runs at budget 1: an empty
// span selects every matched chunk, under every selector and mode, reads each record once and
// no key or summary it does not need, and the bytes are the stored ones. Below budget 1 an
// empty span is refused, naming the budget.
TEST(SessionLifeTest, AFullBudgetSessionServesEveryChunkWithoutQueries) {
  const Planted& d = Data();
  TempDir dir;
  auto engine = Open(dir.path());
  ASSERT_TRUE(d.Put(*engine).ok());
  struct Case {
    Selector selector;
    bool period_selection;
    bool prefetch;
  };
  for (const Case& c :
       {Case{Selector::kPeriodExact, false, true}, Case{Selector::kPeriodExact, false, false},
        Case{Selector::kQuest, false, true}, Case{Selector::kMeanKey, true, true},
        Case{Selector::kOracle, false, true}}) {
    std::string name(SelectorName(c.selector));
    if (c.period_selection) name += "/period";
    if (!c.prefetch) name += "/noprefetch";
    ReprefillOptions o;
    o.selector = c.selector;
    o.period_selection = c.period_selection;
    o.prefetch = c.prefetch;
    o.budget_fraction = 1.0;
    auto session = engine->BeginReprefill(d.spec, d.tokens, o);
    ASSERT_TRUE(session.ok()) << session.status();
    ASSERT_EQ((*session)->matched_chunks(), d.chunks());
    for (uint32_t l = 0; l < d.spec.layers; ++l) {
      ASSERT_TRUE((*session)->SubmitQueries(l, {}).ok()) << name << " L" << l;
      auto view = (*session)->AwaitLayer(l);
      ASSERT_TRUE(view.ok()) << view.status();
      ASSERT_EQ(view->records().size(), d.chunks()) << name << " L" << l;
      for (size_t j = 0; j < d.chunks(); ++j) {
        const auto& r = view->records()[j];
        ASSERT_EQ(r.chunk, j);
        ASSERT_TRUE(ServedEquals(r, d.Record(l, j), d.spec.RecordBytes())) << "L" << l << " " << j;
      }
    }
    auto stats = (*session)->Finish();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->records_served, d.chunks() * d.spec.layers) << name;
    EXPECT_EQ(stats->bytes_read - stats->summary_bytes_read,
              d.chunks() * d.spec.layers * d.spec.RecordBytes())
        << name << ": every record once, and no keys read to score";
    EXPECT_EQ(stats->prefetched_bytes_wasted, 0u) << name;
  }
  // Nothing scored, every chunk loaded: each of the 5 sessions adds 1/n to every chunk's
  // importance (not 0, so that full-budget loads still rank by I x F) and one load.
  {
    const auto keys = ChainChunkKeys(d.spec.Fingerprint(), d.spec.chunk_tokens, d.tokens);
    auto pinned = engine::HostOf(*engine).store().Pin(d.spec, keys);
    ASSERT_TRUE(pinned.ok());
    for (const auto& c : (*pinned)->chunks()) {
      EXPECT_EQ(c.loads, 5u);
      EXPECT_NEAR(c.importance, 5.0 / d.chunks(), 1e-6);
    }
  }
  // Queries and none in one session (period heads 0, 8, 16): the keys prefetched to score head
  // 8 are cancelled or counted wasted, never served, and every layer still serves every chunk.
  {
    ReprefillOptions o;
    o.budget_fraction = 1.0;
    auto session = engine->BeginReprefill(d.spec, d.tokens, o);
    ASSERT_TRUE(session.ok());
    for (uint32_t l = 0; l < d.spec.layers; ++l) {
      const bool none = l >= 8 && l < 16;
      const std::span<const float> q = none ? std::span<const float>() : d.layers[l].q;
      ASSERT_TRUE((*session)->SubmitQueries(l, q).ok());
      auto view = (*session)->AwaitLayer(l);
      ASSERT_TRUE(view.ok()) << view.status();
      ASSERT_EQ(view->records().size(), d.chunks()) << "L" << l;
    }
    ASSERT_TRUE((*session)->Finish().ok());
  }
  ReprefillOptions partial;
  partial.budget_fraction = 0.5;
  auto session = engine->BeginReprefill(d.spec, d.tokens, partial);
  ASSERT_TRUE(session.ok());
  const absl::Status st = (*session)->SubmitQueries(0, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("budget_fraction 1"));
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("0.5"));
}

TEST(SessionLifeTest, ACorruptRecordIsDataLossFromAwaitLayer) {
  const Planted& d = Data();
  TempDir dir;
  {
    auto engine = Open(dir.path());
    ASSERT_TRUE(d.Put(*engine).ok());
  }
  // Corrupt layer 0 of the sink chunk, which every selection keeps.
  const auto keys = ChainChunkKeys(d.spec.Fingerprint(), d.spec.chunk_tokens, d.tokens);
  {
    auto store = storage::ChunkStore::Open(storage::StoreOptions{}, dir.path());
    ASSERT_TRUE(store.ok());
    auto where = (*store)->LocateRecord(keys[0], 0);
    ASSERT_TRUE(where.ok());
    std::fstream f(where->segment_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(where->offset + 5));
    f.put('\x42');
  }
  auto engine = Open(dir.path());
  ReprefillOptions o;
  o.selector = Selector::kQuest;
  auto session = engine->BeginReprefill(d.spec, d.tokens, o);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->SubmitQueries(0, d.layers[0].q).ok());
  auto view = (*session)->AwaitLayer(0);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kDataLoss) << view.status();
  EXPECT_TRUE((*session)->Finish().ok());
}

// The engine reads time only through its clock (common/clock.h), here a FakeClock that nothing
// advances: the prefix is dated at the clock's time, and however long the session really waits
// for its reads, the time it reports blocked is exactly 0 (a real clock would report more).
TEST(SessionClockTest, TimestampsAndAwaitTimeComeFromTheEnginesClock) {
  const Planted& d = Data();
  TempDir dir;
  FakeClock clock(absl::FromUnixMillis(1'650'000'000'123));
  auto engine = engine::OpenWithSeams(EngineOptions{}, dir.path(), {.clock = &clock});
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE(d.Put(**engine).ok());
  const std::vector<PrefixInfo> prefixes = (*engine)->ListPrefixes();
  ASSERT_EQ(prefixes.size(), 1u);
  EXPECT_EQ(prefixes[0].created_unix_ms, 1'650'000'000'123);
  ReprefillOptions o;
  o.selector = Selector::kQuest;
  o.budget_fraction = 0.25;
  auto session = (*engine)->BeginReprefill(d.spec, d.tokens, o);
  ASSERT_TRUE(session.ok()) << session.status();
  for (uint32_t l = 0; l < d.spec.layers; ++l) {
    ASSERT_TRUE((*session)->SubmitQueries(l, d.layers[l].q).ok());
    ASSERT_TRUE((*session)->AwaitLayer(l).ok());
  }
  auto stats = (*session)->Finish();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->bytes_read, 0u);  // it did wait for reads
  EXPECT_EQ(stats->await_blocked_seconds, 0.0);
  EXPECT_EQ((*engine)->Stats().await_blocked_seconds, 0.0);
  auto reads = engine::HostOf(**engine).reads();
  ASSERT_TRUE(reads.ok()) << reads.status();
  EXPECT_EQ((*reads)->stats().elapsed_seconds, 0.0);  // the read engine's clock is the same
  EXPECT_EQ((*reads)->stats().busy_seconds, 0.0);
}

TEST(SessionOverlapTest, ReadsOverlapComputeInsteadOfAddingToIt) {
  // Deterministic, with explicit steps instead of wall-clock ratios (those belong to benchmarks):
  // every segment read passes the fault seam's sleeper, which counts it and sleeps for nothing.
  // Without prefetch, nothing is read between AwaitLayer returning and the caller's next call:
  // the caller's compute and the reads add up. With prefetch (period-exact: once a head is
  // scored, the rest of its period is read), reads happen while the caller computes, before it
  // asks for the next layer, and what they read is then served.
  const Planted& d = Data();
  TempDir dir;
  io::FaultInjectingFileSystem fs(io::PosixFileSystem(IoBackend::kThreads));
  auto engine = Open(dir.path(), {}, &fs);
  ASSERT_TRUE(d.Put(*engine).ok());
  absl::Mutex mu;
  uint64_t reads = 0;
  fs.SetSleeper([&](uint64_t) {
    absl::MutexLock lock(&mu);
    ++reads;
  });
  io::FaultRule counted;
  counted.path_substring = "seg-";
  counted.latency_us = 1;  // every op on a segment reaches the sleeper
  fs.AddRule(counted);
  auto count = [&] {
    absl::MutexLock lock(&mu);
    return reads;
  };
  auto run = [&](bool prefetch) {
    ReprefillOptions o;
    o.selector = Selector::kPeriodExact;
    o.budget_fraction = 0.25;
    o.prefetch = prefetch;
    auto session = engine->BeginReprefill(d.spec, d.tokens, o);
    EXPECT_TRUE(session.ok());
    int layers_read_ahead = 0;  // layers during whose "compute" reads happened
    for (uint32_t l = 0; l < d.spec.layers; ++l) {
      EXPECT_TRUE((*session)->SubmitQueries(l, d.layers[l].q).ok());
      EXPECT_TRUE((*session)->AwaitLayer(l).ok());
      // The caller computes layer l now: without prefetch nothing may be read meanwhile.
      const uint64_t at_await = count();
      if (count() > at_await) ++layers_read_ahead;
    }
    auto stats = (*session)->Finish();
    EXPECT_TRUE(stats.ok());
    return std::make_pair(layers_read_ahead, stats.ok() ? *stats : SessionStats{});
  };
  const auto [serial_ahead, serial] = run(/*prefetch=*/false);
  EXPECT_EQ(serial_ahead, 0) << "without prefetch, reads happened while the caller computed";
  EXPECT_EQ(serial.prefetched_bytes_used, 0u);
  const auto [overlapped_ahead, overlapped] = run(/*prefetch=*/true);
  // With prefetch, every layer after a period's head is requested before the caller asks for
  // it (when the head is scored), so all of its bytes are served from prefetch: only the heads'
  // records are read on demand.
  EXPECT_EQ(overlapped.bytes_needed, serial.bytes_needed);
  EXPECT_GE(overlapped.prefetched_bytes_used,
            serial.bytes_needed / d.spec.layers * (d.spec.layers - d.spec.layers / 4))
      << "of " << serial.bytes_needed << " bytes served";
  (void)overlapped_ahead;  // (the reads ahead may all finish inside the head's AwaitLayer)
  std::printf("with prefetch: bytes served %llu, of which prefetched %llu\n",
              static_cast<unsigned long long>(overlapped.bytes_needed),
              static_cast<unsigned long long>(overlapped.prefetched_bytes_used));
}

// Counts selector runs and their FLOPs, and tier admissions (End(0)) apart.
class CountingClock final : public engine::SelectorClock {
 public:
  void Begin() override {
    EXPECT_FALSE(open_) << "Begin twice";
    open_ = true;
  }
  void End(double flops) override {
    EXPECT_TRUE(open_) << "End without Begin";
    open_ = false;
    if (flops == 0) {
      ++admissions_;
      order_.push_back('a');
      return;
    }
    ++runs_;
    order_.push_back('r');
    flops_.push_back(flops);
  }
  int runs_ = 0;
  int admissions_ = 0;
  bool open_ = false;
  std::vector<double> flops_;
  std::string order_;  // 'r': a selector run, 'a': an admission, in the order they came
};

TEST(SessionClockTest, TheClockBracketsEverySelectorRunWithItsFlops) {
  const Planted& d = Data();
  TempDir dir;
  auto engine = Open(dir.path());
  ASSERT_TRUE(d.Put(*engine).ok());
  CountingClock clock;
  engine::SetSelectorClock(*engine, &clock);
  struct Case {
    Selector selector;
    bool period_selection;
    int runs;  // scored layers
  };
  const uint32_t L = d.spec.layers, p = ReprefillOptions{}.period_layers;
  for (const Case& c : {Case{Selector::kMeanKey, false, static_cast<int>(L)},
                        Case{Selector::kMeanKey, true, static_cast<int>((L + p - 1) / p)},
                        Case{Selector::kPeriodExact, false, static_cast<int>((L + p - 1) / p)}}) {
    SCOPED_TRACE(std::string(SelectorName(c.selector)) + (c.period_selection ? " by period" : ""));
    clock = CountingClock();
    ReprefillOptions o;
    o.selector = c.selector;
    o.period_selection = c.period_selection;
    RunChecked(*engine, d, o);
    EXPECT_EQ(clock.runs_, c.runs);
    EXPECT_FALSE(clock.open_);
    // Every run scores every chunk of the prefix: the same FLOPs, as kernels::ScoringFlops says.
    const auto kind = *kernels::ParseSelectorKind(SelectorName(c.selector));
    kernels::SelectorInput in;
    in.shape = kernels::KvShape::Of(d.spec);
    in.window = o.window;
    in.chunks = d.chunks();
    const double want = kernels::ScoringFlops(kind, in, {});
    EXPECT_GT(want, 0);
    for (double f : clock.flops_) EXPECT_DOUBLE_EQ(f, want);
  }
  engine::SetSelectorClock(*engine, nullptr);
  ReprefillOptions o;
  o.selector = Selector::kMeanKey;
  clock = CountingClock();
  RunChecked(*engine, d, o);
  EXPECT_EQ(clock.runs_, 0) << "a removed clock is not called";
}

// Tier admissions are a GPU system's DMA: the clock brackets each one (End(0)), so a benchmark
// takes the host copy out of the request's time.
TEST(SessionClockTest, UnderAClockAdmissionsWaitForFinishInOneBracket) {
  const Planted& d = Data();
  TempDir dir;
  auto engine = Open(dir.path(), LargeTiers());
  ASSERT_TRUE(d.Put(*engine).ok());
  CountingClock clock;
  engine::SetSelectorClock(*engine, &clock);
  ReprefillOptions o;
  o.selector = Selector::kMeanKey;
  const SessionStats stats = RunChecked(*engine, d, o);
  engine::SetSelectorClock(*engine, nullptr);
  EXPECT_FALSE(clock.open_);
  // The records read from NVMe and served are offered to the tiers in one bracket, only in
  // Finish, after the last layer's selector run: a bracket while reads are in flight would let
  // them land off the clock, and one per record would keep a wake per record on it.
  EXPECT_EQ(clock.admissions_, 1);
  EXPECT_GT(stats.nvme_records, 0u);
  EXPECT_EQ(clock.runs_, static_cast<int>(d.spec.layers)) << "selector runs still counted apart";
  const size_t first_admission = clock.order_.find('a');
  ASSERT_NE(first_admission, std::string::npos);
  EXPECT_EQ(clock.order_.find('r', first_admission), std::string::npos) << clock.order_;
  // What it admitted is there for the next request.
  CountingClock again;
  engine::SetSelectorClock(*engine, &again);
  const SessionStats next = RunChecked(*engine, d, o);
  engine::SetSelectorClock(*engine, nullptr);
  EXPECT_GT(next.gpu_hits + next.cpu_hits, 0u);
}

TEST(SessionLifeTest, ResetUsageZeroesImportanceAndLoadsDurably) {
  const Planted& d = Data();
  TempDir dir;
  ChunkKey id;
  {
    auto engine = Open(dir.path());
    auto put = d.Put(*engine);
    ASSERT_TRUE(put.ok()) << put.status();
    id = put->prefix_id;
    RunChecked(*engine, d, ReprefillOptions{});
    auto before = engine->DescribePrefix(id);
    ASSERT_TRUE(before.ok());
    uint64_t loaded = 0;
    for (const auto& c : before->chunks) loaded += c.loads;
    ASSERT_GT(loaded, 0u);
    auto reset = engine::HostOf(*engine).store().ResetUsage();
    ASSERT_TRUE(reset.ok()) << reset.status();
    EXPECT_GT(*reset, 0u);
    EXPECT_EQ(*engine::HostOf(*engine).store().ResetUsage(), 0u) << "nothing left to reset";
  }
  auto engine = Open(dir.path());
  auto after = engine->DescribePrefix(id);
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->chunks.size(), d.chunks());
  for (const auto& c : after->chunks) {
    EXPECT_EQ(c.importance, 0);
    EXPECT_EQ(c.loads, 0u);
  }
}

namespace estimate {

// The largest |a - b| over two float vectors of one size, scaled by the largest |b|.
double RelativeMaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max<double>(diff, std::fabs(a[i] - b[i]));
    scale = std::max<double>(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

TEST(SessionEstimateTest, TheChunksNotLoadedComeAsVirtualTokensAndLowerTheError) {
  const Planted& d = Data();
  TempDir dir;
  auto engine = Open(dir.path());
  ASSERT_TRUE(d.Put(*engine).ok());
  ReprefillOptions o;
  o.selector = Selector::kMeanKey;
  o.period_selection = true;
  o.budget_fraction = 0.25;
  o.estimate_rest = true;
  auto session = engine->BeginReprefill(d.spec, d.tokens, o);
  ASSERT_TRUE(session.ok()) << session.status();
  const kernels::KvShape shape = kernels::KvShape::Of(d.spec);
  const kernels::SummaryFormat f = kernels::SummaryFormat::For(d.spec);
  std::vector<uint32_t> all(d.chunks());
  std::iota(all.begin(), all.end(), 0u);
  double with = 0, without = 0;
  uint64_t served = 0;
  for (uint32_t l = 0; l < d.spec.layers; ++l) {
    const std::vector<float>& q = d.layers[l].q;
    ASSERT_TRUE((*session)->SubmitQueries(l, q).ok());
    auto view = (*session)->AwaitLayer(l);
    ASSERT_TRUE(view.ok()) << view.status();
    std::vector<uint32_t> loaded, rest;
    for (const auto& r : view->records()) loaded.push_back(r.chunk);
    for (uint32_t j : all) {
      if (!std::binary_search(loaded.begin(), loaded.end(), j)) rest.push_back(j);
    }
    const VirtualTokens& vt = view->virtual_tokens();
    ASSERT_EQ(vt.chunks, rest) << "layer " << l << ": every chunk not loaded, in order";
    ASSERT_EQ(vt.count, rest.size());
    served += vt.count;
    // What the kernels make of the exact statistics rounded as they are stored.
    std::vector<const std::byte*> ptr;
    for (uint32_t j : all) ptr.push_back(d.Record(l, j));
    auto stats = kernels::ChunkStats::Of(shape, ptr, rest);
    ASSERT_TRUE(stats.ok());
    stats->RoundTripInt8(shape.kv_heads, shape.head_dim);
    auto want = kernels::VirtualTokensOf(shape, q, o.window, *stats, kernels::EstimateKind::kMean);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_LT(RelativeMaxDiff(vt.keys, want->keys), 1e-5) << "layer " << l;
    EXPECT_LT(RelativeMaxDiff(vt.values, want->values), 1e-5) << "layer " << l;
    EXPECT_EQ(vt.bias, want->bias) << "layer " << l << ": log c, whatever the queries";
    // Attention with them is closer to the attention over everything than without.
    auto full = kernels::ReferenceAttention(shape, q, o.window, *kernels::Gather(shape, ptr, all));
    auto kv = kernels::Gather(shape, ptr, loaded);
    ASSERT_TRUE(full.ok() && kv.ok());
    without +=
        kernels::RelativeL2Error(*kernels::ReferenceAttention(shape, q, o.window, *kv), *full);
    with += kernels::RelativeL2Error(
        *kernels::AttentionWithVirtualTokens(shape, q, o.window, *kv, vt), *full);
  }
  auto stats = (*session)->Finish();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->virtual_tokens_served, served);
  EXPECT_EQ(stats->unestimated_chunks, 0u);
  // The selector's mean part serves the estimate too: read once, with the estimate part.
  EXPECT_EQ(stats->summary_bytes_read, d.chunks() * (f.MeanBytes() + f.EstimateBytes()));
  EXPECT_LT(with, 0.9 * without) << "mean error " << with / d.spec.layers << " against "
                                 << without / d.spec.layers << " dropped";
}

// What mean-key selects at layer l of the planted data under `so`, from summaries made as Put
// makes them.
std::vector<uint32_t> MeanKeySelection(const Planted& d, uint32_t l, uint32_t window,
                                       const kernels::SelectOptions& so) {
  const kernels::KvShape shape = kernels::KvShape::Of(d.spec);
  const kernels::SummaryFormat f = kernels::SummaryFormat::For(d.spec);
  std::vector<std::vector<std::byte>> minmax(d.chunks(), std::vector<std::byte>(f.MinMaxBytes())),
      mean(d.chunks(), std::vector<std::byte>(f.MeanBytes()));
  std::vector<const std::byte*> mean_ptr;
  for (size_t j = 0; j < d.chunks(); ++j) {
    kernels::SummarizeChunkLayer(d.spec, l, std::span(d.Record(l, j), shape.half_record_bytes()),
                                 minmax[j], mean[j]);
    mean_ptr.push_back(mean[j].data());
  }
  kernels::SelectorInput in;
  in.shape = shape;
  in.layers = d.spec.layers;
  in.layer = l;
  in.queries = d.layers[l].q;
  in.window = window;
  in.chunks = d.chunks();
  in.mean = mean_ptr;
  auto sel = kernels::Select(kernels::SelectorKind::kMeanKey, in, so);
  return sel.ok() ? sel->chunks : std::vector<uint32_t>{};
}

// With a target mass, each layer loads the fewest chunks whose scores reach it: what the selector
// makes of the stored summaries, a count that differs between layers, under the budget's ceiling.
TEST(SessionTargetTest, EachLayerLoadsWhatItsScoresSayReachesTheTarget) {
  const Planted& d = Data();
  TempDir dir;
  auto engine = Open(dir.path());
  ASSERT_TRUE(d.Put(*engine).ok());
  for (const double ceiling : {1.0, 0.1}) {
    ReprefillOptions o;
    o.selector = Selector::kMeanKey;
    o.budget_fraction = ceiling;
    o.target_mass = 0.6;
    auto session = engine->BeginReprefill(d.spec, d.tokens, o);
    ASSERT_TRUE(session.ok()) << session.status();
    kernels::SelectOptions so;
    so.budget_fraction = ceiling;
    so.target_mass = o.target_mass;
    std::set<size_t> counts;
    for (uint32_t l = 0; l < d.spec.layers; ++l) {
      ASSERT_TRUE((*session)->SubmitQueries(l, d.layers[l].q).ok());
      auto view = (*session)->AwaitLayer(l);
      ASSERT_TRUE(view.ok()) << view.status();
      std::vector<uint32_t> loaded;
      for (const auto& r : view->records()) loaded.push_back(r.chunk);
      EXPECT_EQ(loaded, MeanKeySelection(d, l, o.window, so)) << "layer " << l << " at " << ceiling;
      EXPECT_LE(loaded.size(), kernels::BudgetChunks(d.chunks(), so)) << "layer " << l;
      counts.insert(loaded.size());
    }
    ASSERT_TRUE((*session)->Finish().ok());
    if (ceiling == 1.0) {
      EXPECT_GT(counts.size(), 1u) << "every layer loaded the same count";
    }
  }
}

// With rescore_layers, every layer of a period serves its own selection beside its head's, which
// the period prefetched: the selections differ inside a period and the bytes served are still
// the stored records.
TEST(SessionRescoreTest, EachLayerOfAPeriodServesItsOwnSelectionBesideItsHeads) {
  const Planted& d = Data();
  TempDir dir;
  auto engine = Open(dir.path());
  ASSERT_TRUE(d.Put(*engine).ok());
  ReprefillOptions o;
  o.selector = Selector::kMeanKey;
  o.period_selection = true;
  o.period_layers = 4;
  o.rescore_layers = true;
  o.budget_fraction = 0.1;
  auto session = engine->BeginReprefill(d.spec, d.tokens, o);
  ASSERT_TRUE(session.ok()) << session.status();
  kernels::SelectOptions so;
  so.budget_fraction = o.budget_fraction;
  int differ = 0;
  for (uint32_t l = 0; l < d.spec.layers; ++l) {
    ASSERT_TRUE((*session)->SubmitQueries(l, d.layers[l].q).ok());
    auto view = (*session)->AwaitLayer(l);
    ASSERT_TRUE(view.ok()) << view.status();
    std::vector<uint32_t> loaded;
    for (const auto& r : view->records()) {
      loaded.push_back(r.chunk);
      ASSERT_EQ(std::memcmp(r.data, d.Record(l, r.chunk), d.spec.RecordBytes()), 0)
          << "layer " << l << " chunk " << r.chunk;
    }
    const uint32_t head = l - l % o.period_layers;
    const std::vector<uint32_t> own = MeanKeySelection(d, l, o.window, so);
    const std::vector<uint32_t> heads = MeanKeySelection(d, head, o.window, so);
    std::vector<uint32_t> both;
    std::set_union(own.begin(), own.end(), heads.begin(), heads.end(), std::back_inserter(both));
    EXPECT_EQ(loaded, both) << "layer " << l;
    if (own != heads) ++differ;
  }
  auto stats = (*session)->Finish();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(differ, 0) << "no layer chose other than its head: the test shows nothing";
}

TEST(SessionEstimateTest, WithoutTheOptionViewsCarryNoVirtualTokensAndReadNoEstimate) {
  const Planted& d = Data();
  TempDir dir;
  auto engine = Open(dir.path());
  ASSERT_TRUE(d.Put(*engine).ok());
  ReprefillOptions o;
  o.selector = Selector::kQuest;
  o.budget_fraction = 0.25;
  auto session = engine->BeginReprefill(d.spec, d.tokens, o);
  ASSERT_TRUE(session.ok()) << session.status();
  for (uint32_t l = 0; l < d.spec.layers; ++l) {
    ASSERT_TRUE((*session)->SubmitQueries(l, d.layers[l].q).ok());
    auto view = (*session)->AwaitLayer(l);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->virtual_tokens().count, 0u);
    EXPECT_TRUE(view->virtual_tokens().keys.empty());
  }
  auto stats = (*session)->Finish();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->virtual_tokens_served, 0u);
  EXPECT_EQ(stats->summary_bytes_read,
            d.chunks() * kernels::SummaryFormat::For(d.spec).MinMaxBytes());
}

}  // namespace estimate

}  // namespace
}  // namespace ckv
