// SPDX-License-Identifier: Apache-2.0
#include "storage/segment.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"

namespace ckv::storage {

Segment::Segment(uint32_t id, const SegmentRecord& geometry, std::unique_ptr<io::File> file)
    : id_(id), geometry_(geometry), file_(std::move(file)) {
  free_.emplace(0, geometry_.capacity_slots);
}

std::string Segment::FileName(uint32_t id) { return absl::StrFormat("seg-%08u.ckv", id); }

namespace {
uint64_t RoundUp4K(uint64_t v) { return (v + 4095) / 4096 * 4096; }
}  // namespace

SegmentRecord Segment::GeometryFor(const ModelSpec& spec, RecordLayout layout,
                                   uint32_t period_layers, uint64_t segment_bytes,
                                   int64_t now_unix_ms,
                                   const std::vector<uint32_t>& aux_record_bytes) {
  SegmentRecord g;
  g.fingerprint = spec.Fingerprint();
  g.layout = layout;
  g.layers = spec.layers;
  g.band_layers = layout == RecordLayout::kLayerMajor ? 1 : std::min(period_layers, spec.layers);
  g.record_bytes = static_cast<uint32_t>(spec.RecordBytes());
  g.record_slot_bytes = static_cast<uint32_t>(RoundUp4K(spec.RecordBytes()));
  g.aux_record_bytes = aux_record_bytes;
  g.capacity_slots = static_cast<uint32_t>(
      std::clamp<uint64_t>(segment_bytes / ChunkBytes(g), 1, kMaxSegmentSlots));
  g.created_unix_ms = now_unix_ms;
  return g;
}

uint64_t Segment::ChunkBytes(const SegmentRecord& g) {
  uint64_t bytes = uint64_t{g.layers} * g.record_slot_bytes;
  for (uint32_t aux : g.aux_record_bytes) bytes += RoundUp4K(aux);
  return bytes;
}

uint32_t Segment::record_bytes(uint32_t record) const {
  return record < geometry_.layers ? geometry_.record_bytes
                                   : geometry_.aux_record_bytes[record - geometry_.layers];
}

uint32_t Segment::band_of(uint32_t record) const {
  return record < geometry_.layers ? record / geometry_.band_layers
                                   : layer_bands() + (record - geometry_.layers);
}

uint32_t Segment::records_in_band(uint32_t band) const {
  if (band >= layer_bands()) return 1;
  const uint32_t first = band * geometry_.band_layers;
  return std::min(geometry_.band_layers, geometry_.layers - first);
}

uint32_t Segment::first_record_of_band(uint32_t band) const {
  return band < layer_bands() ? band * geometry_.band_layers
                              : geometry_.layers + (band - layer_bands());
}

uint64_t Segment::record_stride(uint32_t band) const {
  return band < layer_bands() ? geometry_.record_slot_bytes
                              : RoundUp4K(geometry_.aux_record_bytes[band - layer_bands()]);
}

uint64_t Segment::BandOffset(uint32_t band, uint32_t slot) const {
  // Every layer band but the last has the same region size; the last may hold fewer layers.
  const uint64_t layer_band_region =
      uint64_t{geometry_.capacity_slots} * geometry_.band_layers * geometry_.record_slot_bytes;
  if (band < layer_bands()) return band * layer_band_region + slot * band_slot_bytes(band);
  uint64_t offset =
      uint64_t{geometry_.capacity_slots} * geometry_.layers * geometry_.record_slot_bytes;
  for (uint32_t b = layer_bands(); b < band; ++b) {
    offset += uint64_t{geometry_.capacity_slots} * band_slot_bytes(b);
  }
  return offset + slot * band_slot_bytes(band);
}

uint64_t Segment::RecordOffset(uint32_t slot, uint32_t record) const {
  CKV_DCHECK(slot < geometry_.capacity_slots && record < records());
  const uint32_t band = band_of(record);
  return BandOffset(band, slot) +
         uint64_t{record - first_record_of_band(band)} * record_stride(band);
}

void Segment::BeginLoad() {
  CKV_CHECK(used_slots_ == 0 && !loading_active_);
  loading_active_ = true;  // the bitmap is allocated by the first MarkUsed: none for no chunk
}

bool Segment::MarkUsed(uint32_t slot) {
  CKV_DCHECK(slot < geometry_.capacity_slots && loading_active_);
  if (geometry_.capacity_slots > kMaxLoadBitmapSlots) {
    // A bitmap this large is not worth its memory: split the slot out of the free runs instead,
    // O(log runs) and no memory but the runs'.
    auto it = free_.upper_bound(slot);
    if (it == free_.begin()) return false;
    --it;
    const uint32_t start = it->first, count = it->second;
    if (slot >= start + count) return false;
    free_.erase(it);
    if (slot > start) free_.emplace(start, slot - start);
    if (slot + 1 < start + count) free_.emplace(slot + 1, start + count - slot - 1);
    ++used_slots_;
    return true;
  }
  if (loading_.empty()) {
    loading_.assign((uint64_t{geometry_.capacity_slots} + 63) / 64, 0);
    free_.clear();
  }
  uint64_t& word = loading_[slot / 64];
  const uint64_t bit = uint64_t{1} << (slot % 64);
  if ((word & bit) != 0) return false;
  word |= bit;
  ++used_slots_;
  return true;
}

void Segment::EndLoad() {
  CKV_CHECK(loading_active_);
  loading_active_ = false;
  // Without a bitmap, the free runs are right already: no slot was marked, or they were split.
  if (loading_.empty()) return;
  // The free runs are the runs of clear bits below capacity_slots.
  const uint32_t capacity = geometry_.capacity_slots;
  uint32_t slot = 0;
  auto bit = [&](uint32_t s) { return (loading_[s / 64] >> (s % 64)) & 1; };
  while (slot < capacity) {
    // Skip used slots, a whole word at a time where every slot in it is used.
    if (slot % 64 == 0 && loading_[slot / 64] == ~uint64_t{0}) {
      slot += 64;
      continue;
    }
    if (bit(slot) != 0) {
      ++slot;
      continue;
    }
    const uint32_t start = slot;
    while (slot < capacity) {
      if (slot % 64 == 0 && loading_[slot / 64] == 0) {
        slot += 64;
      } else if (bit(slot) == 0) {
        ++slot;
      } else {
        break;
      }
    }
    slot = std::min(slot, capacity);
    free_.emplace_hint(free_.end(), start, slot - start);
  }
  loading_.clear();
  loading_.shrink_to_fit();
}

SlotRun Segment::Allocate(uint32_t count) {
  if (free_.empty() || count == 0) return {};
  // First fit for the whole request keeps a Put's chunks contiguous; otherwise the largest run,
  // so a Put is split into as few runs as possible.
  auto pick = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= count) {
      pick = it;
      break;
    }
    if (pick == free_.end() || it->second > pick->second) pick = it;
  }
  const uint32_t start = pick->first, avail = pick->second;
  const uint32_t take = std::min(avail, count);
  free_.erase(pick);
  if (take < avail) free_.emplace(start + take, avail - take);
  used_slots_ += take;
  CKV_DCHECK(start + take <= geometry_.capacity_slots && used_slots_ <= geometry_.capacity_slots);
  return SlotRun{start, take};
}

