// SPDX-License-Identifier: Apache-2.0
#include "bench/reprefill/baseline.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "engine/internal.h"
#include "storage/record_checksum.h"

namespace ckv::bench {

BaselineRunner::BaselineRunner(const RunContext& ctx)
    : ctx_(ctx),
      spec_(ctx_.spec),
      kf_(ctx.w->spec(), ctx.w->stored_tokens(), ctx.w->flags().conversations),
      max_chunks_(static_cast<uint32_t>(ctx.w->stored_tokens() / ctx.w->spec().chunk_tokens)) {
  const uint32_t pool = ctx.state->tiers ? spec_.layers + 2 : 3;
  for (uint32_t i = 0; i < pool; ++i) free_.push_back(MakeLayer(max_chunks_));
  if (ctx.state->tiers) {  // not grown on a request's time
    held_.reserve(pool);
    admissions_.reserve(size_t{spec_.layers} * max_chunks_ * (2 + spec_.kv_heads));
    touched_.reserve(admissions_.capacity() + size_t{spec_.layers} * max_chunks_ * 2);
  }
}

void BaselineRunner::Recycle::operator()(Layer* L) const {
  if (L->batch) L->batch->Wait().IgnoreError();
  L->pins.clear();
  (runner->ctx_.state->tiers ? runner->held_ : runner->free_).push_back(std::unique_ptr<Layer>(L));
}

std::unique_ptr<BaselineRunner::Layer> BaselineRunner::MakeLayer(uint32_t n) const {
  auto L = std::make_unique<Layer>();
  L->rec.reserve(n);
  L->filled.reserve(n);
  L->own.resize(n);
  for (auto& b : L->own) b.resize(spec_.RecordBytes());  // zero-filled: the pages are touched
  L->keys.resize(size_t{n} * spec_.chunk_tokens * spec_.kv_heads * kf_.key_bytes());
  SizeExtraOf(*L);
  return L;
}

void BaselineRunner::SizeExtraOf(Layer& L) const {
  L.extra.resize(extra_count_);
  for (auto& b : L.extra) b.resize(extra_bytes_);  // zero-filled: the pages are touched
}

void BaselineRunner::SizeExtra(size_t count, size_t bytes) {
  extra_count_ = count;
  extra_bytes_ = bytes;
  for (auto& L : free_) SizeExtraOf(*L);
}

BaselineRunner::LayerPtr BaselineRunner::NewLayer(uint32_t n) {
  std::unique_ptr<Layer> L;
  if (!free_.empty() && n <= max_chunks_) {
    L = std::move(free_.back());
    free_.pop_back();
  } else {
    // More layers in flight than the pool holds (or a longer prefix): a fresh one.
    L = MakeLayer(n);
  }
  L->rec.assign(n, nullptr);
  L->filled.assign(n, false);
  L->pins.clear();
  L->key_segments.clear();
  L->h2d_bytes = 0;
  L->batch = std::make_unique<ReadBatch>(ctx_.reads, ctx_.gpu);
  return LayerPtr(L.release(), Recycle{this});
}

engine::TierManager::Handle BaselineRunner::Lookup(const ChunkKey& k, uint32_t record,
                                                   RequestResult& out, bool lru_touch) {
  if (!ctx_.state->tiers) return {};
  auto h = ctx_.state->tiers->Lookup(engine::RecordId{k, record});
  if (h) {
    (h.level() == engine::TierLevel::kGpu ? out.gpu_hits : out.cpu_hits)++;
    if (lru_touch) touched_.push_back({k, Tick()});
  }
  return h;
}

void BaselineRunner::Admit(const ChunkKey& k, uint32_t record, std::span<const std::byte> bytes,
                           double score) {
  if (!ctx_.state->tiers) return;
  admissions_.push_back({engine::RecordId{k, record}, bytes, score});
}

void BaselineRunner::AdmitHeld(const std::function<bool(const engine::RecordId&)>& skip) {
  // One bracket for them all, as the engine's sessions: a hold and release of the reads per
  // record would keep a wake of the read engine's thread per record on the clock.
  if (!admissions_.empty() || !touched_.empty()) {
    ctx_.clock->Begin();
    for (const Held& a : admissions_) {
      if (skip && skip(a.id)) continue;
      ctx_.state->tiers->Admit(a.id, a.bytes, a.score).IgnoreError();  // not cached: a miss later
    }
    // Then the LRU touches, as the engine's Finish ranks after its admissions: each chunk a
    // lookup hit takes the tick of its last use in this request, a hit's or an admission's
    // (an LRU system admits at Tick()), so that its records rank by when it was last used.
    if (!touched_.empty()) {
      for (const Held& a : admissions_) touched_.push_back({a.id.chunk, a.score});
      std::sort(touched_.begin(), touched_.end(), [](const Touch& x, const Touch& y) {
        return x.first != y.first ? x.first < y.first : x.second > y.second;
      });
      for (size_t i = 0; i < touched_.size(); ++i) {
        if (i == 0 || touched_[i].first != touched_[i - 1].first) {
          ctx_.state->tiers->UpdateScore(touched_[i].first, touched_[i].second);
        }
      }
    }
    ctx_.clock->End(0);
  }
  DropHeld();
}

void BaselineRunner::DropHeld() {
  admissions_.clear();
  touched_.clear();
  for (auto& H : held_) free_.push_back(std::move(H));
  held_.clear();
}

absl::Status BaselineRunner::RequestRecords(const storage::PinnedChunks& pinned, uint32_t layer,
                                            std::span<const uint32_t> chunks, Layer& L,
                                            RequestResult& out, bool lru_touch) {
  const auto& keys = pinned.chunks();
  if (!L.batch) L.batch = std::make_unique<ReadBatch>(ctx_.reads, ctx_.gpu);
  for (uint32_t j : chunks) {
    if (auto h = Lookup(keys[j].key, layer, out, lru_touch)) {
      L.rec[j] = h.data();
      if (h.level() != engine::TierLevel::kGpu) {
        L.h2d_bytes += spec_.RecordBytes();
        L.batch->Charge(spec_.RecordBytes());
      }
      L.pins.push_back(std::move(h));
      continue;
    }
    auto& buf = L.own[j];
    L.filled[j] = true;
    CKV_ASSIGN_OR_RETURN(
        prefetch::ReadRequest q,
        engine::RecordRead(*ctx_.reads, pinned, j, layer, prefetch::Priority::kDemand, buf));
    out.bytes_read += q.length;
    out.nvme_records++;
    L.h2d_bytes += spec_.RecordBytes();
    L.batch->Add(std::move(q), spec_.RecordBytes());
    L.rec[j] = buf.data();
  }
  return L.batch->Submit();
}

absl::Status BaselineRunner::RequestKeys(uint32_t conversation, uint32_t layer, uint32_t n,
                                         const std::vector<bool>& need,
                                         const std::vector<uint32_t>& heads, Layer& L,
                                         RequestResult& out, prefetch::Priority priority) {
  const uint32_t c = spec_.chunk_tokens;
  const size_t ckb = kf_.chunk_key_bytes();
  // Reads of whole chunks, so that each chunk's keys are verified against keys.sum as they land.
  const uint32_t per_read = static_cast<uint32_t>(std::max<size_t>(1, kMaxIo / ckb));
  if (!L.batch) L.batch = std::make_unique<ReadBatch>(ctx_.reads, ctx_.gpu);
  for (uint32_t j = 0; j < n;) {
    if (!need[j]) {
      ++j;
      continue;
    }
    uint32_t e = j;
    while (e < n && need[e]) ++e;
    for (uint32_t h : heads) {
      for (uint32_t a = j; a < e; a += per_read) {
        const uint32_t b = std::min(e, a + per_read);
        const size_t bytes = size_t{b - a} * ckb;
        std::byte* dst = L.keys.data() + (size_t{h} * n * c + size_t{a} * c) * kf_.key_bytes();
        prefetch::ReadRequest r;
        r.file = ctx_.key_file;
        r.offset = kf_.Offset(conversation, layer, h, size_t{a} * c);
        r.length = static_cast<uint32_t>(bytes);
        r.priority = priority;
        r.dest = std::span<std::byte>(dst, bytes);
        const size_t first = kf_.SumIndex(conversation, layer, h, a);
        L.batch->Add(std::move(r), bytes,
                     [this, first, ckb, conversation, layer, h, a](std::span<const std::byte> got) {
                       for (size_t i = 0; i * ckb < got.size(); ++i) {
                         CKV_RETURN_IF_ERROR(storage::VerifyRecordChecksum(
                             got.data() + i * ckb, ckb, (*ctx_.key_sums)[first + i], [&] {
                               return absl::StrCat("keys.bin: conversation ", conversation,
                                                   ", layer ", layer, ", kv head ", h, ", chunk ",
                                                   a + i);
                             }));
                       }
                       return absl::OkStatus();
                     });
        out.bytes_read += bytes;
        L.h2d_bytes += bytes;
      }
    }
    j = e;
  }
  return L.batch->Submit();
}

void BaselineRunner::ScratchRecords(uint32_t n, const std::vector<bool>& from_keys,
                                    const std::vector<uint32_t>& heads, Layer& L) {
  const size_t kb = kf_.key_bytes();
  const uint32_t c = spec_.chunk_tokens;
  for (uint32_t j = 0; j < n; ++j) {
    if (!from_keys[j]) continue;
    auto& buf = L.own[j];
    L.filled[j] = true;
    for (uint32_t h : heads) {
      for (uint32_t t = 0; t < c; ++t) {
        std::memcpy(buf.data() + (size_t{t} * spec_.kv_heads + h) * kb,
                    L.keys.data() + (size_t{h} * n * c + size_t{j} * c + t) * kb, kb);
      }
    }
    L.rec[j] = buf.data();
  }
}

absl::StatusOr<kernels::Selection> BaselineRunner::ScoreKeys(
    kernels::SelectorKind kind, uint32_t layer, uint32_t n, std::span<const float> queries,
    const std::vector<bool>& from_keys, const std::vector<uint32_t>& heads, Layer& L,
    const kernels::SelectOptions& so, absl::Time keys_there) {
  kernels::SelectorInput in;
  in.shape = kernels::KvShape::Of(spec_);
  in.layers = spec_.layers;
  in.layer = layer;
  in.queries = queries;
  in.window = ctx_.w->flags().window;
  in.chunks = n;
  ctx_.clock->Begin();
  ScratchRecords(n, from_keys, heads, L);
  in.records = L.rec;
  auto selected = kernels::Select(kind, in, so);
  ctx_.clock->End(0);
  if (selected.ok()) {
    ctx_.gpu->Compute(kernels::ScoringFlops(kind, in, so) / ctx_.gpu->params().flops_per_s,
                      keys_there);
  }
  return selected;
}

std::vector<uint32_t> BaselineRunner::Attended(const std::vector<uint32_t>& tokens, uint32_t n,
                                               const kernels::SelectOptions& so) const {
  const uint32_t c = spec_.chunk_tokens;
  std::vector<uint32_t> out = tokens;
  for (uint32_t j = 0; j < n; ++j) {
    if (j < so.sink_chunks || j + so.recent_chunks >= n) {
      for (uint32_t t = j * c; t < (j + 1) * c; ++t) out.push_back(t);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::Status BaselineRunner::Wait(Layer& L, RequestResult& out) {
  if (!L.batch) return absl::OkStatus();
  const absl::Time w0 = absl::Now();
  absl::Status st = L.batch->Wait();
  out.blocked_s += absl::ToDoubleSeconds(absl::Now() - w0);
  return st;
}

}  // namespace ckv::bench
