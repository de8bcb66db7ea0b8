// SPDX-License-Identifier: Apache-2.0
// storage/chunk_store.cc: ChunkStore open and load, lookup, pins and checked reads, prefix
// listings and stats. Put is in chunk_store_put.cc, eviction, removal and usage in
// chunk_store_evict.cc; verify, repair and gc are the StoreChecker's (store_checker.cc).
#include "storage/chunk_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "storage/chunk_store_internal.h"
#include "storage/record_checksum.h"
#include "storage/store_checker.h"

namespace ckv::storage {

namespace {

using chunk_store_internal::kCatalogDir;
using chunk_store_internal::kSegmentsDir;
using chunk_store_internal::PunchGaveBack;

std::string ShortKey(const ChunkKey& k) { return k.ToHex().substr(0, 16); }

io::FileSystem* ChooseFileSystem(const StoreOptions& options) {
  if (options.file_system != nullptr) return options.file_system;
  return io::PosixFileSystem(options.io_backend);
}

}  // namespace

ChunkStore::ChunkStore(const StoreOptions& options, std::string path, io::FileSystem* fs,
                       Logger* logger)
    : options_(options),
      path_(std::move(path)),
      fs_(fs),
      logger_(logger),
      staging_(std::make_unique<io::StagingPool>(
          fs, options.put_staging_bytes, options.max_write_bytes, options.io_queue_depth)) {}

// The reclaimer goes first: its rounds use the catalog, the segments and the listeners.
ChunkStore::~ChunkStore() {
  StopReclaimer();
  if (!snapshot_on_close_) return;
  if (absl::Status s = WriteIndexSnapshot(); !s.ok()) {
    logger_->Log(LogLevel::kWarning,
                 absl::StrCat("could not write the index snapshot of ", path_, ": ", s.message(),
                              " (the next open reads the catalog)"));
  }
}

std::string ChunkStore::SegmentPath(uint32_t id) const {
  return absl::StrCat(path_, "/", kSegmentsDir, "/", Segment::FileName(id));
}

uint64_t ChunkStore::ChunkBytesOf(const ModelSpec& spec,
                                  const std::vector<uint32_t>& aux_bytes) const {
  return Segment::ChunkBytes(Segment::GeometryFor(spec, RecordLayout::kLayerMajor, 1,
                                                  options_.segment_bytes, 0, aux_bytes));
}

absl::StatusOr<std::unique_ptr<ChunkStore>> ChunkStore::Open(const StoreOptions& options,
                                                             const std::string& path_in) {
  if (path_in.empty()) return absl::InvalidArgumentError("store path is empty");
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (options.io_queue_depth < 1 || options.io_queue_depth > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EngineOptions.io_queue_depth = ", options.io_queue_depth, ": must be in 1..1024"));
  }
  if (options.max_write_bytes < io::kDirectIoAlignment || options.max_write_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("EngineOptions.max_write_bytes = ", options.max_write_bytes,
                     ": must be a positive multiple of 4096"));
  }
  if (options.put_staging_bytes < (1u << 20) || options.put_staging_bytes > (64ull << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("EngineOptions.put_staging_bytes = ", options.put_staging_bytes,
                     ": must be in 1 MiB..64 GiB"));
  }
  if (options.period_layers < 1 || options.period_layers > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EngineOptions.period_layers = ", options.period_layers, ": must be in 1..1024"));
  }
  if (options.io_backend == IoBackend::kUring && options.file_system == nullptr &&
      !io::UringAvailable()) {
    return absl::UnavailableError(
        "EngineOptions.io_backend = io_uring, but io_uring cannot be set up in this process "
        "(kernel.io_uring_disabled, a seccomp profile or an old kernel); use kAuto or kThreads");
  }
  if (options.read_only) return OpenReadOnly(options, path);
  io::FileSystem* fs = ChooseFileSystem(options);
  Logger* logger = options.logger != nullptr ? options.logger : StderrLogger();

  // The store directory: created when allowed, but never its parents, so that a mistyped path
  // is an error rather than a new tree.
  std::string created_parent;  // set when this Open made the store directory
  if (!fs->Exists(path)) {
    if (!options.create_if_missing) {
      return absl::NotFoundError(absl::StrCat("no ckv store at ", path));
    }
    const size_t slash = path.find_last_of('/');
    const std::string parent =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    if (!fs->Exists(parent)) {
      return absl::NotFoundError(
          absl::StrCat("cannot create store ", path, ": directory ", parent, " does not exist"));
    }
    CKV_RETURN_IF_ERROR(fs->CreateDir(path));
    created_parent = parent;
  }
  CKV_RETURN_IF_ERROR(fs->CreateDir(absl::StrCat(path, "/", kSegmentsDir)));

  StoreOptions resolved = options;
  if (resolved.clock == nullptr) resolved.clock = RealClock();
  std::unique_ptr<ChunkStore> store;
  Catalog::Contents contents;
  // With the index snapshot first; when it matched the catalog but did not load, again, afresh,
  // from the catalog.
  for (const bool use_snapshot : {true, false}) {
    store.reset(new ChunkStore(resolved, path, fs, logger));
    contents = Catalog::Contents{};
    CKV_ASSIGN_OR_RETURN(
        store->catalog_,
        Catalog::Open(absl::StrCat(path, "/", kCatalogDir), options.create_if_missing,
                      options.error_if_exists && use_snapshot, &contents, fs, resolved.clock));
    bool snapshot_failed = false;
    absl::Status loaded = store->Load(contents, use_snapshot, &snapshot_failed);
    if (snapshot_failed) {
      logger->Log(LogLevel::kWarning, absl::StrCat(loaded.message(), "; reading the catalog"));
      continue;
    }
    CKV_RETURN_IF_ERROR(loaded);
    break;
  }
  // The snapshot held the index as of the last close: gone before this open writes anything, so
  // that no later state of the catalog can be taken for it.
  const std::string snapshot = store->SnapshotPath();
  if (fs->Exists(snapshot)) {
    CKV_RETURN_IF_ERROR(fs->DeleteFile(snapshot));
    CKV_RETURN_IF_ERROR(fs->SyncDir(path));
  }
  // The parent's entry for a store directory made here must be durable before any Put is
  // acknowledged in it.
  if (!created_parent.empty()) CKV_RETURN_IF_ERROR(fs->SyncDir(created_parent));
  CKV_RETURN_IF_ERROR(store->ReclaimOrphans());

