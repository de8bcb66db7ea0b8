// SPDX-License-Identifier: Apache-2.0
// storage/segment.h: one segment file, its geometry and its free slots.
//
// A segment holds the records of up to capacity_slots chunks of one ModelSpec. A chunk occupies
// one slot, the same slot index in every band. A band is a group of layers: one layer
// (layer-major) or one period of p layers (period-major). The file is a sequence of band regions:
//
//   band b region at  b * capacity_slots * band_stride        (band_stride = p * record_slot)
//   chunk slot s      at  region + s * layers_in_band(b) * record_slot
//   layer l record    at  slot + (l - first layer of b) * record_slot
//
// After the layer bands come the auxiliary bands, one per auxiliary record (the key summaries),
// each with slots of that record's size rounded up to 4096, so the summaries of consecutive slots
// are one contiguous run too. In layer-major, layer l of consecutive slots is one contiguous run,
// and in period-major one chunk's records of a period are. record_slot is the record size rounded
// up to 4096 for direct I/O. Files are sparse: a slot's blocks exist while a chunk lives in it; a
// freed slot is punched, or, when the reclaimer freed it, keeps its blocks for the next Put to
// write over (ChunkStore counts those against the cap). See docs/format.md.
//
// Thread-safety: geometry methods are const and thread-safe. The allocator (Allocate/Free) is not
// synchronised: ChunkStore calls it under its mutex. The File is thread-safe.
#ifndef CKV_STORAGE_SEGMENT_H_
#define CKV_STORAGE_SEGMENT_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/file_system.h"
#include "storage/catalog_format.h"

namespace ckv::storage {

// A run of consecutive slots.
struct SlotRun {
  uint32_t start = 0;
  uint32_t count = 0;
};

class Segment {
 public:
  Segment(uint32_t id, const SegmentRecord& geometry, std::unique_ptr<io::File> file);

  // "seg-00000007.ckv".
  static std::string FileName(uint32_t id);
  // The geometry a new segment for `spec` gets; each chunk also has one auxiliary record of
  // each size in `aux_record_bytes`.
  static SegmentRecord GeometryFor(const ModelSpec& spec, RecordLayout layout,
                                   uint32_t period_layers, uint64_t segment_bytes,
                                   int64_t now_unix_ms,
                                   const std::vector<uint32_t>& aux_record_bytes);
  // Bytes one chunk occupies over all bands of a segment of geometry `g`.
  static uint64_t ChunkBytes(const SegmentRecord& g);

  uint32_t id() const { return id_; }
  const SegmentRecord& geometry() const { return geometry_; }
  io::File* file() const { return file_.get(); }

  // Records of a chunk: its layers' records (index = layer), then its auxiliary records.
  uint32_t records() const {
    return geometry_.layers + static_cast<uint32_t>(geometry_.aux_record_bytes.size());
  }
  // Bytes of record `record` (without padding).
  uint32_t record_bytes(uint32_t record) const;

  // Bands: the layer bands, then one band per auxiliary record.
  uint32_t layer_bands() const {
    return (geometry_.layers + geometry_.band_layers - 1) / geometry_.band_layers;
  }
  uint32_t bands() const {
    return layer_bands() + static_cast<uint32_t>(geometry_.aux_record_bytes.size());
  }
  uint32_t band_of(uint32_t record) const;
  // Records a chunk has in band `band` (1 for an auxiliary band), and the first of them.
  uint32_t records_in_band(uint32_t band) const;
  uint32_t first_record_of_band(uint32_t band) const;
  // Bytes between consecutive records of a chunk in band `band`.
  uint64_t record_stride(uint32_t band) const;
  // Bytes one chunk occupies in band `band`.
  uint64_t band_slot_bytes(uint32_t band) const {
    return records_in_band(band) * record_stride(band);
  }
  // Bytes one chunk occupies over all bands.
  uint64_t chunk_bytes() const { return ChunkBytes(geometry_); }
  // Offset of slot `slot` in band `band`.
  uint64_t BandOffset(uint32_t band, uint32_t slot) const;
  // Offset of record `record` of the chunk in `slot`.
  uint64_t RecordOffset(uint32_t slot, uint32_t record) const;

  // Allocator. Loading the catalog: BeginLoad, then MarkUsed of each live slot, in any order, at
  // O(1) each (a bitmap of capacity_slots bits, allocated by the first MarkUsed), then EndLoad,
  // which builds the free runs in one pass. A segment of more than kMaxLoadBitmapSlots slots
  // splits each slot out of its free runs instead, so that a damaged geometry cannot make a load
  // allocate without bound. MarkUsed is false when the slot was marked already. REQUIRES:
  // BeginLoad on a segment with no slot used; MarkUsed between BeginLoad and EndLoad.
  static constexpr uint32_t kMaxLoadBitmapSlots = uint32_t{1} << 26;  // an 8 MiB bitmap
  void BeginLoad();
  bool MarkUsed(uint32_t slot);
  void EndLoad();
  // Takes up to `count` slots, as one run where one is free, else the first free run. Returns an
  // empty run when the segment is full.
  SlotRun Allocate(uint32_t count);
  // Takes exactly `run`. False, taking nothing, unless every slot of it is free.
  bool AllocateRun(SlotRun run);
  void Free(SlotRun run);
  uint32_t used_slots() const { return used_slots_; }
  uint32_t free_slots() const { return geometry_.capacity_slots - used_slots_; }
  // The free runs, for reclaiming their space.
  std::vector<SlotRun> FreeRuns() const;

  // Frees the blocks of `run` in every band.
  absl::Status PunchSlots(SlotRun run);

 private:
  uint32_t id_;
  SegmentRecord geometry_;
  std::unique_ptr<io::File> file_;
  std::map<uint32_t, uint32_t> free_;  // start -> count, disjoint, never adjacent
  std::vector<uint64_t> loading_;      // during a load: bit s set = slot s used
  bool loading_active_ = false;        // between BeginLoad and EndLoad
  uint32_t used_slots_ = 0;
};

}  // namespace ckv::storage

#endif  // CKV_STORAGE_SEGMENT_H_
