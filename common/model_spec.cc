// SPDX-License-Identifier: Apache-2.0
// ModelSpec: presets, validation, fingerprint and sizes (see include/ckv/model_spec.h).
#include "ckv/model_spec.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckv/chunk_key.h"
#include "ckv/codec.h"
#include "xxhash.h"

namespace ckv {
namespace {

// The installed Abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW
// is 0), which std::string_view does not convert to implicitly.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

struct PresetShape {
  std::string_view name;
  uint32_t layers;
  uint32_t q_heads;
  uint32_t kv_heads;
  uint32_t head_dim;
};

// The shapes of DESIGN.md ("Model shapes").
constexpr std::array<PresetShape, 4> kPresets = {{
    {"qwen2.5-0.5b", 24, 14, 2, 64},
    {"qwen2.5-7b", 28, 28, 4, 128},
    {"qwen2.5-14b", 48, 40, 8, 128},
    {"qwen2.5-32b", 64, 40, 8, 128},
}};

constexpr size_t kMaxModelIdBytes = 256;

bool IsKnownDType(DType dtype) {
  return dtype == DType::kFp16 || dtype == DType::kBf16 || dtype == DType::kFp32;
}

absl::Status CheckRange(std::string_view field, uint32_t value, uint32_t max) {
  if (value >= 1 && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("ModelSpec.", Sv(field), " = ", value, ": must be in 1..", max));
}

void AppendLe32(uint32_t v, std::string& out) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

size_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
    case DType::kBf16:
      return 2;
    case DType::kFp32:
      return 4;
  }
  return 0;  // not a DType; Validate() rejects it
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
      return "fp16";
    case DType::kBf16:
      return "bf16";
    case DType::kFp32:
      return "fp32";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(Sv(name));
  if (lower == "fp16" || lower == "float16") return DType::kFp16;
  if (lower == "bf16" || lower == "bfloat16") return DType::kBf16;
  if (lower == "fp32" || lower == "float32") return DType::kFp32;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype \"", absl::CHexEscape(Sv(name)), "\": must be fp16, bf16 or fp32"));
}

std::string_view KvCodecName(KvCodec codec) {
  switch (codec) {
    case KvCodec::kNone:
      return "none";
    case KvCodec::kFp8E4M3:
      return "fp8";
    case KvCodec::kInt8:
      return "int8";
    case KvCodec::kInt4:
      return "int4";
  }
  return "unknown";
}

absl::StatusOr<KvCodec> ParseKvCodec(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(Sv(name));
  if (lower == "none") return KvCodec::kNone;
  if (lower == "fp8" || lower == "fp8-e4m3" || lower == "e4m3") return KvCodec::kFp8E4M3;
  if (lower == "int8") return KvCodec::kInt8;
  if (lower == "int4") return KvCodec::kInt4;
  return absl::InvalidArgumentError(
      absl::StrCat("codec \"", absl::CHexEscape(Sv(name)), "\": must be none, fp8, int8 or int4"));
}

absl::StatusOr<ModelSpec> ModelSpec::Preset(std::string_view name, DType dtype,
                                            uint32_t chunk_tokens) {
  for (const PresetShape& p : kPresets) {
    if (p.name != name) continue;
    ModelSpec spec;
    spec.model_id = std::string(p.name);
    spec.layers = p.layers;
    spec.q_heads = p.q_heads;
    spec.kv_heads = p.kv_heads;
    spec.head_dim = p.head_dim;
    spec.dtype = dtype;
    spec.chunk_tokens = chunk_tokens;
    if (absl::Status s = spec.Validate(); !s.ok()) return s;
    return spec;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model preset \"", absl::CHexEscape(Sv(name)),
                   "\": unknown; known: ", absl::StrJoin(PresetNames(), ", ")));
}

std::vector<std::string> ModelSpec::PresetNames() {
  std::vector<std::string> names;
  names.reserve(kPresets.size());
  for (const PresetShape& p : kPresets) names.emplace_back(p.name);
  return names;
}

