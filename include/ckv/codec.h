// SPDX-License-Identifier: Apache-2.0
// ckv/codec.h: how a spec's codec (ModelSpec::codec) stores a record, and how to read it back.
//
// A record of a spec with a codec is its K part then its V part (docs/format.md, "Record
// codecs"); with N = c * kv_heads * head_dim elements per part:
//
//   K part:  payload[N]  then one scale entry per channel (head h, dim d), index h * D + d
//   V part:  payload[N]  then one scale entry per token and head (t, h), index t * H + h
//
// The payload is [c, kv_heads, head_dim], row-major, as a record without a codec: one byte per
// element (fp8 e4m3, int8), or two per byte (int4: element i in the low nibble of byte i / 2
// when i is even, the high nibble when odd). A scale entry is an fp16 scale s (fp8, int8:
// x = q * s, symmetric), or an fp16 scale s then an fp16 minimum m (int4: x = m + q * s, q in
// 0..15). Keys are grouped per channel and values per token, as KIVI does: a key channel's
// outliers then cost only their own channel. Scales are rounded up (and int4 minima down) to
// fp16, so every element is in range. Elements are first clamped to fp16's range: NaN is stored
// as 0, anything beyond ±65504 (an infinity, or a large bf16 or fp32 value) as ±65504, and a
// decoded fp16 element is at most ±65504, never infinite. The stated error of a decoded element
// x' against x (clamped), before x' is rounded to the dtype:
//
//   int8:  |x' - x| <= s / 2            (s <= max|x| / 127 of its group, rounded up)
//   int4:  |x' - x| <= s / 2            (s <= (max - min) / 15 of its group, rounded up)
//   fp8:   |x' - x| <= |x| / 16 + s / 1024  (3 mantissa bits; the second term is subnormals)
//
// Decoding is deterministic: a record decodes to the same bits on every read, on every machine
// (the CUDA kernel computes the same float products).
//
// Thread-safety: pure functions.
#ifndef CKV_CODEC_H_
#define CKV_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "ckv/model_spec.h"

namespace ckv {

// Bytes of `elements` payload values of `codec` (int4: two per byte, the last one half-filled).
size_t CodecPayloadBytes(KvCodec codec, size_t elements);
// Bytes of one scale entry: 2 (fp8, int8: an fp16 scale) or 4 (int4: fp16 scale and minimum);
// 0 for kNone.
size_t CodecScaleBytes(KvCodec codec);

// Encodes one record: `k` and `v` are one chunk's K and V at one layer ([c, kv_heads, head_dim]
// in spec.dtype, spec.DecodedRecordBytes() / 2 bytes each); `out` is spec.RecordBytes() bytes.
// Without a codec it copies. InvalidArgument for a wrong size or an invalid spec.
absl::Status EncodeRecord(const ModelSpec& spec, std::span<const std::byte> k,
                          std::span<const std::byte> v, std::span<std::byte> out);

// Decodes a stored record (spec.RecordBytes() bytes) into `out`: K then V in spec.dtype,
// spec.DecodedRecordBytes() bytes (a record as a spec without a codec stores it). Without a
// codec it copies. InvalidArgument for a wrong size or an invalid spec.
absl::Status DecodeRecord(const ModelSpec& spec, std::span<const std::byte> record,
                          std::span<std::byte> out);

// Decodes a record's K part (its first spec.RecordKeyBytes() bytes) into `out`: K in spec.dtype,
// spec.DecodedRecordBytes() / 2 bytes.
absl::Status DecodeRecordKeys(const ModelSpec& spec, std::span<const std::byte> key_part,
                              std::span<std::byte> out);

// The float value of fp8 e4m3 (OCP "FN": no infinities, 0x7f and 0xff are NaN, max 448), and
// the e4m3 nearest to `x` (ties to even), saturating at ±448; NaN gives 0x7f.
float E4M3ToFloat(uint8_t code);
uint8_t FloatToE4M3(float x);

}  // namespace ckv

#endif  // CKV_CODEC_H_