  absl::ReleasableMutexLock lock(&store->mu_);
  Catalog::Batch batch = store->catalog_->NewBatch();
  if (options.max_disk_bytes.has_value() && *options.max_disk_bytes != store->max_disk_bytes_) {
    store->max_disk_bytes_ = *options.max_disk_bytes;
    batch.PutMeta(kMetaMaxDiskBytes, EncodeU64(store->max_disk_bytes_));
  }
  if (options.layout.has_value() && *options.layout != store->layout_) {
    store->layout_ = *options.layout;
    batch.PutMeta(kMetaLayout, std::string(1, static_cast<char>(store->layout_)));
  }
  if (contents.format_version < kCatalogFormatVersion) {
    // New segments are written in the current encoding: older builds must refuse the store now.
    batch.PutMeta(kMetaFormatVersion, EncodeU32(kCatalogFormatVersion));
  }
  if (!batch.empty()) CKV_RETURN_IF_ERROR(store->catalog_->Commit(batch));
  // A cap lowered since the last open takes effect now.
  uint64_t evicted = 0;
  CKV_RETURN_IF_ERROR(store->MakeRoomLocked(0, &evicted));
  // The cap holds once the open's eviction is done.
  CKV_DCHECK(store->max_disk_bytes_ == 0 || store->used_bytes_ <= store->DataCapLocked());
  if (evicted > 0) {
    store->logger_->Log(LogLevel::kInfo,
                        absl::StrCat("evicted ", evicted, " chunks of ", path,
                                     " to fit max_disk_bytes ", store->max_disk_bytes_));
  }
  lock.Release();
  store->StartReclaimer();
  store->snapshot_on_close_ = true;
  return store;
}

absl::StatusOr<std::unique_ptr<ChunkStore>> ChunkStore::OpenReadOnly(const StoreOptions& options,
                                                                     const std::string& path) {
  io::FileSystem* fs = ChooseFileSystem(options);
  Logger* logger = options.logger != nullptr ? options.logger : StderrLogger();
  if (!fs->Exists(path)) return absl::NotFoundError(absl::StrCat("no ckv store at ", path));
  StoreOptions resolved = options;
  if (resolved.clock == nullptr) resolved.clock = RealClock();
  std::unique_ptr<ChunkStore> store(new ChunkStore(resolved, path, fs, logger));
  Catalog::Contents contents;
  CKV_ASSIGN_OR_RETURN(store->catalog_,
                       Catalog::OpenReadOnly(absl::StrCat(path, "/", kCatalogDir), &contents, fs));
  bool snapshot_failed = false;
  // A segment the view's catalog names may be gone (DataLoss "is missing") because the writer's
  // Gc deleted it after the catalog was read: the engine opens again when the store changed.
  CKV_RETURN_IF_ERROR(store->Load(contents, /*use_snapshot=*/false, &snapshot_failed));
  return store;
}

absl::StatusOr<uint64_t> ChunkStore::FreeSpaceToOpen(const StoreOptions& options,
                                                     const std::string& path_in,
                                                     std::span<const ChunkKey> delete_prefixes) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  io::FileSystem* fs = ChooseFileSystem(options);
  Logger* logger = options.logger != nullptr ? options.logger : StderrLogger();
  if (!fs->Exists(path)) return absl::NotFoundError(absl::StrCat("no ckv store at ", path));
  const std::string catalog_dir = absl::StrCat(path, "/", kCatalogDir);
  // Held to the end: nothing may allocate the slots punched here.
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<Catalog::Lock> lock, Catalog::LockDir(catalog_dir));
  StoreOptions resolved = options;
  resolved.read_only = false;  // the segments are opened for punching; the catalog read-only
  resolved.put_staging_bytes = 1u << 20;
  if (resolved.clock == nullptr) resolved.clock = RealClock();
  std::unique_ptr<ChunkStore> view(new ChunkStore(resolved, path, fs, logger));
  Catalog::Contents contents;
  CKV_ASSIGN_OR_RETURN(view->catalog_, Catalog::OpenReadOnly(catalog_dir, &contents, fs));
  bool snapshot_failed = false;
  CKV_RETURN_IF_ERROR(view->Load(contents, /*use_snapshot=*/false, &snapshot_failed));
  uint64_t freed = 0;
  absl::MutexLock l(&view->mu_);
  // The chunks a DeletePrefix of each prefix would remove (walking up from its end while no
  // other chunk or prefix uses them): their blocks go now, the catalog forgets them once open.
  for (const ChunkKey& prefix : delete_prefixes) {
    if (!view->prefixes_.contains(prefix)) {
      return absl::NotFoundError(absl::StrCat("no stored prefix ", prefix.ToHex()));
    }
    ChunkKey key = prefix;
    uint32_t removed_children = 0;
    while (!key.IsZero()) {
      auto it = view->chunks_.find(key);
      if (it == view->chunks_.end()) break;
      const ChunkEntry& e = it->second;
      if ((e.prefix_end && !(key == prefix)) || e.children != removed_children) break;
      Segment& seg = *view->segments_.at(e.segment);
      if (PunchGaveBack(seg.PunchSlots(SlotRun{e.slot, 1}))) freed += seg.chunk_bytes();
      key = view->ParentKeyLocked(key, e);
      removed_children = 1;
    }
  }
  // Free slots whose blocks are still allocated (the reclaimer's, a failed punch's, a crash's).
  for (auto& [id, segment] : view->segments_) {
    CKV_ASSIGN_OR_RETURN(uint64_t bytes, PunchFreeRuns(*segment));
    freed += bytes;
  }
  // The index snapshot: the open that follows reads the catalog instead.
  const std::string snapshot = view->SnapshotPath();
  if (fs->Exists(snapshot)) {
    uint64_t bytes = 0;
    if (auto file = fs->Open(snapshot, io::FileSystem::OpenMode::kReadOnly); file.ok()) {
      if (absl::StatusOr<uint64_t> held = (*file)->AllocatedBytes(); held.ok()) bytes = *held;
    }
    CKV_RETURN_IF_ERROR(fs->DeleteFile(snapshot));
    freed += bytes;
  }
  logger->Log(LogLevel::kInfo, absl::StrCat("gave back ", freed, " bytes of ", path,
                                            " before opening it on a full file system"));
  return freed;
}

absl::Status ChunkStore::RefuseIfReadOnly(std::string_view op) const {
  if (!options_.read_only) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      std::string(op), " on ", path_, ": the store is open read-only (Engine::OpenReadOnly)"));
}

absl::Status ChunkStore::Load(const Catalog::Contents& c, bool use_snapshot,
                              bool* snapshot_failed) {
  absl::MutexLock lock(&mu_);
  max_disk_bytes_ = c.max_disk_bytes;
  layout_ = c.layout;
  counters_ = c.counters;
  for (const ModelSpec& spec : c.specs) specs_.emplace(spec.Fingerprint(), spec);

  for (const auto& [id, geometry] : c.segments) {
    const std::string file_path = SegmentPath(id);
    if (!fs_->Exists(file_path)) {
      return absl::DataLossError(
          absl::StrCat("segment ", id, " (", file_path, ") named by the catalog is missing"));
    }
    CKV_ASSIGN_OR_RETURN(
        std::unique_ptr<io::File> file,
        fs_->Open(file_path, options_.read_only ? io::FileSystem::OpenMode::kReadOnly
                                                : io::FileSystem::OpenMode::kReadWrite));
    segments_.emplace(id, std::make_unique<Segment>(id, geometry, std::move(file)));
    next_segment_id_ = std::max(next_segment_id_, id + 1);
  }

  for (auto& [id, segment] : segments_) segment->BeginLoad();
  bool from_snapshot = false;
  if (use_snapshot) {
    if (absl::Status s = LoadIndexSnapshotLocked(&from_snapshot); !s.ok()) {
      *snapshot_failed = true;
      return s;
    }
  }
  if (!from_snapshot) CKV_RETURN_IF_ERROR(ScanCatalogLocked());
  index_from_snapshot_ = from_snapshot;
  for (auto& [id, segment] : segments_) segment->EndLoad();
  for (const auto& [key, e] : chunks_) {
    if (e.children == 0) leaves_.insert(key);
  }
  for (const auto& [key, p] : c.prefixes) {
    auto chunk = chunks_.find(key);
    if (chunk == chunks_.end()) {
      open_problems_.push_back(VerifyProblem{
          .kind = VerifyProblem::Kind::kInconsistent,
          .chunk = key,
          .message = absl::StrCat("prefix ", key.ToHex(), " ends at a chunk that is not stored")});
      dropped_prefixes_.push_back(key);
      continue;
    }
    chunk->second.prefix_end = true;
    prefixes_.emplace(key, PrefixEntry{p.fingerprint, p.chunks, p.created_unix_ms});
  }
  return absl::OkStatus();
}

