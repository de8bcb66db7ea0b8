// SPDX-License-Identifier: Apache-2.0
// engine/session.cc: Re-Prefill sessions (see engine/session.h and ckv/session.h).
#include "engine/session.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iterator>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ckv/codec.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "engine/remote_tier.h"
#include "engine/summaries.h"
#include "kernels/estimate.h"
#include "kernels/selector.h"
#include "prefetch/planner.h"
#include "storage/eviction_policy.h"

namespace ckv {

// ---------------------------------------------------------------------------------------------
// Selector names and LayerView (public API).

std::string_view SelectorName(Selector selector) {
  switch (selector) {
    case Selector::kPeriodExact:
      return "period-exact";
    case Selector::kQuest:
      return "quest";
    case Selector::kMeanKey:
      return "mean-key";
    case Selector::kOracle:
      return "oracle";
    case Selector::kOutlierKey:
      return "outlier-key";
  }
  return "unknown";
}

absl::StatusOr<Selector> ParseSelector(std::string_view name) {
  for (Selector s : {Selector::kPeriodExact, Selector::kQuest, Selector::kMeanKey,
                     Selector::kOracle, Selector::kOutlierKey}) {
    if (SelectorName(s) == name) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown selector '", std::string(name),
                   "' (period-exact, quest, mean-key, oracle, outlier-key)"));
}

LayerView::LayerView(uint32_t layer, std::vector<Record> records, std::unique_ptr<Pins> pins,
                     VirtualTokens virtual_tokens)
    : layer_(layer),
      records_(std::move(records)),
      virtual_tokens_(std::move(virtual_tokens)),
      pins_(std::move(pins)) {}
LayerView::LayerView(LayerView&&) noexcept = default;
LayerView& LayerView::operator=(LayerView&&) noexcept = default;
LayerView::~LayerView() = default;
void LayerView::Release() {
  pins_.reset();
  records_.clear();
  virtual_tokens_ = {};
}

namespace engine {
namespace {

kernels::SelectorKind KindOf(Selector s) {
  switch (s) {
    case Selector::kPeriodExact:
      return kernels::SelectorKind::kPeriodExact;
    case Selector::kQuest:
      return kernels::SelectorKind::kQuest;
    case Selector::kMeanKey:
      return kernels::SelectorKind::kMeanKey;
    case Selector::kOracle:
      return kernels::SelectorKind::kOracle;
    case Selector::kOutlierKey:
      return kernels::SelectorKind::kOutlierKey;
  }
  return kernels::SelectorKind::kOracle;
}

// One record a session asked for: its buffer, shared with the read callback and with the views
// that show it, so that neither outlives it.
struct Slot {
  enum class State { kQueued, kLanded, kFailed, kCancelled };
  std::vector<std::byte> data;  // the read's destination, when read from NVMe
  TierCache::Handle tier;       // where the record is cached, when it is
  // The record's bytes: tier.data() when cached, else data.data().
  const std::byte* bytes() const { return tier ? tier.data() : data.data(); }
  // Its bytes on the host (a period head's scoring): our copy when we read it.
  const std::byte* host_bytes() const { return data.empty() ? tier.data() : data.data(); }
  LayerView::Tier where() const {
    if (!tier) return LayerView::Tier::kSession;
    return tier.level() == TierLevel::kGpu ? LayerView::Tier::kGpu : LayerView::Tier::kCpu;
  }
  State state = State::kQueued;
  absl::Status status;
  prefetch::RequestId id = 0;
  prefetch::Priority priority = prefetch::Priority::kDemand;
  uint32_t read_bytes = 0;  // the device read's length
  bool served = false;      // shown in a view
  bool hit = false;         // found in a tier, not read
  bool remote = false;      // read from the shared tier
  // A remote read ahead: set when a layer comes to wait for it, so that the tier reads it first
  // (a remote read cannot be resubmitted at another priority as a local one is).
  std::shared_ptr<std::atomic<bool>> promoted;
  // Read from NVMe and not yet offered to the tiers: the session offers it when a layer first
  // needs it (on its own thread, so that the read engine's thread only reads and verifies), or
  // in Finish under a benchmark's clock (SelectorClock).
  bool to_admit = false;
  double score = 0;  // its chunk's S when it was requested
};

// A selection of a prefix of `n` chunks: chunk indices, strictly increasing (CancelUnneeded
// searches it), each one of the session's chunks.
bool IsSelection(std::span<const uint32_t> chosen, size_t n) {
  for (size_t i = 0; i < chosen.size(); ++i) {
    if (chosen[i] >= n || (i > 0 && chosen[i - 1] >= chosen[i])) return false;
  }
  return true;
}

// A record's read is aligned, has room for the bytes wanted, and is at most the record's length
// padded to the file's alignment (where that divides the 4 KiB segments pad records to).
bool ReadFitsRecord(const storage::PinnedChunks& pinned, size_t chunk, uint32_t record,
                    const prefetch::ReadRequest& r, size_t wanted) {
  const storage::PinnedChunks::Location where = pinned.RecordAt(chunk, record);
  const uint64_t align = std::max<uint64_t>(1, where.file->alignment());
  const uint64_t padded = (uint64_t{where.length} + 4095) / 4096 * 4096;  // the record's slot
  return wanted <= r.length && r.offset % align == 0 && r.length % align == 0 &&
         (io::kDirectIoAlignment % align != 0 || r.length <= padded);
}

// Keeps the slots of one view alive.
class SlotPins final : public LayerView::Pins {
 public:
  explicit SlotPins(std::vector<std::shared_ptr<Slot>> slots) : slots_(std::move(slots)) {}

