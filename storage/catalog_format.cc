// SPDX-License-Identifier: Apache-2.0
#include "storage/catalog_format.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"

namespace ckv::storage {
namespace {

// Value encoding versions (the first byte of each value).
constexpr uint8_t kChunkRecordV1 = 1;
constexpr uint8_t kPrefixRecordV1 = 1;
constexpr uint8_t kSegmentRecordV1 = 1;
constexpr uint8_t kSegmentRecordV2 = 2;  // adds aux_record_bytes
// Auxiliary records a segment may declare.
constexpr uint32_t kMaxAuxRecords = 16;
constexpr uint8_t kModelSpecV1 = 1;
constexpr uint8_t kModelSpecV2 = 2;  // V1 then the codec (u8); written only for a spec with one
constexpr uint8_t kCountersV1 = 1;

// Little-endian fixed-width appends. The build targets little-endian hosts (checked below), so a
// memcpy is the encoding.
static_assert(std::endian::native == std::endian::little, "ckv's on-disk encodings assume LE");

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    char buf[sizeof(T)];
    std::memcpy(buf, &v, sizeof(T));
    out_.append(buf, sizeof(T));
  }
  void PutKey(const ChunkKey& k) {
    Put(k.hi);
    Put(k.lo);
  }
  void PutString(absl::string_view s) {
    Put(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(absl::string_view in, absl::string_view what) : in_(in), what_(what) {}

  template <typename T>
  absl::Status Get(T* v) {
    if (in_.size() < sizeof(T)) return Truncated();
    std::memcpy(v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return absl::OkStatus();
  }
  absl::Status GetKey(ChunkKey* k) {
    CKV_RETURN_IF_ERROR(Get(&k->hi));
    return Get(&k->lo);
  }
  absl::Status GetString(std::string* s, size_t max_len) {
    uint32_t n = 0;
    CKV_RETURN_IF_ERROR(Get(&n));
    if (n > max_len) {
      return absl::DataLossError(
          absl::StrCat("catalog entry ", what_, ": string of ", n, " bytes exceeds ", max_len));
    }
    if (in_.size() < n) return Truncated();
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return absl::OkStatus();
  }
  absl::Status Version(uint8_t expected) {
    uint8_t v = 0;
    CKV_RETURN_IF_ERROR(Get(&v));
    if (v != expected) {
      return absl::FailedPreconditionError(
          absl::StrCat("catalog entry ", what_, ": encoding version ", v, " is not ", expected,
                       " (written by another ckv version?)"));
    }
    return absl::OkStatus();
  }
  absl::Status Finish() {
    if (!in_.empty()) {
      return absl::DataLossError(
          absl::StrCat("catalog entry ", what_, ": ", in_.size(), " unexpected trailing bytes"));
    }
    return absl::OkStatus();
  }
  absl::Status Skip(size_t n) {
    if (in_.size() < n) return Truncated();
    in_.remove_prefix(n);
    return absl::OkStatus();
  }
  size_t remaining() const { return in_.size(); }

 private:
  absl::Status Truncated() const {
    return absl::DataLossError(absl::StrCat("catalog entry ", what_, ": value is truncated"));
  }
  absl::string_view in_;
  absl::string_view what_;
};

// Bounds on decoded vector lengths, so a corrupt value cannot make us allocate without limit.
constexpr uint32_t kMaxTokensPerChunk = 4096;
constexpr uint32_t kMaxLayers = 1024;

}  // namespace

std::string EncodeChunkKey(const ChunkKey& key) {
  std::string out(16, '\0');
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>(key.hi >> (56 - 8 * i));
    out[8 + i] = static_cast<char>(key.lo >> (56 - 8 * i));
  }
  return out;
}

absl::StatusOr<ChunkKey> DecodeChunkKey(absl::string_view bytes) {
  if (bytes.size() != 16) {
    return absl::DataLossError(
        absl::StrCat("catalog key of ", bytes.size(), " bytes is not a 16-byte chunk key"));
  }
  ChunkKey k;
  for (int i = 0; i < 8; ++i) {
    k.hi = (k.hi << 8) | static_cast<uint8_t>(bytes[i]);
    k.lo = (k.lo << 8) | static_cast<uint8_t>(bytes[8 + i]);
  }
  return k;
}

std::string EncodeSegmentKey(uint32_t id) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(id >> (24 - 8 * i));
  return out;
}