absl::Status ChunkStore::ScanCatalogLocked() {
  // Sized from RocksDB's estimate, bounded by the catalog's size (a chunk's record holds two
  // 16-byte keys that do not compress), so that a damaged estimate cannot reserve without bound.
  const size_t expected_chunks =
      std::min(catalog_->EstimateChunks(), catalog_->ApproximateBytes() / 16 + 4096);
  chunks_.reserve(expected_chunks);
  // The parents' keys, by the chunk's id in chunks_, until every chunk is in (a scan in key order
  // meets a parent after its children as often as before): freed once the links are ids.
  std::vector<LoadLink> links;
  links.reserve(expected_chunks);
  // ScanChunks calls the lambda before it returns, with mu_ still held here.
  CKV_RETURN_IF_ERROR(catalog_->ScanChunks([&](const ChunkKey& key, const ChunkRecord& r)
                                               ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
                                                 LoadChunkLocked(key, r, links);
                                                 return absl::OkStatus();
                                               }));
  // The use order starts as the Put order: the latest 2^31 Puts keep theirs.
  use_clock_ = put_seq_;
  use_base_ = use_clock_ > kUseRebase ? use_clock_ - kUseRebase : 0;
  // Each chunk's parent, found at random: the parents of the chunks a few ahead are prefetched.
  constexpr int kAhead = 8;
  auto ahead = chunks_.begin();
  for (int i = 0; i < kAhead && ahead != chunks_.end(); ++i, ++ahead) {
    chunks_.Prefetch(links[ahead.id()].parent);
  }
  for (auto it = chunks_.begin(); it != chunks_.end(); ++it) {
    if (ahead != chunks_.end()) {
      chunks_.Prefetch(links[ahead.id()].parent);
      ++ahead;
    }
    auto [key, e] = *it;
    e.last_use = UseStampLocked(links[it.id()].put_seq);
    const ChunkKey& parent_key = links[it.id()].parent;
    if (parent_key.IsZero()) continue;  // kRoot
    auto parent = chunks_.find(parent_key);
    if (parent == chunks_.end()) {
      open_problems_.push_back(VerifyProblem{
          .kind = VerifyProblem::Kind::kDamaged,
          .chunk = key,
          .message =
              absl::StrCat("chunk ", key.ToHex(), " has no stored parent ", parent_key.ToHex())});
      e.parent = ChunkEntry::kLostParent;
      lost_parents_.emplace(key, parent_key);
      continue;
    }
    e.parent = parent.id();
    parent->second.children++;
  }
  std::vector<LoadLink>().swap(links);
  return absl::OkStatus();
}

void ChunkStore::LoadChunkLocked(const ChunkKey& key, const ChunkRecord& r,
                                 std::vector<LoadLink>& links) {
  auto seg = segments_.find(r.segment);
  std::string problem;
  if (seg == segments_.end()) {
    problem = absl::StrCat("chunk ", key.ToHex(), " names segment ", r.segment,
                           ", which the catalog does not hold");
  } else if (r.slot >= seg->second->geometry().capacity_slots) {
    problem = absl::StrCat("chunk ", key.ToHex(), " names slot ", r.slot, " of segment ", r.segment,
                           ", which has ", seg->second->geometry().capacity_slots);
  } else if (!(seg->second->geometry().fingerprint == r.fingerprint) ||
             r.checksums.size() != seg->second->records()) {
    problem =
        absl::StrCat("chunk ", key.ToHex(), " does not match the spec of segment ", r.segment);
  } else if (absl::Status s = FingerprintOrdinalLocked(r.fingerprint).status(); !s.ok()) {
    problem = absl::StrCat("chunk ", key.ToHex(), ": ", s.message());
  } else if (!seg->second->MarkUsed(r.slot)) {
    problem = absl::StrCat("chunk ", key.ToHex(), " shares slot ", r.slot, " of segment ",
                           r.segment, " with another chunk");
  }
  if (!problem.empty()) {
    // Such a chunk cannot be served safely; keep it out of the index and let Verify say so.
    open_problems_.push_back(
        VerifyProblem{.kind = VerifyProblem::Kind::kDamaged, .chunk = key, .message = problem});
    dropped_chunks_.push_back(key);
    logger_->Log(LogLevel::kError, problem);
    return;
  }
  put_seq_ = std::max(put_seq_, r.put_seq);
  used_bytes_ += seg->second->chunk_bytes();
  const uint32_t id = chunks_.Insert(key, EntryFromRecordLocked(r, /*last_use=*/0));
  if (id == chunks_.kNoId) return;  // the scan gives each key once
  if (id >= links.size()) links.resize(id + 1);
  links[id] = LoadLink{r.parent, r.put_seq};
}

absl::StatusOr<uint64_t> ChunkStore::PunchFreeRuns(Segment& segment) {
  CKV_ASSIGN_OR_RETURN(uint64_t before, segment.file()->AllocatedBytes());
  const uint64_t live = uint64_t{segment.used_slots()} * segment.chunk_bytes();
  if (before <= live) return 0;
  for (const SlotRun& run : segment.FreeRuns()) {
    absl::Status s = segment.PunchSlots(run);
    if (absl::IsUnimplemented(s)) break;  // cannot punch here: space stays until reuse
    CKV_RETURN_IF_ERROR(s);
  }
  CKV_ASSIGN_OR_RETURN(uint64_t after, segment.file()->AllocatedBytes());
  return after < before ? before - after : 0;
}

