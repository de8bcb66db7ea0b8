// SPDX-License-Identifier: Apache-2.0
// The record codecs: fp8 e4m3, int8 and int4 with per-chunk scales (see include/ckv/codec.h).
//
// Built with -ffp-contract=off (common/CMakeLists.txt): a decoded element is m + q * s rounded
// twice, never fused into one rounding, so every machine and the CUDA kernel decode the same bits.
#include "ckv/codec.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ckv/model_spec.h"
#include "common/half.h"

namespace ckv {
namespace {

constexpr float kHalfMax = 65504.0f;

// The smallest fp16 >= v (v finite, |v| <= 65504).
uint16_t HalfAtLeast(float v) {
  uint16_t h = FloatToHalf(v);
  if (HalfToFloat(h) >= v) return h;
  if (h == 0x8000u) return 0x0001u;      // -0 -> the smallest positive subnormal
  return (h & 0x8000u) ? h - 1 : h + 1;  // one step towards +inf
}
// The largest fp16 <= v.
uint16_t HalfAtMost(float v) { return HalfAtLeast(-v) ^ 0x8000u; }

float LoadElement(DType dtype, const std::byte* p) {
  switch (dtype) {
    case DType::kFp16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return HalfToFloat(h);
    }
    case DType::kBf16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return Bf16ToFloat(b);
    }
    case DType::kFp32:
      break;
  }
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

void StoreElement(DType dtype, float f, std::byte* p) {
  switch (dtype) {
    case DType::kFp16: {
      // A scale rounded up can carry q * s past 65504: the largest fp16, never infinity.
      const uint16_t h = FloatToHalf(std::clamp(f, -kHalfMax, kHalfMax));
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::kBf16: {
      const uint16_t b = FloatToBf16(f);
      std::memcpy(p, &b, 2);
      return;
    }
    case DType::kFp32:
      break;
  }
  std::memcpy(p, &f, 4);
}

// Finite, within fp16's range: a scale must be an fp16.
float Sanitise(float x) {
  if (std::isnan(x)) return 0.0f;
  return std::clamp(x, -kHalfMax, kHalfMax);
}

// The groups of one part: group g's elements are at base(g) + i * stride, i < count.
struct Grouping {
  size_t groups;
  size_t count;
  size_t stride;
  size_t base_step;  // base(g) = g * base_step
};
// Keys per channel: group h * D + d holds the c tokens' element (t, h, d).
Grouping KeyGroups(const ModelSpec& s) {
  const size_t hd = size_t{s.kv_heads} * s.head_dim;
  return {hd, s.chunk_tokens, hd, 1};
}
// Values per token: group t * H + h holds the D elements of (t, h).
Grouping ValueGroups(const ModelSpec& s) {
  return {size_t{s.chunk_tokens} * s.kv_heads, s.head_dim, 1, s.head_dim};
}

void PutHalf(uint16_t h, std::byte* p) { std::memcpy(p, &h, 2); }
uint16_t GetHalf(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

void SetNibble(std::byte* payload, size_t i, uint8_t q) {
  uint8_t b = static_cast<uint8_t>(payload[i / 2]);
  b = (i % 2 == 0) ? static_cast<uint8_t>((b & 0xf0u) | q)
                   : static_cast<uint8_t>((b & 0x0fu) | (q << 4));
  payload[i / 2] = static_cast<std::byte>(b);
}
uint8_t GetNibble(const std::byte* payload, size_t i) {
  const uint8_t b = static_cast<uint8_t>(payload[i / 2]);
  return (i % 2 == 0) ? (b & 0x0fu) : (b >> 4);
}

// Encodes one part (K or V): `x` holds its N elements as floats, sanitised.
void EncodePart(KvCodec codec, const Grouping& g, const std::vector<float>& x, std::byte* out) {
  const size_t n = x.size();
  std::byte* payload = out;
  std::byte* scales = out + CodecPayloadBytes(codec, n);
  if (codec == KvCodec::kInt4) std::memset(payload, 0, CodecPayloadBytes(codec, n));
  for (size_t grp = 0; grp < g.groups; ++grp) {
    const size_t base = grp * g.base_step;
    if (codec == KvCodec::kInt4) {
      float lo = x[base], hi = x[base];
      for (size_t i = 1; i < g.count; ++i) {
        lo = std::min(lo, x[base + i * g.stride]);
        hi = std::max(hi, x[base + i * g.stride]);
      }
      const uint16_t m_bits = HalfAtMost(lo);
      const float m = HalfToFloat(m_bits);
      const uint16_t s_bits = HalfAtLeast((hi - m) / 15.0f);
      const float s = HalfToFloat(s_bits);
      PutHalf(s_bits, scales + grp * 4);
      PutHalf(m_bits, scales + grp * 4 + 2);
      for (size_t i = 0; i < g.count; ++i) {
        const size_t at = base + i * g.stride;
        const float q = s > 0 ? std::nearbyint((x[at] - m) / s) : 0.0f;
        SetNibble(payload, at, static_cast<uint8_t>(std::clamp(q, 0.0f, 15.0f)));
      }
      continue;
    }
    float amax = 0;
    for (size_t i = 0; i < g.count; ++i) amax = std::max(amax, std::fabs(x[base + i * g.stride]));
    const float qmax = codec == KvCodec::kInt8 ? 127.0f : 448.0f;
    const uint16_t s_bits = HalfAtLeast(amax / qmax);
    const float s = HalfToFloat(s_bits);
    PutHalf(s_bits, scales + grp * 2);
    for (size_t i = 0; i < g.count; ++i) {
      const size_t at = base + i * g.stride;
      const float r = s > 0 ? x[at] / s : 0.0f;
      payload[at] = codec == KvCodec::kInt8 ? static_cast<std::byte>(static_cast<int8_t>(
                                                  std::clamp(std::nearbyint(r), -127.0f, 127.0f)))
                                            : static_cast<std::byte>(FloatToE4M3(r));
    }
  }
}

void DecodePart(const ModelSpec& spec, const Grouping& g, const std::byte* in, std::byte* out) {
  const KvCodec codec = spec.codec;
  const size_t n = size_t{spec.chunk_tokens} * spec.kv_heads * spec.head_dim;
  const size_t eb = DTypeBytes(spec.dtype);
  const std::byte* payload = in;
  const std::byte* scales = in + CodecPayloadBytes(codec, n);
  for (size_t grp = 0; grp < g.groups; ++grp) {
    const size_t base = grp * g.base_step;
    if (codec == KvCodec::kInt4) {
      const float s = HalfToFloat(GetHalf(scales + grp * 4));
      const float m = HalfToFloat(GetHalf(scales + grp * 4 + 2));
      for (size_t i = 0; i < g.count; ++i) {
        const size_t at = base + i * g.stride;
        const float scaled = static_cast<float>(GetNibble(payload, at)) * s;
        StoreElement(spec.dtype, m + scaled, out + at * eb);
      }
      continue;
    }
    const float s = HalfToFloat(GetHalf(scales + grp * 2));
    for (size_t i = 0; i < g.count; ++i) {
      const size_t at = base + i * g.stride;
      const uint8_t q = static_cast<uint8_t>(payload[at]);
      const float v =
          codec == KvCodec::kInt8 ? static_cast<float>(static_cast<int8_t>(q)) : E4M3ToFloat(q);
      StoreElement(spec.dtype, v * s, out + at * eb);
    }
  }
}

absl::Status CheckSize(const char* what, size_t got, size_t want, const ModelSpec& spec) {
  if (got == want) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " of ", got, " bytes; a record of ", spec.DebugString(), " needs ", want));
}

}  // namespace

