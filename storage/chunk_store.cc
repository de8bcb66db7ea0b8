#include "storage/chunk_store.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "ckv/status.h"
#include "storage/record_checksum.h"

namespace ckv::storage {
namespace {

constexpr char kCatalogDir[] = "catalog";
constexpr char kSegmentsDir[] = "segments";

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

std::string ShortKey(const ChunkKey& k) { return k.ToHex().substr(0, 16); }

FileSystem* ChooseFileSystem(const EngineOptions& options) {
  if (options.file_system != nullptr) return options.file_system;
  switch (options.io_backend) {
    case IoBackend::kUring:
      return PosixFileSystem(QueueBackend::kUring);
    case IoBackend::kThreads:
      return PosixFileSystem(QueueBackend::kThreads);
    case IoBackend::kAuto:
      break;
  }
  return PosixFileSystem(QueueBackend::kAuto);
}

// Whether a punch gave its blocks back (a file system without hole punching never had them
// allocated apart: Unimplemented counts as given back).
bool PunchGaveBack(const absl::Status& s) { return s.ok() || absl::IsUnimplemented(s); }

}  // namespace

ChunkStore::ChunkStore(const EngineOptions& options, std::string path, FileSystem* fs,
                       Logger* logger)
    : options_(options), path_(std::move(path)), fs_(fs), logger_(logger) {}

ChunkStore::~ChunkStore() = default;

std::string ChunkStore::SegmentPath(uint32_t id) const {
  return absl::StrCat(path_, "/", kSegmentsDir, "/", Segment::FileName(id));
}

uint64_t ChunkStore::ChunkBytesOf(const ModelSpec& spec,
                                  const std::vector<uint32_t>& aux_bytes) const {
  return Segment::ChunkBytes(Segment::GeometryFor(spec, RecordLayout::kLayerMajor, 1,
                                                  options_.segment_bytes, 0, aux_bytes));
}

absl::StatusOr<std::unique_ptr<ChunkStore>> ChunkStore::Open(const EngineOptions& options,
                                                             const std::string& path_in) {
  if (path_in.empty()) return absl::InvalidArgumentError("store path is empty");
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (options.io_queue_depth < 1 || options.io_queue_depth > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("EngineOptions.io_queue_depth = ", options.io_queue_depth,
                     ": must be in 1..1024"));
  }
  if (options.max_write_bytes < kDirectIoAlignment || options.max_write_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("EngineOptions.max_write_bytes = ", options.max_write_bytes,
                     ": must be a positive multiple of 4096"));
  }
  if (options.period_layers < 1 || options.period_layers > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EngineOptions.period_layers = ", options.period_layers, ": must be in 1..1024"));
  }
  if (options.io_backend == IoBackend::kUring && options.file_system == nullptr &&
      !UringAvailable()) {
    return absl::UnavailableError(
        "EngineOptions.io_backend = io_uring, but io_uring cannot be set up in this process "
        "(kernel.io_uring_disabled, a seccomp profile or an old kernel); use kAuto or kThreads");
  }
  FileSystem* fs = ChooseFileSystem(options);
  Logger* logger = options.logger != nullptr ? options.logger : StderrLogger();

  // The store directory: created when allowed, but never its parents, so that a mistyped path
  // is an error rather than a new tree.
  std::string created_parent;  // set when this Open made the store directory
  if (!fs->Exists(path)) {
    if (!options.create_if_missing) {
      return absl::NotFoundError(absl::StrCat("no ckv store at ", path));
    }
    const size_t slash = path.find_last_of('/');
    const std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    if (!fs->Exists(parent)) {
      return absl::NotFoundError(absl::StrCat("cannot create store ", path, ": directory ",
                                              parent, " does not exist"));
    }
    CKV_RETURN_IF_ERROR(fs->CreateDir(path));
    created_parent = parent;
  }
  CKV_RETURN_IF_ERROR(fs->CreateDir(absl::StrCat(path, "/", kSegmentsDir)));

  auto store = std::unique_ptr<ChunkStore>(new ChunkStore(options, path, fs, logger));
  Catalog::Contents contents;
  CKV_ASSIGN_OR_RETURN(store->catalog_,
                       Catalog::Open(absl::StrCat(path, "/", kCatalogDir),
                                     options.create_if_missing, options.error_if_exists,
                                     &contents, fs));
  // The parent's entry for a store directory made here must be durable before any Put is
  // acknowledged in it.
  if (!created_parent.empty()) CKV_RETURN_IF_ERROR(fs->SyncDir(created_parent));
  CKV_RETURN_IF_ERROR(store->Load(contents));
  CKV_RETURN_IF_ERROR(store->ReclaimOrphans());

  absl::MutexLock lock(&store->mu_);
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
  if (evicted > 0) {
    store->logger_->Log(LogLevel::kInfo,
                        absl::StrCat("evicted ", evicted, " chunks of ", path,
                                     " to fit max_disk_bytes ", store->max_disk_bytes_));
  }
  return store;
}

absl::Status ChunkStore::Load(const Catalog::Contents& c) {
  absl::MutexLock lock(&mu_);
  max_disk_bytes_ = c.max_disk_bytes;
  layout_ = c.layout;
  counters_ = c.counters;
  for (const ModelSpec& spec : c.specs) specs_.emplace(spec.Fingerprint(), spec);

  for (const auto& [id, geometry] : c.segments) {
    const std::string file_path = SegmentPath(id);
    if (!fs_->Exists(file_path)) {
      return absl::DataLossError(absl::StrCat("segment ", id, " (", file_path,
                                              ") named by the catalog is missing"));
    }
    CKV_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                         fs_->Open(file_path, FileSystem::OpenMode::kReadWrite));
    segments_.emplace(id, std::make_unique<Segment>(id, geometry, std::move(file)));
    next_segment_id_ = std::max(next_segment_id_, id + 1);
  }

  for (const auto& [key, r] : c.chunks) {
    auto seg = segments_.find(r.segment);
    std::string problem;
    if (seg == segments_.end()) {
      problem = absl::StrCat("chunk ", key.ToHex(), " names segment ", r.segment,
                             ", which the catalog does not hold");
    } else if (r.slot >= seg->second->geometry().capacity_slots) {
      problem = absl::StrCat("chunk ", key.ToHex(), " names slot ", r.slot, " of segment ",
                             r.segment, ", which has ", seg->second->geometry().capacity_slots);
    } else if (!(seg->second->geometry().fingerprint == r.fingerprint) ||
               r.checksums.size() != seg->second->records()) {
      problem = absl::StrCat("chunk ", key.ToHex(), " does not match the spec of segment ",
                             r.segment);
    } else if (!seg->second->MarkUsed(r.slot)) {
      problem = absl::StrCat("chunk ", key.ToHex(), " shares slot ", r.slot, " of segment ",
                             r.segment, " with another chunk");
    }
    if (!problem.empty()) {
      // Such a chunk cannot be served safely; keep it out of the index and let Verify say so.
      open_problems_.push_back(problem);
      dropped_chunks_.push_back(key);
      logger_->Log(LogLevel::kError, problem);
      continue;
    }
    put_seq_ = std::max(put_seq_, r.put_seq);
    used_bytes_ += seg->second->chunk_bytes();
    chunks_.emplace(key, EntryFromRecord(r, /*last_use=*/r.put_seq));
  }
  use_clock_ = put_seq_;
  for (auto& [key, e] : chunks_) {
    if (e.parent.IsZero()) continue;
    auto parent = chunks_.find(e.parent);
    if (parent == chunks_.end()) {
      open_problems_.push_back(absl::StrCat("chunk ", key.ToHex(), " at depth ", e.depth,
                                            " has no stored parent ", e.parent.ToHex()));
      continue;
    }
    parent->second.children++;
  }
  for (const auto& [key, p] : c.prefixes) {
    auto chunk = chunks_.find(key);
    if (chunk == chunks_.end()) {
      open_problems_.push_back(
          absl::StrCat("prefix ", key.ToHex(), " ends at a chunk that is not stored"));
      dropped_prefixes_.push_back(key);
      continue;
    }
    chunk->second.prefix_end = true;
    prefixes_.emplace(key, PrefixEntry{p.fingerprint, p.chunks, p.created_unix_ms});
  }
  return absl::OkStatus();
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
    auto file = fs_->Open(file_path, FileSystem::OpenMode::kReadWrite);
    if (file.ok()) {
      auto bytes = (*file)->AllocatedBytes();
      if (bytes.ok()) reclaimed += *bytes;
    }
    CKV_RETURN_IF_ERROR(fs_->DeleteFile(file_path));
    deleted_any = true;
  }
  if (deleted_any) CKV_RETURN_IF_ERROR(fs_->SyncDir(dir));
  // Space inside segments that no committed chunk names: written by a Put that did not commit.
  for (auto& [id, segment] : segments_) {
    CKV_ASSIGN_OR_RETURN(uint64_t freed, PunchFreeRuns(*segment));
    reclaimed += freed;
  }
  orphan_bytes_reclaimed_ = reclaimed;
  if (reclaimed > 0) {
    logger_->Log(LogLevel::kInfo, absl::StrCat("reclaimed ", reclaimed,
                                               " bytes of uncommitted segment data in ", path_));
  }
  return absl::OkStatus();
}