absl::Status ChunkStore::ReclaimOrphans() {
  absl::MutexLock lock(&mu_);
  const std::string dir = absl::StrCat(path_, "/", kSegmentsDir);
  CKV_ASSIGN_OR_RETURN(std::vector<std::string> names, fs_->ListDir(dir));
  uint64_t reclaimed = 0;
  bool deleted_any = false;
  for (const std::string& name : names) {
    uint32_t id = 0;
    if (std::sscanf(name.c_str(), "seg-%08u.ckv", &id) == 1 && name == Segment::FileName(id) &&
        segments_.contains(id)) {
      continue;
    }
    // A file the catalog does not name: a segment whose creation did not commit. Its contents
    // were never visible.
    const std::string file_path = absl::StrCat(dir, "/", name);
    auto file = fs_->Open(file_path, io::FileSystem::OpenMode::kReadWrite);
    if (file.ok()) {
      auto bytes = (*file)->AllocatedBytes();
      if (bytes.ok()) reclaimed += *bytes;
    }
    CKV_RETURN_IF_ERROR(fs_->DeleteFile(file_path));
    deleted_any = true;
  }
  if (deleted_any) CKV_RETURN_IF_ERROR(fs_->SyncDir(dir));
  // Space inside segments that no committed chunk names: written by a Put that did not commit,
  // or slots the last process freed and kept for its Puts to write over.
  for (auto& [id, segment] : segments_) {
    CKV_ASSIGN_OR_RETURN(uint64_t freed, PunchFreeRuns(*segment));
    reclaimed += freed;
  }
  orphan_bytes_reclaimed_ = reclaimed;
  if (reclaimed > 0) {
    logger_->Log(LogLevel::kInfo, absl::StrCat("reclaimed ", reclaimed,
                                               " bytes of segment space no committed "
                                               "chunk names in ",
                                               path_,
                                               " (slots freed for reuse, or writes a "
                                               "crash left uncommitted)"));
  }
  return absl::OkStatus();
}

absl::Status ChunkStore::CheckFingerprintOrdinalLocked(const ChunkKey& fp) const {
  if (fingerprints_.size() <= UINT16_MAX || fingerprint_ordinals_.contains(fp)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "model spec ", fp.ToHex(), ": the store has indexed chunks of ", fingerprints_.size(),
      " model specs since it was opened, the most one open store indexes; reopen it"));
}

absl::StatusOr<uint16_t> ChunkStore::FingerprintOrdinalLocked(const ChunkKey& fp) {
  auto it = fingerprint_ordinals_.find(fp);
  if (it != fingerprint_ordinals_.end()) return it->second;
  CKV_RETURN_IF_ERROR(CheckFingerprintOrdinalLocked(fp));
  const auto ordinal = static_cast<uint16_t>(fingerprints_.size());
  fingerprints_.push_back(fp);
  fingerprint_ordinals_.emplace(fp, ordinal);
  return ordinal;
}

uint64_t ChunkStore::ChainLengthLocked(const ChunkKey& key) const {
  // Entries of one Put's chunks sit next to each other in the table: the walk is mostly in cache.
  uint64_t length = 0;
  auto it = chunks_.find(key);
  // Bounded: a loop of links (a damaged catalog) stops at the table's size.
  while (it != chunks_.end() && length <= chunks_.size()) {
    ++length;
    const uint32_t parent = (*it).second.parent;
    if (parent == ChunkEntry::kRoot || parent == ChunkEntry::kLostParent) break;
    it = chunks_.AtId(parent);
  }
  return length;
}

uint32_t ChunkStore::UseTickLocked() {
  ++use_clock_;
  if (use_clock_ - use_base_ > UINT32_MAX) RebaseUseLocked();
  return UseStampLocked(use_clock_);
}

void ChunkStore::RebaseUseLocked() {
  use_base_ += kUseRebase;
  for (auto [key, e] : chunks_) {
    e.last_use = e.last_use > kUseRebase ? static_cast<uint32_t>(e.last_use - kUseRebase) : 0;
  }
}

void ChunkStore::SkipUseTicksForTesting(uint64_t ticks) {
  absl::MutexLock lock(&mu_);
  while (ticks > 0) {
    const uint64_t step = std::min<uint64_t>(ticks, kUseRebase);
    use_clock_ += step - 1;
    UseTickLocked();
    ticks -= step;
  }
}

void ChunkStore::PutUnpinLocked(const ChunkKey& key) {
  auto it = put_pins_.find(key);
  CKV_DCHECK(it != put_pins_.end() && it->second > 0);  // pinned by the Put that unpins it
  if (--it->second == 0) put_pins_.erase(it);
}

ChunkKey ChunkStore::ParentKeyLocked(const ChunkKey& key, const ChunkEntry& e) const {
  if (e.parent == ChunkEntry::kRoot) return ChunkKey{};
  if (e.parent == ChunkEntry::kLostParent) return lost_parents_.at(key);
  return chunks_.KeyAt(e.parent);
}

ChunkStore::ChunkEntry ChunkStore::EntryFromRecordLocked(const ChunkRecord& r, uint32_t last_use) {
  ChunkEntry e;  // the parent is linked by the caller
  e.spec = fingerprint_ordinals_.at(r.fingerprint);
  e.segment = r.segment;
  e.slot = r.slot;
  e.last_use = last_use;
  e.importance = static_cast<float>(r.importance);
  e.loads = static_cast<uint32_t>(std::min<uint64_t>(r.loads, UINT32_MAX));
  return e;
}

bool ChunkStore::HeldLocked(const ChunkKey& key, const ChunkEntry& e) const {
  return put_pins_.contains(key) || inflight_.contains(key) ||
         read_pins_.contains(SlotId{e.segment, e.slot});
}

absl::StatusOr<uint64_t> ChunkStore::Lookup(const ModelSpec& spec, std::span<const int32_t> tokens,
                                            bool touch) {
  CKV_RETURN_IF_ERROR(spec.Validate());
  const std::vector<ChunkKey> keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  absl::MutexLock lock(&mu_);
  const uint32_t tick = touch ? UseTickLocked() : 0;
  uint64_t matched = 0;
  for (const ChunkKey& k : keys) {
    auto it = chunks_.find(k);
    if (it == chunks_.end()) break;
    if (touch) it->second.last_use = tick;
    ++matched;
  }
  return matched;
}

void ChunkStore::PinLocked(SlotId slot) { read_pins_[slot]++; }

void ChunkStore::Unpin(SlotId slot) {
  absl::MutexLock lock(&mu_);
  auto it = read_pins_.find(slot);
  // Every unpin matches a pin (PinnedChunks, ReadRecord, Verify): a count never goes below one.
  CKV_DCHECK(it != read_pins_.end() && it->second > 0);
  if (it == read_pins_.end()) return;
  if (--it->second > 0) return;
  read_pins_.erase(it);
  if (deferred_free_.erase(slot) > 0) FreeSlotLocked(slot.first, slot.second);
}

std::string ChunkStore::RecordName(const Segment& seg, const ChunkKey& key, uint32_t record) {
  if (record < seg.geometry().layers) return absl::StrFormat("%s/L%u", ShortKey(key), record);
  return absl::StrFormat("%s/aux%u", ShortKey(key), record - seg.geometry().layers);
}