size_t CodecPayloadBytes(KvCodec codec, size_t elements) {
  switch (codec) {
    case KvCodec::kNone:
      return 0;
    case KvCodec::kFp8E4M3:
    case KvCodec::kInt8:
      return elements;
    case KvCodec::kInt4:
      return (elements + 1) / 2;
  }
  return 0;
}

size_t CodecScaleBytes(KvCodec codec) {
  switch (codec) {
    case KvCodec::kNone:
      return 0;
    case KvCodec::kFp8E4M3:
    case KvCodec::kInt8:
      return 2;
    case KvCodec::kInt4:
      return 4;
  }
  return 0;
}

float E4M3ToFloat(uint8_t code) {
  const uint32_t e = (code >> 3) & 0xfu;
  const uint32_t m = code & 0x7u;
  if (e == 0xf && m == 0x7) return std::nanf("");
  const int exponent = static_cast<int>(e) - 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                           : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, exponent);
  return (code & 0x80u) ? -mag : mag;
}

uint8_t FloatToE4M3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  uint32_t code;
  if (a < 0.015625f) {  // below 2^-6, the smallest normal: subnormals, steps of 2^-9
    code = static_cast<uint32_t>(std::nearbyint(a * 512.0f));  // 8 is 2^-6, the code after 7
  } else if (a >= 448.0f) {
    code = 0x7e;
  } else {
    int exp = 0;
    const float f = std::frexp(a, &exp);  // a = f * 2^exp, f in [0.5, 1)
    const uint32_t mant = static_cast<uint32_t>(std::nearbyint((2.0f * f - 1.0f) * 8.0f));
    code = (static_cast<uint32_t>(exp + 6) << 3) + mant;  // a mantissa of 8 carries: fine
  }
  return static_cast<uint8_t>(sign | std::min<uint32_t>(code, 0x7e));
}