bool Segment::AllocateRun(SlotRun run) {
  if (run.count == 0) return true;
  auto it = free_.upper_bound(run.start);
  if (it == free_.begin()) return false;
  --it;  // the free run starting at or before run.start
  const uint32_t start = it->first, count = it->second;
  if (run.start + run.count > start + count) return false;
  free_.erase(it);
  if (run.start > start) free_.emplace(start, run.start - start);
  if (run.start + run.count < start + count) {
    free_.emplace(run.start + run.count, start + count - run.start - run.count);
  }
  used_slots_ += run.count;
  return true;
}

void Segment::Free(SlotRun run) {
  if (run.count == 0) return;
  // Freeing slots that are not in use (a double free, or a run past the end) would hand one slot
  // to two chunks, and a reader the other chunk's bytes: stop here instead.
  CKV_CHECK(run.count <= used_slots_ && run.start <= geometry_.capacity_slots - run.count);
  used_slots_ -= run.count;
  uint32_t start = run.start, count = run.count;
  auto next = free_.lower_bound(start);
  // The run overlaps no free run: none starts inside it, and the one before ends at or before it.
  CKV_DCHECK(next == free_.end() || next->first >= start + count);
  CKV_DCHECK(next == free_.begin() || std::prev(next)->first + std::prev(next)->second <= start);
  if (next != free_.end() && next->first == start + count) {
    count += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      count += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(start, count);
}

std::vector<SlotRun> Segment::FreeRuns() const {
  std::vector<SlotRun> runs;
  runs.reserve(free_.size());
  for (const auto& [start, count] : free_) runs.push_back({start, count});
  return runs;
}

absl::Status Segment::PunchSlots(SlotRun run) {
  if (run.count == 0) return absl::OkStatus();
  for (uint32_t b = 0; b < bands(); ++b) {
    CKV_RETURN_IF_ERROR(file_->PunchHole(BandOffset(b, run.start), run.count * band_slot_bytes(b)));
  }
  return absl::OkStatus();
}

}  // namespace ckv::storage