absl::Status ChunkStore::ValidatePut(const ModelSpec& spec, std::span<const int32_t> tokens,
                                     const KvTensors& kv) {
  CKV_RETURN_IF_ERROR(spec.Validate());
  // Validate allows records of up to 2^40 bytes; a segment's geometry keeps sizes in a u32,
  // which would truncate them silently.
  if (spec.RecordBytes() > kMaxRecordBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelSpec ", spec.model_id, ": a record (K and V of ", spec.chunk_tokens,
        " tokens x ", spec.kv_heads, " kv heads x ", spec.head_dim, " head dim) is ",
        spec.RecordBytes(), " bytes, over the limit of ", kMaxRecordBytes));
  }
  if (tokens.size() < spec.chunk_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Put of ", tokens.size(), " tokens: fewer than one chunk of ", spec.chunk_tokens));
  }
  if (kv.tokens != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("KvTensors.tokens = ", kv.tokens,
                                                   " but the prefix has ", tokens.size(),
                                                   " tokens"));
  }
  if (kv.k.size() != spec.layers || kv.v.size() != spec.layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvTensors has ", kv.k.size(), " K and ", kv.v.size(), " V tensors; ", spec.model_id,
        " has ", spec.layers, " layers"));
  }
  const uint64_t want = uint64_t{kv.tokens} * spec.TokenBytesPerLayer();
  for (uint32_t l = 0; l < spec.layers; ++l) {
    for (const auto* side : {&kv.k, &kv.v}) {
      const auto& t = (*side)[l];
      if (t.size() != want || (t.data() == nullptr && want > 0)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s tensor of layer %u has %u bytes; [%u tokens, %u kv heads, %u head dim] of %s is "
            "%u bytes",
            side == &kv.k ? "K" : "V", l, t.size(), kv.tokens, spec.kv_heads, spec.head_dim,
            DTypeName(spec.dtype), want));
      }
    }
  }
  return absl::OkStatus();
}

ChunkStore::ChunkEntry ChunkStore::EntryFromRecord(const ChunkRecord& r, uint64_t last_use) {
  ChunkEntry e;
  e.parent = r.parent;
  e.fingerprint = r.fingerprint;
  e.depth = r.depth;
  e.segment = r.segment;
  e.slot = r.slot;
  e.put_seq = r.put_seq;
  e.last_use = last_use;
  e.created_unix_ms = r.created_unix_ms;
  e.importance = r.importance;
  e.loads = r.loads;
  e.checksums = r.checksums;
  return e;
}

bool ChunkStore::HeldLocked(const ChunkKey& key, const ChunkEntry& e) const {
  return e.put_pins > 0 || inflight_.contains(key) ||
         read_pins_.contains(SlotId{e.segment, e.slot});
}

