// SPDX-License-Identifier: Apache-2.0
// impress: IMPRESS (FAST'25), built as its authors describe it (docs/baselines.md, "impress"):
//  - identification: the keys of 3 probe q heads (--impress-probes: "group", 3 heads of one GQA
//    group, so one kv head's keys are read; or "spread", one head in each of 3 groups) are read
//    from the key file, and the probes' mean attention picks the top budget_fraction of tokens;
//  - the next layer's probe keys are read while this layer scores, loads and computes (keys do
//    not depend on the queries);
//  - scoring: every q head the loaded keys serve ranks the tokens (7 per kv head on qwen2.5-7b);
//  - Jaccard gate: when the probes' own top-k token sets agree less than t = j^0.6 (mean
//    pairwise Jaccard; j = r / (2 - r), --impress-gate), the layer falls back to every kv head's
//    keys and every q head;
//  - storage: its own file (impress.bin) of 64-token blocks, a block's K then V one read; the
//    selected tokens' blocks are read whole;
//  - reordering: between turns (off the request's clock; the warm-up turns repeated until it
//    converges, main.cc) each conversation's tokens are
//    permuted, per layer, so that the tokens ever selected (accumulated attention > 0) share as
//    few blocks as possible; a mapping list (token -> slot) says where each token lives;
//  - tiers: blocks keyed by (conversation, layer, physical block), score = frequency x share of
//    the block's slots that the request attended to; probe keys in segments of whole chunks
//    (one key-file read each), score = frequency x 1 (every key of a segment is used);
//  - checksums: every block and key read is verified as it lands (impress.sum, keys.sum), and a
//    block read to be reordered before it is rewritten.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/reprefill/baseline.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "kernels/selector.h"
#include "storage/record_checksum.h"

namespace ckv::bench {
namespace {

constexpr uint32_t kNone = ~0u;
constexpr uint32_t kB = ImpressFile::kBlockTokens;

// One conversation's mapping list, per layer. Immutable once published: a request reads the
// snapshot it started with.
struct ImpressLayout {
  std::vector<std::vector<uint32_t>> slot_of;   // [layer][token] -> slot
  std::vector<std::vector<uint32_t>> token_at;  // [layer][slot] -> token (kNone: padding)
  std::vector<std::vector<uint64_t>> sum;       // [layer][block]: its bytes' checksum
};

struct ImpressConversation {
  std::shared_ptr<const ImpressLayout> layout;
  std::vector<std::vector<double>> importance;  // [layer][token]: accumulated attention
  bool reordered = false;
};

// Reorder totals of the run (stderr at Finish).
struct ImpressCounters {
  double seconds = 0;
  uint64_t bytes_rewritten = 0;
  uint64_t reorders = 0;
};

// IMPRESS's gate threshold t = j^0.6 (docs/baselines.md): by default j = r / (2 - r), the
// expected Jaccard similarity of two independent random top-k sets that each hold a share r of
// the tokens (|A n B| = r^2 N, |A u B| = (2r - r^2) N): 0.111 at 5%. "budget" takes j = r
// (0.166 at 5%), the reading used before.
double GateThreshold(double budget, const std::string& gate) {
  const double j = gate == "budget" ? budget : budget / (2 - budget);
  return std::pow(j, 0.6);
}

ChunkKey BlockKey(uint32_t conversation, uint32_t layer, uint32_t block) {
  return ChunkKey{0x1a9e55b10c000000ull | conversation, (uint64_t{layer} << 32) | block};
}

// A segment of kv head `head`'s keys at `layer`, from chunk `first` (its record index in the
// tiers is its length in chunks).
ChunkKey KeySegmentKey(uint32_t conversation, uint32_t layer, uint32_t head, uint32_t first) {
  return ChunkKey{0x1a9e55b1e0000000ull | conversation,
                  (uint64_t{layer} << 40) | (uint64_t{head} << 24) | first};
}

class ImpressRunner final : public BaselineRunner {
 public:
  explicit ImpressRunner(const RunContext& ctx)
      : BaselineRunner(ctx),
        imf_(spec_, ctx.w->stored_tokens(), ctx.w->flags().conversations),
        stored_(static_cast<uint32_t>(ctx.w->stored_tokens())) {
    const uint32_t group = spec_.q_heads / spec_.kv_heads;
    if (ctx.w->flags().impress_probes == "spread" || group < 3) {
      for (uint32_t i = 0; i < 3; ++i) probe_q_.push_back(i * spec_.q_heads / 3);
    } else {
      probe_q_ = {0, 1, 2};  // three q heads of kv group 0
    }
    std::vector<bool> kv(spec_.kv_heads, false);
    for (uint32_t q : probe_q_) kv[q / group] = true;
    for (uint32_t h = 0; h < spec_.kv_heads; ++h) (kv[h] ? probe_kv_ : other_kv_).push_back(h);
    // Every q head the probes' keys serve scores (the gate stays the probes').
    for (uint32_t q = 0; q < spec_.q_heads; ++q) {
      if (kv[q / group]) score_q_.push_back(q);
    }
    all_q_.resize(spec_.q_heads);
    std::iota(all_q_.begin(), all_q_.end(), 0u);
    all_kv_.resize(spec_.kv_heads);
    std::iota(all_kv_.begin(), all_kv_.end(), 0u);
    // Buffers sized once, before timing.
    SizeExtra(imf_.blocks(), imf_.block_bytes());  // each layer's: per physical block, its bytes
    acc_.assign(spec_.layers, std::vector<float>(stored_, 0.0f));
    block_mark_.reserve(imf_.blocks());
    chunk_mark_.reserve(max_chunks_);
    all_chunks_.reserve(max_chunks_);
    blocks_.reserve(imf_.blocks());
    scores_.reserve(size_t{spec_.layers} * (imf_.blocks() + spec_.kv_heads * (max_chunks_ + 1)));
    if (!ctx.state->impress_counters)
      ctx.state->impress_counters = std::make_shared<ImpressCounters>();
  }