 private:
  std::vector<std::shared_ptr<Slot>> slots_;
};

// Whether a session chooses among its chunks (and so needs queries): below budget 1, or with a
// target mass; otherwise it serves every matched chunk.
bool ChoosesChunks(const ReprefillOptions& o) {
  return o.budget_fraction < 1.0 || o.target_mass > 0;
}

class SessionImpl final : public ReprefillSession {
 public:
  // `keys`: the pinned chunks' keys, then those of `remote` (the chunks that continue the prefix
  // in the shared tier; empty without one).
  SessionImpl(const SessionParts& parts, const ModelSpec& spec, const ReprefillOptions& options,
              std::vector<ChunkKey> keys, std::unique_ptr<storage::PinnedChunks> pinned,
              RemoteHeads remote, std::vector<int32_t> fill_tokens)
      : parts_(parts),
        spec_(spec),
        options_(options),
        kind_(KindOf(options.selector)),
        keys_(std::move(keys)),
        pinned_(std::move(pinned)),
        local_(pinned_->chunks().size()),
        reads_(parts.reads),
        remote_(std::move(remote)),
        fill_tokens_(std::move(fill_tokens)),
        selections_(spec.layers),
        defer_admissions_(parts.selector_clock != nullptr && parts.tiers != nullptr),
        scores_(spec.layers),
        submitted_(spec.layers, false),
        queryless_(spec.layers, false),
        failed_(spec.layers),
        virtual_(spec.layers) {
    select_options_.budget_fraction = options.budget_fraction;
    select_options_.target_mass = options.target_mass;
    select_options_.sink_chunks = options.sink_chunks;
    select_options_.recent_chunks = options.recent_chunks;
    stats_.matched_chunks = keys_.size();
    stats_.remote_chunks = remote_.size();
    for (const std::string& head : remote_.bytes) stats_.remote_bytes_read += head.size();
    CKV_DCHECK(keys_.size() == local_ + remote_.size());
    idle_at_begin_ = reads_->stats().idle_with_pending_seconds;
    // Not grown on the request's time.
    if (defer_admissions_) deferred_.reserve(keys_.size() * spec_.layers);
  }

  ~SessionImpl() override { CancelQueued(); }

  // The summaries the selector reads: from the CPU tier where cached there, the rest read from
  // NVMe in a few large reads and then cached (ahead of records: every Re-Prefill of the prefix
  // reads them). With estimate_rest, also the mean and estimate parts of every chunk that has
  // them.
  absl::Status LoadSummaries() {
    if (keys_.empty()) return absl::OkStatus();
    if (kernels::ReadsSummaries(kind_)) {
      const SummaryPart part =
          kind_ == kernels::SelectorKind::kQuest ? SummaryPart::kMinMax : SummaryPart::kMean;
      CKV_RETURN_IF_ERROR(LoadPart(part, /*optional=*/false, summary_ptrs_));
    }
    if (kind_ == kernels::SelectorKind::kOutlierKey) {
      // Beside the mean part; a chunk without one (older, or remote) is scored by its mean.
      CKV_RETURN_IF_ERROR(LoadPart(SummaryPart::kOutlier, /*optional=*/true, outlier_ptrs_));
    }
    if (!options_.estimate_rest) return absl::OkStatus();
    if (kind_ == kernels::SelectorKind::kMeanKey || kind_ == kernels::SelectorKind::kOutlierKey) {
      mean_ptrs_ = summary_ptrs_;
    } else {
      CKV_RETURN_IF_ERROR(LoadPart(SummaryPart::kMean, /*optional=*/true, mean_ptrs_));
    }
    CKV_RETURN_IF_ERROR(LoadPart(SummaryPart::kEstimate, /*optional=*/true, estimate_ptrs_));
    for (const std::byte* e : estimate_ptrs_) stats_.unestimated_chunks += e == nullptr ? 1 : 0;
    return absl::OkStatus();
  }

  // Points ptrs[j] at part `part` of chunk j: the shared tier's verified head, the CPU tier's
  // summary cache, or a read from NVMe (then cached). A selector's part is required: a local
  // chunk without it (stored with no summaries) fails the load with NotFound, as the selector
  // cannot score it. An `optional` part (the estimate's) is left null for a chunk without it (a
  // local chunk written before it existed, or kEstimate of a remote chunk).
  absl::Status LoadPart(SummaryPart part, bool optional, std::vector<const std::byte*>& ptrs) {
    const auto part_index = static_cast<uint32_t>(part);
    TierCache* tiers = parts_.tiers;
    ptrs.assign(keys_.size(), nullptr);
    for (size_t j = local_; j < keys_.size(); ++j) {  // from the shared tier's verified heads
      const remote::DecodedChunkHead& head = remote_.heads[j - local_];
      if (part == SummaryPart::kMinMax) ptrs[j] = head.minmax.data();
      if (part == SummaryPart::kMean) ptrs[j] = head.mean.data();
    }
    const uint32_t record = spec_.layers + part_index;
    std::vector<size_t> missing_index;
    for (size_t j = 0; j < local_; ++j) {
      if (optional && record >= pinned_->chunks()[j].segment->records()) continue;
      TierCache::Handle h;
      if (tiers != nullptr) h = tiers->GetSummaries(keys_[j], part_index);
      if (h) {
        ptrs[j] = h.data();
        summary_pins_.push_back(std::move(h));
        stats_.summary_cache_hits++;
      } else {
        missing_index.push_back(j);
      }
    }
    if (missing_index.empty()) return absl::OkStatus();
    CKV_ASSIGN_OR_RETURN(ChunkSummaries read, engine::LoadSummaries(*parts_.store, spec_, *pinned_,
                                                                    missing_index, part));
    stats_.summary_bytes_read += read.data.size();
    stats_.bytes_read += read.data.size();
    summaries_.push_back(std::make_unique<ChunkSummaries>(std::move(read)));
    const ChunkSummaries& got = *summaries_.back();
    for (size_t i = 0; i < missing_index.size(); ++i) {
      const size_t j = missing_index[i];
      ptrs[j] = got.chunk(i);
      if (tiers == nullptr) continue;
      auto cached =
          tiers->PutSummaries(keys_[j], part_index, std::span(got.chunk(i), got.record_bytes));
      if (cached.ok() && *cached) summary_pins_.push_back(std::move(*cached));
    }
    return absl::OkStatus();
  }

