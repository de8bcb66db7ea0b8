// SPDX-License-Identifier: Apache-2.0
#include "engine/summaries.h"

#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"

namespace ckv::engine {

size_t SummaryPartBytes(const kernels::SummaryFormat& f, SummaryPart part) {
  switch (part) {
    case SummaryPart::kMinMax:
      return f.MinMaxBytes();
    case SummaryPart::kMean:
      return f.MeanBytes();
    case SummaryPart::kEstimate:
      return f.EstimateBytes();
    case SummaryPart::kOutlier:
      return f.OutlierBytes();
  }
  return 0;
}

storage::AuxRecords SummaryRecords(const ModelSpec& spec, const KvTensors& kv) {
  const kernels::SummaryFormat f = kernels::SummaryFormat::For(spec);
  storage::AuxRecords aux;
  aux.record_bytes = {static_cast<uint32_t>(f.MinMaxBytes()), static_cast<uint32_t>(f.MeanBytes()),
                      static_cast<uint32_t>(f.EstimateBytes()),
                      static_cast<uint32_t>(f.OutlierBytes())};
  const size_t chunk_bytes = size_t{spec.chunk_tokens} * spec.TokenBytesPerLayer();
  aux.fill = [spec, &kv, chunk_bytes](size_t chunk, std::span<const std::span<std::byte>> out) {
    // The store hands one buffer per summary part, in SummaryPart order (record_bytes above).
    CKV_DCHECK(out.size() == 4);
    for (uint32_t layer = 0; layer < spec.layers; ++layer) {
      const auto keys = kv.k[layer].subspan(chunk * chunk_bytes, chunk_bytes);
      kernels::SummarizeChunkLayer(spec, layer, keys,
                                   out[static_cast<size_t>(SummaryPart::kMinMax)],
                                   out[static_cast<size_t>(SummaryPart::kMean)],
                                   out[static_cast<size_t>(SummaryPart::kOutlier)]);
      kernels::EstimateChunkLayer(spec, layer,
                                  kv.v[layer].subspan(chunk * chunk_bytes, chunk_bytes),
                                  out[static_cast<size_t>(SummaryPart::kEstimate)]);
    }
  };
  return aux;
}

std::vector<const std::byte*> ChunkSummaries::Pointers() const {
  std::vector<const std::byte*> p(chunks());
  for (size_t i = 0; i < p.size(); ++i) p[i] = chunk(i);
  return p;
}

namespace {

ChunkSummaries EmptySummaries(const ModelSpec& spec, size_t chunks, SummaryPart part) {
  ChunkSummaries s;
  s.format = kernels::SummaryFormat::For(spec);
  s.part = part;
  s.record_bytes = SummaryPartBytes(s.format, part);
  s.data.resize(chunks * s.record_bytes);
  return s;
}

}  // namespace

absl::StatusOr<ChunkSummaries> LoadSummaries(storage::ChunkStore& store, const ModelSpec& spec,
                                             std::span<const ChunkKey> keys, SummaryPart part) {
  ChunkSummaries s = EmptySummaries(spec, keys.size(), part);
  CKV_RETURN_IF_ERROR(store.ReadAux(spec, keys, static_cast<uint32_t>(part), s.data));
  return s;
}

absl::StatusOr<ChunkSummaries> LoadSummaries(storage::ChunkStore& store, const ModelSpec& spec,
                                             const storage::PinnedChunks& pinned,
                                             std::span<const size_t> which, SummaryPart part) {
  ChunkSummaries s = EmptySummaries(spec, which.size(), part);
  CKV_RETURN_IF_ERROR(store.ReadAux(spec, pinned, which, static_cast<uint32_t>(part), s.data));
  return s;
}

}  // namespace ckv::engine