  absl::StatusOr<RequestResult> Run(const Request& r,
                                    const std::vector<std::vector<float>>& queries) override {
    RequestResult out;
    out.loaded.resize(spec_.layers);
    out.attended.resize(spec_.layers);
    DropHeld();
    const absl::Time start = absl::Now();
    const uint32_t c = spec_.chunk_tokens;
    const uint32_t n = static_cast<uint32_t>(ctx_.w->Prefix(r).size() / c);
    const uint32_t T = n * c;
    last_tokens_ = T;
    const size_t tok_bytes = spec_.TokenBytesPerLayer();
    std::shared_ptr<const ImpressLayout> layout;
    {
      absl::MutexLock lock(&ctx_.state->mu);
      layout = Conversation(r.conversation).layout;
    }
    kernels::SelectOptions so;
    so.budget_fraction = ctx_.budget;
    so.impress_probe_q_heads = probe_q_;
    so.impress_score_q_heads = score_q_;
    kernels::SelectOptions so_all = so;
    so_all.impress_probe_q_heads = all_q_;
    so_all.impress_score_q_heads.clear();  // every head probes and scores
    const double threshold = GateThreshold(ctx_.budget, ctx_.w->flags().impress_gate);
    all_need_.assign(n, true);
    scores_.clear();

    LayerPtr cur = NewLayer(n);
    CKV_RETURN_IF_ERROR(RequestKeysCached(r.conversation, 0, n, probe_kv_, *cur, out));
    for (uint32_t l = 0; l < spec_.layers; ++l) {
      CKV_RETURN_IF_ERROR(Wait(*cur, out));
      AdmitKeys(r.conversation, l, n, *cur);
      // The next layer's probe keys, read while this layer works.
      LayerPtr next;
      if (l + 1 < spec_.layers) {
        next = NewLayer(n);
        // Behind this layer's fallback keys and blocks, read on demand.
        CKV_RETURN_IF_ERROR(
            RequestKeysCached(r.conversation, l + 1, n, probe_kv_, *next, out, PreloadPriority()));
      }
      // The probe keys crossed PCIe as they landed.
      const uint64_t h2d_seen = cur->h2d_bytes;
      absl::Time keys_there = cur->batch->crossed();
      out.h2d_bytes += h2d_seen;
      CKV_ASSIGN_OR_RETURN(kernels::Selection sel,
                           ScoreKeys(kernels::SelectorKind::kImpress, l, n, queries[l], all_need_,
                                     probe_kv_, *cur, so, keys_there));
      if (sel.probe_jaccard < threshold && !other_kv_.empty()) {
        // The probes disagree: every head's keys, every head scores.
        out.fallback_layers++;
        CKV_RETURN_IF_ERROR(RequestKeysCached(r.conversation, l, n, other_kv_, *cur, out));
        CKV_RETURN_IF_ERROR(Wait(*cur, out));
        AdmitKeys(r.conversation, l, n, *cur);
        keys_there = cur->batch->crossed();
        out.h2d_bytes += cur->h2d_bytes - h2d_seen;
        // The scratch records keep the probe heads' keys; the other heads join them.
        CKV_ASSIGN_OR_RETURN(sel, ScoreKeys(kernels::SelectorKind::kImpress, l, n, queries[l],
                                            all_need_, other_kv_, *cur, so_all, keys_there));
      }
      out.bytes_needed += sel.tokens.size() * 2 * tok_bytes;
      uint64_t load_h2d = 0;
      CKV_RETURN_IF_ERROR(LoadLayer(r, l, n, sel, so, *layout, *cur, out, &load_h2d));
      out.h2d_bytes += load_h2d;
      ctx_.gpu->Compute(ctx_.LayerSeconds(sel.tokens.size()), cur->batch->crossed());
      cur = std::move(next);
    }
    {
      // Under the lock AfterRequest reorders under: a request that ran beside this one
      // (--concurrency > 1) may have rewritten the conversation's blocks meanwhile, and bytes of
      // the old layout are not cached. Key segments stay valid (the key file is not reordered).
      absl::MutexLock lock(&ctx_.state->mu);
      const bool stale = Conversation(r.conversation).layout != layout;
      const uint64_t blocks = BlockKey(r.conversation, 0, 0).hi;
      AdmitHeld([&](const engine::RecordId& id) { return stale && id.chunk.hi == blocks; });
    }
    if (ctx_.state->tiers) {
      // Block score = frequency x share of important tokens.
      absl::MutexLock lock(&ctx_.state->mu);
      for (const auto& [key, share] : scores_) {
        const uint64_t f = ++ctx_.state->freq[key];
        ctx_.state->tiers->UpdateScore(key, double(f) * share);
      }
    }
    out.latency_s = absl::ToDoubleSeconds(absl::Now() - start);
    return out;
  }

