// impress: IMPRESS (FAST'25). The probe heads' keys identify the important tokens (token-level
// top-k), the 64-token blocks holding them are loaded whole (K and V), and its tiers rank blocks
// by access frequency x share of important tokens. Identification, then load, then compute.
#include <set>

#include "absl/time/clock.h"
#include "bench/reprefill/baseline.h"
#include "ckv/status.h"
#include "engine/session.h"
#include "kernels/selector.h"

namespace ckv::bench {
namespace {

class ImpressRunner final : public BaselineRunner {
 public:
  explicit ImpressRunner(const RunContext& ctx) : BaselineRunner(ctx) {}

  absl::StatusOr<RequestResult> Run(const Request& r,
                                    const std::vector<std::vector<float>>& queries) override {
    RequestResult out;
    out.loaded.resize(spec_.layers);
    out.attended.resize(spec_.layers);
    const absl::Time start = absl::Now();
    const std::vector<ChunkKey> keys =
        ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, ctx_.w->Prefix(r));
    engine::SessionHost& host = engine::HostOf(*ctx_.engine);
    CKV_ASSIGN_OR_RETURN(auto pinned, host.store().PinLeading(spec_, keys));
    const uint32_t n = static_cast<uint32_t>(pinned->chunks().size());
    const uint32_t c = spec_.chunk_tokens;
    const size_t tok_bytes = spec_.TokenBytesPerLayer();
    kernels::SelectOptions so;
    so.budget_fraction = ctx_.budget;
    // The probe kv heads (kernels/selector.h: q heads i * q_heads / 3).
    std::set<uint32_t> probe_kv;
    for (uint32_t i = 0; i < so.impress_probe_heads; ++i) {
      probe_kv.insert(i * spec_.q_heads / so.impress_probe_heads / (spec_.q_heads / spec_.kv_heads));
    }
    const std::vector<uint32_t> probe_heads(probe_kv.begin(), probe_kv.end());
    std::vector<double> block_share(n, 0.0);  // per chunk, share of important tokens summed
    const uint32_t bc = so.impress_block_tokens / c;

    for (uint32_t l = 0; l < spec_.layers; ++l) {
      auto L = NewLayer(n);
      // The probe heads' keys of the 64-token blocks the tiers do not hold whole.
      std::vector<bool> need(n, false);
      for (uint32_t b = 0; b < n; b += bc) {
        const uint32_t e = std::min(n, b + bc);
        std::vector<engine::TierManager::Handle> hs;
        for (uint32_t j = b; j < e; ++j) {
          if (auto h = Lookup(pinned->chunks()[j].key, l, out, /*lru_touch=*/false)) {
            hs.push_back(std::move(h));
          } else {
            break;
          }
        }
        if (hs.size() == e - b) {
          for (uint32_t j = b; j < e; ++j) {
            L->rec[j] = hs[j - b].data();
            if (hs[j - b].level() != engine::TierLevel::kGpu) L->h2d_bytes += spec_.RecordBytes();
            L->pins.push_back(std::move(hs[j - b]));
          }
        } else {
          // Lookup counted hits for a block it does not use whole: take them back.
          for (auto& h : hs) (h.level() == engine::TierLevel::kGpu ? out.gpu_hits : out.cpu_hits)--;
          for (uint32_t j = b; j < e; ++j) need[j] = true;
        }
      }
      CKV_RETURN_IF_ERROR(RequestKeys(r.conversation, l, n, need, probe_heads, *L, out));
      CKV_RETURN_IF_ERROR(Wait(*L, out));
      const absl::Time keys_there = ctx_.gpu->Transfer(L->h2d_bytes);
      out.h2d_bytes += L->h2d_bytes;
      std::vector<bool> from_keys(n, false);
      for (uint32_t j = 0; j < n; ++j) from_keys[j] = L->rec[j] == nullptr;
      kernels::SelectorInput in;
      in.shape = kernels::KvShape::Of(spec_);
      in.layers = spec_.layers;
      in.layer = l;
      in.queries = queries[l];
      in.window = ctx_.w->flags().window;
      in.chunks = n;
      ctx_.clock->Begin();  // a GPU gathers the keys in its scoring kernel: host time taken out
      ScratchRecords(n, from_keys, probe_heads, *L);
      in.records = L->rec;
      auto selected = kernels::Select(kernels::SelectorKind::kImpress, in, so);
      ctx_.clock->End(0);
      CKV_ASSIGN_OR_RETURN(kernels::Selection sel, std::move(selected));
      ctx_.gpu->Compute(kernels::ScoringFlops(kernels::SelectorKind::kImpress, in, so) /
                            ctx_.gpu->params().flops_per_s,
                        keys_there);
      out.bytes_needed += sel.tokens.size() * 2 * tok_bytes;
      out.loaded[l] = sel.chunks;
      out.attended[l] = Attended(sel.tokens, n, so);
      // Load the selected tokens' 64-token blocks whole, K and V.
      std::vector<uint32_t> missing;
      for (uint32_t j : sel.chunks) {
        if (from_keys[j]) missing.push_back(j);
      }
      std::vector<uint32_t> hot(n, 0);
      for (uint32_t t : sel.tokens) hot[t / c]++;
      auto loads = NewLayer(n);
      CKV_RETURN_IF_ERROR(RequestRecords(*pinned, l, missing, *loads, out, /*lru_touch=*/false));
      CKV_RETURN_IF_ERROR(Wait(*loads, out));
      {
        absl::MutexLock lock(&ctx_.state->mu);
        for (uint32_t j : sel.chunks) {
          const uint32_t b = j / bc * bc, e = std::min(n, b + bc);
          uint32_t block_hot = 0;
          for (uint32_t k = b; k < e; ++k) block_hot += hot[k];
          const double share = double(block_hot) / ((e - b) * c);
          block_share[j] += share;
          const double f = double(ctx_.state->freq[pinned->chunks()[j].key] + 1);
          if (!loads->own[j].empty()) Admit(pinned->chunks()[j].key, l, loads->own[j], f * share, L->pins);
        }
      }
      out.h2d_bytes += loads->h2d_bytes;
      ctx_.gpu->Compute(ctx_.LayerSeconds(sel.tokens.size()), ctx_.gpu->Transfer(loads->h2d_bytes));
    }
    if (ctx_.state->tiers) {
      // Block score = frequency x share of important tokens (averaged over the layers).
      absl::MutexLock lock(&ctx_.state->mu);
      for (uint32_t j = 0; j < n; ++j) {
        if (block_share[j] <= 0) continue;
        const ChunkKey& k = pinned->chunks()[j].key;
        const uint64_t f = ++ctx_.state->freq[k];
        ctx_.state->tiers->UpdateScore(k, double(f) * block_share[j] / spec_.layers);
      }
    }
    out.latency_s = absl::ToDoubleSeconds(absl::Now() - start);
    return out;
  }
};

}  // namespace

std::unique_ptr<SystemRunner> MakeImpressRunner(const RunContext& ctx) {
  return std::make_unique<ImpressRunner>(ctx);
}

}  // namespace ckv::bench
