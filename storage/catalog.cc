// SPDX-License-Identifier: Apache-2.0
#include "storage/catalog.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <deque>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "io/private_file_system.h"
#include "rocksdb/cache.h"
#include "rocksdb/env.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"

namespace ckv::storage {
namespace {

// Order of handles_: default first, then ours.
enum CfIndex { kDefault = 0, kChunks, kPrefixes, kSegments, kStatistics, kMeta, kCfCount };
const char* const kCfNames[kCfCount] = {"default",   kCfChunks,     kCfPrefixes,
                                        kCfSegments, kCfStatistics, kCfMeta};

rocksdb::Slice ToSlice(absl::string_view s) { return rocksdb::Slice(s.data(), s.size()); }
absl::string_view ToView(const rocksdb::Slice& s) { return absl::string_view(s.data(), s.size()); }

template <typename Fn>
absl::Status ScanCf(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* cf, absl::string_view name,
                    Fn fn) {
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  // A whole scan at open: keep its blocks out of the block cache, which it would fill with blocks
  // no one reads again. (RocksDB reads ahead by itself on a sequential scan; a larger
  // readahead_size cost 38 MB of RSS at 1M chunks and no time.)
  ro.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro, cf));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    CKV_RETURN_IF_ERROR(fn(ToView(it->key()), ToView(it->value())));
  }
  return FromRocks(it->status(), absl::StrCat("scan catalog column family ", name));
}

}  // namespace

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view context) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(context, ": ", s.ToString());
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsNoSpace()) return NoSpaceError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) return absl::UnavailableError(msg);
  if (s.IsIOError()) {
    if (s.ToString().find("lock") != std::string::npos) {
      return absl::UnavailableError(
          absl::StrCat(context, ": the store is open in another process (", s.ToString(), ")"));
    }
    if (s.ToString().find("Permission denied") != std::string::npos) {
      return absl::PermissionDeniedError(msg);
    }
    if (s.ToString().find("No space") != std::string::npos) return NoSpaceError(msg);
  }
  return absl::InternalError(msg);
}

void Catalog::Batch::PutChunk(const ChunkKey& key, const ChunkRecord& record) {
  batch_.Put(catalog_->handles_[kChunks], EncodeChunkKey(key), EncodeChunkRecord(record));
}
void Catalog::Batch::DeleteChunk(const ChunkKey& key) {
  batch_.Delete(catalog_->handles_[kChunks], EncodeChunkKey(key));
}
void Catalog::Batch::PutPrefix(const ChunkKey& key, const PrefixRecord& record) {
  batch_.Put(catalog_->handles_[kPrefixes], EncodeChunkKey(key), EncodePrefixRecord(record));
}
void Catalog::Batch::DeletePrefix(const ChunkKey& key) {
  batch_.Delete(catalog_->handles_[kPrefixes], EncodeChunkKey(key));
}
void Catalog::Batch::PutSegment(uint32_t id, const SegmentRecord& record) {
  batch_.Put(catalog_->handles_[kSegments], EncodeSegmentKey(id), EncodeSegmentRecord(record));
}
void Catalog::Batch::DeleteSegment(uint32_t id) {
  batch_.Delete(catalog_->handles_[kSegments], EncodeSegmentKey(id));
}
void Catalog::Batch::PutSpec(const ModelSpec& spec) {
  batch_.Put(catalog_->handles_[kMeta], absl::StrCat(kMetaSpecPrefix, spec.Fingerprint().ToHex()),
             EncodeModelSpec(spec));
}
void Catalog::Batch::PutCounters(const StoredCounters& counters) {
  batch_.Put(catalog_->handles_[kStatistics], kStatsEngine, EncodeCounters(counters));
}
void Catalog::Batch::PutMeta(absl::string_view name, absl::string_view value) {
  batch_.Put(catalog_->handles_[kMeta], ToSlice(name), ToSlice(value));
}