absl::StatusOr<uint32_t> DecodeSegmentKey(absl::string_view bytes) {
  if (bytes.size() != 4) {
    return absl::DataLossError(
        absl::StrCat("catalog key of ", bytes.size(), " bytes is not a 4-byte segment id"));
  }
  uint32_t id = 0;
  for (int i = 0; i < 4; ++i) id = (id << 8) | static_cast<uint8_t>(bytes[i]);
  return id;
}

std::string EncodeChunkRecord(const ChunkRecord& r) {
  Writer w;
  w.Put(kChunkRecordV1);
  w.PutKey(r.parent);
  w.PutKey(r.fingerprint);
  w.Put(r.depth);
  w.Put(r.segment);
  w.Put(r.slot);
  w.Put(r.put_seq);
  w.Put(r.created_unix_ms);
  w.Put(r.importance);
  w.Put(r.loads);
  w.Put(static_cast<uint32_t>(r.tokens.size()));
  for (int32_t t : r.tokens) w.Put(t);
  w.Put(static_cast<uint32_t>(r.checksums.size()));
  for (uint64_t c : r.checksums) w.Put(c);
  return w.Take();
}

absl::StatusOr<ChunkRecord> DecodeChunkRecord(absl::string_view bytes, absl::string_view what) {
  ChunkRecord c;
  CKV_RETURN_IF_ERROR(DecodeChunkRecordInto(bytes, what, /*with_tokens=*/true, &c));
  return c;
}

absl::Status DecodeChunkRecordInto(absl::string_view bytes, absl::string_view what,
                                   bool with_tokens, ChunkRecord* out) {
  Reader r(bytes, what);
  ChunkRecord& c = *out;
  CKV_RETURN_IF_ERROR(r.Version(kChunkRecordV1));
  CKV_RETURN_IF_ERROR(r.GetKey(&c.parent));
  CKV_RETURN_IF_ERROR(r.GetKey(&c.fingerprint));
  CKV_RETURN_IF_ERROR(r.Get(&c.depth));
  CKV_RETURN_IF_ERROR(r.Get(&c.segment));
  CKV_RETURN_IF_ERROR(r.Get(&c.slot));
  CKV_RETURN_IF_ERROR(r.Get(&c.put_seq));
  CKV_RETURN_IF_ERROR(r.Get(&c.created_unix_ms));
  CKV_RETURN_IF_ERROR(r.Get(&c.importance));
  CKV_RETURN_IF_ERROR(r.Get(&c.loads));
  uint32_t n = 0;
  CKV_RETURN_IF_ERROR(r.Get(&n));
  if (n == 0 || n > kMaxTokensPerChunk) {
    return absl::DataLossError(absl::StrCat("catalog entry ", what, ": ", n, " tokens per chunk"));
  }
  if (with_tokens) {
    c.tokens.resize(n);
    for (auto& t : c.tokens) CKV_RETURN_IF_ERROR(r.Get(&t));
  } else {
    c.tokens.clear();
    CKV_RETURN_IF_ERROR(r.Skip(size_t{n} * sizeof(int32_t)));
  }
  CKV_RETURN_IF_ERROR(r.Get(&n));
  if (n == 0 || n > kMaxLayers + kMaxAuxRecords) {
    return absl::DataLossError(absl::StrCat("catalog entry ", what, ": ", n, " checksums"));
  }
  c.checksums.resize(n);
  for (auto& x : c.checksums) CKV_RETURN_IF_ERROR(r.Get(&x));
  return r.Finish();
}

std::string EncodePrefixRecord(const PrefixRecord& p) {
  Writer w;
  w.Put(kPrefixRecordV1);
  w.PutKey(p.fingerprint);
  w.Put(p.chunks);
  w.Put(p.created_unix_ms);
  return w.Take();
}

absl::StatusOr<PrefixRecord> DecodePrefixRecord(absl::string_view bytes, absl::string_view what) {
  Reader r(bytes, what);
  PrefixRecord p;
  CKV_RETURN_IF_ERROR(r.Version(kPrefixRecordV1));
  CKV_RETURN_IF_ERROR(r.GetKey(&p.fingerprint));
  CKV_RETURN_IF_ERROR(r.Get(&p.chunks));
  CKV_RETURN_IF_ERROR(r.Get(&p.created_unix_ms));
  CKV_RETURN_IF_ERROR(r.Finish());
  return p;
}