absl::StatusOr<PutResult> ChunkStore::Put(const ModelSpec& spec, std::span<const int32_t> tokens,
                                          const KvTensors& kv, const AuxRecords* aux) {
  CKV_RETURN_IF_ERROR(ValidatePut(spec, tokens, kv));
  const std::vector<uint32_t> aux_bytes = aux != nullptr ? aux->record_bytes
                                                         : std::vector<uint32_t>{};
  if (aux != nullptr) {
    if (aux_bytes.empty() || aux_bytes.size() > 16 || !aux->fill) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Put with ", aux_bytes.size(), " auxiliary records", aux->fill ? "" : " and no fill",
          ": 1..16 records and a fill function are needed"));
    }
    for (uint32_t b : aux_bytes) {
      if (b == 0 || b > (1u << 30)) {
        return absl::InvalidArgumentError(
            absl::StrCat("auxiliary record of ", b, " bytes: must be 1 B..1 GiB"));
      }
    }
  }
  const ChunkKey fp = spec.Fingerprint();
  const uint32_t c = spec.chunk_tokens;
  const std::vector<ChunkKey> keys = ChainChunkKeys(fp, c, tokens);
  const size_t n = keys.size();
  const uint64_t chunk_bytes = ChunkBytesOf(spec, aux_bytes);

  PutResult result;
  result.chunks = n;
  result.tail_tokens = tokens.size() - n * c;
  result.prefix_id = keys.back();

  std::vector<PlannedRun> plan;
  size_t m = 0;  // chunks stored already
  bool new_spec = false;
  {
    absl::MutexLock lock(&mu_);
    // Wait for a concurrent Put of the same chunks to finish, then take what it stored.
    for (;;) {
      bool conflict = false;
      for (const ChunkKey& k : keys) {
        if (inflight_.contains(k)) {
          conflict = true;
          break;
        }
      }
      if (!conflict) break;
      inflight_cv_.Wait(&mu_);
    }
    while (m < n && chunks_.contains(keys[m])) ++m;
    for (size_t i = m; i < n; ++i) {
      if (chunks_.contains(keys[i])) {
        // Stored chunks always include their parents; only a catalog damaged before this open
        // (a chunk Load had to drop) breaks that. Writing here would shadow the stored record.
        return absl::DataLossError(absl::StrCat(
            "chunk ", keys[i].ToHex(), " (", i, " of this prefix) is stored but chunk ",
            keys[m].ToHex(), " before it is not; run kvctl verify"));
      }
    }
    new_spec = !specs_.contains(fp);
    const uint64_t tick = ++use_clock_;
    for (size_t i = 0; i < m; ++i) chunks_[keys[i]].last_use = tick;
    result.chunks_existing = m;

    if (m == n) {
      // Everything is stored; record the prefix end if this is a new one.
      ChunkEntry& last = chunks_[keys[n - 1]];
      if (!last.prefix_end) {
        Catalog::Batch batch = catalog_->NewBatch();
        PrefixEntry p{fp, n, NowMs()};
        batch.PutPrefix(keys[n - 1], PrefixRecord{p.fingerprint, p.chunks, p.created_unix_ms});
        StoredCounters next = counters_;
        next.puts++;
        next.chunks_deduplicated += n;
        batch.PutCounters(next);
        CKV_RETURN_IF_ERROR(catalog_->Commit(batch));
        counters_ = next;
        last.prefix_end = true;
        prefixes_[keys[n - 1]] = p;
      } else {
        counters_.puts++;
        counters_.chunks_deduplicated += n;
      }
      return result;
    }

    const uint64_t need = (n - m) * chunk_bytes;
    if (max_disk_bytes_ > 0 && need > DataCapLocked()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "Put of ", n - m, " new chunks (", need, " bytes) of ", spec.model_id,
          " exceeds the store's max_disk_bytes of ", max_disk_bytes_, " (", DataCapLocked(),
          " bytes of data after the file system's metadata allowance)"));
    }
    for (size_t i = m; i < n; ++i) inflight_.insert(keys[i]);
    if (m > 0) chunks_[keys[m - 1]].put_pins++;
    auto undo = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (size_t i = m; i < n; ++i) inflight_.erase(keys[i]);
      if (m > 0) chunks_[keys[m - 1]].put_pins--;
      inflight_cv_.SignalAll();
    };
    absl::Status s = MakeRoomLocked(need, &result.chunks_evicted);
    const size_t segments_before = segments_.size();
    if (s.ok()) s = AllocateLocked(spec, aux_bytes, n - m, &plan);
    if (s.ok() && max_disk_bytes_ > 0 && segments_.size() > segments_before + 1 &&
        used_bytes_ + need > DataCapLocked()) {
      // The room was made for one new segment's metadata and the Put needed more segments: make
      // room again now that they exist (the slots are taken already and do not count yet).
      s = MakeRoomLocked(need, &result.chunks_evicted);
      if (!s.ok()) {
        ReleasePlanLocked(plan, /*counted=*/false);
        plan.clear();
      }
    }
    if (!s.ok()) {
      undo();
      return s;
    }
    // Reused slots whose punch had failed are counted already.
    uint64_t reused = 0;
    for (const PlannedRun& r : plan) {
      for (uint32_t i = 0; i < r.run.count; ++i) {
        reused += unpunched_.erase(SlotId{r.segment->id(), r.run.start + i});
      }
    }
    used_bytes_ += need - reused * chunk_bytes;
  }

  // Compute the auxiliary records on a second thread while the layers' records are written.
  // The future's destructor waits, so nothing it uses goes away under it on any return path.
  std::vector<std::vector<std::byte>> aux_data(aux_bytes.size());
  for (size_t a = 0; a < aux_bytes.size(); ++a) aux_data[a].resize((n - m) * aux_bytes[a]);
  std::future<void> aux_future;
  if (aux != nullptr) {
    aux_future = std::async(std::launch::async, [&] {
      std::vector<std::span<std::byte>> out(aux_bytes.size());
      for (size_t i = 0; i < n - m; ++i) {
        for (size_t a = 0; a < aux_bytes.size(); ++a) {
          out[a] = std::span<std::byte>(aux_data[a].data() + i * aux_bytes[a], aux_bytes[a]);
        }
        aux->fill(m + i, out);
      }
    });
  }
  auto aux_ready = [&] {
    if (aux_future.valid()) aux_future.wait();
  };

  // Write the records, then make them durable.
  std::vector<std::vector<uint64_t>> checksums(
      n - m, std::vector<uint64_t>(spec.layers + aux_bytes.size()));
  uint64_t bytes_written = 0;
  absl::Status s = WriteChunks(spec, kv, m, plan, aux_data, aux_ready, &checksums, &bytes_written);
  if (s.ok()) {
    std::vector<Segment*> synced;
    for (const PlannedRun& r : plan) {
      if (std::find(synced.begin(), synced.end(), r.segment) != synced.end()) continue;
      s = r.segment->file()->Sync();
      if (!s.ok()) break;
      synced.push_back(r.segment);
    }
  }
  if (s.ok()) s = fs_->CrashSeam(kSeamPutDataSynced);

  absl::MutexLock lock(&mu_);
  const int64_t now = NowMs();
  const uint64_t seq = ++put_seq_;
  StoredCounters next = counters_;
  std::vector<std::pair<size_t, ChunkRecord>> records;  // (index in keys, what the batch names)
  if (s.ok()) {
    Catalog::Batch batch = catalog_->NewBatch();
    if (new_spec && !specs_.contains(fp)) batch.PutSpec(spec);
    records.reserve(n - m);
    for (const PlannedRun& r : plan) {
      for (uint32_t i = 0; i < r.run.count; ++i) {
        const size_t idx = m + r.first + i;
        ChunkRecord& rec = records.emplace_back(idx, ChunkRecord{}).second;
        rec.parent = idx == 0 ? ChunkKey{} : keys[idx - 1];
        rec.fingerprint = fp;
        rec.depth = static_cast<uint32_t>(idx);
        rec.segment = r.segment->id();
        rec.slot = r.run.start + i;
        rec.put_seq = seq;
        rec.created_unix_ms = now;
        rec.tokens.assign(tokens.begin() + idx * c, tokens.begin() + (idx + 1) * c);
        rec.checksums = std::move(checksums[r.first + i]);
        batch.PutChunk(keys[idx], rec);
      }
    }
    batch.PutPrefix(keys[n - 1], PrefixRecord{fp, n, now});
    next.puts++;
    next.chunks_written += n - m;
    next.chunks_deduplicated += m;
    next.bytes_written += bytes_written;
    batch.PutCounters(next);
    s = catalog_->Commit(batch);
  }
  for (size_t i = m; i < n; ++i) inflight_.erase(keys[i]);
  if (m > 0) chunks_[keys[m - 1]].put_pins--;
  inflight_cv_.SignalAll();
  if (!s.ok()) {
    // Nothing names the slots: free them and give their blocks back.
    ReleasePlanLocked(plan, /*counted=*/true);
    return s;
  }
  counters_ = next;
  if (new_spec) specs_.emplace(fp, spec);
  const uint64_t tick = ++use_clock_;
  for (const auto& [idx, rec] : records) chunks_.emplace(keys[idx], EntryFromRecord(rec, tick));
  for (size_t idx = std::max<size_t>(m, 1); idx < n; ++idx) chunks_[keys[idx - 1]].children++;
  chunks_[keys[n - 1]].prefix_end = true;
  prefixes_[keys[n - 1]] = PrefixEntry{fp, n, now};
  result.chunks_written = n - m;
  result.bytes_written = bytes_written;
  CKV_RETURN_IF_ERROR(fs_->CrashSeam(kSeamPutCommitted));
  return result;
}

void ChunkStore::ReleasePlanLocked(const std::vector<PlannedRun>& plan, bool counted) {
  for (const PlannedRun& r : plan) {
    absl::Status s = r.segment->PunchSlots(r.run);
    const bool punched = PunchGaveBack(s);
    if (!punched) {
      // The slots are free either way; their blocks stay counted until a retry (the next Put
      // that needs room, Gc) or the next open gives them back.
      last_punch_error_ = std::string(s.message());
      logger_->Log(LogLevel::kWarning, absl::StrCat("could not free blocks of segment ",
                                                    r.segment->id(), ": ", s.message()));
    }
    r.segment->Free(r.run);
    for (uint32_t i = 0; i < r.run.count; ++i) {
      const SlotId slot{r.segment->id(), r.run.start + i};
      if (!counted) {
        // Not reserved by this Put; a reused unpunched slot is counted as such.
        if (punched && unpunched_.erase(slot) > 0) used_bytes_ -= r.segment->chunk_bytes();
      } else if (punched) {
        used_bytes_ -= r.segment->chunk_bytes();
      } else {
        unpunched_.insert(slot);
      }
    }
  }
}

absl::StatusOr<uint64_t> ChunkStore::RetryPunchesLocked() {
  uint64_t given_back = 0;
  absl::Status first_error;
  for (auto it = unpunched_.begin(); it != unpunched_.end();) {
    auto seg = segments_.find(it->first);
    if (seg == segments_.end()) {  // cannot happen: a segment with unpunched slots is not empty
      unpunched_.erase(it++);
      continue;
    }
    absl::Status s = seg->second->PunchSlots(SlotRun{it->second, 1});
    if (!PunchGaveBack(s)) {
      if (first_error.ok()) first_error = s;
      ++it;
      continue;
    }
    used_bytes_ -= seg->second->chunk_bytes();
    given_back += seg->second->chunk_bytes();
    unpunched_.erase(it++);
  }
  if (!first_error.ok()) return first_error;
  return given_back;
}