namespace {

absl::Status SyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open directory ", path));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoToStatus(err, absl::StrCat("fsync directory ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status Catalog::CreateEmpty(const std::string& dir, io::FileSystem* fs, Clock* clock) {
  // Built aside and renamed into place, so that a crash during creation (RocksDB creates column
  // families one by one) leaves either no catalog or a complete one.
  const std::string aside = dir + ".creating";
  std::error_code ec;
  std::filesystem::remove_all(aside, ec);
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("remove ", aside));
  {
    auto catalog = OpenDb(aside, /*create=*/true, fs);
    if (!catalog.ok()) return catalog.status();
    Batch b = (*catalog)->NewBatch();
    b.PutMeta(kMetaFormatVersion, EncodeU32(kCatalogFormatVersion));
    b.PutMeta(kMetaMaxDiskBytes, EncodeU64(0));
    b.PutMeta(kMetaLayout, std::string(1, static_cast<char>(RecordLayout::kLayerMajor)));
    b.PutMeta(kMetaCreatedMs, EncodeU64(static_cast<uint64_t>(absl::ToUnixMillis(clock->Now()))));
    b.PutCounters(StoredCounters{});
    CKV_RETURN_IF_ERROR((*catalog)->Commit(b));
  }
  if (::rename(aside.c_str(), dir.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("rename ", aside, " to ", dir));
  }
  const std::string parent = std::filesystem::path(dir).parent_path().string();
  return SyncDirectory(parent.empty() ? "." : parent);
}

absl::StatusOr<std::unique_ptr<Catalog>> Catalog::Open(const std::string& dir,
                                                       bool create_if_missing, bool error_if_exists,
                                                       Contents* contents, io::FileSystem* fs,
                                                       Clock* clock) {
  std::error_code ec;
  const bool exists = std::filesystem::exists(std::filesystem::path(dir) / "CURRENT", ec);
  if (!exists && !create_if_missing) {
    return absl::NotFoundError(absl::StrCat("no ckv store at ", dir, " (no catalog)"));
  }
  if (exists && error_if_exists) {
    return absl::AlreadyExistsError(absl::StrCat("a ckv store already exists at ", dir));
  }
  if (!exists) CKV_RETURN_IF_ERROR(CreateEmpty(dir, fs, clock != nullptr ? clock : RealClock()));
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<Catalog> catalog, OpenDb(dir, /*create=*/false, fs));
  CKV_RETURN_IF_ERROR(catalog->Load(contents));
  contents->created = !exists;
  return catalog;
}

namespace {

// RocksDB's lock on a catalog's LOCK file, held without the catalog open (Catalog::LockDir).
class RocksFileLock final : public Catalog::Lock {
 public:
  RocksFileLock(rocksdb::Env* env, rocksdb::FileLock* lock) : env_(env), lock_(lock) {}
  // Unlocking closes the file; nothing to act on if it fails.
  ~RocksFileLock() override { env_->UnlockFile(lock_).PermitUncheckedError(); }

 private:
  rocksdb::Env* const env_;
  rocksdb::FileLock* const lock_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Catalog::Lock>> Catalog::LockDir(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::path(dir) / "CURRENT", ec)) {
    return absl::NotFoundError(absl::StrCat("no ckv store at ", dir, " (no catalog)"));
  }
  // The same lock RocksDB takes when it opens the catalog (fcntl, and its own table of the
  // files this process locked), so that an engine of this process or another cannot open it
  // meanwhile.
  rocksdb::Env* env = rocksdb::Env::Default();
  rocksdb::FileLock* lock = nullptr;
  CKV_RETURN_IF_ERROR(FromRocks(env->LockFile(absl::StrCat(dir, "/LOCK"), &lock),
                                absl::StrCat("lock catalog ", dir)));
  return std::unique_ptr<Lock>(new RocksFileLock(env, lock));
}

absl::StatusOr<std::unique_ptr<Catalog>> Catalog::OpenReadOnly(const std::string& dir,
                                                               Contents* contents,
                                                               io::FileSystem* fs) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::path(dir) / "CURRENT", ec)) {
    return absl::NotFoundError(absl::StrCat("no ckv store at ", dir, " (no catalog)"));
  }
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<Catalog> catalog,
                       OpenDb(dir, /*create=*/false, fs, /*read_only=*/true));
  CKV_RETURN_IF_ERROR(catalog->Load(contents));
  return catalog;
}

namespace {

// RocksDB's info log of a read-only catalog goes nowhere: a read-only open writes no file.
class DiscardingRocksLogger final : public rocksdb::Logger {
 public:
  using rocksdb::Logger::Logv;
  void Logv(const char* /*format*/, va_list /*ap*/) override {}
};

}  // namespace