  // With estimate_rest, the virtual tokens of `layer`: every chunk not in `chosen` that has its
  // mean and estimate parts, in kernels::VirtualTokensOf's mean form (docs/estimate.md says why
  // not the Gaussian one), decoded straight into the view's arrays. Not on a benchmark's clock:
  // its Begin drains the reads in flight, and at every layer that would stall the prefetch
  // pipeline for work of about a millisecond, which this CPU's time is charged for instead.
  void BuildVirtualTokens(uint32_t layer, std::span<const uint32_t> chosen) {
    if (!options_.estimate_rest) return;
    const kernels::SummaryFormat f = kernels::SummaryFormat::For(spec_);
    const uint32_t d_n = spec_.head_dim;
    const size_t per_chunk = size_t{spec_.kv_heads} * d_n;
    std::vector<bool> loaded(keys_.size(), false);
    for (uint32_t j : chosen) loaded[j] = true;
    VirtualTokens& vt = virtual_[layer];
    for (uint32_t j = 0; j < keys_.size(); ++j) {
      if (!loaded[j] && mean_ptrs_[j] != nullptr && estimate_ptrs_[j] != nullptr) {
        vt.chunks.push_back(j);
      }
    }
    vt.count = static_cast<uint32_t>(vt.chunks.size());
    vt.keys.resize(vt.chunks.size() * per_chunk);
    vt.values.resize(vt.chunks.size() * per_chunk);
    vt.bias.assign(vt.chunks.size() * spec_.q_heads,
                   std::log(static_cast<float>(spec_.chunk_tokens)));
    for (size_t n = 0; n < vt.chunks.size(); ++n) {
      for (uint32_t h = 0; h < spec_.kv_heads; ++h) {
        const size_t at = n * per_chunk + size_t{h} * d_n;
        kernels::DecodeMean(kernels::MeanAt(f, mean_ptrs_[vt.chunks[n]], layer, h), d_n,
                            vt.keys.data() + at);
        kernels::DecodeEstimate(kernels::EstimateAt(f, estimate_ptrs_[vt.chunks[n]], layer, h), d_n,
                                vt.values.data() + at);
      }
    }
  }

  uint64_t matched_chunks() const override { return keys_.size(); }

  absl::Status SubmitQueries(uint32_t layer, std::span<const float> queries) override {
    if (finished_) return absl::FailedPreconditionError("SubmitQueries after Finish");
    if (layer >= spec_.layers || submitted_[layer]) {
      return absl::InvalidArgumentError(absl::StrCat("SubmitQueries for layer ", layer, ": ",
                                                     spec_.model_id, " has ", spec_.layers,
                                                     " layers and each is submitted once"));
    }
    const size_t want = size_t{options_.window} * spec_.q_heads * spec_.head_dim;
    if (queries.empty() && ChoosesChunks(options_)) {
      return absl::InvalidArgumentError(
          absl::StrCat("queries of layer ", layer,
                       ": none given; only a session at budget_fraction 1 (every "
                       "chunk) and no target_mass selects without queries, and this one's are ",
                       options_.budget_fraction, " and ", options_.target_mass));
    }
    if (!queries.empty() && queries.size() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "queries of layer ", layer, ": ", queries.size(), " floats; window ", options_.window,
          " x ", spec_.q_heads, " q heads x ", spec_.head_dim, " = ", want));
    }
    submitted_[layer] = true;
    if (keys_.empty()) return absl::OkStatus();
    const uint32_t n = static_cast<uint32_t>(keys_.size());
    const uint32_t p = std::max<uint32_t>(1, options_.period_layers);
    const bool per_layer = kind_ == kernels::SelectorKind::kOracle ||
                           (kernels::ReadsSummaries(kind_) && !options_.period_selection);
    const uint32_t head = per_layer ? layer : kernels::PeriodHead(layer, p);

    if (layer == head) {
      // A head that cannot be scored or read leaves its layers without a selection: they must
      // fail with its error, never serve an empty one.
      absl::Status st = SubmitHead(layer, queries, per_layer, n, p);
      if (!st.ok()) failed_[layer] = st;
      return st;
    }
    // A layer inside a period: the head's selection serves it.
    if (!submitted_[head]) {
      // The layer counts as submitted: AwaitLayer must return this, never an empty view.
      failed_[layer] = absl::FailedPreconditionError(
          absl::StrCat("queries of layer ", layer, " before those of its period head ", head));
      return failed_[layer];
    }
    if (!failed_[head].ok()) {
      failed_[layer] = absl::Status(failed_[head].code(),
                                    absl::StrCat("layer ", layer, ": its period head, layer ", head,
                                                 ", failed: ", failed_[head].message()));
      return absl::OkStatus();
    }
    selections_[layer] = selections_[head];
    // BeginSession allows rescore_layers only with period_selection and a summary selector.
    if (options_.rescore_layers && !queries.empty() && !queryless_[head]) {
      // The layer's own choice, beside the head's that the period prefetched anyway: what it
      // adds is read on demand.
      absl::StatusOr<kernels::Selection> sel = Select(layer, queries, {});
      if (!sel.ok()) {
        failed_[layer] = absl::Status(
            sel.status().code(), absl::StrCat("layer ", layer, " (rescored; period head ", head,
                                              "): ", sel.status().message()));
        return failed_[layer];
      }
      std::vector<uint32_t> both;
      std::set_union(selections_[head].begin(), selections_[head].end(), sel->chunks.begin(),
                     sel->chunks.end(), std::back_inserter(both));
      selections_[layer] = std::move(both);
      scores_[layer] = std::move(sel->scores);
    }
    CancelUnneeded(layer, Part::kRecord, selections_[layer]);
    CKV_RETURN_IF_ERROR(
        Request(layer, Part::kRecord, selections_[layer], prefetch::Priority::kDemand));
    BuildVirtualTokens(layer, selections_[layer]);
    return absl::OkStatus();
  }