absl::Status ChunkStore::CheckRecord(const Segment& seg, uint32_t slot, uint32_t record,
                                     uint64_t expected, const ChunkKey& key,
                                     const std::byte* data) {
  absl::Status status = VerifyRecordChecksum(data, seg.record_bytes(record), expected, [&] {
    return absl::StrFormat("record %s (segment %u slot %u, offset %u of %s)",
                           RecordName(seg, key, record), seg.id(), slot,
                           seg.RecordOffset(slot, record), seg.file()->path());
  });
  if (!status.ok()) checksum_failures_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

absl::Status ChunkStore::ReadAndVerify(Segment* seg, uint32_t slot, uint32_t record,
                                       uint64_t expected, const ChunkKey& key,
                                       std::span<std::byte> out) {
  const uint64_t stride = seg->record_stride(seg->band_of(record));
  // Reused per thread, so made again when too small or aligned for another file's alignment.
  thread_local io::AlignedBuffer buffer;
  const size_t alignment = seg->file()->alignment();
  if (buffer.size() < stride || reinterpret_cast<uintptr_t>(buffer.data()) % alignment != 0) {
    CKV_ASSIGN_OR_RETURN(buffer, io::AlignedBuffer::Allocate(stride, alignment));
  }
  CKV_RETURN_IF_ERROR(seg->file()->ReadAt(seg->RecordOffset(slot, record),
                                          std::span<std::byte>(buffer.data(), stride)));
  records_read_.fetch_add(1, std::memory_order_relaxed);
  bytes_read_.fetch_add(stride, std::memory_order_relaxed);
  CKV_RETURN_IF_ERROR(CheckRecord(*seg, slot, record, expected, key, buffer.data()));
  if (!out.empty()) std::memcpy(out.data(), buffer.data(), seg->record_bytes(record));
  return absl::OkStatus();
}

absl::Status ChunkStore::ReadRecord(const ModelSpec& spec, const ChunkKey& key, uint32_t layer,
                                    std::span<std::byte> out) {
  CKV_RETURN_IF_ERROR(spec.Validate());
  const ChunkKey fp = spec.Fingerprint();
  Segment* seg = nullptr;
  SlotId slot;
  std::unique_ptr<PinnedChunks> handle;  // unpins when it goes
  {
    absl::MutexLock lock(&mu_);
    auto it = chunks_.find(key);
    if (it == chunks_.end()) {
      return absl::NotFoundError(absl::StrCat("chunk ", key.ToHex(), " is not stored"));
    }
    ChunkEntry& e = it->second;
    if (!(FingerprintOf(e) == fp)) {
      auto owner = specs_.find(FingerprintOf(e));
      return absl::FailedPreconditionError(absl::StrCat(
          "chunk ", key.ToHex(), " is stored under model ",
          owner == specs_.end() ? FingerprintOf(e).ToHex() : owner->second.DebugString(), ", not ",
          spec.DebugString()));
    }
    if (layer >= spec.layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, " out of range: ", spec.model_id, " has ", spec.layers));
    }
    if (out.size() != spec.RecordBytes()) {
      return absl::InvalidArgumentError(absl::StrCat("record buffer of ", out.size(),
                                                     " bytes; a record of ", spec.model_id, " is ",
                                                     spec.RecordBytes()));
    }
    e.last_use = UseTickLocked();
    seg = segments_.at(e.segment).get();
    slot = SlotId{e.segment, e.slot};
    PinLocked(slot);
    handle.reset(new PinnedChunks(
        this, {PinnedChunks::Chunk{key, seg, slot.second, {}, e.importance, e.loads}}));
  }
  std::vector<std::pair<size_t, absl::Status>> unusable;
  absl::Status s = ReadChecksums(*handle, &unusable);
  if (s.ok() && !unusable.empty()) s = unusable.front().second;
  if (s.ok()) {
    s = ReadAndVerify(seg, slot.second, layer, handle->chunks()[0].checksums[layer], key, out);
  }
  // A read-only view's mismatch may be a slot its writer reused: its engine decides, and logs.
  if (absl::IsDataLoss(s) && !options_.read_only) {
    logger_->Log(LogLevel::kError, std::string(s.message()));
  }
  return s;
}

absl::StatusOr<uint32_t> ChunkStore::AuxBytes(const ChunkKey& key, uint32_t aux) {
  absl::MutexLock lock(&mu_);
  auto it = chunks_.find(key);
  if (it == chunks_.end()) {
    return absl::NotFoundError(absl::StrCat("chunk ", key.ToHex(), " is not stored"));
  }
  const Segment& seg = *segments_.at(it->second.segment);
  if (aux >= seg.geometry().aux_record_bytes.size()) {
    return absl::NotFoundError(absl::StrCat("chunk ", key.ToHex(), " has no auxiliary record ", aux,
                                            " (it has ", seg.geometry().aux_record_bytes.size(),
                                            ")"));
  }
  return seg.geometry().aux_record_bytes[aux];
}

PinnedChunks::~PinnedChunks() {
  for (const Chunk& c : chunks_) store_->Unpin(ChunkStore::SlotId{c.segment->id(), c.slot});
}

PinnedChunks::Location PinnedChunks::RecordAt(size_t chunk, uint32_t record) const {
  CKV_DCHECK(chunk < chunks_.size());  // only a pinned chunk's records are read
  const Chunk& c = chunks_[chunk];
  CKV_DCHECK(record < c.checksums.size());  // one checksum per record of the chunk
  const Segment& seg = *c.segment;
  const uint32_t band = seg.band_of(record);
  return Location{seg.file(), seg.RecordOffset(c.slot, record), seg.record_bytes(record),
                  static_cast<uint32_t>(seg.band_slot_bytes(band)), c.checksums[record]};
}

io::FileRead PinnedChunks::ReadOf(size_t chunk, uint32_t record) const {
  const Location where = RecordAt(chunk, record);
  io::FileRead read = PartOf(chunk, record, 0, where.length);
  // The whole padded slot, when the file's alignment divides it: a record smaller than its slot
  // (a codec's, or any record not a multiple of 4 KiB) then ends where the next slot's read
  // begins, so the read engine coalesces a run of them into one device read, as it does
  // records that fill their slots. Read past the record only to the alignment, they were
  // single reads of a few blocks each. The checksum still covers the record's bytes alone.
  const Segment& seg = *chunks_[chunk].segment;
  const uint64_t slot = seg.record_stride(seg.band_of(record));
  const uint64_t align = std::max<uint64_t>(1, where.file->alignment());
  if (read.skip == 0 && slot % align == 0 && slot > read.length) {
    read.length = static_cast<uint32_t>(slot);
  }
  read.checksum = where.checksum;
  read.checksum_bytes = where.length;
  return read;
}

io::FileRead PinnedChunks::PartOf(size_t chunk, uint32_t record, uint32_t from,
                                  uint32_t bytes) const {
  const Location where = RecordAt(chunk, record);
  const uint64_t align = std::max<uint64_t>(1, where.file->alignment());
  const uint64_t begin = (where.offset + from) / align * align;
  const uint64_t end = (where.offset + from + bytes + align - 1) / align * align;
  io::FileRead read;
  read.file = where.file;
  read.offset = begin;
  read.length = static_cast<uint32_t>(end - begin);
  read.skip = static_cast<uint32_t>(where.offset + from - begin);
  // The read is aligned and stays inside the record's padded slot (a part, inside the record).
  CKV_DCHECK(uint64_t{from} + bytes <= where.length);
  // Segments pad records to 4 KiB, so an alignment that divides 4 KiB never reads past the pad.
  const Segment& seg = *chunks_[chunk].segment;
  CKV_DCHECK(begin % align == 0 && read.length % align == 0 && begin <= where.offset + from);
  CKV_DCHECK(io::kDirectIoAlignment % align != 0 ||
             end <= where.offset + seg.record_stride(seg.band_of(record)));
  return read;
}

