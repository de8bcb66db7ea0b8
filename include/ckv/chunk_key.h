// SPDX-License-Identifier: Apache-2.0
// ckv/chunk_key.h: the identity of a ContiguousChunk.
//
// A chunk's key is a hash chain (as vLLM and TensorRT-LLM key their KV blocks):
//   key_0 = XXH3-128(zero key,      model fingerprint, tokens[0 .. c))
//   key_i = XXH3-128(key_{i-1},     model fingerprint, tokens[i*c .. (i+1)*c))
// A chunk's KV depends on every token before it, so equal keys mean equal KV under one model;
// prefixes that share a beginning share those chunks, and they are stored once.
//
// Thread-safety: value type and pure functions.
#ifndef CKV_CHUNK_KEY_H_
#define CKV_CHUNK_KEY_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ckv {

struct ChunkKey {
  uint64_t hi = 0;
  uint64_t lo = 0;

  // 32 lowercase hex digits, hi first.
  std::string ToHex() const;
  // Parses exactly 32 hex digits.
  static absl::StatusOr<ChunkKey> FromHex(std::string_view hex);

  bool IsZero() const { return hi == 0 && lo == 0; }
  friend bool operator==(const ChunkKey&, const ChunkKey&) = default;
  friend auto operator<=>(const ChunkKey&, const ChunkKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const ChunkKey& k) {
    return H::combine(std::move(h), k.hi, k.lo);
  }
};

// The key of the chunk whose parent is `parent` (the zero key for the first chunk) and whose
// tokens are `chunk_tokens`, under the model whose fingerprint is `fingerprint`.
ChunkKey ChainChunkKey(const ChunkKey& parent, const ChunkKey& fingerprint,
                       std::span<const int32_t> chunk_tokens);

// The keys of the whole chunks of `tokens` (tokens.size() / chunk_tokens of them; a shorter tail
// has no key).
std::vector<ChunkKey> ChainChunkKeys(const ChunkKey& fingerprint, uint32_t chunk_tokens,
                                     std::span<const int32_t> tokens);

}  // namespace ckv

#endif  // CKV_CHUNK_KEY_H_
