#include "storage/segment.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "ckv/status.h"

namespace ckv::storage {

Segment::Segment(uint32_t id, const SegmentRecord& geometry, std::unique_ptr<File> file)
    : id_(id), geometry_(geometry), file_(std::move(file)) {
  free_.emplace(0, geometry_.capacity_slots);
}

std::string Segment::FileName(uint32_t id) { return absl::StrFormat("seg-%08u.ckv", id); }

SegmentRecord Segment::GeometryFor(const ModelSpec& spec, RecordLayout layout,
                                   uint32_t period_layers, uint64_t segment_bytes,
                                   int64_t now_unix_ms) {
  SegmentRecord g;
  g.fingerprint = spec.Fingerprint();
  g.layout = layout;
  g.layers = spec.layers;
  g.band_layers = layout == RecordLayout::kLayerMajor ? 1 : std::min(period_layers, spec.layers);
  g.record_bytes = static_cast<uint32_t>(spec.RecordBytes());
  g.record_slot_bytes = static_cast<uint32_t>((spec.RecordBytes() + 4095) / 4096 * 4096);
  const uint64_t chunk = uint64_t{g.layers} * g.record_slot_bytes;
  g.capacity_slots = static_cast<uint32_t>(
      std::clamp<uint64_t>(segment_bytes / chunk, 1, uint64_t{1} << 30));
  g.created_unix_ms = now_unix_ms;
  return g;
}

uint32_t Segment::layers_in_band(uint32_t band) const {
  const uint32_t first = band * geometry_.band_layers;
  return std::min(geometry_.band_layers, geometry_.layers - first);
}

uint64_t Segment::BandOffset(uint32_t band, uint32_t slot) const {
  const uint64_t band_stride = uint64_t{geometry_.band_layers} * geometry_.record_slot_bytes;
  return uint64_t{band} * geometry_.capacity_slots * band_stride + slot * band_slot_bytes(band);
}

uint64_t Segment::RecordOffset(uint32_t slot, uint32_t layer) const {
  const uint32_t band = band_of(layer);
  return BandOffset(band, slot) +
         uint64_t{layer - band * geometry_.band_layers} * geometry_.record_slot_bytes;
}

bool Segment::MarkUsed(uint32_t slot) {
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
  return SlotRun{start, take};
}

void Segment::Free(SlotRun run) {
  if (run.count == 0) return;
  used_slots_ -= run.count;
  uint32_t start = run.start, count = run.count;
  auto next = free_.lower_bound(start);
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
