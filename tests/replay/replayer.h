// SPDX-License-Identifier: Apache-2.0
// tests/replay/replayer.h: replays a trace (tests/replay/trace.h) through an Engine and checks
// every step with GoogleTest assertions.
//
// Per turn: BeginReprefill over the prompt, every layer (SubmitQueries, AwaitLayer), Finish, then
// Put of the whole prompt. Checked:
//   - the match: the leading chunks of the prompt found in the catalog (ListPrefixes +
//     PrefixChunks after the previous step) equal Lookup and the session's matched_chunks; with
//     no eviction so far they also equal the longest chunk prefix shared with any earlier turn's
//     prompt (so turn t matches everything turn t-1 stored, and a shared system prompt or
//     document matches across conversations); with eviction they may only be shorter;
//   - every record served, bit for bit, against synth::FillRecord of its chunk key and layer;
//   - every layer's selection against kernels::Select run on the generated records and
//     summaries (see Replayer::ExpectedSelection for period-exact);
//   - the session's figures (layers, records, bytes needed, matched chunks);
//   - the Put's figures (chunks, written + existing, existing = what the catalog held, tail), and
//     the catalog after it: it holds the prompt's chunks, nothing it did not hold before or the
//     Put brought, is closed under parents, lost exactly the chunks the Put says it evicted, and
//     Stats().chunks agrees;
//   - after every step (Begin, each AwaitLayer, Finish, Put): resident <= budget in both tiers,
//     and disk bytes <= the cap when there is one.
//
// KV: synth::SyntheticKv / synth::FillRecord (tools/synthetic_kv.h), whose records are a pure
// function of (chunk key, layer), i.e. of the token prefix, so chunks that conversations share
// deduplicate and every served record can be checked from its key alone. The planted-attention
// generator (tools/synthetic_attention.h) cannot serve here: its keys depend on the prefix's
// length (recency is planted relative to the prefix's end) and not on the token ids, so a chunk
// stored by turn t-1 would differ from the same chunk generated for turn t's longer prompt.
// Queries are uniform in [-2, 2), a pure function of (seed, conversation, turn, layer).
//
// Thread-safety: one thread drives a Replayer.
#ifndef CKV_TESTS_REPLAY_REPLAYER_H_
#define CKV_TESTS_REPLAY_REPLAYER_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "ckv/engine.h"
#include "tests/replay/trace.h"

namespace ckv::replay {

struct ReplayConfig {
  ModelSpec spec;
  ReprefillOptions reprefill;
  uint64_t query_seed = 1;
  // The cap the engine was opened with (0 = none), checked after every step.
  uint64_t max_disk_bytes = 0;
  // Print one line per turn to stdout.
  bool verbose = false;
};

// What a replay did, for the tests' own assertions.
struct ReplaySummary {
  uint64_t turns = 0;
  uint64_t matched_chunks = 0;  // summed over turns
  uint64_t cross_conversation_matches =
      0;                            // first turns that matched another conversation's chunks
  uint64_t shorter_matches = 0;     // turns that matched less than earlier turns stored
  uint64_t records_checked = 0;     // records served and compared with the generator
  uint64_t selections_checked = 0;  // layers whose selection was compared
  std::array<uint64_t, 3> records_by_tier{};  // indexed by LayerView::Tier
  uint64_t chunks_written = 0;
  uint64_t chunks_existing = 0;
  uint64_t chunks_evicted = 0;
  uint64_t max_gpu_resident_bytes = 0;
  uint64_t max_cpu_resident_bytes = 0;
};

class Replayer {
 public:
  Replayer(Engine& engine, ReplayConfig config);

  // Replays one turn. Stops at the first fatal failure (check HasFatalFailure()).
  void RunTurn(const Turn& turn);
  // Replays every turn of `trace`, stopping at the first fatal failure.
  void Run(const Trace& trace);

  const ReplaySummary& summary() const { return summary_; }

 private:
  void RunSession(const Turn& turn, const std::vector<ChunkKey>& keys, uint64_t expected_match);
  void PutAndCheckCatalog(const Turn& turn, const std::vector<ChunkKey>& keys);
  void CheckTiersAndCap(const char* step);
  // The catalog's chunks, read through ListPrefixes and PrefixChunks.
  absl::flat_hash_set<ChunkKey> CatalogChunks();
  std::vector<float> Queries(const Turn& turn, uint32_t layer) const;
  std::vector<uint32_t> ExpectedSelection(const std::vector<ChunkKey>& keys, size_t matched,
                                          uint32_t layer, std::span<const float> queries) const;

  Engine& engine_;
  ReplayConfig config_;
  ReplaySummary summary_;
  absl::flat_hash_set<ChunkKey> catalog_;           // after the last Put
  absl::flat_hash_set<ChunkKey> ever_put_;          // every chunk any Put stored
  absl::flat_hash_map<ChunkKey, ChunkKey> parent_;  // chunk -> parent (zero key: first chunk)
  absl::flat_hash_map<uint32_t, size_t> last_prompt_chunks_;  // conversation -> its last Put
  uint64_t engine_evicted_at_start_ = 0;
  std::vector<std::byte> record_;  // scratch
};

}  // namespace ckv::replay

#endif  // CKV_TESTS_REPLAY_REPLAYER_H_