  // Layer l's keys of kv heads `heads`, in segments of whole chunks (one key-file read each):
  // a segment the tiers hold is copied from there (on the scoring clock: a GPU scores it where
  // it lies; a CPU-tier copy crosses PCIe), the others are read, verified, and offered by
  // AdmitKeys once they land (admitted when the request ends). IMPRESS keeps its probe keys in
  // its tiers like any other data.
  absl::Status RequestKeysCached(uint32_t conversation, uint32_t l, uint32_t n,
                                 const std::vector<uint32_t>& heads, Layer& L, RequestResult& out,
                                 prefetch::Priority priority = prefetch::Priority::kDemand) {
    const uint32_t c = spec_.chunk_tokens;
    const size_t kb = kf_.key_bytes();
    const uint32_t seg = SegmentChunks();
    for (uint32_t h : heads) {
      key_need_.assign(n, false);
      bool any = false;
      for (uint32_t first = 0; first < n; first += seg) {
        const uint32_t len = std::min(seg, n - first);
        const ChunkKey key = KeySegmentKey(conversation, l, h, first);
        scores_.push_back({key, 1.0});  // every key of the segment is used
        if (auto hit = Lookup(key, len, out, /*lru_touch=*/false)) {
          ctx_.clock->Begin();
          std::memcpy(L.keys.data() + (size_t{h} * n * c + size_t{first} * c) * kb, hit.data(),
                      hit.size());
          ctx_.clock->End(0);
          if (hit.level() != engine::TierLevel::kGpu) {
            L.h2d_bytes += hit.size();
            L.batch->Charge(hit.size());
          }
          L.pins.push_back(std::move(hit));
          continue;
        }
        std::fill(key_need_.begin() + first, key_need_.begin() + first + len, true);
        if (ctx_.state->tiers) L.key_segments.push_back({h, first, len});
        any = true;
      }
      if (any) {
        CKV_RETURN_IF_ERROR(RequestKeys(conversation, l, n, key_need_, {h}, L, out, priority));
      }
    }
    return absl::OkStatus();
  }