std::string EncodeSegmentRecord(const SegmentRecord& s) {
  Writer w;
  w.Put(kSegmentRecordV2);
  w.PutKey(s.fingerprint);
  w.Put(static_cast<uint8_t>(s.layout));
  w.Put(s.layers);
  w.Put(s.band_layers);
  w.Put(s.record_bytes);
  w.Put(s.record_slot_bytes);
  w.Put(s.capacity_slots);
  w.Put(s.created_unix_ms);
  // DecodeSegmentRecord refuses more: a segment written with more could never be opened again.
  CKV_CHECK(s.aux_record_bytes.size() <= kMaxAuxRecords);
  w.Put(static_cast<uint32_t>(s.aux_record_bytes.size()));
  for (uint32_t b : s.aux_record_bytes) w.Put(b);
  return w.Take();
}

absl::StatusOr<SegmentRecord> DecodeSegmentRecord(absl::string_view bytes, absl::string_view what) {
  Reader r(bytes, what);
  SegmentRecord s;
  uint8_t version = 0;
  CKV_RETURN_IF_ERROR(r.Get(&version));
  if (version != kSegmentRecordV1 && version != kSegmentRecordV2) {
    return absl::DataLossError(absl::StrCat("catalog entry ", what, ": encoding version ", version,
                                            " is not 1 or 2 (written by another ckv version?)"));
  }
  CKV_RETURN_IF_ERROR(r.GetKey(&s.fingerprint));
  uint8_t layout = 0;
  CKV_RETURN_IF_ERROR(r.Get(&layout));
  if (layout != static_cast<uint8_t>(RecordLayout::kLayerMajor) &&
      layout != static_cast<uint8_t>(RecordLayout::kPeriodMajor)) {
    return absl::DataLossError(absl::StrCat("catalog entry ", what, ": unknown layout ", layout));
  }
  s.layout = static_cast<RecordLayout>(layout);
  CKV_RETURN_IF_ERROR(r.Get(&s.layers));
  CKV_RETURN_IF_ERROR(r.Get(&s.band_layers));
  CKV_RETURN_IF_ERROR(r.Get(&s.record_bytes));
  CKV_RETURN_IF_ERROR(r.Get(&s.record_slot_bytes));
  CKV_RETURN_IF_ERROR(r.Get(&s.capacity_slots));
  CKV_RETURN_IF_ERROR(r.Get(&s.created_unix_ms));
  if (version == kSegmentRecordV2) {
    uint32_t n = 0;
    CKV_RETURN_IF_ERROR(r.Get(&n));
    if (n > kMaxAuxRecords) {
      return absl::DataLossError(absl::StrCat("catalog entry ", what, ": ", n, " aux records"));
    }
    s.aux_record_bytes.resize(n);
    for (auto& b : s.aux_record_bytes) {
      CKV_RETURN_IF_ERROR(r.Get(&b));
      if (b == 0 || b > (1u << 30)) {
        return absl::DataLossError(
            absl::StrCat("catalog entry ", what, ": aux record of ", b, " bytes"));
      }
    }
  }
  CKV_RETURN_IF_ERROR(r.Finish());
  if (s.layers == 0 || s.layers > kMaxLayers || s.band_layers == 0 || s.band_layers > s.layers ||
      s.record_bytes == 0 || s.record_bytes > kMaxRecordBytes ||
      s.record_slot_bytes < s.record_bytes || s.record_slot_bytes > kMaxRecordBytes ||
      s.record_slot_bytes % 4096 != 0 || s.capacity_slots == 0 ||
      s.capacity_slots > kMaxSegmentSlots) {
    return absl::DataLossError(absl::StrCat("catalog entry ", what, ": inconsistent geometry"));
  }
  return s;
}

std::string EncodeModelSpec(const ModelSpec& spec) {
  Writer w;
  const bool v2 = spec.codec != KvCodec::kNone;
  w.Put(v2 ? kModelSpecV2 : kModelSpecV1);
  w.PutString(spec.model_id);
  w.Put(spec.layers);
  w.Put(spec.q_heads);
  w.Put(spec.kv_heads);
  w.Put(spec.head_dim);
  w.Put(static_cast<uint8_t>(spec.dtype));
  w.Put(spec.chunk_tokens);
  if (v2) w.Put(static_cast<uint8_t>(spec.codec));
  return w.Take();
}

