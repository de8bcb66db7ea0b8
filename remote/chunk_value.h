// SPDX-License-Identifier: Apache-2.0
// remote/chunk_value.h: the key and the value of one chunk published to the cluster.
//
// Key: "<prefix>:<model fingerprint, 32 hex digits>:<chunk key, 32 hex digits>". No hash tag:
// the chunks of one prefix spread over every slot, so a prefix's reads spread over every master.
//
// Value (all integers little-endian; docs/remote.md has the same table):
//   offset        size  field
//   0             4     magic "CKVR"
//   4             2     format version, 1
//   6             1     layout: 1 = layer-major (layer 0's record, then layer 1's, ...)
//   7             1     reserved, 0
//   8             16    model fingerprint (ModelSpec::Fingerprint(): hi then lo)
//   24            16    chunk key (hi then lo)
//   40            4     layers L
//   44            4     record bytes R (ModelSpec::RecordBytes(): K then V of the chunk at one
//                       layer, as storage writes it)
//   48            8 L   per record: its checksum (storage/record_checksum.h, XXH3-64)
//   48 + 8 L      8     header checksum: XXH3-64 of bytes [0, 48 + 8 L)
//   56 + 8 L      L R   the records, layer 0 first
// A value is exactly 56 + 8 L + L R bytes.
//
// DecodeChunkValue verifies all of it before handing out a byte: magic, version, layout, header
// checksum, the fingerprint and the key it was asked for, L and R against the spec, the size, and
// every record's checksum. Anything else is DataLoss naming the key and what did not match, so a
// torn value (a SETRANGE, a half-written SET of another client), a value of another model or of
// another chunk is never served.
//
// Thread-safety: pure functions.
#ifndef CKV_REMOTE_CHUNK_VALUE_H_
#define CKV_REMOTE_CHUNK_VALUE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/chunk_key.h"
#include "ckv/model_spec.h"

namespace ckv::remote {

inline constexpr uint32_t kChunkValueMagic = 0x52564B43;  // "CKVR" read as little-endian
inline constexpr uint16_t kChunkValueVersion = 1;
inline constexpr uint8_t kChunkValueLayerMajor = 1;
// Bytes of the header before the per-record checksums.
inline constexpr size_t kChunkValueFixedHeaderBytes = 48;

// The cluster key of chunk `key` of the model whose fingerprint is `fingerprint`.
std::string ChunkValueKey(std::string_view prefix, const ChunkKey& fingerprint,
                          const ChunkKey& key);

// Bytes of the value of one chunk under `spec`.
size_t ChunkValueBytes(const ModelSpec& spec);

// The value of chunk `key` under `spec`, whose records are `records` (spec.layers of them,
// spec.RecordBytes() each, layer 0 first). REQUIRES: records.size() == spec.layers and every
// record spec.RecordBytes() long.
std::string EncodeChunkValue(const ModelSpec& spec, const ChunkKey& key,
                             std::span<const std::span<const std::byte>> records);

// A verified value: views into the bytes it was decoded from (which must outlive it).
struct DecodedChunkValue {
  std::vector<std::span<const std::byte>> records;  // one per layer
};

// Verifies `value` as the value of chunk `key` under `spec` (see the file comment); DataLoss
// "remote chunk <key> (<cluster key>): <what>" on any mismatch.
absl::StatusOr<DecodedChunkValue> DecodeChunkValue(const ModelSpec& spec, const ChunkKey& key,
                                                   std::string_view value);

}  // namespace ckv::remote

#endif  // CKV_REMOTE_CHUNK_VALUE_H_