  // Offers the tiers the key segments of L that landed (after Wait).
  void AdmitKeys(uint32_t conversation, uint32_t l, uint32_t n, Layer& L) {
    const uint32_t c = spec_.chunk_tokens;
    const size_t kb = kf_.key_bytes();
    absl::MutexLock lock(&ctx_.state->mu);
    for (const Layer::KeySegment& s : L.key_segments) {
      const ChunkKey key = KeySegmentKey(conversation, l, s.head, s.first);
      const double f = double(ctx_.state->freq[key] + 1);
      Admit(key, s.chunks,
            std::span<const std::byte>(
                L.keys.data() + (size_t{s.head} * n * c + size_t{s.first} * c) * kb,
                size_t{s.chunks} * c * kb),
            f);
    }
    L.key_segments.clear();
  }

  // Chunks per key segment: as many as one read takes.
  uint32_t SegmentChunks() const {
    return static_cast<uint32_t>(std::max<size_t>(1, kMaxIo / kf_.chunk_key_bytes()));
  }

  // Layer l's loads: the physical blocks holding the tokens `sel` attends to, from the tiers or
  // read from the block file, then what they hold in logical chunks (out.loaded, out.attended),
  // and the blocks' scores; read blocks are offered to the tiers (admitted when the request
  // ends). `*load_h2d` gets the bytes that cross PCIe.
  absl::Status LoadLayer(const Request& r, uint32_t l, uint32_t n, const kernels::Selection& sel,
                         const kernels::SelectOptions& so, const ImpressLayout& layout, Layer& cur,
                         RequestResult& out, uint64_t* load_h2d) {
    const uint32_t c = spec_.chunk_tokens;
    const uint32_t T = n * c;
    std::vector<uint32_t> attended = Attended(sel.tokens, n, so);
    // The physical blocks holding the attended tokens (the mapping list).
    const std::vector<uint32_t>& slot_of = layout.slot_of[l];
    const std::vector<uint32_t>& token_at = layout.token_at[l];
    block_mark_.assign(imf_.blocks(), 0);
    std::vector<float>& acc = acc_[l];
    std::fill(acc.begin(), acc.begin() + T, 0.0f);
    for (uint32_t t : attended) {
      block_mark_[slot_of[t] / kB]++;
      acc[t] = sel.token_mass[t];
    }
    blocks_.clear();
    for (uint32_t b = 0; b < imf_.blocks(); ++b) {
      if (block_mark_[b]) blocks_.push_back(b);
    }
    ReadBatch& batch = *cur.batch;
    read_mark_.assign(imf_.blocks(), false);
    for (uint32_t b : blocks_) {
      const ChunkKey key = BlockKey(r.conversation, l, b);
      if (auto h = Lookup(key, 0, out, /*lru_touch=*/false)) {
        if (h.level() != engine::TierLevel::kGpu) {
          *load_h2d += 2 * imf_.kv_bytes();
          batch.Charge(2 * imf_.kv_bytes());
        }
        cur.pins.push_back(std::move(h));
        continue;
      }
      // One read per block, verified against its checksum as it lands.
      prefetch::ReadRequest q;
      q.file = ctx_.impress_file;
      q.offset = imf_.Offset(r.conversation, l, b);
      q.length = static_cast<uint32_t>(imf_.block_bytes());
      q.priority = prefetch::Priority::kDemand;
      q.verify_checksum = true;
      q.expected_checksum = layout.sum[l][b];
      q.name =
          absl::StrCat("impress.bin: conversation ", r.conversation, ", layer ", l, ", block ", b);
      q.dest = std::span<std::byte>(cur.extra[b]);
      batch.Add(std::move(q), /*cross_bytes=*/2 * imf_.kv_bytes());
      read_mark_[b] = true;
      out.bytes_read += imf_.block_bytes();
      out.nvme_records++;
      *load_h2d += 2 * imf_.kv_bytes();
    }
    CKV_RETURN_IF_ERROR(batch.Submit());
    CKV_RETURN_IF_ERROR(Wait(cur, out));
    // What was loaded, in logical chunks (fidelity gathers them; attended says which tokens).
    chunk_mark_.assign(n, false);
    for (uint32_t b : blocks_) {
      for (uint32_t s = b * kB; s < (b + 1) * kB; ++s) {
        const uint32_t t = token_at[s];
        if (t != kNone && t < T) chunk_mark_[t / c] = true;
      }
    }
    for (uint32_t j = 0; j < n; ++j) {
      if (chunk_mark_[j]) out.loaded[l].push_back(j);
    }
    out.attended[l] = std::move(attended);
    {
      absl::MutexLock lock(&ctx_.state->mu);
      for (uint32_t b : blocks_) {
        const ChunkKey key = BlockKey(r.conversation, l, b);
        const double share = double(block_mark_[b]) / kB;
        scores_.push_back({key, share});
        if (!read_mark_[b]) continue;
        const double f = double(ctx_.state->freq[key] + 1);
        Admit(key, 0, std::span(cur.extra[b]).first(2 * imf_.kv_bytes()), f * share);
      }
    }
    return absl::OkStatus();
  }