absl::StatusOr<ModelSpec> DecodeModelSpec(absl::string_view bytes, absl::string_view what) {
  Reader r(bytes, what);
  ModelSpec s;
  uint8_t version = 0;
  CKV_RETURN_IF_ERROR(r.Get(&version));
  if (version != kModelSpecV1 && version != kModelSpecV2) {
    return absl::FailedPreconditionError(
        absl::StrCat("catalog entry ", what, ": encoding version ", version,
                     " is not 1 or 2 (written by another ckv version?)"));
  }
  CKV_RETURN_IF_ERROR(r.GetString(&s.model_id, 256));
  CKV_RETURN_IF_ERROR(r.Get(&s.layers));
  CKV_RETURN_IF_ERROR(r.Get(&s.q_heads));
  CKV_RETURN_IF_ERROR(r.Get(&s.kv_heads));
  CKV_RETURN_IF_ERROR(r.Get(&s.head_dim));
  uint8_t dtype = 0;
  CKV_RETURN_IF_ERROR(r.Get(&dtype));
  s.dtype = static_cast<DType>(dtype);
  CKV_RETURN_IF_ERROR(r.Get(&s.chunk_tokens));
  if (version == kModelSpecV2) {
    uint8_t codec = 0;
    CKV_RETURN_IF_ERROR(r.Get(&codec));
    s.codec = static_cast<KvCodec>(codec);
    if (s.codec == KvCodec::kNone) {
      return absl::DataLossError(
          absl::StrCat("catalog entry ", what, ": a version 2 spec without a codec"));
    }
    if (codec > static_cast<uint8_t>(KvCodec::kInt4)) {  // fails closed: never decoded wrongly
      return absl::FailedPreconditionError(absl::StrCat(
          "catalog entry ", what, ": codec ", codec,
          " is not one this build of ckv decodes (written by a newer ckv?); upgrade ckv"));
    }
  }
  CKV_RETURN_IF_ERROR(r.Finish());
  absl::Status valid = s.Validate();
  if (!valid.ok()) {
    return absl::DataLossError(absl::StrCat("catalog entry ", what, ": ", valid.message()));
  }
  return s;
}

std::string EncodeCounters(const StoredCounters& c) {
  Writer w;
  w.Put(kCountersV1);
  w.Put(c.puts);
  w.Put(c.chunks_written);
  w.Put(c.chunks_deduplicated);
  w.Put(c.bytes_written);
  w.Put(c.chunks_evicted);
  w.Put(c.bytes_evicted);
  w.Put(c.chunks_deleted);
  return w.Take();
}

absl::StatusOr<StoredCounters> DecodeCounters(absl::string_view bytes, absl::string_view what) {
  Reader r(bytes, what);
  StoredCounters c;
  CKV_RETURN_IF_ERROR(r.Version(kCountersV1));
  CKV_RETURN_IF_ERROR(r.Get(&c.puts));
  CKV_RETURN_IF_ERROR(r.Get(&c.chunks_written));
  CKV_RETURN_IF_ERROR(r.Get(&c.chunks_deduplicated));
  CKV_RETURN_IF_ERROR(r.Get(&c.bytes_written));
  CKV_RETURN_IF_ERROR(r.Get(&c.chunks_evicted));
  CKV_RETURN_IF_ERROR(r.Get(&c.bytes_evicted));
  CKV_RETURN_IF_ERROR(r.Get(&c.chunks_deleted));
  CKV_RETURN_IF_ERROR(r.Finish());
  return c;
}

std::string EncodeU32(uint32_t v) {
  Writer w;
  w.Put(v);
  return w.Take();
}

std::string EncodeU64(uint64_t v) {
  Writer w;
  w.Put(v);
  return w.Take();
}

absl::StatusOr<uint32_t> DecodeU32(absl::string_view bytes, absl::string_view what) {
  Reader r(bytes, what);
  uint32_t v = 0;
  CKV_RETURN_IF_ERROR(r.Get(&v));
  CKV_RETURN_IF_ERROR(r.Finish());
  return v;
}

absl::StatusOr<uint64_t> DecodeU64(absl::string_view bytes, absl::string_view what) {
  Reader r(bytes, what);
  uint64_t v = 0;
  CKV_RETURN_IF_ERROR(r.Get(&v));
  CKV_RETURN_IF_ERROR(r.Finish());
  return v;
}

}  // namespace ckv::storage