absl::StatusOr<std::unique_ptr<PinnedChunks>> ChunkStore::PinLeading(
    const ModelSpec& spec, std::span<const ChunkKey> keys) {
  CKV_RETURN_IF_ERROR(spec.Validate());
  std::unique_ptr<PinnedChunks> pinned;
  {
    absl::MutexLock lock(&mu_);
    size_t m = 0;
    while (m < keys.size() && chunks_.contains(keys[m])) ++m;
    CKV_ASSIGN_OR_RETURN(pinned, PinLocked(spec, keys.first(m)));
  }
  std::vector<std::pair<size_t, absl::Status>> unusable;
  CKV_RETURN_IF_ERROR(ReadChecksums(*pinned, &unusable));
  if (!unusable.empty()) {
    // A chunk removed since it was found ends the leading run, as if removed before; damage fails.
    const auto& [first, status] = unusable.front();
    if (!absl::IsNotFound(status)) return status;
    for (size_t i = first; i < pinned->chunks_.size(); ++i) {
      Unpin(SlotId{pinned->chunks_[i].segment->id(), pinned->chunks_[i].slot});
    }
    pinned->chunks_.resize(first);
  }
  return pinned;
}

absl::StatusOr<std::unique_ptr<PinnedChunks>> ChunkStore::Pin(const ModelSpec& spec,
                                                              std::span<const ChunkKey> keys) {
  CKV_RETURN_IF_ERROR(spec.Validate());
  std::unique_ptr<PinnedChunks> pinned;
  {
    absl::MutexLock lock(&mu_);
    CKV_ASSIGN_OR_RETURN(pinned, PinLocked(spec, keys));
  }
  std::vector<std::pair<size_t, absl::Status>> unusable;
  CKV_RETURN_IF_ERROR(ReadChecksums(*pinned, &unusable));
  if (!unusable.empty()) return unusable.front().second;
  return pinned;
}

absl::Status ChunkStore::CheckPlace(const ChunkKey& key, const ChunkRecord& record,
                                    const Segment& segment, uint32_t slot) {
  // A pinned chunk's record cannot change but for its usage (evicting or deleting it keeps its
  // slot while pinned, and a chunk stored is not written again): any other record is damage.
  if (record.segment != segment.id() || record.slot != slot) {
    return absl::DataLossError(absl::StrCat(
        "catalog record of chunk ", key.ToHex(), " names segment ", record.segment, " slot ",
        record.slot, "; the store indexed it at segment ", segment.id(), " slot ", slot));
  }
  if (record.checksums.size() != segment.records()) {
    return absl::DataLossError(absl::StrCat(
        "catalog record of chunk ", key.ToHex(), " has ", record.checksums.size(),
        " checksums; segment ", segment.id(), " holds ", segment.records(), " records per chunk"));
  }
  return absl::OkStatus();
}