absl::Status EncodeRecord(const ModelSpec& spec, std::span<const std::byte> k,
                          std::span<const std::byte> v, std::span<std::byte> out) {
  if (absl::Status s = spec.Validate(); !s.ok()) return s;
  const size_t half = spec.DecodedRecordBytes() / 2;
  if (absl::Status s = CheckSize("EncodeRecord: K", k.size(), half, spec); !s.ok()) return s;
  if (absl::Status s = CheckSize("EncodeRecord: V", v.size(), half, spec); !s.ok()) return s;
  if (absl::Status s = CheckSize("EncodeRecord: output", out.size(), spec.RecordBytes(), spec);
      !s.ok()) {
    return s;
  }
  if (spec.codec == KvCodec::kNone) {
    std::memcpy(out.data(), k.data(), half);
    std::memcpy(out.data() + half, v.data(), half);
    return absl::OkStatus();
  }
  const size_t n = size_t{spec.chunk_tokens} * spec.kv_heads * spec.head_dim;
  const size_t eb = DTypeBytes(spec.dtype);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = Sanitise(LoadElement(spec.dtype, k.data() + i * eb));
  EncodePart(spec.codec, KeyGroups(spec), x, out.data());
  for (size_t i = 0; i < n; ++i) x[i] = Sanitise(LoadElement(spec.dtype, v.data() + i * eb));
  EncodePart(spec.codec, ValueGroups(spec), x, out.data() + spec.RecordKeyBytes());
  return absl::OkStatus();
}

absl::Status DecodeRecordKeys(const ModelSpec& spec, std::span<const std::byte> key_part,
                              std::span<std::byte> out) {
  if (absl::Status s = spec.Validate(); !s.ok()) return s;
  const size_t half = spec.DecodedRecordBytes() / 2;
  if (absl::Status s =
          CheckSize("DecodeRecordKeys: K part", key_part.size(), spec.RecordKeyBytes(), spec);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckSize("DecodeRecordKeys: output", out.size(), half, spec); !s.ok()) {
    return s;
  }
  if (spec.codec == KvCodec::kNone) {
    std::memcpy(out.data(), key_part.data(), half);
    return absl::OkStatus();
  }
  DecodePart(spec, KeyGroups(spec), key_part.data(), out.data());
  return absl::OkStatus();
}

absl::Status DecodeRecord(const ModelSpec& spec, std::span<const std::byte> record,
                          std::span<std::byte> out) {
  if (absl::Status s = spec.Validate(); !s.ok()) return s;
  if (absl::Status s = CheckSize("DecodeRecord: record", record.size(), spec.RecordBytes(), spec);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckSize("DecodeRecord: output", out.size(), spec.DecodedRecordBytes(), spec);
      !s.ok()) {
    return s;
  }
  const size_t half = spec.DecodedRecordBytes() / 2;
  if (spec.codec == KvCodec::kNone) {
    std::memcpy(out.data(), record.data(), record.size());
    return absl::OkStatus();
  }
  DecodePart(spec, KeyGroups(spec), record.data(), out.data());
  DecodePart(spec, ValueGroups(spec), record.data() + spec.RecordKeyBytes(), out.data() + half);
  return absl::OkStatus();
}

}  // namespace ckv