absl::Status ChunkStore::AllocateLocked(const ModelSpec& spec,
                                        const std::vector<uint32_t>& aux_bytes, size_t count,
                                        std::vector<PlannedRun>* plan) {
  const ChunkKey fp = spec.Fingerprint();
  size_t done = 0;
  // Segments of this spec in the current layout, oldest first, so space is reused before growth.
  std::vector<Segment*> candidates;
  for (auto& [id, seg] : segments_) {
    const SegmentRecord& g = seg->geometry();
    if (g.fingerprint == fp && g.layout == layout_ && g.aux_record_bytes == aux_bytes &&
        seg->free_slots() > 0) {
      candidates.push_back(seg.get());
    }
  }
  std::sort(candidates.begin(), candidates.end(),
            [](Segment* a, Segment* b) { return a->id() < b->id(); });
  size_t next_candidate = 0;
  while (done < count) {
    Segment* seg = nullptr;
    if (next_candidate < candidates.size()) {
      seg = candidates[next_candidate];
    } else {
      auto created = NewSegmentLocked(spec, aux_bytes);
      if (!created.ok()) {
        ReleasePlanLocked(*plan, /*counted=*/false);
        plan->clear();
        return created.status();
      }
      seg = *created;
      candidates.push_back(seg);
    }
    SlotRun run = seg->Allocate(static_cast<uint32_t>(std::min<size_t>(count - done, UINT32_MAX)));
    if (run.count == 0) {
      ++next_candidate;
      continue;
    }
    plan->push_back(PlannedRun{seg, run, done});
    done += run.count;
  }
  return absl::OkStatus();
}

absl::StatusOr<Segment*> ChunkStore::NewSegmentLocked(const ModelSpec& spec,
                                                      const std::vector<uint32_t>& aux_bytes) {
  const uint32_t id = next_segment_id_++;
  const SegmentRecord g = Segment::GeometryFor(spec, layout_, options_.period_layers,
                                               options_.segment_bytes, NowMs(), aux_bytes);
  const std::string file_path = SegmentPath(id);
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                       fs_->Open(file_path, FileSystem::OpenMode::kCreateReadWrite));
  CKV_RETURN_IF_ERROR(fs_->SyncDir(absl::StrCat(path_, "/", kSegmentsDir)));
  // The segment is committed empty before any chunk is written into it, so a crash can leave an
  // empty segment but never a chunk in an unnamed file.
  Catalog::Batch batch = catalog_->NewBatch();
  batch.PutSegment(id, g);
  CKV_RETURN_IF_ERROR(catalog_->Commit(batch));
  auto seg = std::make_unique<Segment>(id, g, std::move(file));
  Segment* raw = seg.get();
  segments_.emplace(id, std::move(seg));
  return raw;
}

absl::Status ChunkStore::WriteChunks(const ModelSpec& spec, const KvTensors& kv,
                                     size_t first_chunk, const std::vector<PlannedRun>& plan,
                                     const std::vector<std::vector<std::byte>>& aux_data,
                                     const std::function<void()>& aux_ready,
                                     std::vector<std::vector<uint64_t>>* checksums,
                                     uint64_t* bytes_written) {
  const uint32_t c = spec.chunk_tokens;
  const size_t token_bytes = spec.TokenBytesPerLayer();
  const size_t half = size_t{c} * token_bytes;  // K (or V) bytes of one chunk at one layer
  const size_t depth = options_.io_queue_depth;
  // Staging buffers, allocated as the pipeline needs them, at most depth + 1: a Submit into a
  // full queue first reaps a completion (whose callback returns its buffer), so with one buffer
  // more than the queue holds, one is always free to fill while `depth` writes are in flight.
  // Declared before the queue so that they outlive it: nothing may free a buffer the kernel may
  // still be reading.
  std::vector<AlignedBuffer> buffers;
  std::vector<size_t> free_buffers;
  absl::Status first_error;
  uint64_t written = 0;
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> queue,
                       fs_->NewIoQueue(static_cast<uint32_t>(depth)));
  // On an early return, wait for what is in flight before the buffers go.
  struct DrainOnExit {
    IoQueue* q;
    ~DrainOnExit() { q->Drain().IgnoreError(); }  // the error was already reported or returned
  } drain_on_exit{queue.get()};

  // Reserve the blocks first: one fallocate per band run instead of block-by-block allocation
  // under each direct write, and a full disk is found before any data moves.
  for (const PlannedRun& r : plan) {
    for (uint32_t band = 0; band < r.segment->bands(); ++band) {
      absl::Status s = r.segment->file()->Allocate(r.segment->BandOffset(band, r.run.start),
                                                   r.run.count * r.segment->band_slot_bytes(band));
      if (absl::IsUnimplemented(s)) break;  // the writes allocate instead
      CKV_RETURN_IF_ERROR(s);
    }
  }
  bool aux_waited = false;
  for (const PlannedRun& r : plan) {
    Segment* seg = r.segment;
    for (uint32_t band = 0; band < seg->bands(); ++band) {
      const bool aux_band = band >= seg->layer_bands();
      if (aux_band && !aux_waited) {
        aux_ready();
        aux_waited = true;
      }
      const uint64_t slot_stride = seg->record_stride(band);
      const uint64_t band_slot = seg->band_slot_bytes(band);
      const uint32_t per_io = static_cast<uint32_t>(
          std::max<uint64_t>(1, options_.max_write_bytes / band_slot));
      const uint32_t first_record = seg->first_record_of_band(band);
      const uint32_t records = seg->records_in_band(band);
      for (uint32_t s0 = 0; s0 < r.run.count; s0 += per_io) {
        const uint32_t count = std::min(per_io, r.run.count - s0);
        const size_t io_bytes = count * band_slot;
        if (free_buffers.empty() && buffers.size() > depth) {
          // Not reached while the queue keeps its promise (below); waiting for everything is
          // the safe answer if it does not.
          CKV_RETURN_IF_ERROR(queue->Drain());
        }
        size_t bi;
        if (!free_buffers.empty()) {
          bi = free_buffers.back();
          free_buffers.pop_back();
        } else {
          bi = buffers.size();
          buffers.emplace_back(io_bytes, seg->file()->alignment());
        }
        if (buffers[bi].size() < io_bytes) {
          buffers[bi] = AlignedBuffer(io_bytes, seg->file()->alignment());
        }
        std::byte* buf = buffers[bi].data();
        for (uint32_t i = 0; i < count; ++i) {
          const size_t new_index = r.first + s0 + i;
          const size_t token_offset = (first_chunk + new_index) * c;
          for (uint32_t j = 0; j < records; ++j) {
            const uint32_t record = first_record + j;
            const size_t bytes = seg->record_bytes(record);
            std::byte* dst = buf + i * band_slot + j * slot_stride;
            if (aux_band) {
              const size_t a = record - spec.layers;
              std::memcpy(dst, aux_data[a].data() + new_index * bytes, bytes);
            } else {
              std::memcpy(dst, kv.k[record].data() + token_offset * token_bytes, half);
              std::memcpy(dst + half, kv.v[record].data() + token_offset * token_bytes, half);
            }
            if (slot_stride > bytes) std::memset(dst + bytes, 0, slot_stride - bytes);
            (*checksums)[new_index][record] = RecordChecksum(dst, bytes);
          }
        }
        IoOp op;
        op.kind = IoOp::Kind::kWrite;
        op.file = seg->file();
        op.offset = seg->BandOffset(band, r.run.start + s0);
        op.buffer = buf;
        op.length = io_bytes;
        CKV_RETURN_IF_ERROR(queue->Submit(op, [&, bi, io_bytes](const absl::Status& st) {
          if (!st.ok() && first_error.ok()) first_error = st;
          if (st.ok()) written += io_bytes;
          free_buffers.push_back(bi);
        }));
        if (!first_error.ok()) break;
      }
      if (!first_error.ok()) break;
    }
    if (!first_error.ok()) break;
  }
  CKV_RETURN_IF_ERROR(queue->Drain());
  CKV_RETURN_IF_ERROR(first_error);
  *bytes_written = written;
  return absl::OkStatus();
}

uint64_t ChunkStore::DataCapLocked() const {
  // The cap bounds the blocks the segment files occupy. Besides the data, a sparse file's extent
  // tree takes blocks (ext4: one 4 KiB block per ~340 extents, and a punched slot can split an
  // extent): reserve one block per segment (one more for a segment a Put may create) and 1/256
  // of the data, several times the worst case of one extent per record.
  const uint64_t per_segment = (segments_.size() + 1) * kDirectIoAlignment;
  if (max_disk_bytes_ <= per_segment) return 0;
  return (max_disk_bytes_ - per_segment) / 257 * 256;
}