  // The head path of SubmitQueries: scores `layer` and requests its selection and prefetches.
  absl::Status SubmitHead(uint32_t layer, std::span<const float> queries, bool per_layer,
                          uint32_t n, uint32_t p) {
    std::vector<uint32_t> chosen;
    const bool queryless = queries.empty();  // at budget 1: every chunk, nothing scored
    if (queryless) {
      chosen.resize(n);
      for (uint32_t j = 0; j < n; ++j) chosen[j] = j;
      queryless_[layer] = true;
      CancelUnneeded(layer, Part::kKeys, {});  // keys an earlier head prefetched to score this one
    } else if (kernels::ReadsSummaries(kind_)) {
      CKV_ASSIGN_OR_RETURN(kernels::Selection sel, Select(layer, queries, {}));
      chosen = std::move(sel.chunks);
      scores_[layer] = std::move(sel.scores);
    } else {
      // Exact scoring reads the layer's keys, every chunk's K half, on demand (a record held
      // by a tier serves its own; a benchmark's key source, ScoringKeys, serves the rest from
      // its key file, verified). The keys are not served, so the K halves of records are read
      // without the record's checksum, which covers K and V together: a corrupt key can steer
      // the selection, never the bytes a view serves, which are read whole and verified.
      std::vector<uint32_t> all(n);
      for (uint32_t j = 0; j < n; ++j) all[j] = j;
      CKV_RETURN_IF_ERROR(Request(layer, Part::kKeys, all, prefetch::Priority::kDemand));
      CKV_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Slot>> slots, Wait(layer, Part::kKeys, all));
      {
        absl::MutexLock lock(&mu_);
        for (const auto& slot : slots) {
          if (slot->served) continue;
          slot->served = true;  // used by the scoring, so a prefetched one was not wasted
          if (!slot->hit && slot->priority != prefetch::Priority::kDemand) {
            stats_.prefetched_bytes_used += slot->read_bytes;
          }
        }
      }
      std::vector<const std::byte*> records(n);
      for (uint32_t j = 0; j < n; ++j) records[j] = slots[j]->host_bytes();
      std::vector<std::byte> decoded;  // the keys of a spec with a codec, in its dtype
      if (spec_.codec != KvCodec::kNone) {
        const size_t half = spec_.DecodedRecordBytes() / 2;
        decoded.resize(n * half);
        for (uint32_t j = 0; j < n; ++j) {
          CKV_RETURN_IF_ERROR(DecodeRecordKeys(spec_, {records[j], spec_.RecordKeyBytes()},
                                               {decoded.data() + j * half, half}));
          records[j] = decoded.data() + j * half;
        }
      }
      CKV_ASSIGN_OR_RETURN(kernels::Selection sel, Select(layer, queries, records));
      chosen = std::move(sel.chunks);
      scores_[layer] = std::move(sel.scores);
    }
    CKV_DCHECK(IsSelection(chosen, keys_.size()));  // only the session's chunks are read
    selections_[layer] = chosen;
    CancelUnneeded(layer, Part::kRecord, chosen);
    CKV_RETURN_IF_ERROR(Request(layer, Part::kRecord, chosen, prefetch::Priority::kDemand));
    if (!options_.prefetch) {
      BuildVirtualTokens(layer, chosen);
      return absl::OkStatus();
    }
    const prefetch::PlanOptions plan{
        .layers = spec_.layers,
        .period_layers = p,
        .per_layer = per_layer,
        .read_keys_ahead = !queryless && !kernels::ReadsSummaries(kind_)};
    for (const prefetch::PlannedRead& r : prefetch::PlanAfterSelection(layer, plan)) {
      if (r.keys_only) {
        std::vector<uint32_t> all(n);
        for (uint32_t j = 0; j < n; ++j) all[j] = j;
        CKV_RETURN_IF_ERROR(Request(r.layer, Part::kKeys, all, r.priority));
        continue;
      }
      // A layer of this period now needs this selection: reads queued for another go.
      if (r.priority == prefetch::Priority::kIntraPeriod) {
        CancelUnneeded(r.layer, Part::kRecord, chosen);
      }
      CKV_RETURN_IF_ERROR(Request(r.layer, Part::kRecord, chosen, r.priority));
    }
    BuildVirtualTokens(layer, chosen);
    return absl::OkStatus();
  }

  absl::StatusOr<LayerView> AwaitLayer(uint32_t layer) override {
    if (layer >= spec_.layers || !submitted_[layer]) {
      return absl::FailedPreconditionError(
          absl::StrCat("AwaitLayer(", layer, ") before SubmitQueries for it"));
    }
    if (!failed_[layer].ok()) return failed_[layer];
    if (keys_.empty()) {
      stats_.layers_served++;
      return LayerView(layer, {}, nullptr);
    }
    const std::vector<uint32_t>& chosen = selections_[layer];
    Clock& clock = *parts_.store->clock();  // the store's: tests may step it
    const int64_t start_ns = clock.MonotonicNanos();
    CKV_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Slot>> slots,
                         Wait(layer, Part::kRecord, chosen));
    stats_.await_blocked_seconds += static_cast<double>(clock.MonotonicNanos() - start_ns) * 1e-9;
    std::vector<LayerView::Record> records;
    records.reserve(chosen.size());
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < chosen.size(); ++i) {
        Slot& s = *slots[i];
        // A layer serves only the session's chunks, each landed (read and verified, or a tier's).
        CKV_DCHECK(chosen[i] < keys_.size() && s.state == Slot::State::kLanded);
        if (!s.served) {
          s.served = true;
          stats_.records_served++;
          stats_.bytes_needed += spec_.RecordBytes();
          if (s.hit) {
            (s.tier.level() == TierLevel::kGpu ? stats_.gpu_hits : stats_.cpu_hits)++;
          } else if (s.priority != prefetch::Priority::kDemand) {
            stats_.prefetched_bytes_used += s.read_bytes;
          }
        }
        LayerView::Record rec{chosen[i], chosen[i] * spec_.chunk_tokens, s.bytes(), s.where()};
        rec.found_in = s.hit ? (s.tier.level() == TierLevel::kGpu ? LayerView::Tier::kGpu
                                                                  : LayerView::Tier::kCpu)
                             : LayerView::Tier::kSession;
        records.push_back(rec);
      }
    }
    stats_.layers_served++;
    stats_.virtual_tokens_served += virtual_[layer].count;
    return LayerView(layer, std::move(records), std::make_unique<SlotPins>(std::move(slots)),
                     std::move(virtual_[layer]));
  }

  absl::StatusOr<SessionStats> Finish() override {
    if (finished_) return stats_;
    finished_ = true;
    CancelQueued();  // returns once no read of this session is outstanding: figures are final
    AdmitDeferred();
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [key, slot] : slots_) {
        if (slot->state == Slot::State::kLanded && !slot->served &&
            slot->priority != prefetch::Priority::kDemand) {
          stats_.prefetched_bytes_wasted += slot->read_bytes;
        }
      }
    }
    // I: each chunk's share of the selectors' scores, averaged over the scored layers; a head
    // layer submitted without queries knows nothing of attention and counts every chunk alike
    // (1/n), so that loads at a full budget still rank by F.
    // F: one load per chunk this session served.
    std::vector<double> importance(keys_.size(), 0.0);
    int scored = 0;
    for (size_t l = 0; l < scores_.size(); ++l) {
      if (queryless_[l] && !keys_.empty()) {
        for (double& i : importance) i += 1.0 / static_cast<double>(keys_.size());
        ++scored;
        continue;
      }
      const std::vector<float>& scores = scores_[l];
      if (scores.size() != keys_.size()) continue;
      double total = 0;
      for (float s : scores) total += std::max(0.0f, s);
      if (total <= 0) continue;
      for (size_t j = 0; j < scores.size(); ++j) importance[j] += std::max(0.0f, scores[j]) / total;
      ++scored;
    }
    std::vector<bool> loaded(keys_.size(), false);
    for (const auto& sel : selections_) {
      for (uint32_t j : sel) loaded[j] = true;
    }
    std::vector<storage::ChunkStore::Usage> usage;
    std::vector<size_t> chunk_of;  // usage[i] is chunk chunk_of[i]
    // Chunks read from the shared tier are not stored here (yet): their I and F start with the
    // fill that stores them.
    for (size_t j = 0; j < local_; ++j) {
      if (loaded[j] || importance[j] > 0) {
        usage.push_back({keys_[j], scored > 0 ? importance[j] / scored : 0.0, loaded[j] ? 1u : 0u});
        chunk_of.push_back(j);
      }
    }
    stats_.device_idle_seconds = reads_->stats().idle_with_pending_seconds - idle_at_begin_;
    if (!remote_.keys.empty()) parts_.remote->FillLater(spec_, fill_tokens_);
    if (parts_.record_session) parts_.record_session(stats_);
    CKV_RETURN_IF_ERROR(parts_.store->AddUsage(usage));
    if (TierCache* tiers = parts_.tiers) {
      for (size_t i = 0; i < usage.size(); ++i) {
        const auto& c = pinned_->chunks()[chunk_of[i]];
        tiers->UpdateScore(usage[i].key,
                           storage::EvictionPolicy::Score(c.importance + usage[i].importance,
                                                          c.loads + usage[i].loads));
      }
    }
    return stats_;
  }

 private:
  // What part of a record a read wants: the whole record (what a view serves, verified), or its
  // K half alone (scoring reads, on the host, unverified: see SubmitHead), in slots of their own.
  enum class Part : uint8_t { kRecord, kKeys };
  // A slot's key, ordered so that the slots of one layer and part are adjacent.
  struct SlotKey {
    uint32_t layer;
    Part part;
    uint32_t chunk;
    auto operator<=>(const SlotKey&) const = default;
  };

  absl::StatusOr<kernels::Selection> Select(uint32_t layer, std::span<const float> queries,
                                            std::span<const std::byte* const> records) {
    kernels::SelectorInput in;
    in.shape = kernels::KvShape::Of(spec_);
    in.layers = spec_.layers;
    in.layer = layer;
    in.queries = queries;
    in.window = options_.window;
    in.chunks = keys_.size();
    if (kind_ == kernels::SelectorKind::kQuest) in.minmax = summary_ptrs_;
    if (kind_ == kernels::SelectorKind::kMeanKey || kind_ == kernels::SelectorKind::kOutlierKey) {
      in.mean = summary_ptrs_;
    }
    if (kind_ == kernels::SelectorKind::kOutlierKey) in.outlier = outlier_ptrs_;
    in.records = records;
    SelectorClock* clock = parts_.selector_clock;
    if (clock == nullptr) return kernels::Select(kind_, in, select_options_);
    clock->Begin();
    auto selection = kernels::Select(kind_, in, select_options_);
    clock->End(kernels::ScoringFlops(kind_, in, select_options_));
    return selection;
  }

  // Requests (layer, chunk) for each chunk not requested yet; a queued request of lower priority
  // that is now needed on demand is resubmitted as a demand read.
  absl::Status Request(uint32_t layer, Part part, std::span<const uint32_t> chunks,
                       prefetch::Priority priority) {
    const bool keys_only = part == Part::kKeys;
    std::vector<prefetch::ReadRequest> batch;
    std::vector<std::shared_ptr<Slot>> new_slots;
    std::vector<RemoteRecordFetch> remote_batch;
    absl::Status request_error;
    {
      absl::MutexLock lock(&mu_);
      for (uint32_t j : chunks) {
        auto it = slots_.find(SlotKey{layer, part, j});
        if (it != slots_.end()) {
          Slot& s = *it->second;
          const bool upgrade = priority == prefetch::Priority::kDemand &&
                               s.priority != prefetch::Priority::kDemand &&
                               s.state == Slot::State::kQueued;
          // A cancelled request, or a failed prefetch now needed on demand: read it (again).
          const bool retry =
              s.state == Slot::State::kCancelled ||
              (s.state == Slot::State::kFailed && s.priority != prefetch::Priority::kDemand &&
               priority == prefetch::Priority::kDemand);
          if (upgrade && s.remote) {  // promoted in place, and waited for
            if (s.promoted != nullptr) s.promoted->store(true);
            continue;
          }
          if (!upgrade && !retry) continue;
          if (upgrade) {
            // Only a queued request can be taken back; one in flight is simply waited for.
            const prefetch::RequestId id = s.id;
            mu_.Unlock();
            const absl::Status cancelled = reads_->Cancel(id);
            mu_.Lock();
            if (!cancelled.ok()) continue;
            it = slots_.find(SlotKey{layer, part, j});
          }
        }
        auto slot = std::make_shared<Slot>();
        slot->priority = priority;
        slots_[SlotKey{layer, part, j}] = slot;
        if (TierCache* tiers = parts_.tiers) {
          TierCache::Handle hit = tiers->Lookup(RecordId{keys_[j], layer});
          // Scoring reads a head layer's bytes on the host: a device pointer will not do.
          if (hit && !(hit.device_pointer() && keys_only)) {
            slot->tier = std::move(hit);
            slot->state = Slot::State::kLanded;
            slot->hit = true;
            continue;
          }
        }
        slot->data.resize(keys_only ? spec_.RecordKeyBytes() : spec_.RecordBytes());
        if (j >= local_) {
          // Only selectors that read summaries take chunks from the shared tier: no key reads.
          CKV_DCHECK(!keys_only);
          slot->remote = true;
          slot->read_bytes = spec_.RecordBytes();
          if (priority != prefetch::Priority::kDemand) {
            slot->promoted = std::make_shared<std::atomic<bool>>(false);
          }
          remote_batch.push_back(RemoteRecordFetch{
              keys_[j], layer, &remote_.heads[j - local_], slot->data,
              [this, slot](const absl::Status& status) {
                absl::MutexLock lock(&mu_);
                CKV_DCHECK(slot->state == Slot::State::kQueued);  // each fetch completes once
                if (status.ok()) {
                  slot->to_admit = parts_.tiers != nullptr;
                  slot->state = Slot::State::kLanded;
                  stats_.remote_records++;
                  stats_.remote_bytes_read += slot->read_bytes;
                } else if (absl::IsCancelled(status)) {
                  slot->state = Slot::State::kCancelled;
                } else {
                  slot->state = Slot::State::kFailed;
                  slot->status = status;
                }
                cv_.SignalAll();
              },
              priority == prefetch::Priority::kDemand, slot->promoted, this});
          continue;
        }
        new_slots.push_back(slot);
        absl::StatusOr<prefetch::ReadRequest> read =
            keys_only ? KeysRead(j, layer, priority, slot->data)
                      : RecordRead(*reads_, *pinned_, j, layer, priority, slot->data);
        if (!read.ok()) {
          // None of this call's local reads is submitted: their slots fail, so that no one
          // waits for them (the remote ones queued so far go ahead).
          request_error = read.status();
          for (auto& s : new_slots) {
            s->state = Slot::State::kFailed;
            s->status = request_error;
          }
          new_slots.clear();
          batch.clear();
          cv_.SignalAll();
          break;
        }
        prefetch::ReadRequest r = std::move(*read);
        slot->read_bytes = r.length;
        slot->score = storage::EvictionPolicy::Score(pinned_->chunks()[j].importance,
                                                     pinned_->chunks()[j].loads);
        r.callback = [this, slot, keys_only](const prefetch::ReadResult& result) {
          absl::MutexLock lock(&mu_);
          CKV_DCHECK(slot->state == Slot::State::kQueued);  // each read completes once
          if (result.status.ok()) {
            slot->to_admit = parts_.tiers != nullptr && !keys_only;
            slot->state = Slot::State::kLanded;
            stats_.bytes_read += slot->read_bytes;
            if (!keys_only) stats_.nvme_records++;
          } else if (absl::IsCancelled(result.status)) {
            slot->state = Slot::State::kCancelled;
          } else {
            slot->state = Slot::State::kFailed;
            slot->status = result.status;
          }
          cv_.SignalAll();
        };
        batch.push_back(std::move(r));
      }
    }
    if (!remote_batch.empty()) parts_.remote->FetchRecords(spec_, std::move(remote_batch));
    if (!request_error.ok()) return request_error;
    if (batch.empty()) return absl::OkStatus();
    auto ids = reads_->SubmitBatch(batch);
    absl::MutexLock lock(&mu_);
    if (!ids.ok()) {
      for (auto& slot : new_slots) {
        slot->state = Slot::State::kFailed;
        slot->status = ids.status();
      }
      cv_.SignalAll();
      return ids.status();
    }
    for (size_t i = 0; i < new_slots.size(); ++i) new_slots[i]->id = (*ids)[i];
    return absl::OkStatus();
  }

  // The read of chunk j's keys at `layer` into `dest`: from the host's key source when it holds
  // them (verified), else the record's first half, unverified (the checksum covers the record).
  absl::StatusOr<prefetch::ReadRequest> KeysRead(uint32_t j, uint32_t layer,
                                                 prefetch::Priority priority,
                                                 std::span<std::byte> dest) {
    // A key source holds keys in the dtype; a spec with a codec scores its records' K parts.
    if (ScoringKeys* source = spec_.codec == KvCodec::kNone ? parts_.scoring_keys : nullptr) {
      absl::StatusOr<prefetch::ReadRequest> r = source->KeysRead(keys_[j], layer, priority, dest);
      if (!absl::IsNotFound(r.status())) return r;
    }
    return RecordRead(*reads_, *pinned_, j, layer, priority, dest,
                      static_cast<uint32_t>(dest.size()));
  }

  // Waits for (layer, chunk) of every chunk to land. A cancelled one, or a failed prefetch, is
  // requested again on demand. Errors: the first failed demand read's.
  absl::StatusOr<std::vector<std::shared_ptr<Slot>>> Wait(uint32_t layer, Part part,
                                                          std::span<const uint32_t> chunks) {
    for (;;) {
      std::vector<uint32_t> again;
      std::vector<std::shared_ptr<Slot>> out;
      {
        absl::MutexLock lock(&mu_);
        bool pending = true;
        while (pending) {
          pending = false;
          again.clear();
          for (uint32_t j : chunks) {
            auto it = slots_.find(SlotKey{layer, part, j});
            if (it == slots_.end() || it->second->state == Slot::State::kCancelled) {
              again.push_back(j);
            } else if (it->second->state == Slot::State::kFailed) {
              // A failed prefetch gets one demand read of its own; a failed demand read is final.
              if (it->second->priority != prefetch::Priority::kDemand) {
                again.push_back(j);
              } else {
                return it->second->status;
              }
            } else if (it->second->state == Slot::State::kQueued) {
              pending = true;
            }
          }
          if (!again.empty()) break;
          if (pending) cv_.Wait(&mu_);
        }
        if (again.empty()) {
          out.reserve(chunks.size());
          for (uint32_t j : chunks) out.push_back(slots_.at(SlotKey{layer, part, j}));
        }
      }
      if (again.empty()) {
        Admit(layer, chunks, out);  // outside mu_: it copies records into the tiers (or holds
                                    // them for Finish under a benchmark's clock)
        return out;
      }
      CKV_RETURN_IF_ERROR(Request(layer, part, again, prefetch::Priority::kDemand));
    }
  }

  // Offers the records of `slots` (chunks `chunks` of `layer`) that were read from NVMe to the
  // tiers, each once; a record a tier takes is served from there, the others from our copy.
  // Under a benchmark's clock it only holds them for Finish (SelectorClock): served from ours.
  void Admit(uint32_t layer, std::span<const uint32_t> chunks,
             std::span<const std::shared_ptr<Slot>> slots) {
    TierCache* tiers = parts_.tiers;
    if (tiers == nullptr) return;
    for (size_t i = 0; i < slots.size(); ++i) {
      Slot& s = *slots[i];
      double score = 0;
      {
        absl::MutexLock lock(&mu_);
        if (!s.to_admit) continue;
        s.to_admit = false;
        score = s.score;
      }
      if (defer_admissions_) {  // a benchmark's GPU system: DMA, off the request's path
        deferred_.push_back({layer, chunks[i], slots[i]});
        continue;
      }
      // Landed and no longer touched by the read engine: its bytes are stable.
      auto admitted = tiers->Admit(RecordId{keys_[chunks[i]], layer}, s.data, score);
      if (admitted.ok() && *admitted) {
        absl::MutexLock lock(&mu_);
        s.tier = std::move(*admitted);
      }
    }
  }

  // The admissions Admit held back while a benchmark's clock is set, in one bracket, once no
  // read of the session is in flight (Finish). One bracket, not one per record: holding and
  // releasing the reads (a wake of the read engine's thread) stays on the clock.
  void AdmitDeferred() {
    TierCache* tiers = parts_.tiers;
    SelectorClock* clock = parts_.selector_clock;
    if (tiers == nullptr || deferred_.empty()) return;
    if (clock != nullptr) clock->Begin();
    for (const Deferred& d : deferred_) {
      double score = 0;
      {
        absl::MutexLock lock(&mu_);
        score = d.slot->score;
      }
      // Left unpinned: the request is over (nor do the baselines pin what they hold). Admitted
      // as layers are served, a record stays pinned while its session lives.
      tiers->Admit(RecordId{keys_[d.chunk], d.layer}, d.slot->data, score).IgnoreError();
    }
    if (clock != nullptr) clock->End(0);
    deferred_.clear();
  }

  // Cancels queued requests of `part` of `layer` for chunks not in `chosen` (sorted).
  void CancelUnneeded(uint32_t layer, Part part, std::span<const uint32_t> chosen) {
    std::vector<prefetch::RequestId> ids;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = slots_.lower_bound(SlotKey{layer, part, 0});
           it != slots_.end() && it->first.layer == layer && it->first.part == part; ++it) {
        if (it->second->state == Slot::State::kQueued && !it->second->remote &&
            !std::binary_search(chosen.begin(), chosen.end(), it->first.chunk)) {
          ids.push_back(it->second->id);
        }
      }
    }
    // NotFound / FailedPrecondition: it landed or is in flight; it will count as wasted.
    for (prefetch::RequestId id : ids) reads_->Cancel(id).IgnoreError();
  }

  void CancelQueued() {
    std::vector<prefetch::RequestId> ids;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [key, slot] : slots_) {
        if (slot->state == Slot::State::kQueued && slot->id != 0) ids.push_back(slot->id);
      }
    }
    for (prefetch::RequestId id : ids) reads_->Cancel(id).IgnoreError();  // see CancelUnneeded
    // The shared tier's reads still queued are taken back; those in a call end within its
    // deadline.
    if (!remote_.keys.empty()) parts_.remote->CancelFetches(this);
    // Callbacks capture `this`: wait for every read of this session before it goes.
    absl::MutexLock lock(&mu_);
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& [key, slot] : slots_) {
        if (slot->state == Slot::State::kQueued) return false;
      }
      return true;
    };
    while (!settled()) cv_.Wait(&mu_);
  }

  const SessionParts parts_;
  const ModelSpec spec_;
  const ReprefillOptions options_;
  const kernels::SelectorKind kind_;
  kernels::SelectOptions select_options_;
  const std::vector<ChunkKey> keys_;
  const std::unique_ptr<storage::PinnedChunks> pinned_;
  const size_t local_;  // chunks [0, local_) are pinned here, the rest are remote_'s
  prefetch::ReadEngine* const reads_;
  const RemoteHeads remote_;                // the chunks found only in the shared tier
  const std::vector<int32_t> fill_tokens_;  // the prefix Finish has filled locally (FillLater)
  // Summary parts read from NVMe (stable addresses: the pointers below point into them).
  std::vector<std::unique_ptr<ChunkSummaries>> summaries_;
  std::vector<TierCache::Handle> summary_pins_;  // those in the CPU tier, pinned
  std::vector<const std::byte*> summary_ptrs_;   // the selector's part, per chunk, wherever it is
  // With estimate_rest: the mean and estimate parts per chunk (null where a chunk has none).
  std::vector<const std::byte*> mean_ptrs_, estimate_ptrs_;
  std::vector<const std::byte*> outlier_ptrs_;     // outlier-key's outlier parts (null: none)
  std::vector<std::vector<uint32_t>> selections_;  // per layer
  // Whether Admit holds admissions for Finish: a benchmark's clock is set, and there are tiers.
  // Fixed when the session starts (a benchmark sets its clock before its sessions start).
  const bool defer_admissions_;
  // Admissions held for Finish while a benchmark's clock is set (Admit).
  struct Deferred {
    uint32_t layer, chunk;
    std::shared_ptr<Slot> slot;
  };
  std::vector<Deferred> deferred_;
  std::vector<std::vector<float>> scores_;  // per scored layer
  std::vector<bool> submitted_;
  std::vector<bool> queryless_;  // per head layer submitted without queries (budget 1)
  // Per layer: the error of a period head that failed (scoring or requesting), and of the
  // layers of its period, which have no selection. OK otherwise.
  std::vector<absl::Status> failed_;
  std::vector<VirtualTokens> virtual_;  // per layer, with estimate_rest, until its view takes them
  bool finished_ = false;
  double idle_at_begin_ = 0;

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::map<SlotKey, std::shared_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  SessionStats stats_;  // counters touched by callbacks are updated under mu_
};

}  // namespace