absl::Status ModelSpec::Validate() const {
  if (model_id.empty()) {
    return absl::InvalidArgumentError("ModelSpec.model_id = \"\": must not be empty");
  }
  if (model_id.size() > kMaxModelIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelSpec.model_id = \"", absl::CHexEscape(model_id.substr(0, 32)), "...\" (",
                     model_id.size(), " bytes): must be at most ", kMaxModelIdBytes, " bytes"));
  }
  if (absl::Status s = CheckRange("layers", layers, 1024); !s.ok()) return s;
  if (absl::Status s = CheckRange("q_heads", q_heads, 1024); !s.ok()) return s;
  if (absl::Status s = CheckRange("kv_heads", kv_heads, 1024); !s.ok()) return s;
  if (absl::Status s = CheckRange("head_dim", head_dim, 4096); !s.ok()) return s;
  if (absl::Status s = CheckRange("chunk_tokens", chunk_tokens, 4096); !s.ok()) return s;
  if (q_heads % kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelSpec.q_heads = ", q_heads, ": must be a multiple of kv_heads = ", kv_heads));
  }
  if (!IsKnownDType(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("ModelSpec.dtype = ", static_cast<int>(dtype),
                                                   ": must be fp16 (1), bf16 (2) or fp32 (3)"));
  }
  if (codec != KvCodec::kNone && codec != KvCodec::kFp8E4M3 && codec != KvCodec::kInt8 &&
      codec != KvCodec::kInt4) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelSpec.codec = ", static_cast<int>(codec),
                     ": not a codec this build of ckv knows (none 0, fp8 1, int8 2, int4 3)"));
  }
  return absl::OkStatus();
}

// Encoding hashed by Fingerprint(), format "ckv-spec-v1" (bound into every chunk key of every
// store; never change it, add a new format tag instead):
//
//   "ckv-spec-v1"      11 ASCII bytes, no terminator
//   layers             uint32, little-endian
//   q_heads            uint32, little-endian
//   kv_heads           uint32, little-endian
//   head_dim           uint32, little-endian
//   dtype              uint8 (the persisted DType value)
//   chunk_tokens       uint32, little-endian
//   model_id length    uint32, little-endian, in bytes
//   model_id           its bytes
//   codec              uint8 (the persisted KvCodec value), only when not kNone: a spec without
//                      a codec keeps the fingerprint it had before codecs existed
//
// hashed with XXH3-128 unseeded; Fingerprint().hi = high64, .lo = low64.
ChunkKey ModelSpec::Fingerprint() const {
  std::string enc = "ckv-spec-v1";
  enc.reserve(enc.size() + 4 * 6 + 1 + model_id.size());
  AppendLe32(layers, enc);
  AppendLe32(q_heads, enc);
  AppendLe32(kv_heads, enc);
  AppendLe32(head_dim, enc);
  enc.push_back(static_cast<char>(static_cast<uint8_t>(dtype)));
  AppendLe32(chunk_tokens, enc);
  AppendLe32(static_cast<uint32_t>(model_id.size()), enc);
  enc.append(model_id);
  if (codec != KvCodec::kNone) enc.push_back(static_cast<char>(static_cast<uint8_t>(codec)));
  const XXH128_hash_t h = XXH3_128bits(enc.data(), enc.size());
  return ChunkKey{h.high64, h.low64};
}

size_t ModelSpec::TokenBytesPerLayer() const {
  return static_cast<size_t>(kv_heads) * head_dim * DTypeBytes(dtype);
}

namespace {
// Elements of a record's K (or V): c * kv_heads * head_dim.
size_t ElementsPerHalf(const ModelSpec& s) {
  return static_cast<size_t>(s.chunk_tokens) * s.kv_heads * s.head_dim;
}
}  // namespace

size_t ModelSpec::RecordBytes() const {
  if (codec == KvCodec::kNone) return DecodedRecordBytes();
  const size_t value_groups = static_cast<size_t>(chunk_tokens) * kv_heads;  // per token, head
  return RecordKeyBytes() + CodecPayloadBytes(codec, ElementsPerHalf(*this)) +
         value_groups * CodecScaleBytes(codec);
}

size_t ModelSpec::RecordKeyBytes() const {
  if (codec == KvCodec::kNone) return DecodedRecordBytes() / 2;
  const size_t key_groups = static_cast<size_t>(kv_heads) * head_dim;  // per channel
  return CodecPayloadBytes(codec, ElementsPerHalf(*this)) + key_groups * CodecScaleBytes(codec);
}

size_t ModelSpec::DecodedRecordBytes() const {
  return 2 * static_cast<size_t>(chunk_tokens) * TokenBytesPerLayer();
}

size_t ModelSpec::KvBytesPerToken() const {
  return 2 * static_cast<size_t>(layers) * TokenBytesPerLayer();
}

std::string ModelSpec::DebugString() const {
  return absl::StrCat(
      model_id, " (", layers, " layers, ", q_heads, " q heads, ", kv_heads, " kv heads, head dim ",
      head_dim, ", ", Sv(DTypeName(dtype)), ", c=", chunk_tokens,
      codec == KvCodec::kNone ? "" : absl::StrCat(", codec ", Sv(KvCodecName(codec))), ")");
}

}  // namespace ckv
