// SPDX-License-Identifier: Apache-2.0
// The synthetic prefix and KV generator (see tools/synthetic_kv.h and docs/generator.md).
//
// Everything here is defined in integer arithmetic, so the output is the same on every compiler,
// library and machine (std::uniform_*_distribution is implementation-defined and is not used):
//
//   Mix64(x)      the splitmix64 finaliser (Steele, Lea, Flood 2014; constants 0xbf58476d1ce4e5b9,
//                 0x94d049bb133111eb, shifts 30/27/31).
//   Draw(s, j)    Mix64(s + (j + 1) * kGamma), kGamma = 0x9e3779b97f4a7c15: the j-th output of
//                 splitmix64 seeded with s. Counter based, so any range of a stream can be made
//                 without making what precedes it.
//
// A stream of values (one K or V tensor piece) takes one draw per 8 output bytes and turns each
// draw into 4 fp16/bf16 or 2 fp32 values in one 64-bit mask-and-add (see ValuePattern). Bytes are
// little-endian: draw j fills output bytes [8j, 8j + 8) low byte first; a final partial word takes
// the low bytes of its draw. On a little-endian host that is a plain 8-byte store.
#include "tools/synthetic_kv.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "ckv/chunk_key.h"
#include "ckv/codec.h"
#include "ckv/kv.h"
#include "ckv/model_spec.h"
#include "common/assert.h"