absl::StatusOr<std::unique_ptr<Catalog>> Catalog::OpenDb(const std::string& dir, bool create,
                                                         io::FileSystem* fs, bool read_only) {
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = create;
  db_options.create_missing_column_families = create;
  db_options.paranoid_checks = true;
  db_options.max_open_files = 256;
  db_options.keep_log_file_num = 2;
  db_options.max_manifest_file_size = 16 << 20;
  db_options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  // The catalog is small; keep RocksDB's own memory and threads modest.
  db_options.max_background_jobs = 2;
  rocksdb::ColumnFamilyOptions cf_options;
  cf_options.write_buffer_size = 8 << 20;
  // Records not kept in RAM (the checksums a read verifies) are read on demand through one block
  // cache shared by the column families, of a fixed size whatever the store's.
  rocksdb::BlockBasedTableOptions table_options;
  table_options.block_cache = rocksdb::NewLRUCache(kBlockCacheBytes);
  cf_options.compression = rocksdb::kNoCompression;
  cf_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table_options));

  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const char* name : kCfNames) descriptors.emplace_back(name, cf_options);

  auto catalog = std::unique_ptr<Catalog>(new Catalog());
  catalog->dir_ = dir;
  // Store files are 0600 and directories 0700, RocksDB's included, whatever the umask; a test
  // file system puts its layer over them (faults, simulated power loss).
  catalog->env_ = io::NewPrivateEnv(fs);
  db_options.env = catalog->env_.get();
  if (read_only) {
    db_options.info_log = std::make_shared<DiscardingRocksLogger>();
    rocksdb::DB* raw = nullptr;
    CKV_RETURN_IF_ERROR(FromRocks(
        rocksdb::DB::OpenForReadOnly(db_options, dir, descriptors, &catalog->handles_, &raw),
        absl::StrCat("open catalog ", dir, " read-only")));
    catalog->db_.reset(raw);
    return catalog;
  }
  if (!create) {
    CKV_RETURN_IF_ERROR(FromRocks(io::TightenModes(dir), absl::StrCat("restrict modes of ", dir)));
  }
  rocksdb::DB* raw = nullptr;
  CKV_RETURN_IF_ERROR(
      FromRocks(rocksdb::DB::Open(db_options, dir, descriptors, &catalog->handles_, &raw),
                absl::StrCat("open catalog ", dir)));
  catalog->db_.reset(raw);

  return catalog;
}

absl::Status Catalog::Load(Contents* contents) {
  const std::string& dir = dir_;
  Contents c;
  rocksdb::DB* db = db_.get();
  auto& h = handles_;
  std::string value;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  rocksdb::Status s = db->Get(ro, h[kMeta], kMetaFormatVersion, &value);
  if (s.IsNotFound()) {
    return absl::DataLossError(absl::StrCat("catalog ", dir, " has no format version"));
  }
  CKV_RETURN_IF_ERROR(FromRocks(s, "read catalog format version"));
  CKV_ASSIGN_OR_RETURN(c.format_version, DecodeU32(value, kMetaFormatVersion));
  if (c.format_version > kCatalogFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "catalog ", dir, " has format version ", c.format_version,
        ", newer than this build of ckv reads (", kCatalogFormatVersion, "); upgrade ckv"));
  }
  if (c.format_version == 0) {
    return absl::DataLossError(absl::StrCat("catalog ", dir, " has format version 0"));
  }

  CKV_RETURN_IF_ERROR(
      ScanCf(db, h[kMeta], kCfMeta, [&](absl::string_view k, absl::string_view v) -> absl::Status {
        if (k == kMetaMaxDiskBytes) {
          CKV_ASSIGN_OR_RETURN(c.max_disk_bytes, DecodeU64(v, k));
        } else if (k == kMetaLayout) {
          if (v.size() != 1 || (v[0] != static_cast<char>(RecordLayout::kLayerMajor) &&
                                v[0] != static_cast<char>(RecordLayout::kPeriodMajor))) {
            return absl::DataLossError("catalog meta layout is not a known layout");
          }
          c.layout = static_cast<RecordLayout>(v[0]);
        } else if (k == kMetaCreatedMs) {
          CKV_ASSIGN_OR_RETURN(uint64_t ms, DecodeU64(v, k));
          c.created_unix_ms = static_cast<int64_t>(ms);
        } else if (absl::StartsWith(k, kMetaSpecPrefix)) {
          CKV_ASSIGN_OR_RETURN(ModelSpec spec, DecodeModelSpec(v, k));
          c.specs.push_back(std::move(spec));
        }
        return absl::OkStatus();
      }));
  CKV_RETURN_IF_ERROR(ScanCf(db, h[kStatistics], kCfStatistics,
                             [&](absl::string_view k, absl::string_view v) -> absl::Status {
                               if (k == kStatsEngine) {
                                 CKV_ASSIGN_OR_RETURN(c.counters, DecodeCounters(v, k));
                               }
                               return absl::OkStatus();
                             }));
  CKV_RETURN_IF_ERROR(ScanCf(
      db, h[kSegments], kCfSegments, [&](absl::string_view k, absl::string_view v) -> absl::Status {
        CKV_ASSIGN_OR_RETURN(uint32_t id, DecodeSegmentKey(k));
        CKV_ASSIGN_OR_RETURN(SegmentRecord r, DecodeSegmentRecord(v, absl::StrCat("segment ", id)));
        c.segments.emplace_back(id, r);
        return absl::OkStatus();
      }));
  CKV_RETURN_IF_ERROR(ScanCf(
      db, h[kPrefixes], kCfPrefixes, [&](absl::string_view k, absl::string_view v) -> absl::Status {
        CKV_ASSIGN_OR_RETURN(ChunkKey key, DecodeChunkKey(k));
        CKV_ASSIGN_OR_RETURN(PrefixRecord r,
                             DecodePrefixRecord(v, absl::StrCat("prefix ", key.ToHex())));
        c.prefixes.emplace_back(key, r);
        return absl::OkStatus();
      }));
  *contents = std::move(c);
  return absl::OkStatus();
}

