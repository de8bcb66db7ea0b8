// SPDX-License-Identifier: Apache-2.0
// ckv/session.h: a Re-Prefill session, one per request that reuses a stored prefix.
//
// A serving system that finds a stored prefix for a request asks ckv for that prefix's KV layer
// by layer and receives only the important chunks of each layer, while the next layers are
// already being read:
//
//   auto session = engine->BeginReprefill(spec, prompt_tokens, options);   // matched chunks
//   for (uint32_t l = 0; l < spec.layers; ++l) {
//     session->SubmitQueries(l, queries_of_layer_l);  // the suffix's last w queries
//     auto view = session->AwaitLayer(l);            // the selected chunks' K/V, pinned
//     ... attention over view->records ...
//   }                                                // views released
//   auto stats = session->Finish();                  // adds this request's attention to I, loads
//   to F
//
// Selection. Per layer, a selector (ReprefillOptions::selector) turns the queries into a set of
// chunks under the budget (a fraction of the matched chunks, exact in chunks), always keeping the
// first (sink) chunk and the last chunk(s). `period-exact` (the published method) scores the head
// layer of each period from its exact keys and serves the period's p layers with one selection;
// `quest`, `mean-key` and `outlier-key` score every layer from the chunk summaries stored at Put
// time, reading no KV to do so (with `period_selection`, only each period's head layer, serving
// the period as period-exact does); `oracle` scores every layer from its exact keys (evaluation
// only).
//
// Prefetch. As soon as a period head is scored, the records of every layer of the period are
// requested; the last selection is prefetched speculatively for the next period (or, with a
// per-layer selector, for the next layer), and only the difference is read once the real
// selection is known. Demand reads outrank prefetches, which outrank speculation. Prefetched
// bytes that no view used are counted as wasted.
//
// Tiers. Records come from the GPU tier (device memory), the CPU tier (host memory) or NVMe, in
// that order; records read from NVMe enter the tiers by their chunk's score S = I x F.
//
// Thread-safety: one session is driven by one thread at a time (its calls may come from
// different threads, one after the other). Many sessions may run at once on one Engine.
#ifndef CKV_SESSION_H_
#define CKV_SESSION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/chunk_key.h"
#include "ckv/virtual_tokens.h"

namespace ckv {

// How a session picks the chunks of a layer.
enum class Selector : uint8_t {
  kPeriodExact = 1,  // ContiguousKV: exact attention at each period's head layer
  kQuest = 2,        // Quest's upper bound from the min/max summaries, every layer
  kMeanKey = 3,      // softmax over q . mean key per chunk, every layer
  kOracle = 4,       // exact attention at every layer (reads every key: for evaluation)
  kOutlierKey = 5,   // mean-key with each chunk's farthest key kept beside its mean, every layer
};

// "period-exact", "quest", "mean-key", "oracle", "outlier-key".
std::string_view SelectorName(Selector selector);
absl::StatusOr<Selector> ParseSelector(std::string_view name);

struct ReprefillOptions {
  // Fraction of the matched chunks loaded per layer, in (0, 1]. The count is
  // round(budget_fraction * chunks), at least sink_chunks + recent_chunks, at most all.
  // Default: 0.1.
  double budget_fraction = 0.1;
  // Select by quality instead of a fixed share: when > 0, each scored layer loads the fewest
  // chunks whose scores (the selector's estimate of each chunk's share of the layer's attention)
  // sum to at least target_mass, the sink and recent chunks counted first, at most
  // budget_fraction's count (set budget_fraction to 1 for no ceiling). So a layer whose attention
  // is spread loads more than one whose attention is concentrated. In [0, 1]. Default: 0 (off:
  // every layer loads budget_fraction's count).
  double target_mass = 0;
  Selector selector = Selector::kPeriodExact;
  // Layers that share one selection under kPeriodExact, or under a summary selector with
  // period_selection (the first is the period's head).
  // 1..1024 (a period past the last layer ends there). Default: 8.
  uint32_t period_layers = 8;
  // quest, mean-key and outlier-key: score only each period's head layer (period_layers layers)
  // and serve the whole period with its selection, requesting the period's records at once, as
  // period-exact does. Off: every layer is scored. Default: off.
  bool period_selection = false;
  // With period_selection: every other layer of a period is scored too, from its own summaries,
  // and serves its own selection beside the head's. The head's selection is still what the
  // period prefetches (in one run of records per chunk on a period-major store), and is read
  // whatever the layer chooses, so it is served too; what a layer chooses beyond it is read on
  // demand. A layer then loads between the larger of its own and its head's selections and their
  // sum (its view says how many), at the price of a summary scoring per layer. Needs
  // period_selection and quest or mean-key (InvalidArgument otherwise). Default: off (a
  // period's layers serve its head's selection).
  bool rescore_layers = false;
  // Suffix queries per layer that SubmitQueries receives (the last w tokens). 1..4096.
  // Default: 32.
  uint32_t window = 32;
  // Chunks at the start and at the end of the prefix that every selection keeps. Default: 1, 1.
  uint32_t sink_chunks = 1;
  uint32_t recent_chunks = 1;
  // Prefetch the rest of a period, and speculate on the next one. Off: every read is a demand
  // read issued by SubmitQueries. Default: on.
  bool prefetch = true;
  // Hand each view the chunks it did not load as virtual tokens (LayerView::virtual_tokens(),
  // ckv/virtual_tokens.h) for the caller's attention to take beside the loaded records, instead
  // of dropping them. They are estimated from each chunk's key means (its summaries' mean part)
  // and its estimate part (value means), both stored at Put and read once per session for
  // every matched chunk: at head dim 128, each 1.6% of the chunks' KV bytes,
  // counted in summary_bytes_read. Chunks with no estimate part (stored by a ckv that did not
  // write it, or served from the shared tier) are dropped as without this option, and counted in
  // SessionStats::unestimated_chunks. Default: off.
  bool estimate_rest = false;
};

// What AwaitLayer returns: the selected chunks of one layer, pinned where they are until the view
// is destroyed (or reset). Move-only.
class LayerView {
 public:
  // Where a record is.
  enum class Tier : uint8_t { kGpu = 0, kCpu = 1, kSession = 2 };

