// SPDX-License-Identifier: Apache-2.0
// engine/summaries.h: the key summaries of chunks, written at Put time and read by selectors.
//
// Every chunk an Engine stores gets four auxiliary records besides its layers' records (see
// kernels/summary.h for their contents and storage/segment.h for their place on disk): the
// min/max part, which `quest` reads, the mean part, which `mean-key` reads, the estimate part,
// which a session with ReprefillOptions::estimate_rest reads with the mean part, and the outlier
// part, which `outlier-key` reads with the mean part. They are computed from the Put's keys (the
// estimate part from its values) on a second thread while the data is written, and checksummed
// like records. Chunks stored before the estimate part existed have the first two only; those
// stored before the outlier part, the first three.
//
// Thread-safety: pure functions; LoadSummaries is as thread-safe as ChunkStore.
#ifndef CKV_ENGINE_SUMMARIES_H_
#define CKV_ENGINE_SUMMARIES_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "ckv/kv.h"
#include "ckv/model_spec.h"
#include "kernels/summary.h"
#include "storage/chunk_store.h"

namespace ckv::engine {

// The auxiliary record index of each summary part. Persisted: do not renumber.
enum class SummaryPart : uint32_t {
  kMinMax = 0,
  kMean = 1,
  kEstimate = 2,
  kOutlier = 3,
};

// Bytes of one chunk's part `part` under format `f`.
size_t SummaryPartBytes(const kernels::SummaryFormat& f, SummaryPart part);

// The auxiliary records a Put of `kv` (the Put's whole prefix) under `spec` stores per chunk.
// The returned object refers to `kv`: it must not outlive it.
storage::AuxRecords SummaryRecords(const ModelSpec& spec, const KvTensors& kv);

// One summary part of some chunks, back to back.
struct ChunkSummaries {
  kernels::SummaryFormat format;
  SummaryPart part = SummaryPart::kMinMax;
  size_t record_bytes = 0;  // bytes of one chunk's part
  std::vector<std::byte> data;

  size_t chunks() const { return record_bytes == 0 ? 0 : data.size() / record_bytes; }
  // Chunk i's part (see kernels::MinMaxAt / MeanAt).
  const std::byte* chunk(size_t i) const { return data.data() + i * record_bytes; }
  // Pointers to every chunk's part, the form the selectors take.
  std::vector<const std::byte*> Pointers() const;
};

// Reads part `part` of the summaries of `keys` from `store`, checksums verified: a few large
// reads when the chunks were written by few Puts. Errors as ChunkStore::ReadAux.
absl::StatusOr<ChunkSummaries> LoadSummaries(storage::ChunkStore& store, const ModelSpec& spec,
                                             std::span<const ChunkKey> keys, SummaryPart part);
// As above, for chunks `which` (indices) of chunks pinned under `spec`: what a session reads, so
// that a Delete after its pin cannot fail it.
absl::StatusOr<ChunkSummaries> LoadSummaries(storage::ChunkStore& store, const ModelSpec& spec,
                                             const storage::PinnedChunks& pinned,
                                             std::span<const size_t> which, SummaryPart part);

}  // namespace ckv::engine

#endif  // CKV_ENGINE_SUMMARIES_H_