Catalog::~Catalog() {
  if (db_ == nullptr) return;
  for (auto* h : handles_) {
    // Destroying a handle cannot fail in a way we could act on during teardown.
    db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  // Closing makes nothing durable that matters: every commit but AddUsage's statistics is a
  // synced write, and those may lag after a crash by contract (catalog.h). The index snapshot,
  // which records the last sequence number, syncs the WAL itself first (SyncWal).
  db_->Close().PermitUncheckedError();
}

absl::Status Catalog::Commit(Batch& batch, bool sync) {
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  absl::Status s =
      FromRocks(db_->Write(wo, &batch.batch_), absl::StrCat("commit to catalog ", dir_));
  if (!s.ok()) commit_failed_.store(true, std::memory_order_relaxed);
  return s;
}

absl::Status Catalog::SyncWal() {
  return FromRocks(db_->FlushWAL(/*sync=*/true), absl::StrCat("sync the WAL of catalog ", dir_));
}

absl::Status Catalog::FlushAndCompact() {
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    CKV_RETURN_IF_ERROR(FromRocks(db_->Flush(rocksdb::FlushOptions(), h),
                                  absl::StrCat("flush catalog ", dir_, " ", h->GetName())));
    CKV_RETURN_IF_ERROR(
        FromRocks(db_->CompactRange(rocksdb::CompactRangeOptions(), h, nullptr, nullptr),
                  absl::StrCat("compact catalog ", dir_, " ", h->GetName())));
  }
  return absl::OkStatus();
}

absl::Status Catalog::ScanChunks(const ChunkFn& fn) {
  // RocksDB's iterator, its decompression and the decoding run on a thread of their own, up to
  // kBatches batches of kBatchChunks chunks ahead of `fn`, which runs on the caller's thread: on
  // two cores the two halves of an open overlap. Batches go back and forth between the threads
  // and are reused, so the records' vectors are allocated once per batch slot, not per chunk.
  using Batch = std::vector<std::pair<ChunkKey, ChunkRecord>>;
  constexpr size_t kBatchChunks = 4096;
  constexpr size_t kBatches = 4;
  struct Pipe {
    absl::Mutex mu;
    absl::CondVar cv;
    std::deque<Batch> full ABSL_GUARDED_BY(mu);
    std::deque<Batch> empty ABSL_GUARDED_BY(mu);
    bool done ABSL_GUARDED_BY(mu) = false;    // the scanner has handed over its last batch
    bool stop ABSL_GUARDED_BY(mu) = false;    // fn failed: the scanner must stop
    absl::Status status ABSL_GUARDED_BY(mu);  // the scan's
  } pipe;
  {
    absl::MutexLock lock(&pipe.mu);
    pipe.empty.resize(kBatches);
  }
  std::thread scanner([&] {
    Batch batch;
    size_t n = 0;  // chunks decoded into batch
    auto take_empty = [&]() -> bool {
      absl::MutexLock lock(&pipe.mu);
      while (pipe.empty.empty() && !pipe.stop) pipe.cv.Wait(&pipe.mu);
      if (pipe.stop) return false;
      batch = std::move(pipe.empty.front());
      pipe.empty.pop_front();
      n = 0;
      return true;
    };
    auto hand_over = [&] {
      batch.resize(n);
      absl::MutexLock lock(&pipe.mu);
      pipe.full.push_back(std::move(batch));
      pipe.cv.SignalAll();
    };
    absl::Status s = take_empty() ? absl::OkStatus() : absl::CancelledError();
    if (s.ok()) {
      s = ScanCf(db_.get(), handles_[kChunks], kCfChunks,
                 [&](absl::string_view k, absl::string_view v) -> absl::Status {
                   if (n == batch.size()) batch.emplace_back();
                   auto& [key, record] = batch[n];
                   CKV_ASSIGN_OR_RETURN(key, DecodeChunkKey(k));
                   // The entry's name costs a hex format: made only for the error message.
                   if (!DecodeChunkRecordInto(v, "", /*with_tokens=*/false, &record).ok()) {
                     return DecodeChunkRecordInto(v, absl::StrCat("chunk ", key.ToHex()),
                                                  /*with_tokens=*/false, &record);
                   }
                   if (++n < kBatchChunks) return absl::OkStatus();
                   hand_over();
                   return take_empty() ? absl::OkStatus() : absl::CancelledError();
                 });
    }
    if (s.ok() && n > 0) hand_over();
    absl::MutexLock lock(&pipe.mu);
    pipe.status = s;
    pipe.done = true;
    pipe.cv.SignalAll();
  });
  absl::Status result;
  while (result.ok()) {
    Batch batch;
    {
      absl::MutexLock lock(&pipe.mu);
      while (pipe.full.empty() && !pipe.done) pipe.cv.Wait(&pipe.mu);
      if (pipe.full.empty()) break;
      batch = std::move(pipe.full.front());
      pipe.full.pop_front();
    }
    for (const auto& [key, record] : batch) {
      result = fn(key, record);
      if (!result.ok()) break;
    }
    absl::MutexLock lock(&pipe.mu);
    batch.resize(kBatchChunks);  // back to a whole batch's slots, their vectors kept
    pipe.empty.push_back(std::move(batch));
    if (!result.ok()) pipe.stop = true;
    pipe.cv.SignalAll();
  }
  scanner.join();
  if (!result.ok()) return result;
  absl::MutexLock lock(&pipe.mu);
  return pipe.status;
}