absl::Status ChunkStore::MakeRoomLocked(uint64_t need, uint64_t* evicted) {
  if (max_disk_bytes_ == 0) return absl::OkStatus();
  const uint64_t data_cap = DataCapLocked();
  if (used_bytes_ + need <= data_cap) return absl::OkStatus();
  // Blocks an earlier punch could not give back first: they hold space no chunk uses.
  if (!unpunched_.empty()) {
    // A punch that fails again leaves its slot counted; eviction below makes up for it.
    RetryPunchesLocked().IgnoreError();
    if (used_bytes_ + need <= data_cap) return absl::OkStatus();
  }
  const uint64_t target = data_cap - std::min(need, data_cap);
  // Plan: pop the lowest leaf, let its parent compete once it becomes a leaf, until enough
  // bytes would be free. Nothing changes until the plan is known to succeed.
  struct HeapItem {
    EvictionCandidate c;
    bool operator<(const HeapItem& o) const {  // priority_queue pops the "largest"
      return EvictionPolicy::EvictBefore(o.c, c);
    }
  };
  std::priority_queue<HeapItem> heap;
  auto candidate = [&](const ChunkKey& key, const ChunkEntry& e) {
    return HeapItem{EvictionCandidate{EvictionPolicy::Score(e.importance, e.loads), e.last_use, key}};
  };
  for (const auto& [key, e] : chunks_) {
    if (e.children == 0 && !HeldLocked(key, e)) heap.push(candidate(key, e));
  }
  absl::flat_hash_map<ChunkKey, uint32_t> children_left;
  std::vector<ChunkKey> victims;
  uint64_t freed = 0;
  while (used_bytes_ - freed > target && !heap.empty()) {
    const ChunkKey key = heap.top().c.key;
    heap.pop();
    const ChunkEntry& e = chunks_.at(key);
    victims.push_back(key);
    freed += segments_.at(e.segment)->chunk_bytes();
    if (e.parent.IsZero()) continue;
    auto parent = chunks_.find(e.parent);
    if (parent == chunks_.end()) continue;
    auto [it, inserted] = children_left.try_emplace(e.parent, parent->second.children);
    if (--it->second == 0) {
      if (!HeldLocked(e.parent, parent->second)) heap.push(candidate(e.parent, parent->second));
    }
  }
  if (used_bytes_ - freed > target) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot make room for ", need, " bytes under max_disk_bytes ", max_disk_bytes_, ": ",
        used_bytes_, " bytes in use, of which ", freed,
        " can be evicted (the rest is held by readers or Puts in flight)"));
  }
  Catalog::Batch batch = catalog_->NewBatch();
  CKV_RETURN_IF_ERROR(RemoveChunksLocked(victims, batch, Removal::kEvict));
  *evicted += victims.size();
  if (used_bytes_ + need > data_cap) {
    // Punches of evicted chunks failed: their blocks are still on disk, so the Put would pass
    // the cap. The chunks are gone (committed); the Put is refused.
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot make room for ", need, " bytes under max_disk_bytes ", max_disk_bytes_,
        ": evicted ", victims.size(), " chunks but could not give back the blocks of ",
        unpunched_.size(), " slots (", last_punch_error_, ")"));
  }
  return absl::OkStatus();
}

absl::Status ChunkStore::RemoveChunksLocked(const std::vector<ChunkKey>& victims,
                                            Catalog::Batch& batch, Removal why) {
  const bool evicted = why == Removal::kEvict;
  const bool carry_ends = why != Removal::kDelete;
  if (victims.empty()) {
    if (!batch.empty()) return catalog_->Commit(batch);
    return absl::OkStatus();
  }
  absl::flat_hash_set<ChunkKey> gone(victims.begin(), victims.end());
  absl::flat_hash_map<ChunkKey, uint32_t> children_left;
  // Chunks that end an evicted prefix: a victim that ended one, or whose removed descendants did,
  // hands the end on to its parent (evicting C then B of A<-B<-C leaves A as the end).
  absl::flat_hash_set<ChunkKey> carries_end;
  absl::flat_hash_set<ChunkKey> parent_gets_end;
  std::vector<std::pair<ChunkKey, PrefixEntry>> new_prefix_ends;
  StoredCounters next = counters_;
  const int64_t now = NowMs();
  for (const ChunkKey& key : victims) {
    const ChunkEntry& e = chunks_.at(key);
    batch.DeleteChunk(key);
    if (e.prefix_end) batch.DeletePrefix(key);
    const uint64_t bytes = segments_.at(e.segment)->chunk_bytes();
    if (evicted) {
      next.chunks_evicted++;
      next.bytes_evicted += bytes;
    } else {
      next.chunks_deleted++;
    }
    // An evicted (or repaired) prefix end leaves its parent as the end of the (shorter) prefix
    // when nothing else extends the parent. A deleted one does not: the caller asked for it.
    const bool ends = carry_ends && (e.prefix_end || carries_end.contains(key));
    if (e.parent.IsZero()) continue;
    if (gone.contains(e.parent)) {
      if (ends) carries_end.insert(e.parent);
      continue;
    }
    auto parent = chunks_.find(e.parent);
    if (parent == chunks_.end()) continue;
    auto [it, inserted] = children_left.try_emplace(e.parent, parent->second.children);
    --it->second;
    if (ends) parent_gets_end.insert(e.parent);
    if (it->second == 0 && parent_gets_end.contains(e.parent) && !parent->second.prefix_end) {
      PrefixEntry p{e.fingerprint, uint64_t{parent->second.depth} + 1, now};
      batch.PutPrefix(e.parent, PrefixRecord{p.fingerprint, p.chunks, p.created_unix_ms});
      new_prefix_ends.emplace_back(e.parent, p);
    }
  }
  batch.PutCounters(next);
  if (removal_observer_) removal_observer_(RemovalEvent{RemovalEvent::Phase::kCommitting, victims});
  CKV_RETURN_IF_ERROR(catalog_->Commit(batch));
  if (removal_observer_) removal_observer_(RemovalEvent{RemovalEvent::Phase::kCommitted, victims});
  counters_ = next;
  // Committed: apply to memory and give the space back.
  for (const ChunkKey& key : victims) {
    auto it = chunks_.find(key);
    const ChunkEntry e = std::move(it->second);
    chunks_.erase(it);
    if (e.prefix_end) prefixes_.erase(key);
    auto parent = chunks_.find(e.parent);
    if (parent != chunks_.end()) parent->second.children--;
    const SlotId slot{e.segment, e.slot};
    if (read_pins_.contains(slot)) {
      deferred_free_.insert(slot);
    } else {
      FreeSlotLocked(e.segment, e.slot);
    }
  }
  if (removal_listener_) {
    for (const ChunkKey& key : victims) removal_listener_(key);
  }
  for (auto& [key, p] : new_prefix_ends) {
    auto it = chunks_.find(key);
    if (it == chunks_.end()) continue;
    it->second.prefix_end = true;
    prefixes_[key] = p;
  }
  return absl::OkStatus();
}

void ChunkStore::FreeSlotLocked(uint32_t segment, uint32_t slot) {
  Segment* seg = segments_.at(segment).get();
  absl::Status s = seg->PunchSlots(SlotRun{slot, 1});
  seg->Free(SlotRun{slot, 1});
  if (!PunchGaveBack(s)) {
    logger_->Log(LogLevel::kWarning, absl::StrCat("could not free blocks of slot ", slot,
                                                  " of segment ", segment, ": ", s.message()));
    // Its blocks are still allocated: it keeps counting against the cap until a retry punches
    // it or a Put reuses it.
    last_punch_error_ = std::string(s.message());
    unpunched_.insert(SlotId{segment, slot});
    return;
  }
  // Counted until here, not until the catalog forgot the chunk: a slot a reader still holds keeps
  // its blocks on disk, so it keeps counting against the cap.
  used_bytes_ -= seg->chunk_bytes();
}

