// SPDX-License-Identifier: Apache-2.0
// h2o: AttentionStore + H2O. Every key of the layer (from the key file, or the K halves the tiers
// hold), token-level top-k by accumulated attention, then only the selected chunks' values (from
// the value file, or the V halves the tiers hold). The next layer's keys are preloaded while this
// one computes (keys do not depend on queries). LRU tiers.
#include <numeric>

#include "absl/time/clock.h"
#include "bench/reprefill/baseline.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "engine/internal.h"
#include "kernels/selector.h"

namespace ckv::bench {
namespace {

class H2oRunner final : public BaselineRunner {
 public:
  explicit H2oRunner(const RunContext& ctx)
      : BaselineRunner(ctx), vf_(spec_, ctx.w->stored_tokens(), ctx.w->flags().conversations) {
    // Value buffers in each layer, sized once: V of a chunk, page-rounded as values.bin holds it.
    SizeExtra(max_chunks_, vf_.slot_bytes());
    vread_.reserve(max_chunks_);
  }

  absl::StatusOr<RequestResult> Run(const Request& r,
                                    const std::vector<std::vector<float>>& queries) override {
    RequestResult out;
    out.loaded.resize(spec_.layers);
    out.attended.resize(spec_.layers);
    DropHeld();
    const absl::Time start = absl::Now();
    const std::vector<ChunkKey> keys =
        ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, ctx_.w->Prefix(r));
    engine::SessionHost& host = engine::HostOf(*ctx_.engine);
    CKV_ASSIGN_OR_RETURN(auto pinned, host.store().PinLeading(spec_, keys));
    const uint32_t n = static_cast<uint32_t>(pinned->chunks().size());
    const size_t half = spec_.RecordBytes() / 2;
    const size_t tok_bytes = spec_.TokenBytesPerLayer();
    kernels::SelectOptions so;
    so.budget_fraction = ctx_.budget;
    std::vector<uint32_t> heads_all(spec_.kv_heads);
    std::iota(heads_all.begin(), heads_all.end(), 0u);

    auto start_layer = [&](uint32_t layer,
                           prefetch::Priority priority) -> absl::StatusOr<LayerPtr> {
      auto L = NewLayer(n);
      // Every key: K halves the tiers hold (record 2l), the rest from the key file.
      std::vector<bool> need(n, true);
      for (uint32_t j = 0; j < n; ++j) {
        if (auto h = Lookup(pinned->chunks()[j].key, 2 * layer, out, /*lru_touch=*/true)) {
          L->rec[j] = h.data();
          if (h.level() != engine::TierLevel::kGpu) {
            L->h2d_bytes += half;
            L->batch->Charge(half);
          }
          L->pins.push_back(std::move(h));
          need[j] = false;
        }
      }
      CKV_RETURN_IF_ERROR(
          RequestKeys(r.conversation, layer, n, need, heads_all, *L, out, priority));
      return L;
    };
    LayerPtr next;
    for (uint32_t l = 0; l < spec_.layers; ++l) {
      LayerPtr L;
      if (next) {
        L = std::move(next);
      } else {
        CKV_ASSIGN_OR_RETURN(L, start_layer(l, prefetch::Priority::kDemand));
      }
      if (l + 1 < spec_.layers) {
        // Behind this layer's value reads.
        CKV_ASSIGN_OR_RETURN(next, start_layer(l + 1, PreloadPriority()));
      }
      CKV_RETURN_IF_ERROR(Wait(*L, out));
      // The keys crossed to the GPU as they landed; it scores them once all have.
      const absl::Time keys_there = L->batch->crossed();
      out.h2d_bytes += L->h2d_bytes;
      std::vector<bool> from_keys(n, false);
      for (uint32_t j = 0; j < n; ++j) from_keys[j] = L->rec[j] == nullptr;
      CKV_ASSIGN_OR_RETURN(kernels::Selection sel,
                           ScoreKeys(kernels::SelectorKind::kH2o, l, n, queries[l], from_keys,
                                     heads_all, *L, so, keys_there));
      out.bytes_needed += sel.tokens.size() * 2 * tok_bytes;
      out.loaded[l] = sel.chunks;
      out.attended[l] = Attended(sel.tokens, n, so);
      // Offer the keys read to the tiers (LRU; admitted when the request ends), then read the
      // selected chunks' values.
      for (uint32_t j = 0; j < n; ++j) {
        if (from_keys[j]) {
          Admit(pinned->chunks()[j].key, 2 * l, std::span(L->own[j]).first(half), Tick());
        }
      }
      std::vector<std::vector<std::byte>>& vbuf = L->extra;
      vread_.assign(n, false);
      ReadBatch values(ctx_.reads, ctx_.gpu);  // into L's buffers: waited for here
      uint64_t value_bytes = 0;
      for (uint32_t j : sel.chunks) {
        if (auto h = Lookup(pinned->chunks()[j].key, 2 * l + 1, out, /*lru_touch=*/true)) {
          if (h.level() != engine::TierLevel::kGpu) {
            value_bytes += half;
            values.Charge(half);
          }
          L->pins.push_back(std::move(h));
          continue;
        }
        // V of a chunk from the value file: one page-rounded read, verified as it lands;
        // adjacent chunks' reads are merged by the read engine.
        prefetch::ReadRequest q =
            vf_.Read(ctx_.value_file, *ctx_.value_sums, "values.bin", r.conversation, l, j,
                     prefetch::Priority::kDemand, std::span(vbuf[j]));
        values.Add(std::move(q), half);
        vread_[j] = true;
        out.bytes_read += vf_.slot_bytes();
        out.nvme_records++;
        value_bytes += half;
      }
      CKV_RETURN_IF_ERROR(values.Submit());
      const absl::Time v0 = absl::Now();
      CKV_RETURN_IF_ERROR(values.Wait());
      out.blocked_s += absl::ToDoubleSeconds(absl::Now() - v0);
      for (uint32_t j : sel.chunks) {
        if (vread_[j]) {
          Admit(pinned->chunks()[j].key, 2 * l + 1, std::span(vbuf[j]).first(half), Tick());
        }
      }
      out.h2d_bytes += value_bytes;
      ctx_.gpu->Compute(ctx_.LayerSeconds(sel.tokens.size()), values.crossed());
    }
    AdmitHeld();
    out.latency_s = absl::ToDoubleSeconds(absl::Now() - start);
    return out;
  }

 private:
  const HalfFile vf_;        // values.bin's layout
  std::vector<bool> vread_;  // per chunk: its V was read into its layer's extra buffer
};

}  // namespace

std::unique_ptr<SystemRunner> MakeH2oRunner(const RunContext& ctx) {
  return std::make_unique<H2oRunner>(ctx);
}

}  // namespace ckv::bench