absl::StatusOr<prefetch::ReadRequest> RecordRead(prefetch::ReadEngine& reads,
                                                 const storage::PinnedChunks& pinned, size_t chunk,
                                                 uint32_t record, prefetch::Priority priority,
                                                 std::span<std::byte> dest, uint32_t bytes) {
  const bool part = bytes != 0;
  CKV_ASSIGN_OR_RETURN(
      prefetch::ReadRequest r,
      reads.RequestFor(part ? pinned.PartOf(chunk, record, 0, bytes) : pinned.ReadOf(chunk, record),
                       priority));
  r.name = absl::StrCat("record ", pinned.chunks()[chunk].key.ToHex().substr(0, 16), "/L", record,
                        part ? " (keys)" : "");
  CKV_DCHECK(ReadFitsRecord(pinned, chunk, record, r, dest.size()));
  r.dest = dest;
  return r;
}

bool SelectsRemoteRecords(const ReprefillOptions& options) {
  return kernels::ReadsSummaries(KindOf(options.selector)) && ChoosesChunks(options);
}

absl::StatusOr<SessionParts> PartsOf(SessionHost& host) {
  SessionParts parts;
  parts.store = &host.store();
  CKV_ASSIGN_OR_RETURN(parts.reads, host.reads());
  parts.tiers = host.tiers();
  parts.remote = host.remote_tier();
  parts.selector_clock = host.selector_clock();
  parts.scoring_keys = host.scoring_keys();
  parts.record_session = [&host](const SessionStats& stats) { host.RecordSession(stats); };
  return parts;
}