uint64_t Catalog::LatestSequence() { return db_->GetLatestSequenceNumber(); }

std::string Catalog::Identity() {
  std::string id;
  if (!db_->GetDbIdentity(id).ok()) return "";
  return id;
}

uint64_t Catalog::EstimateChunks() {
  uint64_t n = 0;
  db_->GetIntProperty(handles_[kChunks], rocksdb::DB::Properties::kEstimateNumKeys, &n);
  return n;
}

absl::Status Catalog::GetChunks(std::span<const ChunkKey> keys, const IndexedChunkFn& fn) {
  if (keys.empty()) return absl::OkStatus();
  std::vector<std::string> encoded(keys.size());
  std::vector<rocksdb::Slice> slices(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    encoded[i] = EncodeChunkKey(keys[i]);
    slices[i] = encoded[i];
  }
  std::vector<rocksdb::PinnableSlice> values(keys.size());
  std::vector<rocksdb::Status> statuses(keys.size());
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  db_->MultiGet(ro, handles_[kChunks], keys.size(), slices.data(), values.data(), statuses.data());
  ChunkRecord record;
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::Status status;
    if (statuses[i].IsNotFound()) {
      status = absl::NotFoundError(
          absl::StrCat("chunk ", keys[i].ToHex(), " has no record in catalog ", dir_));
    } else {
      CKV_RETURN_IF_ERROR(FromRocks(statuses[i], absl::StrCat("read chunk ", keys[i].ToHex())));
      const absl::string_view value(values[i].data(), values[i].size());
      // The entry's name costs a hex format: made only for the error message.
      if (!DecodeChunkRecordInto(value, "", /*with_tokens=*/false, &record).ok()) {
        status = DecodeChunkRecordInto(value, absl::StrCat("chunk ", keys[i].ToHex()),
                                       /*with_tokens=*/false, &record);
      }
    }
    CKV_RETURN_IF_ERROR(fn(i, status, record));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChunkRecord> Catalog::GetChunk(const ChunkKey& key) {
  std::string value;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  CKV_RETURN_IF_ERROR(FromRocks(db_->Get(ro, handles_[kChunks], EncodeChunkKey(key), &value),
                                absl::StrCat("read chunk ", key.ToHex())));
  return DecodeChunkRecord(value, absl::StrCat("chunk ", key.ToHex()));
}

uint64_t Catalog::ApproximateBytes() {
  // Per column family: without a handle RocksDB answers for the default one only, which is empty.
  uint64_t total = 0;
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    uint64_t sst = 0, memtables = 0;
    db_->GetIntProperty(h, rocksdb::DB::Properties::kTotalSstFilesSize, &sst);
    db_->GetIntProperty(h, rocksdb::DB::Properties::kCurSizeAllMemTables, &memtables);
    total += sst + memtables;
  }
  return total;
}

}  // namespace ckv::storage