  struct Record {
    uint32_t chunk = 0;               // index of the chunk in the prefix (0 = first)
    uint32_t first_token = 0;         // position of its first token: chunk * chunk_tokens
    const std::byte* data = nullptr;  // K [c, kv_heads, head_dim] then V, in the spec's dtype
    Tier tier = Tier::kSession;       // kGpu: a device pointer (the host backend: host memory)
    // Where the session found it: kGpu or kCpu for a tier hit, kSession when it was read for
    // this session, from NVMe or from the shared tier (EngineOptions::remote), and then perhaps
    // admitted to a tier, which `tier` says (a benchmark's clock holds admissions until Finish:
    // engine/session.h).
    Tier found_in = Tier::kSession;
  };

  LayerView() = default;
  LayerView(LayerView&&) noexcept;
  LayerView& operator=(LayerView&&) noexcept;
  LayerView(const LayerView&) = delete;
  LayerView& operator=(const LayerView&) = delete;
  ~LayerView();

  uint32_t layer() const { return layer_; }
  // The selected chunks, in prefix order.
  const std::vector<Record>& records() const { return records_; }
  // With ReprefillOptions::estimate_rest, the matched chunks not in records() that have an
  // estimate, as virtual tokens (host memory, float32) for the layer's attention; empty
  // otherwise.
  const VirtualTokens& virtual_tokens() const { return virtual_tokens_; }
  // Moves them out (the view's are then empty): no copy for a caller that keeps them.
  VirtualTokens TakeVirtualTokens() { return std::move(virtual_tokens_); }
  // Unpins now (the destructor does it otherwise).
  void Release();

  // Internal: built by the session.
  class Pins {
   public:
    virtual ~Pins() = default;
  };
  LayerView(uint32_t layer, std::vector<Record> records, std::unique_ptr<Pins> pins,
            VirtualTokens virtual_tokens = {});