absl::StatusOr<std::unique_ptr<ReprefillSession>> BeginSession(const SessionParts& parts,
                                                               const ModelSpec& spec,
                                                               std::span<const int32_t> tokens,
                                                               const ReprefillOptions& options) {
  CKV_RETURN_IF_ERROR(spec.Validate());
  if (!(options.budget_fraction > 0 && options.budget_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReprefillOptions.budget_fraction = ", options.budget_fraction, ": must be in (0, 1]"));
  }
  if (!(options.target_mass >= 0 && options.target_mass <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReprefillOptions.target_mass = ", options.target_mass, ": must be in [0, 1]"));
  }
  if (options.rescore_layers &&
      (!options.period_selection || !kernels::ReadsSummaries(KindOf(options.selector)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReprefillOptions.rescore_layers needs period_selection and a summary selector (quest, "
        "mean-key, outlier-key); this session's selector is ",
        std::string(SelectorName(options.selector)), ", period_selection ",
        options.period_selection ? "on" : "off"));
  }
  if (options.window < 1 || options.window > 4096 || options.period_layers < 1 ||
      options.period_layers > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("ReprefillOptions: window ", options.window,
                                                   " (1..4096), period_layers ",
                                                   options.period_layers, " (1..1024)"));
  }
  std::vector<ChunkKey> keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<storage::PinnedChunks> pinned,
                       parts.store->PinLeading(spec, keys));
  const uint64_t local = pinned->chunks().size();
  RemoteHeads remote;
  std::vector<int32_t> fill_tokens;
  if (parts.remote != nullptr && SelectsRemoteRecords(options) && local < keys.size()) {
    remote = parts.remote->FindHeads(spec, tokens, local, kMaxRemoteSessionChunks);
    const size_t chunks = local + remote.size();
    fill_tokens.assign(tokens.begin(), tokens.begin() + chunks * spec.chunk_tokens);
  }
  keys.resize(local);
  keys.insert(keys.end(), remote.keys.begin(), remote.keys.end());
  auto session =
      std::make_unique<SessionImpl>(parts, spec, options, std::move(keys), std::move(pinned),
                                    std::move(remote), std::move(fill_tokens));
  CKV_RETURN_IF_ERROR(session->LoadSummaries());
  return session;
}

}  // namespace engine
}  // namespace ckv
