// SPDX-License-Identifier: Apache-2.0
// tools/synthetic_kv.h: deterministic synthetic prefixes and their KV, for tests, kvctl and the
// benchmarks. The model of the data is described in docs/generator.md.
//
// Tokens come from a seed. KV comes from the chunk keys: the record of chunk i at layer l is a
// pure function of (key_i, l, spec), so any stored record can be checked against the generator
// from its key alone, and two prefixes that share chunks generate identical KV for them (as a real
// model would). Tail tokens past the last whole chunk get KV from (last whole chunk key, token
// position, token id).
//
// Thread-safety: pure functions; a SyntheticKv is immutable once built (const access from any
// thread is safe).
#ifndef CKV_TOOLS_SYNTHETIC_KV_H_
#define CKV_TOOLS_SYNTHETIC_KV_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <memory>
#include <vector>

#include "ckv/chunk_key.h"
#include "ckv/kv.h"
#include "ckv/model_spec.h"

namespace ckv::synth {

// The splitmix64 finaliser, the mixing step of every generator here (and of tests that need a
// cheap deterministic hash).
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Vocabulary of the synthetic token ids (Qwen2.5's).
inline constexpr int32_t kVocabSize = 151936;

// `count` token ids in [0, kVocabSize), a pure function of (seed, position).
std::vector<int32_t> Tokens(uint64_t seed, size_t count);

// A prefix whose first `shared` tokens are Tokens(shared_seed, shared) and whose remaining
// `count - shared` tokens are Tokens(seed, count - shared): conversations that share a system
// prompt, or a prefix that shares its first chunks with another.
std::vector<int32_t> TokensWithSharedPrefix(uint64_t shared_seed, size_t shared, uint64_t seed,
                                            size_t count);

// Writes the record of the chunk with key `key` at `layer` as Put takes it: K [c, kv_heads,
// head_dim] then V in the dtype, spec.DecodedRecordBytes() bytes (what a spec without a codec
// stores). REQUIRES: out.size() == spec.DecodedRecordBytes().
// Values are finite (no NaN or Inf in any dtype), spread over about [-4, 4).
void FillRecord(const ModelSpec& spec, const ChunkKey& key, uint32_t layer,
                std::span<std::byte> out);
// The same record as ckv stores it: encoded with spec.codec (ckv/codec.h), spec.RecordBytes()
// bytes. REQUIRES: out.size() == spec.RecordBytes().
void FillStoredRecord(const ModelSpec& spec, const ChunkKey& key, uint32_t layer,
                      std::span<std::byte> out);

// The K and V tensors of a whole prefix, laid out as ckv/kv.h describes, owning their memory.
class SyntheticKv {
 public:
  // Generates the KV of `tokens` under `spec` (spec must be valid).
  SyntheticKv(const ModelSpec& spec, std::span<const int32_t> tokens);

  // Move-only: tensors() views this object's heap buffers, which a move hands over intact but a
  // copy would not (the copy's views would point into the original).
  SyntheticKv(const SyntheticKv&) = delete;
  SyntheticKv& operator=(const SyntheticKv&) = delete;
  SyntheticKv(SyntheticKv&&) = default;
  SyntheticKv& operator=(SyntheticKv&&) = default;

  // Views into this object's buffers; valid while it (or the object it is moved into) lives.
  const KvTensors& tensors() const { return tensors_; }
  size_t bytes() const;

 private:
  std::vector<std::vector<std::byte>> k_, v_;
  KvTensors tensors_;
};

// The KV of replayed prompts, in buffers reused from one prompt to the next. Fill(tokens,
// first_chunk) generates the records of whole chunks first_chunk.. of `tokens` exactly as
// SyntheticKv does and leaves the bytes of the chunks before it unspecified (what an earlier
// prompt left there): for a Put whose first `first_chunk` chunks the store holds already, which
// Put does not write again. The caller must make sure they are stored (Lookup, with no eviction
// before the Put: none with a background reclaimer, EngineStats::reclaim_margin_bytes > 0, which
// may evict them at any moment) and should check PutResult::chunks_existing >= first_chunk
// afterwards. A replay then generates only the new chunks of a request, not its whole prompt.
class ReplayKv {
 public:
  explicit ReplayKv(const ModelSpec& spec) : spec_(spec) {}

  // The tensors of the whole chunks of `tokens` (tokens.size() / c * c tokens). Valid until the
  // next Fill. Buffers grow (to the largest request so far) before any is filled; a failed
  // allocation throws std::bad_alloc.
  const KvTensors& Fill(std::span<const int32_t> tokens, size_t first_chunk);

 private:
  ModelSpec spec_;
  // Per layer, K and V of capacity_bytes_ each; not zeroed (Fill writes what it hands out), so
  // growing touches no memory, and a request too large for the process fails at once.
  std::vector<std::unique_ptr<std::byte[]>> k_, v_;
  size_t capacity_bytes_ = 0;
  KvTensors tensors_;
};

// Deterministic stand-in queries for one layer of a replayed request, float32 [window, q_heads,
// head_dim] with values in [-1, 1) from `seed`: replays measure I/O and tiers, not the quality of
// a selection.
std::vector<float> ReplayQueries(const ModelSpec& spec, uint32_t window, uint64_t seed,
                                 uint32_t layer);

}  // namespace ckv::synth

#endif  // CKV_TOOLS_SYNTHETIC_KV_H_
