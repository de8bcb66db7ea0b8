// SPDX-License-Identifier: Apache-2.0
// full: AttentionStore (CachedAttention, ATC'24). No pruning: every record of every layer, the
// next layer preloaded while this one computes, LRU tiers (a hit is a use).
#include <numeric>

#include "absl/time/clock.h"
#include "bench/reprefill/baseline.h"
#include "ckv/status.h"
#include "common/status_macros.h"

namespace ckv::bench {
namespace {

class FullRunner final : public BaselineRunner {
 public:
  explicit FullRunner(const RunContext& ctx) : BaselineRunner(ctx) { all_.reserve(max_chunks_); }

  absl::StatusOr<RequestResult> Run(const Request& r,
                                    const std::vector<std::vector<float>>&) override {
    RequestResult out;
    out.loaded.resize(spec_.layers);
    out.attended.resize(spec_.layers);
    DropHeld();
    const absl::Time start = absl::Now();
    const std::vector<ChunkKey> keys =
        ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, ctx_.w->Prefix(r));
    storage::ChunkStore& store = engine::HostOf(*ctx_.engine).store();
    CKV_ASSIGN_OR_RETURN(auto pinned, store.PinLeading(spec_, keys));
    const uint32_t n = static_cast<uint32_t>(pinned->chunks().size());
    std::vector<uint32_t>& all = all_;
    all.resize(n);
    std::iota(all.begin(), all.end(), 0u);
    auto start_layer = [&](uint32_t layer) -> absl::StatusOr<LayerPtr> {
      auto L = NewLayer(n);
      CKV_RETURN_IF_ERROR(RequestRecords(*pinned, layer, all, *L, out, /*lru_touch=*/true));
      return L;
    };
    LayerPtr next;
    for (uint32_t l = 0; l < spec_.layers; ++l) {
      LayerPtr L;
      if (next) {
        L = std::move(next);
      } else {
        CKV_ASSIGN_OR_RETURN(L, start_layer(l));
      }
      if (l + 1 < spec_.layers) {
        CKV_ASSIGN_OR_RETURN(next, start_layer(l + 1));
      }
      CKV_RETURN_IF_ERROR(Wait(*L, out));
      for (uint32_t j = 0; j < n; ++j) {
        if (L->filled[j]) Admit(pinned->chunks()[j].key, l, L->own[j], Tick());
      }
      out.loaded[l] = all;
      out.bytes_needed += size_t{n} * spec_.RecordBytes();
      out.h2d_bytes += L->h2d_bytes;
      // Its records crossed PCIe as they landed (tier hits when found).
      ctx_.gpu->Compute(ctx_.LayerSeconds(size_t{n} * spec_.chunk_tokens), L->batch->crossed());
    }
    AdmitHeld();
    out.latency_s = absl::ToDoubleSeconds(absl::Now() - start);
    return out;
  }

 private:
  std::vector<uint32_t> all_;
};

}  // namespace

std::unique_ptr<SystemRunner> MakeFullRunner(const RunContext& ctx) {
  return std::make_unique<FullRunner>(ctx);
}

}  // namespace ckv::bench
