// SPDX-License-Identifier: Apache-2.0
// Chunk keys: hex form and the hash chain (see include/ckv/chunk_key.h).
//
// Encoding hashed by ChainChunkKey (format 1; persisted in every store through the catalog's
// keys, so never change it without a store format bump):
//
//   bytes  0..7    parent.hi         uint64, little-endian
//   bytes  8..15   parent.lo         uint64, little-endian
//   bytes 16..23   fingerprint.hi    uint64, little-endian
//   bytes 24..31   fingerprint.lo    uint64, little-endian
//   bytes 32..     tokens[0..n)      int32 each, little-endian (two's complement)
//
// hashed with XXH3-128 unseeded (XXH3_128bits, stable since xxHash 0.8.0); key.hi = high64,
// key.lo = low64. The token count is not encoded: it is fixed by the spec's chunk size, which the
// fingerprint already binds.
#include "ckv/chunk_key.h"

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include "xxhash.h"

namespace ckv {
namespace {

// The installed Abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW
// is 0), which std::string_view does not convert to implicitly.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr char kHexDigits[] = "0123456789abcdef";

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void PutLe64(uint64_t v, std::byte* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(v >> (8 * i));
}

// Used only on big-endian hosts.
[[maybe_unused]] void PutLe32(uint32_t v, std::byte* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::byte>(v >> (8 * i));
}

}  // namespace

std::string ChunkKey::ToHex() const {
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[i] = kHexDigits[(hi >> (60 - 4 * i)) & 0xf];
    out[16 + i] = kHexDigits[(lo >> (60 - 4 * i)) & 0xf];
  }
  return out;
}

absl::StatusOr<ChunkKey> ChunkKey::FromHex(std::string_view hex) {
  if (hex.size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk key \"", absl::CHexEscape(Sv(hex.substr(0, 64))),
                     "\": expected 32 hex digits, got ", hex.size(), " characters"));
  }
  ChunkKey key;
  for (size_t i = 0; i < 32; ++i) {
    const int v = HexValue(hex[i]);
    if (v < 0) {
      return absl::InvalidArgumentError(absl::StrCat("chunk key \"", absl::CHexEscape(Sv(hex)),
                                                     "\": character ", i, " is not a hex digit"));
    }
    uint64_t& half = i < 16 ? key.hi : key.lo;
    half = (half << 4) | static_cast<uint64_t>(v);
  }
  return key;
}

ChunkKey ChainChunkKey(const ChunkKey& parent, const ChunkKey& fingerprint,
                       std::span<const int32_t> chunk_tokens) {
  std::array<std::byte, 32> header;
  PutLe64(parent.hi, header.data());
  PutLe64(parent.lo, header.data() + 8);
  PutLe64(fingerprint.hi, header.data() + 16);
  PutLe64(fingerprint.lo, header.data() + 24);

  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, header.data(), header.size());
  if constexpr (std::endian::native == std::endian::little) {
    // The in-memory int32 array already is the little-endian encoding.
    XXH3_128bits_update(&state, chunk_tokens.data(), chunk_tokens.size_bytes());
  } else {
    std::array<std::byte, 256> buf;
    size_t used = 0;
    for (int32_t t : chunk_tokens) {
      PutLe32(static_cast<uint32_t>(t), buf.data() + used);
      used += 4;
      if (used == buf.size()) {
        XXH3_128bits_update(&state, buf.data(), used);
        used = 0;
      }
    }
    XXH3_128bits_update(&state, buf.data(), used);
  }
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return ChunkKey{h.high64, h.low64};
}

std::vector<ChunkKey> ChainChunkKeys(const ChunkKey& fingerprint, uint32_t chunk_tokens,
                                     std::span<const int32_t> tokens) {
  std::vector<ChunkKey> keys;
  if (chunk_tokens == 0) return keys;
  const size_t chunks = tokens.size() / chunk_tokens;
  keys.reserve(chunks);
  ChunkKey parent;  // the zero key
  for (size_t i = 0; i < chunks; ++i) {
    parent = ChainChunkKey(parent, fingerprint, tokens.subspan(i * chunk_tokens, chunk_tokens));
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace ckv
