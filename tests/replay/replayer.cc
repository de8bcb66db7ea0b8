// SPDX-License-Identifier: Apache-2.0
#include "tests/replay/replayer.h"

#include <cstdio>
#include <cstring>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/selector.h"
#include "kernels/summary.h"
#include "tools/synthetic_kv.h"
#include "tests/served_bytes.h"

namespace ckv::replay {
namespace {

using ::ckv::testing::ServedEquals;

using synth::Mix64;

// Leading entries of `keys` that `set` holds.
template <typename Set>
size_t LeadingRun(const std::vector<ChunkKey>& keys, const Set& set) {
  size_t n = 0;
  while (n < keys.size() && set.contains(keys[n])) ++n;
  return n;
}

std::string Where(const Turn& t) {
  return "conversation " + std::to_string(t.conversation) + " turn " + std::to_string(t.turn);
}

}  // namespace

Replayer::Replayer(Engine& engine, ReplayConfig config)
    : engine_(engine), config_(std::move(config)), record_(config_.spec.RecordBytes()) {
  engine_evicted_at_start_ = engine_.Stats().chunks_evicted;
}

void Replayer::Run(const Trace& trace) {
  for (const Turn& turn : trace.turns) {
    RunTurn(turn);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

std::vector<float> Replayer::Queries(const Turn& turn, uint32_t layer) const {
  const ModelSpec& s = config_.spec;
  std::vector<float> q(size_t{config_.reprefill.window} * s.q_heads * s.head_dim);
  const uint64_t base = Mix64(Mix64(Mix64(config_.query_seed) ^ turn.conversation) ^
                              (uint64_t{turn.turn} << 32 | layer));
  for (size_t i = 0; i < q.size(); ++i) {
    // 24 high bits of a hash, as a multiple of 2^-24 in [0, 1), onto [-2, 2): exact in float.
    const uint64_t h = Mix64(base + (i + 1) * 0x9e3779b97f4a7c15ull);
    q[i] = static_cast<float>(h >> 40) * (4.0f / 16777216.0f) - 2.0f;
  }
  return q;
}

// What the session must return at `layer`: kernels::Select run on the generated data of the
// matched chunks. quest, mean-key and oracle score every layer from that layer's queries.
// period-exact scores the period's head layer and serves every layer of the period with that
// selection (kernels/selector.h, ckv/session.h); prefetching and speculation change what is read
// ahead, never what is served, so the expected selection of layer l is exactly Select run at
// PeriodHead(l) with the head layer's queries. No selector needs a looser comparison.
std::vector<uint32_t> Replayer::ExpectedSelection(const std::vector<ChunkKey>& keys, size_t matched,
                                                  uint32_t layer,
                                                  std::span<const float> queries) const {
  const ModelSpec& s = config_.spec;
  const kernels::KvShape shape = kernels::KvShape::Of(s);
  const kernels::SummaryFormat f = kernels::SummaryFormat::For(s);
  const auto kind = *kernels::ParseSelectorKind(SelectorName(config_.reprefill.selector));
  std::vector<std::byte> records(matched * s.RecordBytes());
  std::vector<std::byte> minmax, mean;
  std::vector<const std::byte*> rec, mm, me;
  const bool summaries = kernels::ReadsSummaries(kind);
  if (summaries) {
    minmax.resize(matched * f.MinMaxBytes());
    mean.resize(matched * f.MeanBytes());
  }
  for (size_t j = 0; j < matched; ++j) {
    std::span<std::byte> r(records.data() + j * s.RecordBytes(), s.RecordBytes());
    synth::FillRecord(s, keys[j], layer, r);
    rec.push_back(r.data());
    if (summaries) {
      // Only this layer's entries are filled; the selector reads no other.
      std::span<std::byte> m(minmax.data() + j * f.MinMaxBytes(), f.MinMaxBytes());
      std::span<std::byte> e(mean.data() + j * f.MeanBytes(), f.MeanBytes());
      kernels::SummarizeChunkLayer(s, layer, r.first(shape.half_record_bytes()), m, e);
      mm.push_back(m.data());
      me.push_back(e.data());
    }
  }
  kernels::SelectorInput in;
  in.shape = shape;
  in.layers = s.layers;
  in.layer = layer;
  in.queries = queries;
  in.window = config_.reprefill.window;
  in.chunks = matched;
  in.minmax = mm;
  in.mean = me;
  in.records = rec;
  kernels::SelectOptions so;
  so.budget_fraction = config_.reprefill.budget_fraction;
  so.sink_chunks = config_.reprefill.sink_chunks;
  so.recent_chunks = config_.reprefill.recent_chunks;
  auto sel = kernels::Select(kind, in, so);
  EXPECT_TRUE(sel.ok()) << sel.status();
  if (!sel.ok()) return {};
  EXPECT_EQ(sel->chunks.size(), kernels::BudgetChunks(matched, so));
  return sel->chunks;
}

void Replayer::CheckTiersAndCap(const char* step) {
  const EngineStats st = engine_.Stats();
  EXPECT_LE(st.gpu_tier_resident_bytes, st.gpu_tier_budget_bytes)
      << "GPU tier over budget " << step;
  EXPECT_LE(st.cpu_tier_resident_bytes, st.cpu_tier_budget_bytes)
      << "CPU tier over budget " << step;
  if (config_.max_disk_bytes > 0) {
    EXPECT_LE(st.disk_bytes_used, config_.max_disk_bytes) << "store over its cap " << step;
  }
  summary_.max_gpu_resident_bytes =
      std::max(summary_.max_gpu_resident_bytes, st.gpu_tier_resident_bytes);
  summary_.max_cpu_resident_bytes =
      std::max(summary_.max_cpu_resident_bytes, st.cpu_tier_resident_bytes);
}

absl::flat_hash_set<ChunkKey> Replayer::CatalogChunks() {
  absl::flat_hash_set<ChunkKey> chunks;
  for (const PrefixInfo& p : engine_.ListPrefixes()) {
    ModelSpec spec;
    auto keys = engine_.PrefixChunks(p.id, &spec);
    EXPECT_TRUE(keys.ok()) << "prefix " << p.id.ToHex() << ": " << keys.status();
    if (!keys.ok()) continue;
    EXPECT_EQ(keys->size(), p.chunks) << "prefix " << p.id.ToHex();
    EXPECT_EQ(keys->back(), p.id) << "a prefix is named by its last chunk";
    for (size_t i = 0; i < keys->size(); ++i) {
      const ChunkKey& k = (*keys)[i];
      // Every stored chunk is one some Put of this replay stored, chained as the Put chained it.
      auto it = parent_.find(k);
      EXPECT_TRUE(it != parent_.end()) << "chunk " << k.ToHex() << " was never Put";
      if (it != parent_.end()) {
        EXPECT_EQ(it->second, i == 0 ? ChunkKey{} : (*keys)[i - 1])
            << "chunk " << i << " of prefix " << p.id.ToHex() << " has the wrong parent";
      }
      chunks.insert(k);
    }
  }
  return chunks;
}

void Replayer::RunTurn(const Turn& turn) {
  const ModelSpec& s = config_.spec;
  const std::vector<ChunkKey> keys = ChainChunkKeys(s.Fingerprint(), s.chunk_tokens, turn.prompt);
  const size_t from_catalog = LeadingRun(keys, catalog_);
  const size_t from_history = LeadingRun(keys, ever_put_);
  const bool evicted_so_far = engine_.Stats().chunks_evicted > engine_evicted_at_start_;

  // The match. The catalog is the reference (an evicted prefix matches shorter, never longer);
  // without eviction it must be everything earlier turns stored.
  ASSERT_LE(from_catalog, from_history) << Where(turn);
  if (!evicted_so_far) {
    ASSERT_EQ(from_catalog, from_history) << Where(turn) << ": the catalog lost chunks "
                                          << "with no eviction";
    if (turn.turn > 0) {
      // Turn t reuses at least every whole chunk turn t-1 of its conversation stored.
      ASSERT_GE(from_catalog, last_prompt_chunks_[turn.conversation]) << Where(turn);
    }
  }
  auto looked_up = engine_.Lookup(s, turn.prompt);
  ASSERT_TRUE(looked_up.ok()) << looked_up.status();
  ASSERT_EQ(*looked_up, from_catalog) << Where(turn);
  if (from_catalog < from_history) ++summary_.shorter_matches;
  if (turn.turn == 0 && from_catalog > 0) ++summary_.cross_conversation_matches;

  RunSession(turn, keys, from_catalog);
  if (::testing::Test::HasFatalFailure()) return;
  PutAndCheckCatalog(turn, keys);
  if (::testing::Test::HasFatalFailure()) return;
  last_prompt_chunks_[turn.conversation] = keys.size();
  ++summary_.turns;
}

void Replayer::RunSession(const Turn& turn, const std::vector<ChunkKey>& keys,
                          uint64_t expected_match) {
  const ModelSpec& s = config_.spec;
  const ReprefillOptions& o = config_.reprefill;
  const EngineStats before = engine_.Stats();
  auto session = engine_.BeginReprefill(s, turn.prompt, o);
  ASSERT_TRUE(session.ok()) << Where(turn) << ": " << session.status();
  ASSERT_EQ((*session)->matched_chunks(), expected_match) << Where(turn);
  CheckTiersAndCap("after BeginReprefill");
  const size_t matched = expected_match;
  summary_.matched_chunks += matched;

  std::vector<uint32_t> expected;
  uint64_t records = 0;
  std::array<uint64_t, 3> tiers{};
  for (uint32_t l = 0; l < s.layers; ++l) {
    const std::vector<float> q = Queries(turn, l);
    ASSERT_TRUE((*session)->SubmitQueries(l, q).ok()) << Where(turn) << " layer " << l;
    const bool scores_here =
        o.selector != Selector::kPeriodExact || kernels::PeriodHead(l, o.period_layers) == l;
    if (matched == 0) {
      expected.clear();
    } else if (scores_here) {
      expected = ExpectedSelection(keys, matched, l, q);
      ASSERT_FALSE(::testing::Test::HasFailure()) << Where(turn) << " layer " << l;
    }
    auto view = (*session)->AwaitLayer(l);
    ASSERT_TRUE(view.ok()) << Where(turn) << " layer " << l << ": " << view.status();
    ASSERT_EQ(view->layer(), l);
    ASSERT_EQ(view->records().size(), expected.size()) << Where(turn) << " layer " << l;
    for (size_t i = 0; i < expected.size(); ++i) {
      const LayerView::Record& r = view->records()[i];
      ASSERT_EQ(r.chunk, expected[i]) << Where(turn) << " layer " << l << " position " << i;
      ASSERT_EQ(r.first_token, expected[i] * s.chunk_tokens) << Where(turn) << " layer " << l;
      ASSERT_NE(r.data, nullptr);
      synth::FillRecord(s, keys[r.chunk], l, record_);
      ASSERT_TRUE(ServedEquals(r, record_.data(), record_.size()))
          << Where(turn) << " layer " << l << " chunk " << r.chunk << " tier "
          << static_cast<int>(r.tier) << ": served bytes differ from the generator";
      ASSERT_LE(static_cast<size_t>(r.tier), 2u);
      ++tiers[static_cast<size_t>(r.tier)];
      ++records;
    }
    if (matched > 0) ++summary_.selections_checked;
    CheckTiersAndCap("after AwaitLayer");
  }
  auto stats = (*session)->Finish();
  ASSERT_TRUE(stats.ok()) << Where(turn) << ": " << stats.status();
  CheckTiersAndCap("after Finish");
  EXPECT_EQ(stats->matched_chunks, matched) << Where(turn);
  // Every layer returned a view, empty when the session matched nothing.
  EXPECT_EQ(stats->layers_served, s.layers) << Where(turn);
  EXPECT_EQ(stats->records_served, records) << Where(turn);
  EXPECT_EQ(stats->bytes_needed, records * s.RecordBytes()) << Where(turn);
  // Every served record came from a tier (a hit) or from NVMe for this session.
  EXPECT_LE(stats->gpu_hits + stats->cpu_hits, records) << Where(turn);
  const EngineStats after = engine_.Stats();
  EXPECT_EQ(after.sessions, before.sessions + 1);
  EXPECT_EQ(after.session_records_served, before.session_records_served + records);
  EXPECT_EQ(after.checksum_failures, 0u);

  summary_.records_checked += records;
  for (size_t i = 0; i < 3; ++i) summary_.records_by_tier[i] += tiers[i];
  if (config_.verbose) {
    std::printf(
        "  conv %2u turn %2u: %5zu tokens, matched %3zu/%3zu chunks, served %5llu records "
        "(gpu %llu cpu %llu session %llu; hits gpu %llu cpu %llu, nvme %llu), read %.2f MB\n",
        turn.conversation, turn.turn, turn.prompt.size(), matched, keys.size(),
        static_cast<unsigned long long>(records), static_cast<unsigned long long>(tiers[0]),
        static_cast<unsigned long long>(tiers[1]), static_cast<unsigned long long>(tiers[2]),
        static_cast<unsigned long long>(stats->gpu_hits),
        static_cast<unsigned long long>(stats->cpu_hits),
        static_cast<unsigned long long>(stats->nvme_records), stats->bytes_read / 1e6);
  }
}

void Replayer::PutAndCheckCatalog(const Turn& turn, const std::vector<ChunkKey>& keys) {
  const ModelSpec& s = config_.spec;
  for (size_t i = 0; i < keys.size(); ++i)
    parent_.emplace(keys[i], i == 0 ? ChunkKey{} : keys[i - 1]);
  const EngineStats before = engine_.Stats();
  const size_t existing = LeadingRun(keys, catalog_);
  auto put = [&] {
    synth::SyntheticKv kv(s, turn.prompt);
    return engine_.Put(s, turn.prompt, kv.tensors());
  }();
  ASSERT_TRUE(put.ok()) << Where(turn) << ": Put: " << put.status();
  CheckTiersAndCap("after Put");
  EXPECT_EQ(put->chunks, keys.size()) << Where(turn);
  EXPECT_EQ(put->tail_tokens, turn.prompt.size() % s.chunk_tokens) << Where(turn);
  EXPECT_EQ(put->chunks_written + put->chunks_existing, put->chunks) << Where(turn);
  EXPECT_EQ(put->chunks_existing, existing) << Where(turn) << ": the Put deduplicated "
                                            << "other chunks than the catalog held";
  ASSERT_FALSE(keys.empty());
  EXPECT_EQ(put->prefix_id, keys.back());

  // The catalog now: the old one plus this prompt's chunks, less exactly what the Put evicted.
  const absl::flat_hash_set<ChunkKey> now = CatalogChunks();
  ASSERT_FALSE(::testing::Test::HasFailure()) << Where(turn) << ": catalog after Put";
  absl::flat_hash_set<ChunkKey> could = catalog_;
  for (const ChunkKey& k : keys) {
    could.insert(k);
    ASSERT_TRUE(now.contains(k)) << Where(turn) << ": a chunk of the Put is not in the catalog";
  }
  for (const ChunkKey& k : now) {
    ASSERT_TRUE(could.contains(k))
        << Where(turn) << ": chunk " << k.ToHex() << " appeared from nowhere";
    auto p = parent_.find(k);
    ASSERT_TRUE(p != parent_.end());
    ASSERT_TRUE(p->second.IsZero() || now.contains(p->second))
        << Where(turn) << ": chunk " << k.ToHex() << " is stored without its parent";
  }
  EXPECT_EQ(could.size() - now.size(), put->chunks_evicted) << Where(turn);
  const EngineStats after = engine_.Stats();
  EXPECT_EQ(after.chunks, now.size()) << Where(turn);
  EXPECT_EQ(after.chunks_evicted, before.chunks_evicted + put->chunks_evicted) << Where(turn);
  EXPECT_EQ(after.puts, before.puts + 1);
  if (config_.max_disk_bytes == 0) {
    EXPECT_EQ(put->chunks_evicted, 0u) << Where(turn);
  }

  catalog_ = now;
  for (const ChunkKey& k : keys) ever_put_.insert(k);
  summary_.chunks_written += put->chunks_written;
  summary_.chunks_existing += put->chunks_existing;
  summary_.chunks_evicted += put->chunks_evicted;
  if (config_.verbose) {
    std::printf(
        "  conv %2u turn %2u: put %zu chunks (%llu written, %llu existing, %llu evicted), "
        "store %zu chunks %.1f MB, tiers gpu %.2f/%.2f MB cpu %.2f/%.2f MB\n",
        turn.conversation, turn.turn, keys.size(),
        static_cast<unsigned long long>(put->chunks_written),
        static_cast<unsigned long long>(put->chunks_existing),
        static_cast<unsigned long long>(put->chunks_evicted), now.size(),
        after.disk_bytes_used / 1e6, after.gpu_tier_resident_bytes / 1e6,
        after.gpu_tier_budget_bytes / 1e6, after.cpu_tier_resident_bytes / 1e6,
        after.cpu_tier_budget_bytes / 1e6);
  }
}

}  // namespace ckv::replay
