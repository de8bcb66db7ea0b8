// SPDX-License-Identifier: Apache-2.0
// bench/reprefill/baseline.h: what the baselines (full, h2o, impress) share: the engine's store
// and read engine under tiers of their own, record reads built as the sessions build them
// (engine::RecordRead), and key reads from the key file.
#ifndef CKV_BENCH_REPREFILL_BASELINE_H_
#define CKV_BENCH_REPREFILL_BASELINE_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "bench/reprefill/read_batch.h"
#include "bench/reprefill/systems.h"
#include "engine/internal.h"
#include "kernels/selector.h"

namespace ckv::bench {

class BaselineRunner : public SystemRunner {
 protected:
  explicit BaselineRunner(const RunContext& ctx);

  // One layer's loads. Its buffers are sized once for the longest prefix when the runner is
  // made (before timing) and reused: a request's clock pays no allocation, page fault or zero
  // fill for them.
  struct Layer {
    std::vector<const std::byte*> rec;        // per chunk: its record (or K-only scratch)
    std::vector<std::vector<std::byte>> own;  // per chunk: a record-sized buffer
    std::vector<bool> filled;                 // per chunk: own[j] was read into (or built)
    std::vector<engine::TierManager::Handle> pins;
    std::vector<std::byte> keys;  // key-file bytes of this layer
    // Key segments read from the key file for the tiers, offered once they land (admitted when
    // the request ends, Admit): (kv head, first chunk, chunks).
    struct KeySegment {
      uint32_t head, first, chunks;
    };
    std::vector<KeySegment> key_segments;
    std::vector<std::vector<std::byte>> extra;  // a system's own buffers (SizeExtra)
    uint64_t h2d_bytes = 0;                     // bytes that must cross PCIe for it
    std::unique_ptr<ReadBatch> batch;           // waited for before the layer is reused
  };
  // Returns a layer to the runner's pool when it goes (after waiting for its reads), or holds
  // it until AdmitHeld when the tiers may admit from its buffers.
  struct Recycle {
    BaselineRunner* runner = nullptr;
    void operator()(Layer* L) const;
  };
  using LayerPtr = std::unique_ptr<Layer, Recycle>;
  // A pooled layer, reset for a prefix of n chunks.
  LayerPtr NewLayer(uint32_t n);
  // Gives every layer, pooled and to come, `count` extra buffers of `bytes` (before timing).
  void SizeExtra(size_t count, size_t bytes);
  // A layer whose buffers hold a prefix of n chunks, extra buffers included.
  std::unique_ptr<Layer> MakeLayer(uint32_t n) const;
  void SizeExtraOf(Layer& L) const;

  // A tier lookup of record `record` of chunk `k`, counting the hit. With `lru_touch`, the hit
  // is a use: the chunk is ranked by its last use when the request ends (AdmitHeld), once per
  // chunk and request, as the engine's sessions rank theirs in Finish, not once per record hit
  // (TierManager::UpdateScore re-ranks every cached record of the chunk).
  engine::TierManager::Handle Lookup(const ChunkKey& k, uint32_t record, RequestResult& out,
                                     bool lru_touch);
  // Offers record `record` of `k` to the tiers when the request ends (AdmitHeld), as the
  // engine's sessions do under a benchmark clock: a GPU system's tier copies are DMA on copy
  // engines, off the request's path, and what it loaded stays in HBM for the whole prefill.
  // `bytes` must live until AdmitHeld: a layer's buffers do (layers are held until then).
  void Admit(const ChunkKey& k, uint32_t record, std::span<const std::byte> bytes, double score);
  // Makes the admissions Admit held (those whose id `skip` names are not made), then ranks the
  // chunks Lookup hit with `lru_touch`, in one clock bracket, once none of the request's reads
  // is in flight, and returns the held layers to the pool.
  void AdmitHeld(const std::function<bool(const engine::RecordId&)>& skip = {});
  // Forgets what a failed request held: each Run starts with it.
  void DropHeld();
  double Tick() { return double(ctx_.state->tick.fetch_add(1)); }

  // Requests whole records of `chunks` at `layer` that the tiers do not hold, into L.
  absl::Status RequestRecords(const storage::PinnedChunks& pinned, uint32_t layer,
                              std::span<const uint32_t> chunks, Layer& L, RequestResult& out,
                              bool lru_touch);
  // Requests from the key file the keys of `layer`, kv heads `heads`, of each chunk with
  // need[j], in runs of consecutive chunks.
  absl::Status RequestKeys(uint32_t conversation, uint32_t layer, uint32_t n,
                           const std::vector<bool>& need, const std::vector<uint32_t>& heads,
                           Layer& L, RequestResult& out,
                           prefetch::Priority priority = prefetch::Priority::kDemand);
  // The priority of a next layer's preload: below this layer's demand reads, so that those go
  // first, as ckv's planner queues its prefetch below its demand reads. Only with one request at
  // a time (--concurrency 1): the runners do not promote a preload their layer comes to wait
  // for, as ckv's sessions do, so beside other requests' demand reads it stays on demand.
  prefetch::Priority PreloadPriority() const {
    return ctx_.w->flags().concurrency == 1 ? prefetch::Priority::kIntraPeriod
                                            : prefetch::Priority::kDemand;
  }
  // K-only scratch records for the selector from the key file's head-major bytes, for each
  // chunk with from_keys[j].
  void ScratchRecords(uint32_t n, const std::vector<bool>& from_keys,
                      const std::vector<uint32_t>& heads, Layer& L);
  // Scores `layer` from the key-file bytes in L: gathers kv heads `heads` of each chunk with
  // from_keys[j] into scoring layout and runs selector `kind`, both on the scoring clock (taken
  // out of the latency: a GPU does this in its scoring kernel), then spends the scoring's FLOPs
  // on the modelled GPU once the keys have crossed (`keys_there`).
  absl::StatusOr<kernels::Selection> ScoreKeys(kernels::SelectorKind kind, uint32_t layer,
                                               uint32_t n, std::span<const float> queries,
                                               const std::vector<bool>& from_keys,
                                               const std::vector<uint32_t>& heads, Layer& L,
                                               const kernels::SelectOptions& so,
                                               absl::Time keys_there);
  // The tokens a token-level system attends to: its selected tokens and every token of the
  // sink and recent chunks it always loads. Sorted.
  std::vector<uint32_t> Attended(const std::vector<uint32_t>& tokens, uint32_t n,
                                 const kernels::SelectOptions& so) const;
  // Waits for L's reads, counting the wait as a bubble.
  absl::Status Wait(Layer& L, RequestResult& out);

  const RunContext ctx_;
  const ModelSpec& spec_;
  KeyFile kf_;
  const uint32_t max_chunks_;  // of the longest prefix
  // The pool: 3 layers (current, next, one spare), or one per model layer and two spare when
  // there are tiers, as layers are held until AdmitHeld.
  std::vector<std::unique_ptr<Layer>> free_;
  std::vector<std::unique_ptr<Layer>> held_;  // recycled layers whose buffers Admit points into
  struct Held {
    engine::RecordId id;
    std::span<const std::byte> bytes;
    double score;
  };
  std::vector<Held> admissions_;  // what Admit holds for AdmitHeld
  // Chunks an LRU lookup hit this request, each with the tick of that hit (repeats included).
  using Touch = std::pair<ChunkKey, double>;
  std::vector<Touch> touched_;
  size_t extra_count_ = 0, extra_bytes_ = 0;
  static constexpr uint32_t kMaxIo = 256 * 1024;
};

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_BASELINE_H_