namespace ckv::synth {
namespace {

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;
// Domain tags keep the record, tail and token streams apart even for equal inputs.
constexpr uint64_t kRecordDomain = 0x636b762d7265632dULL;  // "ckv-rec-"
constexpr uint64_t kTailDomain = 0x636b762d7461696cULL;    // "ckv-tail"

// Which half of a record: K rows come first, then V rows.
enum class Part : uint64_t { kK = 0, kV = 1 };

// A broken precondition of the generator's caller: stops the process as CKV_CHECK does.
[[noreturn]] void Fail(const char* what) { ::ckv::internal::CheckFailed(__FILE__, __LINE__, what); }

// Turns 64 random bits into packed finite values of `dtype`: (r & mask) + add, lane by lane.
// In every lane the mask keeps the sign bit, the mantissa and the low 3 bits of the exponent
// field (0..7), and the add puts a bias on that field:
//   fp16 (5-bit exponent, bias 15):  field 9..16    -> |v| = 2^(field-15)  * 1.m in [2^-6, 4)
//   bf16 (8-bit exponent, bias 127): field 121..128 -> |v| = 2^(field-127) * 1.m in [2^-6, 4)
//   fp32 (8-bit exponent, bias 127): field 121..128, as bf16 with a 23-bit mantissa
// The biased field never reaches the all-ones (Inf/NaN) or zero (subnormal) encodings, and the
// add never carries out of its exponent field, so one 64-bit add serves all lanes.
struct ValuePattern {
  uint64_t mask;
  uint64_t add;
};

ValuePattern PatternFor(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
      return {0x9fff9fff9fff9fffULL, 0x2400240024002400ULL};
    case DType::kBf16:
      return {0x83ff83ff83ff83ffULL, 0x3c803c803c803c80ULL};
    case DType::kFp32:
      return {0x83ffffff83ffffffULL, 0x3c8000003c800000ULL};
  }
  Fail("unknown dtype");
}

inline void StoreLe64(std::byte* p, uint64_t w) {
  if constexpr (std::endian::native != std::endian::little) w = __builtin_bswap64(w);
  std::memcpy(p, &w, sizeof(w));
}

// Fills `out` with the value stream seeded with `seed`.
void FillValues(DType dtype, uint64_t seed, std::span<std::byte> out) {
  const ValuePattern pat = PatternFor(dtype);
  std::byte* p = out.data();
  const size_t words = out.size() / 8;
  uint64_t ctr = seed;
  for (size_t j = 0; j < words; ++j) {
    ctr += kGamma;
    StoreLe64(p + 8 * j, (Mix64(ctr) & pat.mask) + pat.add);
  }
  const size_t rest = out.size() % 8;
  if (rest != 0) {
    ctr += kGamma;
    std::byte last[8];
    StoreLe64(last, (Mix64(ctr) & pat.mask) + pat.add);
    std::memcpy(p + 8 * words, last, rest);
  }
}

uint64_t RecordSeed(const ChunkKey& key, uint32_t layer, Part part) {
  uint64_t s = Mix64(key.hi ^ kRecordDomain);
  s = Mix64(s ^ key.lo);
  return Mix64(s ^ ((static_cast<uint64_t>(layer) << 1) | static_cast<uint64_t>(part)));
}

uint64_t TailSeed(const ChunkKey& anchor, uint64_t position, int32_t token, uint32_t layer,
                  Part part) {
  uint64_t s = Mix64(anchor.hi ^ kTailDomain);
  s = Mix64(s ^ anchor.lo);
  s = Mix64(s ^ position);
  return Mix64(s ^ ((static_cast<uint64_t>(static_cast<uint32_t>(token)) << 32) |
                    (static_cast<uint64_t>(layer) << 1) | static_cast<uint64_t>(part)));
}

// The one definition of a record: its K part (c rows) and its V part (c rows), each
// spec.DecodedRecordBytes() / 2 bytes. FillRecord writes both parts into one buffer; SyntheticKv
// writes them straight into the rows of its per-layer K and V tensors, which is the same bytes
// without a copy.
void FillRecordParts(const ModelSpec& spec, const ChunkKey& key, uint32_t layer,
                     std::span<std::byte> k_out, std::span<std::byte> v_out) {
  FillValues(spec.dtype, RecordSeed(key, layer, Part::kK), k_out);
  FillValues(spec.dtype, RecordSeed(key, layer, Part::kV), v_out);
}

// Sizes `buf` to `bytes` zeroed bytes. Multi-GB tensors are bound by first-touch page faults more
// than by generation (FillValues runs at several GB/s), so on Linux the buffer is reserved first
// and its interior advised for transparent huge pages, which cuts the fault cost several-fold
// where THP is in "madvise" mode. Advice only: failure changes nothing but speed.
void AllocateTensor(std::vector<std::byte>& buf, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  if (bytes >= 2 * kHugePage) {
    buf.reserve(bytes);
    const uintptr_t start = reinterpret_cast<uintptr_t>(buf.data());
    const uintptr_t begin = (start + kHugePage - 1) & ~(kHugePage - 1);
    const uintptr_t end = (start + bytes) & ~(kHugePage - 1);
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
#endif
  buf.resize(bytes);
}

}  // namespace

std::vector<int32_t> Tokens(uint64_t seed, size_t count) {
  std::vector<int32_t> tokens(count);
  uint64_t ctr = seed;
  for (size_t p = 0; p < count; ++p) {
    ctr += kGamma;  // token p is Draw(seed, p)
    // The high 32 bits scaled to [0, kVocabSize) by a multiply-shift (Lemire); the tiny bias
    // (< 2^-14) does not matter for synthetic text.
    tokens[p] =
        static_cast<int32_t>(((Mix64(ctr) >> 32) * static_cast<uint64_t>(kVocabSize)) >> 32);
  }
  return tokens;
}

std::vector<int32_t> TokensWithSharedPrefix(uint64_t shared_seed, size_t shared, uint64_t seed,
                                            size_t count) {
  shared = std::min(shared, count);
  std::vector<int32_t> tokens = Tokens(shared_seed, shared);
  const std::vector<int32_t> rest = Tokens(seed, count - shared);
  tokens.insert(tokens.end(), rest.begin(), rest.end());
  return tokens;
}

void FillRecord(const ModelSpec& spec, const ChunkKey& key, uint32_t layer,
                std::span<std::byte> out) {
  if (out.size() != spec.DecodedRecordBytes()) {
    Fail("FillRecord: out.size() != spec.DecodedRecordBytes()");
  }
  const size_t half = out.size() / 2;
  FillRecordParts(spec, key, layer, out.first(half), out.subspan(half));
}

void FillStoredRecord(const ModelSpec& spec, const ChunkKey& key, uint32_t layer,
                      std::span<std::byte> out) {
  if (spec.codec == KvCodec::kNone) return FillRecord(spec, key, layer, out);
  std::vector<std::byte> decoded(spec.DecodedRecordBytes());
  FillRecord(spec, key, layer, decoded);
  const size_t half = decoded.size() / 2;
  const absl::Status s =
      EncodeRecord(spec, std::span(decoded).first(half), std::span(decoded).subspan(half), out);
  if (!s.ok()) Fail("FillStoredRecord: EncodeRecord failed");
}

SyntheticKv::SyntheticKv(const ModelSpec& spec, std::span<const int32_t> tokens) {
  if (!spec.Validate().ok()) Fail("SyntheticKv: invalid ModelSpec");
  const size_t n = tokens.size();
  const size_t c = spec.chunk_tokens;
  const size_t row_bytes = spec.TokenBytesPerLayer();
  const size_t part_bytes = c * row_bytes;  // K (or V) bytes of one chunk at one layer
  const std::vector<ChunkKey> keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  const size_t whole_tokens = keys.size() * c;
  // Tail tokens hang off the last whole chunk (the zero key when there is none).
  const ChunkKey anchor = keys.empty() ? ChunkKey{} : keys.back();

  k_.resize(spec.layers);
  v_.resize(spec.layers);
  tensors_.tokens = n;
  tensors_.k.reserve(spec.layers);
  tensors_.v.reserve(spec.layers);
  for (uint32_t l = 0; l < spec.layers; ++l) {
    std::vector<std::byte>& k = k_[l];
    std::vector<std::byte>& v = v_[l];
    AllocateTensor(k, n * row_bytes);
    AllocateTensor(v, n * row_bytes);
    const std::span<std::byte> ks(k);
    const std::span<std::byte> vs(v);
    for (size_t i = 0; i < keys.size(); ++i) {
      FillRecordParts(spec, keys[i], l, ks.subspan(i * part_bytes, part_bytes),
                      vs.subspan(i * part_bytes, part_bytes));
    }
    for (size_t p = whole_tokens; p < n; ++p) {
      FillValues(spec.dtype, TailSeed(anchor, p, tokens[p], l, Part::kK),
                 ks.subspan(p * row_bytes, row_bytes));
      FillValues(spec.dtype, TailSeed(anchor, p, tokens[p], l, Part::kV),
                 vs.subspan(p * row_bytes, row_bytes));
    }
    tensors_.k.emplace_back(k);
    tensors_.v.emplace_back(v);
  }
}

size_t SyntheticKv::bytes() const {
  size_t total = 0;
  for (const auto& k : k_) total += k.size();
  for (const auto& v : v_) total += v.size();
  return total;
}

const KvTensors& ReplayKv::Fill(std::span<const int32_t> tokens, size_t first_chunk) {
  const size_t c = spec_.chunk_tokens;
  const size_t part_bytes = c * spec_.TokenBytesPerLayer();
  const std::vector<ChunkKey> keys =
      ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, tokens);
  const size_t bytes = keys.size() * part_bytes;
  tensors_.tokens = keys.size() * c;
  tensors_.k.clear();
  tensors_.v.clear();
  // Every layer's buffers grow before any is filled: an allocation that fails (it throws
  // std::bad_alloc) does so before the time to generate is spent. The old ones go first, so
  // that the process never holds both.
  if (capacity_bytes_ < bytes) {
    k_.clear();
    v_.clear();
    capacity_bytes_ = 0;
    for (uint32_t l = 0; l < spec_.layers; ++l) {
      k_.push_back(std::make_unique_for_overwrite<std::byte[]>(bytes));
      v_.push_back(std::make_unique_for_overwrite<std::byte[]>(bytes));
    }
    capacity_bytes_ = bytes;
    // The chunks before first_chunk are not generated: zeros here rather than whatever the
    // allocator returned (they were the previous prompt's bytes while buffers grew in place).
    const size_t skipped = std::min(first_chunk, keys.size()) * part_bytes;
    for (uint32_t l = 0; l < spec_.layers; ++l) {
      std::memset(k_[l].get(), 0, skipped);
      std::memset(v_[l].get(), 0, skipped);
    }
  }
  for (uint32_t l = 0; l < spec_.layers; ++l) {
    const std::span<std::byte> ks(k_[l].get(), bytes);
    const std::span<std::byte> vs(v_[l].get(), bytes);
    for (size_t i = first_chunk; i < keys.size(); ++i) {
      FillRecordParts(spec_, keys[i], l, ks.subspan(i * part_bytes, part_bytes),
                      vs.subspan(i * part_bytes, part_bytes));
    }
    tensors_.k.emplace_back(k_[l].get(), bytes);
    tensors_.v.emplace_back(v_[l].get(), bytes);
  }
  return tensors_;
}

std::vector<float> ReplayQueries(const ModelSpec& spec, uint32_t window, uint64_t seed,
                                 uint32_t layer) {
  std::vector<float> q(size_t{window} * spec.q_heads * spec.head_dim);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + layer;
  for (float& v : q) {
    x += 0x9E3779B97F4A7C15ull;
    v = static_cast<float>(static_cast<double>(Mix64(x) >> 11) * 0x1.0p-52 - 1.0);
  }
  return q;
}

}  // namespace ckv::synth
