// SPDX-License-Identifier: Apache-2.0
// storage/catalog_format.h: the catalog's column families, keys and value encodings.
//
// docs/format.md is the prose version of this file; keep them in step. Every value starts with a
// one-byte encoding version; all integers are little-endian fixed width; keys that must sort
// (segment ids) are big-endian. Persisted enum values: do not renumber.
//
// Thread-safety: pure functions and value types.
#ifndef CKV_STORAGE_CATALOG_FORMAT_H_
#define CKV_STORAGE_CATALOG_FORMAT_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/chunk_key.h"
#include "ckv/model_spec.h"
#include "ckv/record_layout.h"

namespace ckv::storage {

// The catalog format this build writes and the newest it reads. Stored in meta under
// kMetaFormatVersion. Bump on any incompatible change to this file.
// Version 2 added auxiliary records (key summaries) to segments; version 1 stores are read as
// stores whose chunks have none.
inline constexpr uint32_t kCatalogFormatVersion = 2;

// Column families.
inline constexpr char kCfChunks[] = "chunks";          // chunk key (16 B) -> ChunkRecord
inline constexpr char kCfPrefixes[] = "prefixes";      // last chunk key (16 B) -> PrefixRecord
inline constexpr char kCfSegments[] = "segments";      // segment id (4 B BE) -> SegmentRecord
inline constexpr char kCfStatistics[] = "statistics";  // name -> counters
inline constexpr char kCfMeta[] = "meta";              // name -> value

// Keys in meta.
inline constexpr char kMetaFormatVersion[] = "format_version";  // u32
inline constexpr char kMetaMaxDiskBytes[] = "max_disk_bytes";   // u64
inline constexpr char kMetaLayout[] = "layout";                 // u8 RecordLayout
inline constexpr char kMetaCreatedMs[] = "created_unix_ms";     // i64
inline constexpr char kMetaSpecPrefix[] = "spec/";  // + fingerprint hex -> encoded ModelSpec
// Key in statistics.
inline constexpr char kStatsEngine[] = "engine";  // StoredCounters

// One chunk: where its records are and how to check them.
struct ChunkRecord {
  ChunkKey parent;       // zero for the first chunk of a prefix
  ChunkKey fingerprint;  // of the ModelSpec it was written under
  uint32_t depth = 0;    // index of the chunk in its prefix (0 = first)
  uint32_t segment = 0;  // segment id
  uint32_t slot = 0;     // slot in the segment
  uint64_t put_seq = 0;  // order of the Put that wrote it (initial LRU order)
  int64_t created_unix_ms = 0;
  double importance = 0;        // I: accumulated attention over Re-Prefills
  uint64_t loads = 0;           // F: times loaded into a faster tier
  std::vector<int32_t> tokens;  // the chunk's c token ids
  // XXH3-64 of each record (record bytes, no padding): the L layers' records, then the segment's
  // auxiliary records in their order.
  std::vector<uint64_t> checksums;
};

// A stored prefix, keyed by the key of its last chunk.
struct PrefixRecord {
  ChunkKey fingerprint;
  uint64_t chunks = 0;
  int64_t created_unix_ms = 0;
};

// One segment file: the geometry that places a chunk's records. See docs/format.md.
struct SegmentRecord {
  ChunkKey fingerprint;  // every chunk in it is of this spec
  RecordLayout layout = RecordLayout::kLayerMajor;
  uint32_t layers = 0;             // L of the spec
  uint32_t band_layers = 1;        // layers per band: 1 (layer-major) or p (period-major)
  uint32_t record_bytes = 0;       // spec.RecordBytes()
  uint32_t record_slot_bytes = 0;  // record_bytes rounded up to 4096
  uint32_t capacity_slots = 0;     // chunks the segment can hold
  int64_t created_unix_ms = 0;
  // Bytes of each auxiliary record a chunk has besides its layers' records (the key summaries
  // the engine computes at Put time; storage does not interpret them). Each is stored in a band
  // of its own after the layer bands, in a slot rounded up to 4096. Empty in version 1 segments.
  std::vector<uint32_t> aux_record_bytes;
};

// Counters persisted with every Put, eviction and delete.
struct StoredCounters {
  uint64_t puts = 0;
  uint64_t chunks_written = 0;
  uint64_t chunks_deduplicated = 0;
  uint64_t bytes_written = 0;
  uint64_t chunks_evicted = 0;
  uint64_t bytes_evicted = 0;
  uint64_t chunks_deleted = 0;
};

std::string EncodeChunkKey(const ChunkKey& key);
absl::StatusOr<ChunkKey> DecodeChunkKey(absl::string_view bytes);
std::string EncodeSegmentKey(uint32_t id);
absl::StatusOr<uint32_t> DecodeSegmentKey(absl::string_view bytes);

std::string EncodeChunkRecord(const ChunkRecord& record);
// `what` names the entry in error messages.
absl::StatusOr<ChunkRecord> DecodeChunkRecord(absl::string_view bytes, absl::string_view what);
// As DecodeChunkRecord, into `out`, reusing its vectors' memory; without `with_tokens` the token
// ids are checked for length and skipped (out->tokens is left empty): what opening a store reads
// of every chunk.
absl::Status DecodeChunkRecordInto(absl::string_view bytes, absl::string_view what,
                                   bool with_tokens, ChunkRecord* out);
std::string EncodePrefixRecord(const PrefixRecord& record);
absl::StatusOr<PrefixRecord> DecodePrefixRecord(absl::string_view bytes, absl::string_view what);
// Largest record (K and V of one chunk at one layer) a store keeps: a SegmentRecord holds its
// size in a u32 and a read's buffer holds one. Put refuses larger specs; decoding a segment
// whose record_bytes is larger is DataLoss. 1 GiB, as an auxiliary record.
inline constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 30;

// Most chunks a segment holds (Segment::GeometryFor clamps to it); decoding a segment that claims
// more is DataLoss, so that a damaged geometry cannot size the structures a load builds.
inline constexpr uint32_t kMaxSegmentSlots = uint32_t{1} << 30;

std::string EncodeSegmentRecord(const SegmentRecord& record);
absl::StatusOr<SegmentRecord> DecodeSegmentRecord(absl::string_view bytes, absl::string_view what);
std::string EncodeModelSpec(const ModelSpec& spec);
absl::StatusOr<ModelSpec> DecodeModelSpec(absl::string_view bytes, absl::string_view what);
std::string EncodeCounters(const StoredCounters& counters);
absl::StatusOr<StoredCounters> DecodeCounters(absl::string_view bytes, absl::string_view what);
std::string EncodeU32(uint32_t v);
std::string EncodeU64(uint64_t v);
absl::StatusOr<uint32_t> DecodeU32(absl::string_view bytes, absl::string_view what);
absl::StatusOr<uint64_t> DecodeU64(absl::string_view bytes, absl::string_view what);

}  // namespace ckv::storage

#endif  // CKV_STORAGE_CATALOG_FORMAT_H_