  // Between turns: the request's attention joins the conversation's importance, and the
  // conversation's blocks are reordered so that every token ever selected shares as few blocks
  // as it can; the blocks whose slots change are rewritten and the mapping list updated.
  absl::Status AfterRequest(const Request& r, const RequestResult&) override {
    const absl::Time t0 = absl::Now();
    absl::MutexLock lock(&ctx_.state->mu);
    ImpressConversation& conv = Conversation(r.conversation);
    auto next = std::make_shared<ImpressLayout>(*conv.layout);
    uint64_t rewritten = 0;
    for (uint32_t l = 0; l < spec_.layers; ++l) {
      std::vector<double>& imp = conv.importance[l];
      for (uint32_t t = 0; t < last_tokens_; ++t) imp[t] += acc_[l][t];
      std::vector<uint32_t> target = Packed(imp, next->token_at[l], next->slot_of[l]);
      CKV_ASSIGN_OR_RETURN(uint64_t bytes,
                           Permute(r.conversation, l, *next, std::move(target), &imp));
      rewritten += bytes;
    }
    if (rewritten > 0 && !conv.reordered) {
      conv.reordered = true;
      std::ofstream(ImpressMapPath(ctx_.w->flags()), std::ios::trunc) << "reordered\n";
    }
    conv.layout = std::move(next);
    auto& k = *std::static_pointer_cast<ImpressCounters>(ctx_.state->impress_counters);
    k.seconds += absl::ToDoubleSeconds(absl::Now() - t0);
    k.bytes_rewritten += rewritten;
    k.reorders++;
    ctx_.state->reordered_bytes += rewritten;
    return absl::OkStatus();
  }

  // Puts every conversation's blocks back in token order (the next run starts from none).
  absl::Status Finish() override {
    absl::MutexLock lock(&ctx_.state->mu);
    auto counters = std::static_pointer_cast<ImpressCounters>(ctx_.state->impress_counters);
    if (counters && counters->reorders > 0) {
      std::fprintf(stderr,
                   "%s: impress: %llu reorders between turns, %.2f s, %.1f MB rewritten (off "
                   "the requests' clocks)\n",
                   kProg, static_cast<unsigned long long>(counters->reorders), counters->seconds,
                   counters->bytes_rewritten / 1e6);
      counters->reorders = 0;
    }
    bool all_restored = true;
    for (auto& [c, p] : ctx_.state->impress) {
      auto& conv = *std::static_pointer_cast<ImpressConversation>(p);
      if (!conv.reordered) continue;
      auto next = std::make_shared<ImpressLayout>(*conv.layout);
      for (uint32_t l = 0; l < spec_.layers; ++l) {
        std::vector<uint32_t> identity(next->token_at[l].size(), kNone);
        std::iota(identity.begin(), identity.begin() + stored_, 0u);
        auto st = Permute(c, l, *next, std::move(identity));
        if (!st.ok()) {
          all_restored = false;
          break;
        }
      }
      conv.layout = std::move(next);
      conv.reordered = !all_restored;
    }
    if (all_restored) std::remove(ImpressMapPath(ctx_.w->flags()).c_str());
    return absl::OkStatus();
  }

