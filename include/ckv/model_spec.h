// SPDX-License-Identifier: Apache-2.0
// ckv/model_spec.h: the shape of a model's KV cache, and the fingerprint that binds data to it.
//
// A ModelSpec says how many layers and KV heads a model has, the head dimension, the element type
// and the chunk size c. Every chunk ckv stores belongs to exactly one spec: the spec's fingerprint
// is hashed into every chunk key, so data written for one spec can never be found, let alone
// served, under another. Changing any field (including the caller-given model id) changes the
// fingerprint.
//
// Thread-safety: ModelSpec is a value type; const methods are safe from any thread.
#ifndef CKV_MODEL_SPEC_H_
#define CKV_MODEL_SPEC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/chunk_key.h"

namespace ckv {

// Element type of K and V. Persisted in the catalog: do not renumber.
enum class DType : uint8_t {
  kFp16 = 1,
  kBf16 = 2,
  kFp32 = 3,
};

// Bytes per element of `dtype`.
size_t DTypeBytes(DType dtype);
// "fp16", "bf16", "fp32".
std::string_view DTypeName(DType dtype);
// Parses "fp16" / "bf16" / "fp32" (also "float16", "bfloat16", "float32").
absl::StatusOr<DType> ParseDType(std::string_view name);

// How a record's K and V are stored (ckv/codec.h, docs/format.md "Record codecs"). Part of the
// spec's fingerprint unless kNone, and persisted in the catalog: do not renumber.
enum class KvCodec : uint8_t {
  kNone = 0,     // the spec's dtype, as given to Put (2 bytes per element at fp16/bf16)
  kFp8E4M3 = 1,  // fp8 e4m3 (OCP, max 448) times an fp16 scale: keys per channel, values per token
  kInt8 = 2,     // int8 times an fp16 scale (symmetric): keys per channel, values per token
  kInt4 = 3,     // 4 bits, min + q * scale (asymmetric, fp16 pair): keys per channel, values per
                 // token, as KIVI stores them
};

// "none", "fp8", "int8", "int4".
std::string_view KvCodecName(KvCodec codec);
// Parses those names (also "fp8-e4m3", "e4m3"). InvalidArgument naming the value otherwise.
absl::StatusOr<KvCodec> ParseKvCodec(std::string_view name);

struct ModelSpec {
  // A caller-given identity of the weights (e.g. "Qwen/Qwen2.5-7B-Instruct@rev"). Two models with
  // the same shape but different weights have different KV, so they must have different ids.
  // At most 256 bytes. Default: the preset name when made by Preset().
  std::string model_id;
  // Transformer layers. 1..1024.
  uint32_t layers = 0;
  // Query heads per layer; a multiple of kv_heads (GQA). 1..1024.
  uint32_t q_heads = 0;
  // KV heads per layer. 1..1024.
  uint32_t kv_heads = 0;
  // Channels per head. 1..4096.
  uint32_t head_dim = 0;
  // Element type of K and V. Default: fp16.
  DType dtype = DType::kFp16;
  // Tokens per ContiguousChunk, c. 1..4096. Default: 16.
  uint32_t chunk_tokens = 16;
  // How records are stored: kNone keeps the dtype (and the fingerprint of a spec without the
  // field); the others quantise at Put and every reader dequantises (ckv/codec.h). A spec of
  // another codec is another spec: its chunks have other keys.
  KvCodec codec = KvCodec::kNone;

  // The named presets of DESIGN.md: "qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b".
  // model_id defaults to the preset name.
  static absl::StatusOr<ModelSpec> Preset(std::string_view name, DType dtype = DType::kFp16,
                                          uint32_t chunk_tokens = 16);
  static std::vector<std::string> PresetNames();

  // OK when every field is in range; InvalidArgument naming the field and value otherwise.
  absl::Status Validate() const;

  // 128-bit hash of every field, in a fixed encoding (stable across builds and machines).
  ChunkKey Fingerprint() const;

  // Bytes of K (or of V) of one token at one layer as Put takes it and a decoded record holds
  // it: kv_heads * head_dim * DTypeBytes(dtype).
  size_t TokenBytesPerLayer() const;
  // Bytes of one stored record: K then V of one chunk at one layer. Without a codec
  // 2 * c * TokenBytesPerLayer(); with one, its K part then its V part (ckv/codec.h).
  size_t RecordBytes() const;
  // Bytes of a stored record's K part (what exact scoring reads), at its start:
  // RecordBytes() / 2 without a codec.
  size_t RecordKeyBytes() const;
  // Bytes of a record decoded to the dtype: 2 * c * TokenBytesPerLayer().
  size_t DecodedRecordBytes() const;
  // K+V bytes per token over all layers, in the dtype (as Put takes them).
  size_t KvBytesPerToken() const;

  // "qwen2.5-7b (28 layers, 28 q heads, 4 kv heads, head dim 128, fp16, c=16)", with
  // ", codec int8" before the ")" for a spec with a codec.
  std::string DebugString() const;

  friend bool operator==(const ModelSpec&, const ModelSpec&) = default;
};

}  // namespace ckv

#endif  // CKV_MODEL_SPEC_H_
