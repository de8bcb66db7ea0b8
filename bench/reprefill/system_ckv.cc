// SPDX-License-Identifier: Apache-2.0
// ckv and ckv-paper: a ckv Re-Prefill session per request, as a serving system would run it.
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/reprefill/systems.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "kernels/summary.h"

namespace ckv::bench {
namespace {

// scoring_keys.bin as the sessions' key source: chunk keys mapped to (conversation, chunk).
class ScoringKeySource final : public engine::ScoringKeys {
 public:
  ScoringKeySource(const Workload& w, prefetch::FileId file, const std::vector<uint64_t>* sums)
      : file_(file), sums_(sums), f_(w.spec(), w.stored_tokens(), w.flags().conversations) {
    for (uint32_t c = 0; c < w.flags().conversations; ++c) {
      const std::vector<ChunkKey> keys =
          ChainChunkKeys(w.spec().Fingerprint(), w.spec().chunk_tokens, w.StoredTokens(c));
      for (uint32_t j = 0; j < f_.chunks() && j < keys.size(); ++j)
        where_.emplace(keys[j], Where{c, j});
    }
  }

  absl::StatusOr<prefetch::ReadRequest> KeysRead(const ChunkKey& chunk, uint32_t layer,
                                                 prefetch::Priority priority,
                                                 std::span<std::byte> dest) override {
    auto it = where_.find(chunk);
    if (it == where_.end()) {
      return absl::NotFoundError(absl::StrCat("scoring_keys.bin holds no chunk ", chunk.ToHex()));
    }
    if (dest.size() != f_.half_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scoring keys of ", dest.size(), " bytes asked, a K half is ", f_.half_bytes()));
    }
    const auto [c, j] = it->second;
    return f_.Read(file_, *sums_, "scoring_keys.bin", c, layer, j, priority, dest);
  }

 private:
  struct Where {
    uint32_t conversation, chunk;
  };
  const prefetch::FileId file_;
  const std::vector<uint64_t>* sums_;
  const HalfFile f_;
  absl::flat_hash_map<ChunkKey, Where> where_;  // read only once made: safe from any thread
};

class CkvRunner final : public SystemRunner {
 public:
  explicit CkvRunner(const RunContext& ctx) : ctx_(ctx) {}

  absl::StatusOr<RequestResult> Run(const Request& r,
                                    const std::vector<std::vector<float>>& queries) override {
    const ModelSpec& spec = ctx_.spec;
    const System& sys = *ctx_.sys;
    RequestResult out;
    out.loaded.resize(spec.layers);
    out.attended.resize(spec.layers);
    ReprefillOptions o;
    o.budget_fraction = sys.target ? 1.0 : ctx_.budget;
    o.target_mass = sys.target ? ctx_.budget : 0.0;
    o.selector = sys.selector;
    o.period_layers = sys.period;
    o.period_selection = sys.period_selection;
    o.window = ctx_.w->flags().window;
    o.prefetch = sys.prefetch;
    o.estimate_rest = sys.estimate;
    o.rescore_layers = sys.rescore;
    if (sys.estimate) out.estimated.resize(spec.layers);
    if (sys.estimate && ctx_.check_served && !r.warmup && measured_++ == 0) {
      out.virtual_tokens.resize(spec.layers);
    }
    const absl::Time start = absl::Now();
    CKV_ASSIGN_OR_RETURN(auto session, ctx_.engine->BeginReprefill(spec, ctx_.w->Prefix(r), o));
    // What the GPU scores from crosses PCIe too, at each scored layer: the head layer's keys
    // (period-exact), or every chunk's summary entries of the layer (quest, mean-key,
    // outlier-key: its mean and outlier entries).
    const kernels::SummaryFormat sf = kernels::SummaryFormat::For(spec);
    const uint64_t n = session->matched_chunks();
    const bool by_period = sys.selector == Selector::kPeriodExact || sys.period_selection;
    uint64_t scoring_bytes = 0;
    switch (sys.selector) {
      case Selector::kPeriodExact:
      case Selector::kOracle:
        scoring_bytes = n * spec.RecordKeyBytes();
        break;
      case Selector::kQuest:
        scoring_bytes = n * spec.kv_heads * sf.MinMaxEntryBytes();
        break;
      case Selector::kMeanKey:
        scoring_bytes = n * spec.kv_heads * sf.MeanEntryBytes();
        break;
      case Selector::kOutlierKey:
        scoring_bytes = n * spec.kv_heads * (sf.MeanEntryBytes() + sf.OutlierEntryBytes());
        break;
    }
    // The estimate's inputs cross at every layer: each chunk's estimate entries, and its mean
    // entries where the selector did not send them.
    const uint64_t estimate_bytes = sys.estimate ? n * spec.kv_heads * sf.EstimateEntryBytes() : 0;
    const uint64_t estimate_mean_bytes = sys.estimate ? n * spec.kv_heads * sf.MeanEntryBytes() : 0;
    for (uint32_t l = 0; l < spec.layers; ++l) {
      CKV_RETURN_IF_ERROR(session->SubmitQueries(l, queries[l]));
      CKV_ASSIGN_OR_RETURN(LayerView view, session->AwaitLayer(l));
      uint64_t crossing = 0;
      const bool scored = !by_period || sys.rescore || l % sys.period == 0;
      if (scored) crossing += scoring_bytes;
      crossing += estimate_bytes;
      const bool sent_means =
          scored && (sys.selector == Selector::kMeanKey || sys.selector == Selector::kOutlierKey);
      if (!sent_means) crossing += estimate_mean_bytes;
      for (const auto& rec : view.records()) {
        out.loaded[l].push_back(rec.chunk);
        if (rec.found_in != LayerView::Tier::kGpu) crossing += spec.RecordBytes();
      }
      const size_t context =
          view.records().size() * spec.chunk_tokens + view.virtual_tokens().count;
      if (!out.estimated.empty()) out.estimated[l] = view.virtual_tokens().chunks;
      if (!out.virtual_tokens.empty()) out.virtual_tokens[l] = view.TakeVirtualTokens();
      view.Release();
      out.h2d_bytes += crossing;
      ctx_.gpu->Compute(ctx_.LayerSeconds(context), ctx_.gpu->Transfer(crossing));
    }
    CKV_ASSIGN_OR_RETURN(SessionStats st, session->Finish());
    out.latency_s = absl::ToDoubleSeconds(absl::Now() - start);
    out.blocked_s = st.await_blocked_seconds;
    out.bytes_needed = st.bytes_needed;
    out.bytes_read = st.bytes_read;
    out.gpu_hits = st.gpu_hits;
    out.cpu_hits = st.cpu_hits;
    out.nvme_records = st.nvme_records;
    out.wasted_prefetch_bytes = st.prefetched_bytes_wasted;
    return out;
  }

 private:
  const RunContext ctx_;
  uint64_t measured_ = 0;  // measured (not warm-up) requests run
};

}  // namespace

std::unique_ptr<SystemRunner> MakeCkvRunner(const RunContext& ctx) {
  return std::make_unique<CkvRunner>(ctx);
}

std::unique_ptr<engine::ScoringKeys> MakeScoringKeys(const Workload& w, prefetch::FileId file,
                                                     const std::vector<uint64_t>* sums) {
  return std::make_unique<ScoringKeySource>(w, file, sums);
}

}  // namespace ckv::bench