absl::Status ChunkStore::ReadChecksums(PinnedChunks& pinned,
                                       std::vector<std::pair<size_t, absl::Status>>* unusable) {
  if (pin_window_hook_) pin_window_hook_();
  std::vector<PinnedChunks::Chunk>& chunks = pinned.chunks_;
  std::vector<ChunkKey> keys(chunks.size());
  std::vector<size_t> offsets(chunks.size() + 1, 0);
  for (size_t i = 0; i < chunks.size(); ++i) {
    keys[i] = chunks[i].key;
    offsets[i + 1] = offsets[i] + chunks[i].segment->records();
  }
  pinned.checksums_.resize(offsets.back());
  std::vector<std::pair<size_t, absl::Status>> misplaced;  // no record, or one elsewhere
  CKV_RETURN_IF_ERROR(
      catalog_->GetChunks(keys, [&](size_t i, const absl::Status& status, const ChunkRecord& r) {
        if (absl::IsNotFound(status)) {
          misplaced.emplace_back(i, status);
        } else if (!status.ok()) {
          unusable->emplace_back(i, status);
        } else if (absl::Status place = CheckPlace(keys[i], r, *chunks[i].segment, chunks[i].slot);
                   !place.ok()) {
          misplaced.emplace_back(i, std::move(place));
        } else {
          std::copy(r.checksums.begin(), r.checksums.end(), pinned.checksums_.begin() + offsets[i]);
        }
        return absl::OkStatus();
      }));
  if (!misplaced.empty()) {
    // The records were read after mu_ was released: a chunk deleted or evicted since (its slot
    // stays pinned) has lost its record, or been stored again elsewhere. One the index still holds
    // at the pinned slot has a damaged catalog.
    absl::MutexLock lock(&mu_);
    for (auto& [i, status] : misplaced) {
      auto it = chunks_.find(keys[i]);
      const bool indexed_there = it != chunks_.end() &&
                                 it->second.segment == chunks[i].segment->id() &&
                                 it->second.slot == chunks[i].slot;
      unusable->emplace_back(
          i, indexed_there
                 ? (absl::IsNotFound(status) ? absl::DataLossError(absl::StrCat(
                                                   "chunk ", keys[i].ToHex(),
                                                   " is stored but its catalog record is missing"))
                                             : status)
                 : absl::NotFoundError(
                       absl::StrCat("chunk ", keys[i].ToHex(), " was removed while being pinned")));
    }
  }
  std::sort(unusable->begin(), unusable->end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < chunks.size(); ++i) {
    chunks[i].checksums = std::span<const uint64_t>(pinned.checksums_)
                              .subspan(offsets[i], offsets[i + 1] - offsets[i]);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PinnedChunks>> ChunkStore::PinLocked(
    const ModelSpec& spec, std::span<const ChunkKey> keys) {
  const ChunkKey fp = spec.Fingerprint();
  std::vector<PinnedChunks::Chunk> chunks;
  chunks.reserve(keys.size());
  for (const ChunkKey& key : keys) {
    auto it = chunks_.find(key);
    if (it == chunks_.end()) {
      return absl::NotFoundError(absl::StrCat("chunk ", key.ToHex(), " is not stored"));
    }
    const ChunkEntry& e = it->second;
    if (!(FingerprintOf(e) == fp)) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", key.ToHex(), " is not stored under ", spec.DebugString()));
    }
    Segment* seg = segments_.at(e.segment).get();
    // A stored chunk sits inside its segment with one checksum per record (Load drops others).
    CKV_DCHECK(e.slot < seg->geometry().capacity_slots);
    chunks.push_back(PinnedChunks::Chunk{key, seg, e.slot, {}, e.importance, e.loads});
  }
  const uint32_t tick = UseTickLocked();
  for (const auto& c : chunks) {
    PinLocked(SlotId{c.segment->id(), c.slot});
    chunks_[c.key].last_use = tick;
  }
  return std::unique_ptr<PinnedChunks>(new PinnedChunks(this, std::move(chunks)));
}

absl::Status ChunkStore::ReadAux(const ModelSpec& spec, std::span<const ChunkKey> keys,
                                 uint32_t aux, std::span<std::byte> out, uint64_t max_io_bytes) {
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<PinnedChunks> pinned, Pin(spec, keys));
  std::vector<size_t> all(keys.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return ReadAux(spec, *pinned, all, aux, out, max_io_bytes);
}

absl::Status ChunkStore::ReadAux(const ModelSpec& spec, const PinnedChunks& pinned,
                                 std::span<const size_t> which, uint32_t aux,
                                 std::span<std::byte> out, uint64_t max_io_bytes) {
  const uint32_t record = spec.layers + aux;
  uint32_t bytes = 0;
  const ChunkKey* first = nullptr;
  for (const size_t i : which) {
    if (i >= pinned.chunks().size()) {
      return absl::InvalidArgumentError(absl::StrCat("ReadAux of pinned chunk ", i, "; only ",
                                                     pinned.chunks().size(), " are pinned"));
    }
    const PinnedChunks::Chunk& c = pinned.chunks()[i];
    if (record >= c.segment->records()) {
      return absl::NotFoundError(absl::StrCat("chunk ", c.key.ToHex(), " has no auxiliary record ",
                                              aux, " (stored by a ckv that did not write it)"));
    }
    const uint32_t b = c.segment->record_bytes(record);
    if (bytes != 0 && b != bytes) {
      return absl::InvalidArgumentError(absl::StrCat("auxiliary record ", aux, " of chunk ",
                                                     c.key.ToHex(), " has ", b, " bytes; chunk ",
                                                     first->ToHex(), "'s has ", bytes));
    }
    bytes = b;
    if (first == nullptr) first = &c.key;
  }
  if (out.size() != which.size() * size_t{bytes}) {
    return absl::InvalidArgumentError(absl::StrCat("ReadAux output of ", out.size(), " bytes; ",
                                                   which.size(), " records of ", bytes,
                                                   " bytes need ", which.size() * size_t{bytes}));
  }
  std::vector<BandRead> reads;
  reads.reserve(which.size());
  for (size_t i = 0; i < which.size(); ++i) {
    const PinnedChunks::Chunk& c = pinned.chunks()[which[i]];
    reads.push_back(
        BandRead{c.segment, c.slot, c.segment->band_of(record), &c.key, c.checksums, i});
  }
  absl::Status first_error;
  CKV_RETURN_IF_ERROR(ReadBands(
      std::move(reads), max_io_bytes,
      [&](const BandRead& read, uint32_t, const absl::Status& st, bool, const std::byte* data) {
        if (!st.ok()) {
          if (first_error.ok()) first_error = st;
          return;
        }
        std::memcpy(out.data() + read.tag * bytes, data, bytes);
      }));
  if (absl::IsDataLoss(first_error)) {
    logger_->Log(LogLevel::kError, std::string(first_error.message()));
  }
  return first_error;
}

absl::Status ChunkStore::ReadBands(std::vector<BandRead> reads, uint64_t max_io_bytes,
                                   const RecordFn& on_record) {
  if (reads.empty()) return absl::OkStatus();
  std::sort(reads.begin(), reads.end(), [](const BandRead& a, const BandRead& b) {
    return std::tie(a.seg, a.band, a.slot, a.tag) < std::tie(b.seg, b.band, b.slot, b.tag);
  });
  // Runs of consecutive slots of one band of one segment become one read each.
  std::vector<std::pair<size_t, size_t>> runs;  // [begin, end) in reads
  for (size_t i = 0; i < reads.size(); ++i) {
    const BandRead& r = reads[i];
    const uint64_t band_slot = r.seg->band_slot_bytes(r.band);
    if (!runs.empty()) {
      const BandRead& prev = reads[i - 1];
      const size_t run_length = i - runs.back().first;
      if (prev.seg == r.seg && prev.band == r.band && prev.slot + 1 == r.slot &&
          (run_length + 1) * band_slot <= max_io_bytes) {
        runs.back().second = i + 1;
        continue;
      }
    }
    runs.emplace_back(i, i + 1);
  }

  // As in WriteChunks: depth + 1 buffers, declared before the queue so they outlive it.
  const size_t depth = options_.io_queue_depth;
  std::vector<io::AlignedBuffer> buffers;
  std::vector<size_t> free_buffers;
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<io::IoQueue> queue,
                       fs_->NewIoQueue(static_cast<uint32_t>(depth)));
  struct DrainOnExit {
    io::IoQueue* q;
    ~DrainOnExit() { q->Drain().IgnoreError(); }  // the error was already returned
  } drain_on_exit{queue.get()};
  for (const auto& run : runs) {
    // Named copies, not a structured binding: the lambda below captures them, and clang 14
    // (tools/thread_safety.sh) rejects the capture of a binding that C++20 allows (P1091/P1381).
    const size_t begin = run.first;
    const size_t end = run.second;
    const BandRead& first = reads[begin];
    const uint64_t band_slot = first.seg->band_slot_bytes(first.band);
    const size_t io_bytes = (end - begin) * band_slot;
    if (free_buffers.empty() && buffers.size() > depth) CKV_RETURN_IF_ERROR(queue->Drain());
    size_t bi;
    if (!free_buffers.empty()) {
      bi = free_buffers.back();
      free_buffers.pop_back();
    } else {
      bi = buffers.size();
      buffers.emplace_back();
    }
    if (buffers[bi].size() < io_bytes) {
      CKV_ASSIGN_OR_RETURN(buffers[bi],
                           io::AlignedBuffer::Allocate(io_bytes, first.seg->file()->alignment()));
    }
    io::IoOp op;
    op.kind = io::IoOp::Kind::kRead;
    op.file = first.seg->file();
    op.offset = first.seg->BandOffset(first.band, first.slot);
    op.buffer = buffers[bi].data();
    op.length = io_bytes;
    CKV_RETURN_IF_ERROR(queue->Submit(op, [&, bi, begin, end, band_slot](const absl::Status& st) {
      // Each read completes once, so its buffer comes back once.
      CKV_DCHECK(std::find(free_buffers.begin(), free_buffers.end(), bi) == free_buffers.end());
      free_buffers.push_back(bi);
      bytes_read_.fetch_add((end - begin) * band_slot, std::memory_order_relaxed);
      for (size_t i = begin; i < end; ++i) {
        const BandRead& r = reads[i];
        const std::byte* chunk = buffers[bi].data() + (i - begin) * band_slot;
        const uint32_t first_record = r.seg->first_record_of_band(r.band);
        const uint64_t stride = r.seg->record_stride(r.band);
        for (uint32_t j = 0; j < r.seg->records_in_band(r.band); ++j) {
          const uint32_t record = first_record + j;
          records_read_.fetch_add(1, std::memory_order_relaxed);
          const std::byte* data = chunk + j * stride;
          if (!st.ok()) {
            on_record(r, record, st, /*read_failed=*/true, nullptr);
            continue;
          }
          absl::Status check =
              CheckRecord(*r.seg, r.slot, record, r.checksums[record], *r.key, data);
          on_record(r, record, check, /*read_failed=*/false, check.ok() ? data : nullptr);
        }
      }
    }));
  }
  return queue->Drain();
}

