// SPDX-License-Identifier: Apache-2.0
// The value format of a chunk in the cluster (see remote/chunk_value.h).
#include "remote/chunk_value.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

size_t HeaderBytes(uint32_t layers) { return kChunkValueFixedHeaderBytes + 8ull * layers + 8; }

}  // namespace

std::string ChunkValueKey(std::string_view prefix, const ChunkKey& fingerprint,
                          const ChunkKey& key) {
  return absl::StrCat(Sv(prefix), ":", fingerprint.ToHex(), ":", key.ToHex());
}

size_t ChunkValueBytes(const ModelSpec& spec) {
  return HeaderBytes(spec.layers) + static_cast<size_t>(spec.layers) * spec.RecordBytes();
}

std::string EncodeChunkValue(const ModelSpec& spec, const ChunkKey& key,
                             std::span<const std::span<const std::byte>> records) {
  const uint32_t layers = spec.layers;
  const size_t record_bytes = spec.RecordBytes();
  std::string out(ChunkValueBytes(spec), '\0');
  char* p = out.data();
  Put32(p, kChunkValueMagic);
  Put16(p + 4, kChunkValueVersion);
  p[6] = static_cast<char>(kChunkValueLayerMajor);
  p[7] = 0;
  const ChunkKey fp = spec.Fingerprint();
  Put64(p + 8, fp.hi);
  Put64(p + 16, fp.lo);
  Put64(p + 24, key.hi);
  Put64(p + 32, key.lo);
  Put32(p + 40, layers);
  Put32(p + 44, static_cast<uint32_t>(record_bytes));
  char* data = p + HeaderBytes(layers);
  for (uint32_t l = 0; l < layers && l < records.size(); ++l) {
    Put64(p + kChunkValueFixedHeaderBytes + 8ull * l,
          storage::RecordChecksum(records[l].data(), records[l].size()));
    std::memcpy(data + l * record_bytes, records[l].data(), record_bytes);
  }
  const size_t checked = kChunkValueFixedHeaderBytes + 8ull * layers;
  Put64(p + checked, storage::RecordChecksum(p, checked));
  return out;
}

absl::StatusOr<DecodedChunkValue> DecodeChunkValue(const ModelSpec& spec, const ChunkKey& key,
                                                   std::string_view value) {
  const ChunkKey fp = spec.Fingerprint();
  auto loss = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("remote chunk ", key.ToHex(), " of ", spec.model_id,
                                            ": ", what));
  };
  if (value.size() < kChunkValueFixedHeaderBytes) {
    return loss(absl::StrCat("value of ", value.size(), " bytes is shorter than its header"));
  }
  const char* p = value.data();
  const uint32_t magic = static_cast<uint32_t>(Load(p, 4));
  if (magic != kChunkValueMagic) {
    return loss(absl::StrFormat("magic 0x%08x != 0x%08x", magic, kChunkValueMagic));
  }
  const uint16_t version = static_cast<uint16_t>(Load(p + 4, 2));
  if (version != kChunkValueVersion) {
    return loss(absl::StrCat("format version ", version, " (this ckv reads ",
                             kChunkValueVersion, ")"));
  }
  const uint32_t layers = static_cast<uint32_t>(Load(p + 40, 4));
  const uint32_t record_bytes = static_cast<uint32_t>(Load(p + 44, 4));
  if (layers != spec.layers) {
    return loss(absl::StrCat("layers ", layers, " != ", spec.layers));
  }
  const size_t header = HeaderBytes(layers);
  if (value.size() < header) {
    return loss(absl::StrCat("value of ", value.size(), " bytes is shorter than its ", header,
                             "-byte header"));
  }
  const size_t checked = header - 8;
  const uint64_t header_sum = Load(p + checked, 8);
  const uint64_t actual_header_sum = storage::RecordChecksum(p, checked);
  if (header_sum != actual_header_sum) {
    return loss(absl::StrFormat("header checksum 0x%016x != 0x%016x", actual_header_sum,
                                header_sum));
  }
  if (static_cast<uint8_t>(p[6]) != kChunkValueLayerMajor) {
    return loss(absl::StrCat("layout ", static_cast<int>(static_cast<uint8_t>(p[6])),
                             " is not layer-major (1)"));
  }
  const ChunkKey got_fp{Load(p + 8, 8), Load(p + 16, 8)};
  if (got_fp != fp) {
    return loss(absl::StrCat("model fingerprint ", got_fp.ToHex(), " != ", fp.ToHex()));
  }
  const ChunkKey got_key{Load(p + 24, 8), Load(p + 32, 8)};
  if (got_key != key) return loss(absl::StrCat("chunk key ", got_key.ToHex(), " != ", key.ToHex()));
  if (record_bytes != spec.RecordBytes()) {
    return loss(absl::StrCat("record bytes ", record_bytes, " != ", spec.RecordBytes()));
  }
  const size_t expected_size = header + static_cast<size_t>(layers) * record_bytes;
  if (value.size() != expected_size) {
    return loss(absl::StrCat("value of ", value.size(), " bytes, expected ", expected_size));
  }
  DecodedChunkValue out;
  out.records.reserve(layers);
  for (uint32_t l = 0; l < layers; ++l) {
    const std::byte* record =
        reinterpret_cast<const std::byte*>(p + header + static_cast<size_t>(l) * record_bytes);
    const uint64_t expected = Load(p + kChunkValueFixedHeaderBytes + 8ull * l, 8);
    absl::Status s = storage::VerifyRecordChecksum(record, record_bytes, expected, [&] {
      return absl::StrCat("remote chunk ", key.ToHex(), " of ", spec.model_id, " record L", l);
    });
    if (!s.ok()) return s;
    out.records.emplace_back(record, record_bytes);
  }
  return out;
}

}  // namespace ckv::remote
