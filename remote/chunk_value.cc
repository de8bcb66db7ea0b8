// SPDX-License-Identifier: Apache-2.0
// The value format of a chunk in the cluster (see remote/chunk_value.h).
#include "remote/chunk_value.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "storage/record_checksum.h"

namespace ckv::remote {
namespace {

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Little-endian stores and loads (x86 and aarch64 are little-endian, but the format says so,
// not the machine).
void Put16(char* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void Put32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void Put64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint64_t Load(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::string ChunkValueKey(std::string_view prefix, const ChunkKey& fingerprint,
                          const ChunkKey& key) {
  return absl::StrCat(Sv(prefix), ":", fingerprint.ToHex(), ":", key.ToHex());
}

ChunkValueLayout LayoutOfChunkValue(const ModelSpec& spec) {
  ChunkValueLayout l;
  l.layers = spec.layers;
  l.record_bytes = spec.RecordBytes();
  // kernels::SummaryFormat's sizes (remote/ sits below kernels/; chunk_value_test checks that
  // they agree): per (layer, kv head), two scales and head_dim int8 minima and maxima; one
  // scale and head_dim int8 means.
  const size_t entries = size_t{spec.layers} * spec.kv_heads;
  l.minmax_bytes = entries * (4 + 2 * size_t{spec.head_dim});
  l.mean_bytes = entries * (2 + size_t{spec.head_dim});
  l.minmax_offset = kChunkValueFixedHeaderBytes + 8ull * spec.layers + 16;
  l.mean_offset = l.minmax_offset + l.minmax_bytes;
  l.head_bytes = l.mean_offset + l.mean_bytes;
  return l;
}

size_t ChunkValueBytes(const ModelSpec& spec) { return LayoutOfChunkValue(spec).value_bytes(); }

std::string EncodeChunkValue(const ModelSpec& spec, const ChunkKey& key,
                             std::span<const std::span<const std::byte>> records,
                             std::span<const std::byte> minmax, std::span<const std::byte> mean) {
  const ChunkValueLayout layout = LayoutOfChunkValue(spec);
  const uint32_t layers = spec.layers;
  std::string out(layout.value_bytes(), '\0');
  char* p = out.data();
  Put32(p, kChunkValueMagic);
  Put16(p + 4, kChunkValueVersion);
  p[6] = static_cast<char>(kChunkValueLayerMajor);
  p[7] = static_cast<char>(spec.codec);  // 0 (none) in every value written before codecs
  const ChunkKey fp = spec.Fingerprint();
  Put64(p + 8, fp.hi);
  Put64(p + 16, fp.lo);
  Put64(p + 24, key.hi);
  Put64(p + 32, key.lo);
  Put32(p + 40, layers);
  Put32(p + 44, static_cast<uint32_t>(layout.record_bytes));
  Put32(p + 48, static_cast<uint32_t>(layout.minmax_bytes));
  Put32(p + 52, static_cast<uint32_t>(layout.mean_bytes));
  for (uint32_t l = 0; l < layers && l < records.size(); ++l) {
    Put64(p + kChunkValueFixedHeaderBytes + 8ull * l,
          storage::RecordChecksum(records[l].data(), records[l].size()));
    std::memcpy(p + layout.RecordOffset(l), records[l].data(), layout.record_bytes);
  }
  std::memcpy(p + layout.minmax_offset, minmax.data(),
              std::min(minmax.size(), layout.minmax_bytes));
  std::memcpy(p + layout.mean_offset, mean.data(), std::min(mean.size(), layout.mean_bytes));
  const size_t summaries_sum_at = kChunkValueFixedHeaderBytes + 8ull * layers;
  Put64(p + summaries_sum_at,
        storage::RecordChecksum(p + layout.minmax_offset, layout.minmax_bytes + layout.mean_bytes));
  Put64(p + summaries_sum_at + 8, storage::RecordChecksum(p, summaries_sum_at + 8));
  return out;
}

namespace {

absl::Status Loss(const ModelSpec& spec, const ChunkKey& key, std::string_view what) {
  return absl::DataLossError(
      absl::StrCat("remote chunk ", key.ToHex(), " of ", spec.model_id, ": ", Sv(what)));
}

}  // namespace

absl::StatusOr<DecodedChunkHead> DecodeChunkHead(const ModelSpec& spec, const ChunkKey& key,
                                                 std::string_view head) {
  const ChunkValueLayout layout = LayoutOfChunkValue(spec);
  auto loss = [&](const std::string& what) { return Loss(spec, key, what); };
  if (head.size() < kChunkValueFixedHeaderBytes) {
    return loss(absl::StrCat("value of ", head.size(), " bytes is shorter than its header"));
  }
  const char* p = head.data();
  const uint32_t magic = static_cast<uint32_t>(Load(p, 4));
  if (magic != kChunkValueMagic) {
    return loss(absl::StrFormat("magic 0x%08x != 0x%08x", magic, kChunkValueMagic));
  }
  const uint16_t version = static_cast<uint16_t>(Load(p + 4, 2));
  if (version != kChunkValueVersion) {
    return loss(
        absl::StrCat("format version ", version, " (this ckv reads ", kChunkValueVersion, ")"));
  }
  const uint32_t layers = static_cast<uint32_t>(Load(p + 40, 4));
  if (layers != spec.layers) {
    return loss(absl::StrCat("layers ", layers, " != ", spec.layers));
  }
  const size_t checked = kChunkValueFixedHeaderBytes + 8ull * layers + 8;
  if (head.size() < checked + 8) {
    return loss(absl::StrCat("value of ", head.size(), " bytes is shorter than its ", checked + 8,
                             "-byte header"));
  }
  const uint64_t header_sum = Load(p + checked, 8);
  const uint64_t actual_header_sum = storage::RecordChecksum(p, checked);
  if (header_sum != actual_header_sum) {
    return loss(
        absl::StrFormat("header checksum 0x%016x != 0x%016x", actual_header_sum, header_sum));
  }
  if (static_cast<uint8_t>(p[6]) != kChunkValueLayerMajor) {
    return loss(absl::StrCat("layout ", static_cast<int>(static_cast<uint8_t>(p[6])),
                             " is not layer-major (1)"));
  }
  if (static_cast<uint8_t>(p[7]) != static_cast<uint8_t>(spec.codec)) {
    return loss(absl::StrCat("codec ", static_cast<int>(static_cast<uint8_t>(p[7])),
                             " != ", static_cast<int>(spec.codec), " (",
                             std::string(KvCodecName(spec.codec)), ")"));
  }
  const ChunkKey fp = spec.Fingerprint();
  const ChunkKey got_fp{Load(p + 8, 8), Load(p + 16, 8)};
  if (got_fp != fp) {
    return loss(absl::StrCat("model fingerprint ", got_fp.ToHex(), " != ", fp.ToHex()));
  }
  const ChunkKey got_key{Load(p + 24, 8), Load(p + 32, 8)};
  if (got_key != key) return loss(absl::StrCat("chunk key ", got_key.ToHex(), " != ", key.ToHex()));
  const uint32_t record_bytes = static_cast<uint32_t>(Load(p + 44, 4));
  if (record_bytes != layout.record_bytes) {
    return loss(absl::StrCat("record bytes ", record_bytes, " != ", layout.record_bytes));
  }
  const uint32_t minmax_bytes = static_cast<uint32_t>(Load(p + 48, 4));
  const uint32_t mean_bytes = static_cast<uint32_t>(Load(p + 52, 4));
  if (minmax_bytes != layout.minmax_bytes || mean_bytes != layout.mean_bytes) {
    return loss(absl::StrCat("summary bytes ", minmax_bytes, " + ", mean_bytes,
                             " != ", layout.minmax_bytes, " + ", layout.mean_bytes));
  }
  if (head.size() != layout.head_bytes) {
    return loss(absl::StrCat("head of ", head.size(), " bytes, expected ", layout.head_bytes));
  }
  const uint64_t summaries_sum = Load(p + checked - 8, 8);
  const uint64_t actual_summaries_sum =
      storage::RecordChecksum(p + layout.minmax_offset, layout.minmax_bytes + layout.mean_bytes);
  if (summaries_sum != actual_summaries_sum) {
    return loss(absl::StrFormat("summaries checksum 0x%016x != 0x%016x", actual_summaries_sum,
                                summaries_sum));
  }
  DecodedChunkHead out;
  out.record_checksums.reserve(layers);
  for (uint32_t l = 0; l < layers; ++l) {
    out.record_checksums.push_back(Load(p + kChunkValueFixedHeaderBytes + 8ull * l, 8));
  }
  const auto* bytes = reinterpret_cast<const std::byte*>(p);
  out.minmax = std::span(bytes + layout.minmax_offset, layout.minmax_bytes);
  out.mean = std::span(bytes + layout.mean_offset, layout.mean_bytes);
  return out;
}

absl::Status VerifyChunkRecord(const ModelSpec& spec, const ChunkKey& key,
                               const DecodedChunkHead& head, uint32_t layer,
                               std::span<const std::byte> record) {
  if (layer >= head.record_checksums.size()) {
    return Loss(spec, key,
                absl::StrCat("record L", layer, ": the head has ", head.record_checksums.size(),
                             " records"));
  }
  if (record.size() != spec.RecordBytes()) {
    return Loss(spec, key,
                absl::StrCat("record L", layer, ": ", record.size(), " bytes, expected ",
                             spec.RecordBytes()));
  }
  return storage::VerifyRecordChecksum(record.data(), record.size(), head.record_checksums[layer],
                                       [&] {
                                         return absl::StrCat("remote chunk ", key.ToHex(), " of ",
                                                             spec.model_id, " record L", layer);
                                       });
}

absl::StatusOr<DecodedChunkValue> DecodeChunkValue(const ModelSpec& spec, const ChunkKey& key,
                                                   std::string_view value) {
  const ChunkValueLayout layout = LayoutOfChunkValue(spec);
  if (value.size() != layout.value_bytes()) {
    // The head's own checks name what is wrong first (a foreign magic, version, model ...).
    CKV_RETURN_IF_ERROR(
        DecodeChunkHead(spec, key, value.substr(0, std::min(value.size(), layout.head_bytes)))
            .status());
    return Loss(spec, key,
                absl::StrCat("value of ", value.size(), " bytes, expected ", layout.value_bytes()));
  }
  DecodedChunkValue out;
  CKV_ASSIGN_OR_RETURN(out.head, DecodeChunkHead(spec, key, value.substr(0, layout.head_bytes)));
  out.records.reserve(layout.layers);
  for (uint32_t l = 0; l < layout.layers; ++l) {
    std::span<const std::byte> record(
        reinterpret_cast<const std::byte*>(value.data() + layout.RecordOffset(l)),
        layout.record_bytes);
    CKV_RETURN_IF_ERROR(VerifyChunkRecord(spec, key, out.head, l, record));
    out.records.push_back(record);
  }
  return out;
}

}  // namespace ckv::remote