absl::StatusOr<uint64_t> ChunkStore::Lookup(const ModelSpec& spec,
                                            std::span<const int32_t> tokens) {
  CKV_RETURN_IF_ERROR(spec.Validate());
  const std::vector<ChunkKey> keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  absl::MutexLock lock(&mu_);
  const uint64_t tick = ++use_clock_;
  uint64_t matched = 0;
  for (const ChunkKey& k : keys) {
    auto it = chunks_.find(k);
    if (it == chunks_.end()) break;
    it->second.last_use = tick;
    ++matched;
  }
  return matched;
}

void ChunkStore::PinLocked(SlotId slot) { read_pins_[slot]++; }

void ChunkStore::Unpin(SlotId slot) {
  absl::MutexLock lock(&mu_);
  auto it = read_pins_.find(slot);
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
  const uint64_t actual = RecordChecksum(data, seg.record_bytes(record));
  if (actual == expected) return absl::OkStatus();
  checksum_failures_.fetch_add(1, std::memory_order_relaxed);
  return absl::DataLossError(absl::StrFormat(
      "record %s (segment %u slot %u, offset %u of %s): checksum 0x%016x != 0x%016x",
      RecordName(seg, key, record), seg.id(), slot, seg.RecordOffset(slot, record),
      seg.file()->path(), actual, expected));
}

absl::Status ChunkStore::ReadAndVerify(Segment* seg, uint32_t slot, uint32_t record,
                                       uint64_t expected, const ChunkKey& key,
                                       std::span<std::byte> out) {
  const uint64_t stride = seg->record_stride(seg->band_of(record));
  thread_local AlignedBuffer buffer;
  if (buffer.size() < stride) buffer = AlignedBuffer(stride, seg->file()->alignment());
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
  uint64_t expected = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = chunks_.find(key);
    if (it == chunks_.end()) {
      return absl::NotFoundError(absl::StrCat("chunk ", key.ToHex(), " is not stored"));
    }
    ChunkEntry& e = it->second;
    if (!(e.fingerprint == fp)) {
      auto owner = specs_.find(e.fingerprint);
      return absl::FailedPreconditionError(absl::StrCat(
          "chunk ", key.ToHex(), " is stored under model ",
          owner == specs_.end() ? e.fingerprint.ToHex() : owner->second.DebugString(),
          ", not ", spec.DebugString()));
    }
    if (layer >= spec.layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, " out of range: ", spec.model_id, " has ", spec.layers));
    }
    if (out.size() != spec.RecordBytes()) {
      return absl::InvalidArgumentError(absl::StrCat("record buffer of ", out.size(),
                                                     " bytes; a record of ", spec.model_id,
                                                     " is ", spec.RecordBytes()));
    }
    e.last_use = ++use_clock_;
    seg = segments_.at(e.segment).get();
    slot = SlotId{e.segment, e.slot};
    expected = e.checksums[layer];
    PinLocked(slot);
  }
  absl::Status s = ReadAndVerify(seg, slot.second, layer, expected, key, out);
  Unpin(slot);
  if (absl::IsDataLoss(s)) logger_->Log(LogLevel::kError, std::string(s.message()));
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
    return absl::NotFoundError(absl::StrCat("chunk ", key.ToHex(), " has no auxiliary record ",
                                            aux, " (it has ",
                                            seg.geometry().aux_record_bytes.size(), ")"));
  }
  return seg.geometry().aux_record_bytes[aux];
}

PinnedChunks::~PinnedChunks() {
  for (const Chunk& c : chunks_) store_->Unpin(ChunkStore::SlotId{c.segment->id(), c.slot});
}

PinnedChunks::Location PinnedChunks::RecordAt(size_t chunk, uint32_t record) const {
  const Chunk& c = chunks_[chunk];
  const Segment& seg = *c.segment;
  const uint32_t band = seg.band_of(record);
  return Location{seg.file(), seg.RecordOffset(c.slot, record), seg.record_bytes(record),
                  static_cast<uint32_t>(seg.band_slot_bytes(band)), c.checksums[record]};
}

absl::StatusOr<std::unique_ptr<PinnedChunks>> ChunkStore::PinLeading(
    const ModelSpec& spec, std::span<const ChunkKey> keys) {
  CKV_RETURN_IF_ERROR(spec.Validate());
  size_t m = 0;
  {
    absl::MutexLock lock(&mu_);
    while (m < keys.size() && chunks_.contains(keys[m])) ++m;
    return PinLocked(spec, keys.first(m));
  }
}

absl::StatusOr<std::unique_ptr<PinnedChunks>> ChunkStore::Pin(const ModelSpec& spec,
                                                              std::span<const ChunkKey> keys) {
  CKV_RETURN_IF_ERROR(spec.Validate());
  absl::MutexLock lock(&mu_);
  return PinLocked(spec, keys);
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
    if (!(e.fingerprint == fp)) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", key.ToHex(), " is not stored under ", spec.DebugString()));
    }
    chunks.push_back(PinnedChunks::Chunk{key, segments_.at(e.segment).get(), e.slot, e.checksums,
                                         e.importance, e.loads});
  }
  const uint64_t tick = ++use_clock_;
  for (const auto& c : chunks) {
    PinLocked(SlotId{c.segment->id(), c.slot});
    chunks_[c.key].last_use = tick;
  }
  return std::unique_ptr<PinnedChunks>(new PinnedChunks(this, std::move(chunks)));
}

void ChunkStore::SetRemovalListener(RemovalListener listener) {
  absl::MutexLock lock(&mu_);
  removal_listener_ = std::move(listener);
}

void ChunkStore::SetRemovalObserver(RemovalObserver observer) {
  absl::MutexLock lock(&mu_);
  removal_observer_ = std::move(observer);
}

absl::Status ChunkStore::AddUsage(std::span<const Usage> usage) {
  // The immutable fields come from the catalog; I and F from memory, updated and written under
  // mu_, so that concurrent additions do not lose each other.
  std::vector<std::pair<const Usage*, ChunkRecord>> records;
  for (const Usage& u : usage) {
    auto record = catalog_->GetChunk(u.key);
    if (absl::IsNotFound(record.status())) continue;
    CKV_RETURN_IF_ERROR(record.status());
    records.emplace_back(&u, std::move(*record));
  }
  absl::MutexLock lock(&mu_);
  Catalog::Batch batch = catalog_->NewBatch();
  std::vector<std::pair<ChunkEntry*, const Usage*>> applied;
  for (auto& [u, record] : records) {
    auto it = chunks_.find(u->key);
    // Only a chunk still stored in the same place: one deleted meanwhile must not come back.
    if (it == chunks_.end() || it->second.segment != record.segment ||
        it->second.slot != record.slot) {
      continue;
    }
    record.importance = it->second.importance + u->importance;
    record.loads = it->second.loads + u->loads;
    batch.PutChunk(u->key, record);
    applied.emplace_back(&it->second, u);
  }
  if (applied.empty()) return absl::OkStatus();
  CKV_RETURN_IF_ERROR(catalog_->Commit(batch, /*sync=*/false));
  for (auto& [entry, u] : applied) {
    entry->importance += u->importance;
    entry->loads += u->loads;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ChunkStore::ResetUsage() {
  std::vector<ChunkKey> used;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, entry] : chunks_) {
      if (entry.importance != 0 || entry.loads != 0) used.push_back(key);
    }
  }
  std::vector<std::pair<ChunkKey, ChunkRecord>> records;
  for (const ChunkKey& key : used) {
    auto record = catalog_->GetChunk(key);
    if (absl::IsNotFound(record.status())) continue;
    CKV_RETURN_IF_ERROR(record.status());
    records.emplace_back(key, std::move(*record));
  }
  absl::MutexLock lock(&mu_);
  Catalog::Batch batch = catalog_->NewBatch();
  std::vector<ChunkEntry*> applied;
  for (auto& [key, record] : records) {
    auto it = chunks_.find(key);
    if (it == chunks_.end() || it->second.segment != record.segment ||
        it->second.slot != record.slot) {
      continue;
    }
    record.importance = 0;
    record.loads = 0;
    batch.PutChunk(key, record);
    applied.push_back(&it->second);
  }
  if (applied.empty()) return 0;
  CKV_RETURN_IF_ERROR(catalog_->Commit(batch, /*sync=*/true));
  for (ChunkEntry* entry : applied) {
    entry->importance = 0;
    entry->loads = 0;
  }
  return applied.size();
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
      return absl::NotFoundError(absl::StrCat("chunk ", c.key.ToHex(),
                                              " has no auxiliary record ", aux,
                                              " (stored by a ckv that did not write it)"));
    }
    const uint32_t b = c.segment->record_bytes(record);
    if (bytes != 0 && b != bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "auxiliary record ", aux, " of chunk ", c.key.ToHex(), " has ", b, " bytes; chunk ",
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
        BandRead{c.segment, c.slot, c.segment->band_of(record), &c.key, &c.checksums, i});
  }
  absl::Status first_error;
  CKV_RETURN_IF_ERROR(ReadBands(std::move(reads), max_io_bytes,
                                [&](const BandRead& read, uint32_t, const absl::Status& st,
                                    const std::byte* data) {
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
  std::vector<AlignedBuffer> buffers;
  std::vector<size_t> free_buffers;
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> queue,
                       fs_->NewIoQueue(static_cast<uint32_t>(depth)));
  struct DrainOnExit {
    IoQueue* q;
    ~DrainOnExit() { q->Drain().IgnoreError(); }  // the error was already returned
  } drain_on_exit{queue.get()};
  for (const auto& [begin, end] : runs) {
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
      buffers.emplace_back(io_bytes, first.seg->file()->alignment());
    }
    if (buffers[bi].size() < io_bytes) {
      buffers[bi] = AlignedBuffer(io_bytes, first.seg->file()->alignment());
    }
    IoOp op;
    op.kind = IoOp::Kind::kRead;
    op.file = first.seg->file();
    op.offset = first.seg->BandOffset(first.band, first.slot);
    op.buffer = buffers[bi].data();
    op.length = io_bytes;
    CKV_RETURN_IF_ERROR(queue->Submit(op, [&, bi, begin, end, band_slot](const absl::Status& st) {
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
            on_record(r, record, st, nullptr);
            continue;
          }
          absl::Status check =
              CheckRecord(*r.seg, r.slot, record, (*r.checksums)[record], *r.key, data);
          on_record(r, record, check, check.ok() ? data : nullptr);
        }
      }
    }));
  }
  return queue->Drain();
}

