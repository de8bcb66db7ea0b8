// SPDX-License-Identifier: Apache-2.0
// remote/chunk_value.h: the key and the value of one chunk published to the cluster.
//
// Key: "<prefix>:<model fingerprint, 32 hex digits>:<chunk key, 32 hex digits>". No hash tag:
// the chunks of one prefix spread over every slot, so a prefix's reads spread over every master.
//
// Value (all integers little-endian; docs/remote.md has the same table). L layers, R record
// bytes, S1 and S2 the bytes of the chunk's two key summaries (kernels/summary.h: the min/max part
// quest reads, the mean part mean-key reads, as engine/summaries.h stores them locally):
//   offset            size  field
//   0                 4     magic "CKVR"
//   4                 2     format version, 2
//   6                 1     layout: 1 = layer-major (layer 0's record, then layer 1's, ...)
//   7                 1     codec (ModelSpec::codec; 0 = none, as every value before codecs)
//   8                 16    model fingerprint (ModelSpec::Fingerprint(): hi then lo)
//   24                16    chunk key (hi then lo)
//   40                4     layers L
//   44                4     record bytes R (ModelSpec::RecordBytes(): K then V of the chunk at
//                           one layer, as storage writes it)
//   48                4     min/max summary bytes S1
//   52                4     mean summary bytes S2
//   56                8 L   per record: its checksum (storage/record_checksum.h, XXH3-64)
//   56 + 8 L          8     summaries checksum: XXH3-64 of the S1 + S2 bytes at 72 + 8 L
//   64 + 8 L          8     header checksum: XXH3-64 of bytes [0, 64 + 8 L)
//   72 + 8 L          S1    the min/max summary
//   72 + 8 L + S1     S2    the mean summary
//   H = 72+8L+S1+S2   L R   the records, layer 0 first
// A value is exactly H + L R bytes. Its first H bytes, the head, are all a selector needs: a
// session on a local miss reads the heads of the chunks that continue its prefix (GETRANGE),
// selects from their summaries, and then reads only the records it selected (GETRANGE again),
// each verified against the head's checksum of it.
//
// The Decode functions verify all they are given before handing out a byte: magic, version,
// layout, header checksum, the fingerprint and the key asked for, L, R, S1 and S2 against the
// spec, the summaries' checksum, the size, and every record's checksum. Anything else is DataLoss
// naming the key and what did not match, so a torn value (a SETRANGE, a half-written SET of
// another client), a value of another model or of another chunk is never served.
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
inline constexpr uint16_t kChunkValueVersion = 2;
inline constexpr uint8_t kChunkValueLayerMajor = 1;
// Bytes of the header before the per-record checksums.
inline constexpr size_t kChunkValueFixedHeaderBytes = 56;

// The cluster key of chunk `key` of the model whose fingerprint is `fingerprint`.
std::string ChunkValueKey(std::string_view prefix, const ChunkKey& fingerprint,
                          const ChunkKey& key);

// Where things are in the value of one chunk under `spec`.
struct ChunkValueLayout {
  size_t head_bytes = 0;     // H: header and summaries
  size_t minmax_offset = 0;  // the min/max summary, S1 bytes
  size_t minmax_bytes = 0;
  size_t mean_offset = 0;  // the mean summary, S2 bytes
  size_t mean_bytes = 0;
  size_t record_bytes = 0;  // R
  uint32_t layers = 0;      // L
  size_t RecordOffset(uint32_t layer) const { return head_bytes + layer * record_bytes; }
  size_t value_bytes() const { return head_bytes + size_t{layers} * record_bytes; }
};
ChunkValueLayout LayoutOfChunkValue(const ModelSpec& spec);

// Bytes of the value of one chunk under `spec`.
size_t ChunkValueBytes(const ModelSpec& spec);

// The value of chunk `key` under `spec`, whose records are `records` (spec.layers of them,
// spec.RecordBytes() each, layer 0 first) and whose summaries are `minmax` and `mean`.
// REQUIRES: records.size() == spec.layers, every record spec.RecordBytes() long, the summaries
// of the spec's sizes (kernels::SummaryFormat).
std::string EncodeChunkValue(const ModelSpec& spec, const ChunkKey& key,
                             std::span<const std::span<const std::byte>> records,
                             std::span<const std::byte> minmax, std::span<const std::byte> mean);

// A verified head: views into the bytes it was decoded from (which must outlive it).
struct DecodedChunkHead {
  std::vector<uint64_t> record_checksums;  // one per layer
  std::span<const std::byte> minmax;
  std::span<const std::byte> mean;
};

// Verifies `head`, the first LayoutOfChunkValue(spec).head_bytes bytes of a value (exactly), as
// the head of chunk `key` under `spec`; DataLoss "remote chunk <key> of <model>: <what>" on any
// mismatch.
absl::StatusOr<DecodedChunkHead> DecodeChunkHead(const ModelSpec& spec, const ChunkKey& key,
                                                 std::string_view head);

// Verifies `record`, layer `layer`'s record of chunk `key` read on its own, against the checksum
// of it in the chunk's verified head; DataLoss naming the chunk and the layer otherwise.
absl::Status VerifyChunkRecord(const ModelSpec& spec, const ChunkKey& key,
                               const DecodedChunkHead& head, uint32_t layer,
                               std::span<const std::byte> record);

// A verified value: views into the bytes it was decoded from (which must outlive it).
struct DecodedChunkValue {
  DecodedChunkHead head;
  std::vector<std::span<const std::byte>> records;  // one per layer
};

// Verifies `value` as the value of chunk `key` under `spec` (see the file comment); DataLoss
// "remote chunk <key> of <model>: <what>" on any mismatch.
absl::StatusOr<DecodedChunkValue> DecodeChunkValue(const ModelSpec& spec, const ChunkKey& key,
                                                   std::string_view value);

}  // namespace ckv::remote

#endif  // CKV_REMOTE_CHUNK_VALUE_H_
