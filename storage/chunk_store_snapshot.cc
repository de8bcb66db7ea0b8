// SPDX-License-Identifier: Apache-2.0
// storage/chunk_store_snapshot.cc: the index snapshot, so that opening a large store need not
// scan its catalog.
//
// A clean close writes the chunk index to <store>/index.snapshot: each chunk's key and entry in
// 48 bytes, the spec fingerprints by ordinal and the use clock, stamped with the catalog's
// identity and last sequence number. The next open loads it in bulk instead of scanning the
// catalog when the stamp matches, that is when the catalog has not changed since the close;
// otherwise it scans. Open deletes the snapshot before any write of its own, so a snapshot exists
// only from a clean close to the next open: after a crash there is none, or one whose stamp the
// catalog no longer has.
//
// Layout (little-endian; every offset a multiple of 4 KiB, for direct I/O):
//   header, padded to 4 KiB: magic "ckvindex" · version u32 · record bytes u32 (48) · chunks u64 ·
//     catalog sequence u64 · use clock u64 · use base u64 · put sequence u64 · header bytes u64 ·
//     records' XXH3-64 u64 · identity length u32 · fingerprints u32 · identity (128 bytes) ·
//     16 bytes per fingerprint · XXH3-64 of the header up to here
//   records, one per chunk, in the order of their ids: key (hi u64, lo u64) · parent u32 (the
//     parent's index in this array, or ChunkEntry::kRoot) · segment u32 · slot u32 · last use u32 ·
//     I f32 · F u32 · spec ordinal u16 · 2 bytes zero · children u32
#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "storage/chunk_store.h"
#include "storage/chunk_store_internal.h"
#include "storage/record_checksum.h"