absl::Status ChunkStore::Delete(const ModelSpec& spec, std::span<const int32_t> tokens) {
  CKV_RETURN_IF_ERROR(spec.Validate());
  if (tokens.empty() || tokens.size() % spec.chunk_tokens != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Delete of ", tokens.size(), " tokens: a stored prefix is a whole number of chunks of ",
        spec.chunk_tokens, " tokens"));
  }
  const std::vector<ChunkKey> keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  return DeletePrefix(keys.back());
}

absl::Status ChunkStore::DeletePrefix(const ChunkKey& prefix_id) {
  absl::MutexLock lock(&mu_);
  auto p = prefixes_.find(prefix_id);
  if (p == prefixes_.end()) {
    return absl::NotFoundError(absl::StrCat("no stored prefix ", prefix_id.ToHex()));
  }
  Catalog::Batch batch = catalog_->NewBatch();
  batch.DeletePrefix(prefix_id);
  // Walk up from the prefix's end while chunks become unused.
  std::vector<ChunkKey> victims;
  ChunkKey key = prefix_id;
  uint32_t removed_children = 0;
  while (!key.IsZero()) {
    auto it = chunks_.find(key);
    if (it == chunks_.end()) break;
    const ChunkEntry& e = it->second;
    const bool is_end = e.prefix_end && !(key == prefix_id);
    if (is_end || e.children != removed_children || e.put_pins > 0 || inflight_.contains(key)) {
      break;
    }
    victims.push_back(key);
    key = e.parent;
    removed_children = 1;
  }
  // The prefix entry goes whether or not its chunks do (others may still use them).
  const PrefixEntry entry = p->second;
  chunks_.at(prefix_id).prefix_end = false;
  prefixes_.erase(p);
  absl::Status s = RemoveChunksLocked(victims, batch, Removal::kDelete);
  if (!s.ok()) {
    chunks_.at(prefix_id).prefix_end = true;
    prefixes_.emplace(prefix_id, entry);
    return s;
  }
  return absl::OkStatus();
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
  if (last != chunks_.end()) info.bytes = p.chunks * segments_.at(last->second.segment)->chunk_bytes();
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
      return absl::DataLossError(absl::StrCat("prefix ", prefix_id.ToHex(), " is missing chunk ",
                                              key.ToHex()));
    }
    const ChunkEntry& e = it->second;
    const Segment& seg = *segments_.at(e.segment);
    d.chunks.push_back(ChunkPlacement{key, e.segment, e.slot, seg.RecordOffset(e.slot, 0),
                                      seg.chunk_bytes(), e.importance, e.loads});
    key = e.parent;
  }
  std::reverse(d.chunks.begin(), d.chunks.end());
  auto s = specs_.find(p->second.fingerprint);
  if (s == specs_.end()) {
    return absl::DataLossError(absl::StrCat("prefix ", prefix_id.ToHex(),
                                            " names an unknown model spec"));
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

absl::StatusOr<VerifyReport> ChunkStore::Verify(const ProgressFn& progress) {
  return VerifyInternal(progress, nullptr, nullptr);
}

absl::StatusOr<VerifyReport> ChunkStore::VerifyInternal(const ProgressFn& progress,
                                                        absl::flat_hash_set<ChunkKey>* corrupt,
                                                        std::vector<std::string>* unreadable) {
  VerifyReport report;
  struct Item {
    ChunkKey key;
    ChunkKey parent;
    ChunkKey fingerprint;
    uint32_t depth;
  };
  std::vector<Item> items;
  uint64_t total_bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    report.problems = open_problems_;
    items.reserve(chunks_.size());
    for (const auto& [key, e] : chunks_) {
      items.push_back({key, e.parent, e.fingerprint, e.depth});
      total_bytes += segments_.at(e.segment)->chunk_bytes();
      if (!specs_.contains(e.fingerprint)) {
        report.problems.push_back(
            absl::StrCat("chunk ", key.ToHex(), " names an unknown model spec"));
      }
      if (!e.parent.IsZero()) {
        auto parent = chunks_.find(e.parent);
        if (parent == chunks_.end()) {
          report.problems.push_back(absl::StrCat("chunk ", key.ToHex(), " has no stored parent"));
          if (corrupt != nullptr) corrupt->insert(key);
        } else if (parent->second.depth + 1 != e.depth) {
          report.problems.push_back(absl::StrCat("chunk ", key.ToHex(), " at depth ", e.depth,
                                                 " has a parent at depth ",
                                                 parent->second.depth));
        }
      } else if (e.depth != 0) {
        report.problems.push_back(
            absl::StrCat("chunk ", key.ToHex(), " at depth ", e.depth, " has no parent"));
      }
    }
    // Child counts are derived state: they must agree with the parent links they count.
    absl::flat_hash_map<ChunkKey, uint32_t> linked_children;
    for (const auto& [key, e] : chunks_) {
      if (!e.parent.IsZero() && chunks_.contains(e.parent)) linked_children[e.parent]++;
    }
    for (const auto& [key, e] : chunks_) {
      auto linked = linked_children.find(key);
      const uint32_t want = linked == linked_children.end() ? 0 : linked->second;
      if (e.children != want) {
        report.problems.push_back(absl::StrCat("chunk ", key.ToHex(), " counts ", e.children,
                                               " children; ", want, " stored chunks name it"));
      }
    }
    for (const auto& [id, p] : prefixes_) {
      auto it = chunks_.find(id);
      if (it == chunks_.end() || it->second.depth + 1 != p.chunks) {
        report.problems.push_back(absl::StrCat("prefix ", id.ToHex(), " of ", p.chunks,
                                               " chunks does not end at a stored chunk of that "
                                               "depth"));
      }
    }
  }
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.key < b.key; });
  // The catalog's own record: its key must be the hash of its parent, spec and tokens.
  for (const Item& item : items) {
    auto record = catalog_->GetChunk(item.key);
    if (!record.ok()) {
      if (!absl::IsNotFound(record.status())) {  // NotFound: removed while we verified
        report.problems.push_back(std::string(record.status().message()));
      }
      continue;
    }
    if (!(ChainChunkKey(record->parent, record->fingerprint, record->tokens) == item.key)) {
      report.problems.push_back(absl::StrCat("chunk ", item.key.ToHex(),
                                             ": key does not match the hash of its parent, "
                                             "model and tokens"));
      if (corrupt != nullptr) corrupt->insert(item.key);
    }
  }
  // Every record, read in batches of chunks in slot order, so that the bands of neighbouring
  // slots are read together; a batch's chunks are pinned while it is read.
  constexpr size_t kBatchChunks = 1024;
  constexpr uint64_t kMaxIoBytes = 1 << 20;
  struct Pinned {
    ChunkKey key;
    Segment* seg;
    uint32_t slot;
    std::vector<uint64_t> checksums;
  };
  uint64_t done_bytes = 0;
  for (size_t begin = 0; begin < items.size(); begin += kBatchChunks) {
    const size_t end = std::min(items.size(), begin + kBatchChunks);
    std::vector<Pinned> pinned;
    pinned.reserve(end - begin);
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = begin; i < end; ++i) {
        auto it = chunks_.find(items[i].key);
        if (it == chunks_.end()) continue;  // removed while we verified
        const ChunkEntry& e = it->second;
        pinned.push_back(Pinned{it->first, segments_.at(e.segment).get(), e.slot, e.checksums});
        PinLocked(SlotId{e.segment, e.slot});
      }
    }
    std::vector<BandRead> reads;
    for (size_t i = 0; i < pinned.size(); ++i) {
      for (uint32_t band = 0; band < pinned[i].seg->bands(); ++band) {
        reads.push_back(BandRead{pinned[i].seg, pinned[i].slot, band, &pinned[i].key,
                                 &pinned[i].checksums, i});
      }
    }
    absl::Status s = ReadBands(std::move(reads), kMaxIoBytes,
                               [&](const BandRead& read, uint32_t record, const absl::Status& st,
                                   const std::byte*) {
                                 report.records_checked++;
                                 report.bytes_checked += read.seg->record_bytes(record);
                                 done_bytes += read.seg->record_stride(read.band);
                                 if (st.ok()) return;
                                 if (absl::IsDataLoss(st) &&
                                     st.message().find("checksum") != std::string_view::npos) {
                                   report.checksum_failures++;
                                   if (corrupt != nullptr) corrupt->insert(*read.key);
                                 } else if (unreadable != nullptr) {
                                   unreadable->push_back(std::string(st.message()));
                                 }
                                 report.problems.push_back(std::string(st.message()));
                               });
    for (const Pinned& p : pinned) Unpin(SlotId{p.seg->id(), p.slot});
    CKV_RETURN_IF_ERROR(s);
    report.chunks_checked += pinned.size();
    if (progress) progress(done_bytes, total_bytes);
  }
  return report;
}