 private:
  uint32_t layer_ = 0;
  std::vector<Record> records_;
  VirtualTokens virtual_tokens_;
  std::unique_ptr<Pins> pins_;
};

// A session's figures (also summed into EngineStats by Finish).
struct SessionStats {
  uint64_t matched_chunks = 0;  // leading chunks of the prompt found stored
  uint64_t layers_served = 0;   // AwaitLayer calls that returned a view
  uint64_t records_served = 0;  // records in those views
  uint64_t bytes_needed = 0;    // record bytes in those views
  uint64_t bytes_read = 0;      // bytes read from NVMe for this session (data and summaries)
  // The shared tier (EngineOptions::remote): matched chunks found there and not locally, whose
  // selected records this session read from the cluster (a selector that reads summaries, below
  // budget 1; see docs/remote.md); those records; and the bytes read from the cluster, the
  // chunks' heads and those records (not in bytes_read). Prefetched bytes (used and wasted)
  // count reads ahead from NVMe and from the cluster alike.
  uint64_t remote_chunks = 0;
  uint64_t remote_records = 0;
  uint64_t remote_bytes_read = 0;
  uint64_t summary_bytes_read = 0;  // of which summaries
  uint64_t summary_cache_hits = 0;  // summary parts (per chunk) that came from the CPU tier
  // With estimate_rest: matched chunks that have no estimate (see ReprefillOptions), and the
  // virtual tokens the views carried.
  uint64_t unestimated_chunks = 0;
  uint64_t virtual_tokens_served = 0;
  // Hits: records found in the GPU / CPU tier when the session looked them up. A record read
  // from NVMe counts in nvme_records, even when it was then admitted to a tier and is served
  // from there (LayerView::Record::tier says where each record is).
  uint64_t gpu_hits = 0;
  uint64_t cpu_hits = 0;
  uint64_t nvme_records = 0;             // records read from NVMe
  uint64_t prefetched_bytes_used = 0;    // prefetched (or speculated) and then served
  uint64_t prefetched_bytes_wasted = 0;  // prefetched (or speculated) and never served
  double await_blocked_seconds = 0;      // time AwaitLayer waited for I/O
  double device_idle_seconds = 0;        // bubbles: time the read engine had no read in flight
                                         // while requests were queued, during the session
                                         // (engine-wide: shared by concurrent sessions)
  // (bytes_read + remote_bytes_read) / bytes_needed (0 when nothing was needed).
  double read_amplification() const {
    return bytes_needed == 0 ? 0.0
                             : static_cast<double>(bytes_read + remote_bytes_read) / bytes_needed;
  }
};

class ReprefillSession {
 public:
  virtual ~ReprefillSession() = default;

  // Leading whole chunks of the prompt that are stored (0 when none: every layer then serves an
  // empty view).
  virtual uint64_t matched_chunks() const = 0;

  // Hands over layer `layer`'s suffix queries: float32 [window, q_heads, head_dim]. Starts the
  // layer's selection and its reads. Layers are submitted in order, each once.
  // A session at budget_fraction 1 and no target_mass serves every matched chunk whatever the
  // queries say: it takes an empty span too (a connector that has no queries, such as vLLM's
  // per-layer load), and then scores nothing: such a layer counts every chunk alike (1/n) in
  // the importance I that Finish adds, and each served chunk's load in F.
  // Errors: InvalidArgument for a wrong layer or shape, or for no queries at a budget below 1 or
  // with a target_mass;
  // FailedPrecondition after Finish. A period
  // head under period-exact (or period_selection) reads its whole layer to score it: a read
  // error there is returned here too (as AwaitLayer would return it).
  virtual absl::Status SubmitQueries(uint32_t layer, std::span<const float> queries) = 0;

  // Waits until every selected record of `layer` is readable and returns them, pinned.
  // REQUIRES: SubmitQueries(layer) was called. Errors: DataLoss for a record that failed its
  // checksum or could not be read (EIO, short read: the medium did not return it); NotFound when
  // a chunk the session needed was deleted before the session pinned it; the read's error
  // otherwise. The message names the record ("record <key>/L<layer>").
  //
  // A failure is confined to its layer: the session stays usable, and the caller recomputes the
  // failed layer's prefix KV from the tokens and goes on with the next layer, which is served as
  // usual. Exception: when a period head fails, every layer of its period fails with the head's
  // error ("layer 5: its period head, layer 4, failed: ..."), since they share its selection;
  // the next period is served as usual. A prefetch (or speculation) that failed is read again
  // on demand when its layer needs it; a failed demand read is final for the session.
  virtual absl::StatusOr<LayerView> AwaitLayer(uint32_t layer) = 0;

  // Ends the session: cancels what is still queued, adds this request's attention to each
  // chunk's importance I and its loads to F (persisted), and returns the figures. Views may
  // outlive Finish. Calling it twice returns the same figures.
  virtual absl::StatusOr<SessionStats> Finish() = 0;
};

}  // namespace ckv

#endif  // CKV_SESSION_H_