namespace ckv::storage {

using chunk_store_internal::kSnapshotFile;

namespace {

static_assert(std::endian::native == std::endian::little, "the snapshot is written as in memory");

constexpr char kMagic[8] = {'c', 'k', 'v', 'i', 'n', 'd', 'e', 'x'};
constexpr uint32_t kVersion = 2;
constexpr size_t kRecordBytes = 48;
constexpr size_t kMaxIdentity = 128;
constexpr size_t kFingerprintsOffset = 80 + kMaxIdentity;  // the fixed part of the header
constexpr size_t kMaxFingerprints = size_t{1} << 16;
constexpr size_t kBlock = 4096;
// Records per read or write: whole records, and a multiple of 4 KiB (48 x 4096 x 256 = 48 MiB).
constexpr size_t kIoBytes = kRecordBytes * kBlock * 256;

uint64_t RoundUp(uint64_t v) { return (v + kBlock - 1) / kBlock * kBlock; }
uint64_t HeaderBytes(size_t fingerprints) {
  return RoundUp(kFingerprintsOffset + 16 * fingerprints + 8);
}

template <typename T>
void PutLe(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
template <typename T>
T GetLe(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

std::string ChunkStore::SnapshotPath() const { return absl::StrCat(path_, "/", kSnapshotFile); }

absl::Status ChunkStore::WriteIndexSnapshot() {
  absl::MutexLock lock(&mu_);
  // Only a sound index: a store with problems is scanned again, so that Verify finds them.
  if (!open_problems_.empty() || !dropped_chunks_.empty() || !dropped_prefixes_.empty() ||
      !lost_parents_.empty() || !inflight_.empty() || !put_pins_.empty()) {
    return absl::OkStatus();
  }
  // Nor one that may disagree with the catalog: a commit failed since the open.
  if (catalog_->CommitFailed()) return absl::OkStatus();
  const std::string identity = catalog_->Identity();
  if (identity.empty() || identity.size() > kMaxIdentity) return absl::OkStatus();
  // The sequence number stamped must be durable: after a power loss the catalog must not come back
  // at an earlier one, from which other writes could reach the stamp with other contents.
  CKV_RETURN_IF_ERROR(catalog_->SyncWal());
  const uint64_t sequence = catalog_->LatestSequence();
  const uint64_t n = chunks_.size();
  // Ids compacted to positions in the records array.
  std::vector<uint32_t> position(chunks_.IdBound(), ChunkEntry::kRoot);
  {
    uint32_t next = 0;
    for (auto it = chunks_.begin(); it != chunks_.end(); ++it) position[it.id()] = next++;
  }
  const uint64_t header_bytes = HeaderBytes(fingerprints_.size());
  const std::string path = SnapshotPath();
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<io::File> file,
                       fs_->Open(path, io::FileSystem::OpenMode::kCreateReadWrite));
  // Records first, the header last: a close cut short leaves a header that does not check.
  CKV_RETURN_IF_ERROR(file->Truncate(0));
  // The buffer before the hash state: a failed allocation returns with nothing to free.
  CKV_ASSIGN_OR_RETURN(io::AlignedBuffer buffer,
                       io::AlignedBuffer::Allocate(std::min<uint64_t>(
                           kIoBytes, RoundUp(std::max<uint64_t>(1, n) * kRecordBytes))));
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  uint64_t offset = header_bytes;
  size_t filled = 0;
  absl::Status s;
  auto flush = [&]() {
    if (filled == 0 || !s.ok()) return;
    XXH3_64bits_update(state, buffer.data(), filled);
    const size_t padded = RoundUp(filled);
    std::memset(buffer.data() + filled, 0, padded - filled);
    s = file->WriteAt(offset, std::span<const std::byte>(buffer.data(), padded));
    offset += padded;
    filled = 0;
  };
  for (auto it = chunks_.begin(); it != chunks_.end() && s.ok(); ++it) {
    const auto [key, e] = *it;
    std::byte* r = buffer.data() + filled;
    std::memset(r, 0, kRecordBytes);
    PutLe<uint64_t>(r, key.hi);
    PutLe<uint64_t>(r + 8, key.lo);
    PutLe<uint32_t>(r + 16, e.parent == ChunkEntry::kRoot ? ChunkEntry::kRoot : position[e.parent]);
    PutLe<uint32_t>(r + 20, e.segment);
    PutLe<uint32_t>(r + 24, e.slot);
    PutLe<uint32_t>(r + 28, e.last_use);
    PutLe<float>(r + 32, e.importance);
    PutLe<uint32_t>(r + 36, e.loads);
    PutLe<uint16_t>(r + 40, e.spec);
    PutLe<uint32_t>(r + 44, e.children);
    filled += kRecordBytes;
    if (filled == buffer.size()) flush();
  }
  flush();
  const uint64_t records_checksum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  CKV_RETURN_IF_ERROR(s);

  CKV_ASSIGN_OR_RETURN(io::AlignedBuffer header, io::AlignedBuffer::Allocate(header_bytes));
  std::memset(header.data(), 0, header_bytes);
  std::byte* h = header.data();
  std::memcpy(h, kMagic, sizeof kMagic);
  PutLe<uint32_t>(h + 8, kVersion);
  PutLe<uint32_t>(h + 12, kRecordBytes);
  PutLe<uint64_t>(h + 16, n);
  PutLe<uint64_t>(h + 24, sequence);
  PutLe<uint64_t>(h + 32, use_clock_);
  PutLe<uint64_t>(h + 40, use_base_);
  PutLe<uint64_t>(h + 48, put_seq_);
  PutLe<uint64_t>(h + 56, header_bytes);
  PutLe<uint64_t>(h + 64, records_checksum);
  PutLe<uint32_t>(h + 72, static_cast<uint32_t>(identity.size()));
  PutLe<uint32_t>(h + 76, static_cast<uint32_t>(fingerprints_.size()));
  std::memcpy(h + 80, identity.data(), identity.size());
  for (size_t i = 0; i < fingerprints_.size(); ++i) {
    PutLe<uint64_t>(h + kFingerprintsOffset + 16 * i, fingerprints_[i].hi);
    PutLe<uint64_t>(h + kFingerprintsOffset + 16 * i + 8, fingerprints_[i].lo);
  }
  const size_t checked = kFingerprintsOffset + 16 * fingerprints_.size();
  PutLe<uint64_t>(h + checked, RecordChecksum(h, checked));
  CKV_RETURN_IF_ERROR(file->WriteAt(0, header.span()));
  return file->Sync();
}

absl::Status ChunkStore::LoadIndexSnapshotLocked(bool* loaded) {
  *loaded = false;
  const std::string path = SnapshotPath();
  if (!fs_->Exists(path)) return absl::OkStatus();
  // Until a record is applied, a snapshot that does not fit is only skipped: the catalog is read.
  // One the catalog has moved past (a crash since the close, another build's writes) is expected;
  // a damaged one is worth a warning.
  auto skip = [&](absl::string_view why) {
    logger_->Log(LogLevel::kWarning, absl::StrCat("index snapshot ", path, " not used (", why,
                                                  "): reading the catalog"));
    return absl::OkStatus();
  };
  auto file = fs_->Open(path, io::FileSystem::OpenMode::kReadWrite);
  if (!file.ok()) return skip(file.status().message());
  auto size = (*file)->Size();
  if (!size.ok()) return skip(size.status().message());
  if (*size < kBlock) return skip(absl::StrCat("a file of ", *size, " bytes"));
  io::AlignedBuffer first(kBlock);
  if (absl::Status s = (*file)->ReadAt(0, first.span()); !s.ok()) return skip(s.message());
  const std::byte* h = first.data();
  const uint64_t header_bytes = GetLe<uint64_t>(h + 56);
  const uint32_t identity_bytes = GetLe<uint32_t>(h + 72);
  const uint32_t fingerprints = GetLe<uint32_t>(h + 76);
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0 || GetLe<uint32_t>(h + 8) != kVersion ||
      GetLe<uint32_t>(h + 12) != kRecordBytes || identity_bytes > kMaxIdentity ||
      fingerprints > kMaxFingerprints || header_bytes != HeaderBytes(fingerprints) ||
      header_bytes > *size) {
    return skip("not a snapshot this build reads");
  }
  const std::string identity(reinterpret_cast<const char*>(h + 80), identity_bytes);
  const uint64_t sequence = GetLe<uint64_t>(h + 24);
  if (identity != catalog_->Identity() || sequence != catalog_->LatestSequence()) {
    return absl::OkStatus();  // the catalog changed since it was written
  }
  absl::StatusOr<io::AlignedBuffer> header = io::AlignedBuffer::Allocate(header_bytes);
  if (!header.ok()) return skip(header.status().message());
  if (absl::Status s = (*file)->ReadAt(0, header->span()); !s.ok()) return skip(s.message());
  h = header->data();
  const size_t checked = kFingerprintsOffset + 16 * size_t{fingerprints};
  if (RecordChecksum(h, checked) != GetLe<uint64_t>(h + checked)) return skip("header checksum");
  const uint64_t n = GetLe<uint64_t>(h + 16);
  if (n >= ChunkEntry::kLostParent || header_bytes + RoundUp(n * kRecordBytes) > *size) {
    return skip(absl::StrCat("a file of ", *size, " bytes for ", n, " chunks"));
  }
  std::vector<ChunkKey> fps(fingerprints);
  absl::flat_hash_set<ChunkKey> distinct;
  for (uint32_t i = 0; i < fingerprints; ++i) {
    fps[i] = ChunkKey{GetLe<uint64_t>(h + kFingerprintsOffset + 16 * i),
                      GetLe<uint64_t>(h + kFingerprintsOffset + 16 * i + 8)};
    if (!distinct.insert(fps[i]).second) return skip("a fingerprint listed twice");
  }
  CKV_CHECK(fingerprints_.empty());  // Load gives ordinals to none before
  for (const ChunkKey& fp : fps) CKV_RETURN_IF_ERROR(FingerprintOrdinalLocked(fp).status());

  // Applying: from here a record that does not fit fails the load, and Open reads the catalog
  // into a fresh store instead.
  auto damaged = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("index snapshot ", path, ": ", why));
  };
  chunks_.reserve(n);
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  struct FreeState {
    XXH3_state_t* s;
    ~FreeState() { XXH3_freeState(s); }
  } free_state{state};
  CKV_ASSIGN_OR_RETURN(io::AlignedBuffer buffer,
                       io::AlignedBuffer::Allocate(std::min<uint64_t>(
                           kIoBytes, RoundUp(std::max<uint64_t>(1, n) * kRecordBytes))));
  uint64_t done = 0;
  uint64_t children = 0, linked = 0;  // must agree: every link is one parent's child
  while (done < n) {
    const uint64_t count = std::min<uint64_t>(n - done, buffer.size() / kRecordBytes);
    const size_t bytes = count * kRecordBytes;
    CKV_RETURN_IF_ERROR((*file)->ReadAt(header_bytes + done * kRecordBytes,
                                        std::span<std::byte>(buffer.data(), RoundUp(bytes))));
    XXH3_64bits_update(state, buffer.data(), bytes);
    constexpr uint64_t kAhead = 8;  // the hash index is probed at random: prefetched ahead
    for (uint64_t j = 0; j < count; ++j) {
      if (j + kAhead < count) {
        const std::byte* ahead = buffer.data() + (j + kAhead) * kRecordBytes;
        chunks_.Prefetch(ChunkKey{GetLe<uint64_t>(ahead), GetLe<uint64_t>(ahead + 8)});
      }
      const std::byte* r = buffer.data() + j * kRecordBytes;
      const uint64_t index = done + j;
      const ChunkKey key{GetLe<uint64_t>(r), GetLe<uint64_t>(r + 8)};
      ChunkEntry e;
      e.parent = GetLe<uint32_t>(r + 16);
      e.segment = GetLe<uint32_t>(r + 20);
      e.slot = GetLe<uint32_t>(r + 24);
      e.last_use = GetLe<uint32_t>(r + 28);
      e.importance = GetLe<float>(r + 32);
      e.loads = GetLe<uint32_t>(r + 36);
      e.spec = GetLe<uint16_t>(r + 40);
      children += GetLe<uint32_t>(r + 44);  // counted again below, from the links
      linked += e.parent != ChunkEntry::kRoot;
      auto seg = segments_.find(e.segment);
      if (seg == segments_.end() || e.slot >= seg->second->geometry().capacity_slots ||
          e.spec >= fingerprints_.size() ||
          !(seg->second->geometry().fingerprint == fingerprints_[e.spec]) ||
          (e.parent != ChunkEntry::kRoot && (e.parent >= n || e.parent == index))) {
        return damaged(absl::StrCat("chunk ", index, " (", key.ToHex(),
                                    ") does not fit the catalog's segments"));
      }
      if (!seg->second->MarkUsed(e.slot)) {
        return damaged(absl::StrCat("chunk ", key.ToHex(), " shares slot ", e.slot, " of segment ",
                                    e.segment));
      }
      if (chunks_.Insert(key, e) != index) {
        return damaged(absl::StrCat("chunk ", key.ToHex(), " is listed twice"));
      }
      used_bytes_ += seg->second->chunk_bytes();
    }
    done += count;
  }
  if (XXH3_64bits_digest(state) != GetLe<uint64_t>(h + 64)) return damaged("records checksum");
  if (children != linked) {
    return damaged(absl::StrCat(children, " children counted for ", linked, " parent links"));
  }
  // The links are the truth (docs/format.md): each chunk's children are counted from them.
  for (auto it = chunks_.begin(); it != chunks_.end(); ++it) {
    const uint32_t parent = (*it).second.parent;
    if (parent != ChunkEntry::kRoot) chunks_.ValueAt(parent).children++;
  }
  use_clock_ = GetLe<uint64_t>(h + 32);
  use_base_ = GetLe<uint64_t>(h + 40);
  put_seq_ = GetLe<uint64_t>(h + 48);
  if (use_base_ > use_clock_ || use_clock_ - use_base_ > UINT32_MAX) {
    return damaged("use clock out of range");
  }
  *loaded = true;
  return absl::OkStatus();
}

}  // namespace ckv::storage