 private:
  // REQUIRES: ctx_.state->mu held.
  ImpressConversation& Conversation(uint32_t c) {
    auto& p = ctx_.state->impress[c];
    if (!p) {
      auto conv = std::make_shared<ImpressConversation>();
      auto layout = std::make_shared<ImpressLayout>();
      const size_t slots = size_t{imf_.blocks()} * kB;
      layout->slot_of.assign(spec_.layers, std::vector<uint32_t>(stored_));
      layout->token_at.assign(spec_.layers, std::vector<uint32_t>(slots, kNone));
      layout->sum.resize(spec_.layers);
      for (uint32_t l = 0; l < spec_.layers; ++l) {
        std::iota(layout->slot_of[l].begin(), layout->slot_of[l].end(), 0u);
        std::iota(layout->token_at[l].begin(), layout->token_at[l].begin() + stored_, 0u);
        const auto first = ctx_.impress_sums->begin() + imf_.SumIndex(c, l, 0);
        layout->sum[l].assign(first, first + imf_.blocks());
      }
      conv->layout = std::move(layout);
      conv->importance.assign(spec_.layers, std::vector<double>(stored_, 0.0));
      p = std::move(conv);
    }
    return *std::static_pointer_cast<ImpressConversation>(p);
  }

  // The slots' tokens after packing: the tokens with importance > 0 gathered into the blocks
  // that already hold most of them, by swapping them with the cold tokens there (so that only
  // the blocks a swap touches change).
  std::vector<uint32_t> Packed(const std::vector<double>& imp,
                               const std::vector<uint32_t>& token_at,
                               const std::vector<uint32_t>& slot_of) const {
    const uint32_t nb = imf_.blocks();
    std::vector<uint32_t> hot(nb, 0), cap(nb, 0);
    uint32_t total = 0;
    for (uint32_t s = 0; s < token_at.size(); ++s) {
      const uint32_t t = token_at[s];
      if (t == kNone) continue;
      cap[s / kB]++;
      if (imp[t] > 0) hot[s / kB]++, total++;
    }
    std::vector<uint32_t> order(nb);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return hot[a] > hot[b]; });
    std::vector<bool> dest(nb, false);
    uint32_t room = 0;
    for (uint32_t b : order) {
      if (room >= total) break;
      dest[b] = true;
      room += cap[b];
    }
    std::vector<uint32_t> target = token_at;
    std::vector<uint32_t> cold_slots;
    for (uint32_t s = 0; s < target.size(); ++s) {
      const uint32_t t = target[s];
      if (t != kNone && dest[s / kB] && imp[t] <= 0) cold_slots.push_back(s);
    }
    size_t k = 0;
    for (uint32_t t = 0; t < stored_; ++t) {
      const uint32_t s = slot_of[t];
      if (imp[t] <= 0 || dest[s / kB]) continue;
      const uint32_t d = cold_slots[k++];  // room >= total: there is one
      std::swap(target[s], target[d]);
    }
    return target;
  }