PrefixInfo ChunkStore::MakePrefixInfo(const ChunkKey& id, const PrefixEntry& p) const {
  PrefixInfo info;
  info.id = id;
  info.model_fingerprint = p.fingerprint;
  auto spec = specs_.find(p.fingerprint);
  if (spec != specs_.end()) {
    info.model_id = spec->second.model_id;
    info.tokens = p.chunks * spec->second.chunk_tokens;
  }
  auto last = chunks_.find(id);
  if (last != chunks_.end())
    info.bytes = p.chunks * segments_.at(last->second.segment)->chunk_bytes();
  info.chunks = p.chunks;
  info.created_unix_ms = p.created_unix_ms;
  return info;
}

std::vector<PrefixInfo> ChunkStore::ListPrefixes() {
  absl::MutexLock lock(&mu_);
  std::vector<PrefixInfo> out;
  out.reserve(prefixes_.size());
  for (const auto& [id, p] : prefixes_) out.push_back(MakePrefixInfo(id, p));
  std::sort(out.begin(), out.end(), [](const PrefixInfo& a, const PrefixInfo& b) {
    if (a.created_unix_ms != b.created_unix_ms) return a.created_unix_ms > b.created_unix_ms;
    return a.id < b.id;
  });
  return out;
}

absl::StatusOr<std::vector<ChunkKey>> ChunkStore::PrefixChunks(const ChunkKey& prefix_id,
                                                               ModelSpec* spec) {
  CKV_ASSIGN_OR_RETURN(PrefixDescription d, DescribePrefix(prefix_id));
  std::vector<ChunkKey> keys;
  keys.reserve(d.chunks.size());
  for (const ChunkPlacement& c : d.chunks) keys.push_back(c.key);
  if (spec != nullptr) *spec = std::move(d.spec);
  return keys;
}

absl::StatusOr<PrefixDescription> ChunkStore::DescribePrefix(const ChunkKey& prefix_id) {
  absl::MutexLock lock(&mu_);
  auto p = prefixes_.find(prefix_id);
  if (p == prefixes_.end()) {
    return absl::NotFoundError(absl::StrCat("no stored prefix ", prefix_id.ToHex()));
  }
  PrefixDescription d;
  ChunkKey key = prefix_id;
  while (!key.IsZero()) {
    auto it = chunks_.find(key);
    if (it == chunks_.end()) {
      return absl::DataLossError(
          absl::StrCat("prefix ", prefix_id.ToHex(), " is missing chunk ", key.ToHex()));
    }
    const ChunkEntry& e = it->second;
    const Segment& seg = *segments_.at(e.segment);
    d.chunks.push_back(ChunkPlacement{key, e.segment, e.slot, seg.RecordOffset(e.slot, 0),
                                      seg.chunk_bytes(), e.importance, e.loads});
    key = ParentKeyLocked(key, e);
  }
  std::reverse(d.chunks.begin(), d.chunks.end());
  auto s = specs_.find(p->second.fingerprint);
  if (s == specs_.end()) {
    return absl::DataLossError(
        absl::StrCat("prefix ", prefix_id.ToHex(), " names an unknown model spec"));
  }
  d.spec = s->second;
  return d;
}

absl::StatusOr<ChunkStore::RecordLocation> ChunkStore::LocateRecord(const ChunkKey& key,
                                                                    uint32_t record) {
  absl::MutexLock lock(&mu_);
  auto it = chunks_.find(key);
  if (it == chunks_.end()) {
    return absl::NotFoundError(absl::StrCat("chunk ", key.ToHex(), " is not stored"));
  }
  const Segment& seg = *segments_.at(it->second.segment);
  if (record >= seg.records()) {
    return absl::InvalidArgumentError(absl::StrCat("record ", record, " out of range: chunk ",
                                                   key.ToHex(), " has ", seg.records()));
  }
  return RecordLocation{SegmentPath(seg.id()), seg.RecordOffset(it->second.slot, record),
                        seg.record_bytes(record)};
}

StoreStats ChunkStore::Stats() {
  absl::MutexLock lock(&mu_);
  StoreStats s;
  s.puts = counters_.puts;
  s.chunks_written = counters_.chunks_written;
  s.chunks_deduplicated = counters_.chunks_deduplicated;
  s.bytes_written = counters_.bytes_written;
  s.chunks_evicted = counters_.chunks_evicted;
  s.bytes_evicted = counters_.bytes_evicted;
  s.chunks_deleted = counters_.chunks_deleted;
  s.records_read = records_read_.load(std::memory_order_relaxed);
  s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
  s.checksum_failures = checksum_failures_.load(std::memory_order_relaxed);
  s.chunks = chunks_.size();
  s.prefixes = prefixes_.size();
  s.segments = segments_.size();
  s.index_memory_bytes = chunks_.MemoryBytes() + leaves_.capacity() * (sizeof(ChunkKey) + 1) +
                         fingerprints_.capacity() * sizeof(ChunkKey) +
                         fingerprint_ordinals_.capacity() * (sizeof(ChunkKey) + 3) +
                         put_pins_.capacity() * (sizeof(ChunkKey) + 5) +
                         lost_parents_.capacity() * (2 * sizeof(ChunkKey) + 1);
  s.disk_bytes_used = used_bytes_;
  s.max_disk_bytes = max_disk_bytes_;
  s.orphan_bytes_reclaimed = orphan_bytes_reclaimed_;
  s.index_from_snapshot = index_from_snapshot_;
  s.reclaim_rounds = reclaim_rounds_;
  s.reclaim_chunks = reclaim_chunks_;
  s.reclaim_bytes = reclaim_bytes_;
  s.free_kept_bytes = unpunched_bytes_;
  s.inline_evictions = inline_evictions_;
  s.no_space_puts = no_space_puts_;
  s.no_space_recovered = no_space_recovered_;
  s.no_space_evictions = no_space_evictions_;
  s.reclaim_margin_bytes = ReclaimMarginLocked();
  const LatencyWindow::Summary put = put_latency_.Summarize();
  s.put_latency_p50_us = put.p50_us;
  s.put_latency_p99_us = put.p99_us;
  s.put_latency_max_us = put.max_us;
  s.put_latency_window = put.window;
  s.put_staging_waits = staging_->waits();
  s.put_direct_bytes = put_direct_bytes_.load(std::memory_order_relaxed);
  return s;
}

absl::StatusOr<VerifyReport> ChunkStore::Verify(const ProgressFn& progress) {
  return StoreChecker(*this).Verify(progress, nullptr, nullptr);
}

absl::StatusOr<VerifyReport> ChunkStore::Verify(const ProgressFn& progress,
                                                absl::flat_hash_set<ChunkKey>* failed) {
  return StoreChecker(*this).Verify(progress, failed, nullptr);
}

absl::StatusOr<RepairReport> ChunkStore::Repair(const ProgressFn& progress) {
  return StoreChecker(*this).Repair(progress);
}

absl::StatusOr<GcReport> ChunkStore::Gc() { return StoreChecker(*this).Gc(); }

}  // namespace ckv::storage