absl::StatusOr<RepairReport> ChunkStore::Repair(const ProgressFn& progress) {
  RepairReport report;
  absl::flat_hash_set<ChunkKey> corrupt;
  CKV_ASSIGN_OR_RETURN(report.verify, VerifyInternal(progress, &corrupt, &report.remaining));
  absl::MutexLock lock(&mu_);
  // Victims: each corrupt chunk and everything after it, descendants before ancestors, so that
  // each is a leaf once the ones before it are gone (RemoveChunksLocked).
  absl::flat_hash_map<ChunkKey, std::vector<ChunkKey>> children;
  for (const auto& [key, e] : chunks_) {
    if (!e.parent.IsZero()) children[e.parent].push_back(key);
  }
  std::vector<ChunkKey> victims;
  absl::flat_hash_set<ChunkKey> taken;
  std::function<bool(const ChunkKey&)> take = [&](const ChunkKey& key) -> bool {
    if (taken.contains(key)) return true;
    const ChunkEntry& e = chunks_.at(key);
    if (e.put_pins > 0 || inflight_.contains(key)) {
      report.remaining.push_back(
          absl::StrCat("chunk ", key.ToHex(), " is being extended by a Put; run repair again"));
      return false;
    }
    bool all = true;
    auto kids = children.find(key);
    if (kids != children.end()) {
      for (const ChunkKey& child : kids->second) all = take(child) && all;
    }
    if (!all) return false;
    taken.insert(key);
    victims.push_back(key);
    report.removed.push_back(absl::StrCat(
        "chunk ", key.ToHex(), " (depth ", e.depth, ")",
        corrupt.contains(key) ? ": failed a check" : ": follows a chunk that failed a check"));
    return true;
  };
  for (const ChunkKey& key : corrupt) {
    if (chunks_.contains(key)) take(key);
  }
  // Catalog entries Load could not serve, and prefixes that end at no stored chunk.
  Catalog::Batch batch = catalog_->NewBatch();
  for (const ChunkKey& key : dropped_chunks_) {
    if (chunks_.contains(key)) continue;  // a later Put stored it again, soundly
    batch.DeleteChunk(key);
    report.removed.push_back(absl::StrCat("catalog entry of chunk ", key.ToHex(),
                                          ": could not be loaded"));
  }
  for (const ChunkKey& key : dropped_prefixes_) {
    if (chunks_.contains(key)) continue;
    batch.DeletePrefix(key);
    report.removed.push_back(
        absl::StrCat("prefix ", key.ToHex(), ": ends at a chunk that is not stored"));
  }
  report.chunks_removed = victims.size();
  CKV_RETURN_IF_ERROR(RemoveChunksLocked(victims, batch, Removal::kRepair));
  dropped_chunks_.clear();
  dropped_prefixes_.clear();
  open_problems_.clear();
  if (!report.removed.empty()) {
    logger_->Log(LogLevel::kWarning, absl::StrCat("repair of ", path_, " removed ",
                                                  report.removed.size(), " entries"));
  }
  return report;
}

absl::StatusOr<GcReport> ChunkStore::Gc() {
  GcReport report;
  absl::MutexLock lock(&mu_);
  CKV_ASSIGN_OR_RETURN(report.bytes_reclaimed, RetryPunchesLocked());
  std::vector<uint32_t> empty;
  for (auto& [id, segment] : segments_) {
    if (segment->used_slots() == 0) {
      CKV_ASSIGN_OR_RETURN(uint64_t bytes, segment->file()->AllocatedBytes());
      empty.push_back(id);
      report.bytes_reclaimed += bytes;
      continue;
    }
    CKV_ASSIGN_OR_RETURN(uint64_t freed, PunchFreeRuns(*segment));
    report.bytes_reclaimed += freed;
  }
  if (empty.empty()) return report;
  // A segment with no used slot has no chunk, no Put writing into it (allocation marks slots
  // used under mu_) and no reader (a pinned slot stays used until unpinned). The catalog forgets
  // it first, so a crash in between leaves a file Open reclaims as an orphan.
  Catalog::Batch batch = catalog_->NewBatch();
  for (uint32_t id : empty) batch.DeleteSegment(id);
  CKV_RETURN_IF_ERROR(catalog_->Commit(batch));
  for (uint32_t id : empty) {
    segments_.erase(id);
    CKV_RETURN_IF_ERROR(fs_->DeleteFile(SegmentPath(id)));
    report.segments_removed++;
  }
  CKV_RETURN_IF_ERROR(fs_->SyncDir(absl::StrCat(path_, "/", kSegmentsDir)));
  return report;
}

EngineStats ChunkStore::Stats() {
  absl::MutexLock lock(&mu_);
  EngineStats s;
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
  s.disk_bytes_used = used_bytes_;
  s.max_disk_bytes = max_disk_bytes_;
  s.orphan_bytes_reclaimed = orphan_bytes_reclaimed_;
  return s;
}

}  // namespace ckv::storage