  // Rewrites layer `l`'s blocks of conversation `c` whose slots change from `layout` to
  // `target`, and makes `target` the layout's. Returns the bytes written.
  absl::StatusOr<uint64_t> Permute(uint32_t c, uint32_t l, ImpressLayout& layout,
                                   std::vector<uint32_t> target,
                                   const std::vector<double>* imp = nullptr) {
    std::vector<uint32_t>& token_at = layout.token_at[l];
    std::vector<uint32_t>& slot_of = layout.slot_of[l];
    const uint32_t nb = imf_.blocks();
    std::vector<int> index(nb, -1);
    std::vector<uint32_t> changed;
    for (uint32_t b = 0; b < nb; ++b) {
      for (uint32_t s = b * kB; s < (b + 1) * kB; ++s) {
        if (token_at[s] != target[s]) {
          index[b] = static_cast<int>(changed.size());
          changed.push_back(b);
          break;
        }
      }
    }
    if (changed.empty()) return uint64_t{0};
    io::File* file = ctx_.impress_io;
    const size_t align = std::max<size_t>(4096, file->alignment());
    const size_t bb = imf_.block_bytes();
    std::vector<std::byte> raw(2 * changed.size() * bb + align);
    std::byte* old_base =
        raw.data() + (align - reinterpret_cast<uintptr_t>(raw.data()) % align) % align;
    std::byte* new_base = old_base + changed.size() * bb;
    for (size_t i = 0; i < changed.size(); ++i) {
      CKV_RETURN_IF_ERROR(
          file->ReadAt(imf_.Offset(c, l, changed[i]), std::span(old_base + i * bb, bb)));
      // A rewrite must not give bad bytes a fresh checksum.
      CKV_RETURN_IF_ERROR(
          storage::VerifyRecordChecksum(old_base + i * bb, bb, layout.sum[l][changed[i]], [&] {
            return absl::StrCat("impress.bin: conversation ", c, ", layer ", l, ", block ",
                                changed[i], " (read to reorder)");
          }));
    }
    const size_t tok_bytes = spec_.TokenBytesPerLayer();
    std::memset(new_base, 0, changed.size() * bb);
    for (size_t i = 0; i < changed.size(); ++i) {
      const uint32_t b = changed[i];
      for (uint32_t s = 0; s < kB; ++s) {
        const uint32_t t = target[b * kB + s];
        if (t == kNone) continue;
        const uint32_t from = slot_of[t];
        const std::byte* src = old_base + size_t(index[from / kB]) * bb;  // in `changed`
        std::byte* dst = new_base + i * bb;
        std::memcpy(dst + s * tok_bytes, src + (from % kB) * tok_bytes, tok_bytes);
        std::memcpy(dst + imf_.kv_bytes() + s * tok_bytes,
                    src + imf_.kv_bytes() + (from % kB) * tok_bytes, tok_bytes);
      }
    }
    for (size_t i = 0; i < changed.size(); ++i) {
      CKV_RETURN_IF_ERROR(
          file->WriteAt(imf_.Offset(c, l, changed[i]), std::span(new_base + i * bb, bb)));
      layout.sum[l][changed[i]] = storage::RecordChecksum(new_base + i * bb, bb);
      if (!ctx_.state->tiers) continue;
      // A tier copy of the old bytes is stale now. IMPRESS rewrites a block from memory, so
      // between turns (`imp` given) a block its tiers held is cached again with its new bytes
      // and the score of its new share of important tokens, rather than left to a miss.
      const ChunkKey key = BlockKey(c, l, changed[i]);
      const bool cached =
          imp != nullptr && static_cast<bool>(ctx_.state->tiers->Lookup(engine::RecordId{key, 0}));
      ctx_.state->tiers->Erase(key);
      if (!cached) continue;
      uint32_t hot = 0;
      for (uint32_t s = 0; s < kB; ++s) {
        const uint32_t t = target[changed[i] * kB + s];
        if (t != kNone && (*imp)[t] > 0) ++hot;
      }
      const double score = double(ctx_.state->freq[key]) * hot / kB;
      ctx_.state->tiers
          ->Admit(engine::RecordId{key, 0},
                  std::span<const std::byte>(new_base + i * bb, 2 * imf_.kv_bytes()),
                  score)
          .IgnoreError();  // not cached again: the next load reads it
    }
    token_at = std::move(target);
    for (uint32_t s = 0; s < token_at.size(); ++s) {
      if (token_at[s] != kNone) slot_of[token_at[s]] = s;
    }
    return uint64_t{changed.size() * bb};
  }

  const ImpressFile imf_;
  const uint32_t stored_;
  std::vector<uint32_t> probe_q_, score_q_, probe_kv_, other_kv_, all_q_, all_kv_;
  // Reused across requests (sized before timing).
  std::vector<std::vector<float>> acc_;  // per layer, per token: this request's mass
  std::vector<uint32_t> block_mark_, blocks_, all_chunks_;
  std::vector<bool> chunk_mark_, read_mark_, all_need_, key_need_;
  std::vector<std::pair<ChunkKey, double>> scores_;
  uint32_t last_tokens_ = 0;
};

}  // namespace

std::unique_ptr<SystemRunner> MakeImpressRunner(const RunContext& ctx) {
  return std::make_unique<ImpressRunner>(ctx);
}

}  // namespace ckv::bench
