// SPDX-License-Identifier: Apache-2.0
// storage/catalog.h: the store's metadata on RocksDB.
//
// The catalog names every committed chunk, prefix, segment and model spec, with the store's meta
// (format version, cap, layout) and persisted counters, in the column families of
// storage/catalog_format.h. Every change is one WriteBatch, committed atomically. Chunks,
// prefixes, segments, specs and meta are committed with sync=true, so such a change is durable
// when Commit returns and entirely absent after a crash before it. The one exception is usage
// statistics (ChunkStore::AddUsage: I and F), committed with sync=false: after a power loss they
// may lag, up to the last synced commit (RocksDB's WAL is ordered, so the next synced commit
// makes them durable too); a SIGKILL loses none of them (they are in the kernel's page cache).
//
// Thread-safety: Commit and Get may be called from any thread (RocksDB serialises writes).
#ifndef CKV_STORAGE_CATALOG_H_
#define CKV_STORAGE_CATALOG_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "io/file_system.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"
#include "storage/catalog_format.h"

namespace ckv::storage {

class Catalog {
 public:
  // Everything the catalog holds but its chunks, read once at open; the chunks are read with
  // ScanChunks, one at a time, so that opening a store of millions of chunks holds none of their
  // records at once.
  struct Contents {
    bool created = false;  // the catalog was created by this Open
    uint32_t format_version = kCatalogFormatVersion;
    uint64_t max_disk_bytes = 0;
    RecordLayout layout = RecordLayout::kLayerMajor;
    int64_t created_unix_ms = 0;
    std::vector<std::pair<ChunkKey, PrefixRecord>> prefixes;
    std::vector<std::pair<uint32_t, SegmentRecord>> segments;
    std::vector<ModelSpec> specs;
    StoredCounters counters;
  };

  // A set of changes committed together.
  class Batch {
   public:
    void PutChunk(const ChunkKey& key, const ChunkRecord& record);
    void DeleteChunk(const ChunkKey& key);
    void PutPrefix(const ChunkKey& key, const PrefixRecord& record);
    void DeletePrefix(const ChunkKey& key);
    void PutSegment(uint32_t id, const SegmentRecord& record);
    void DeleteSegment(uint32_t id);
    void PutSpec(const ModelSpec& spec);
    void PutCounters(const StoredCounters& counters);
    void PutMeta(absl::string_view name, absl::string_view value);
    bool empty() const { return batch_.Count() == 0; }

   private:
    friend class Catalog;
    explicit Batch(Catalog* catalog) : catalog_(catalog) {}
    Catalog* catalog_;
    rocksdb::WriteBatch batch_;
  };

  // Opens the catalog in `dir` (a RocksDB directory), creating it when allowed. Errors:
  // NotFound (missing, !create_if_missing), AlreadyExists (error_if_exists), FailedPrecondition
  // (format version newer than this build), Unavailable (open in another process), DataLoss
  // (corrupt), and the mapped I/O errors. `fs` (optional, not owned, must outlive the catalog):
  // its CatalogFileSystem layer is put over RocksDB's files (io/file_system.h). `clock`
  // (optional, not owned; nullptr = RealClock()) dates a new catalog (Contents::created_unix_ms).
  static absl::StatusOr<std::unique_ptr<Catalog>> Open(const std::string& dir,
                                                       bool create_if_missing, bool error_if_exists,
                                                       Contents* contents,
                                                       io::FileSystem* fs = nullptr,
                                                       Clock* clock = nullptr);
  // Opens the catalog in `dir` read-only, while another process may hold it for writing: a
  // consistent view of what was committed when it opened (RocksDB's read-only instance: no lock,
  // no file written, its info log discarded). Commits fail. Errors as Open's. A writer's flush
  // or compaction may remove a file the open was reading (NotFound, Internal): the caller opens
  // again when the catalog's files changed meanwhile (ReadOnlyEngine does).
  static absl::StatusOr<std::unique_ptr<Catalog>> OpenReadOnly(const std::string& dir,
                                                               Contents* contents,
                                                               io::FileSystem* fs = nullptr);
  // Holds the LOCK of the catalog in `dir` (RocksDB's, as an open catalog holds it) without
  // opening it, until the returned handle is destroyed: a tool may then change the store's
  // files under a read-only view (ChunkStore::FreeSpaceToOpen). Writes nothing (the LOCK file
  // exists once the catalog was opened). Unavailable when another engine holds it.
  class Lock {
   public:
    virtual ~Lock() = default;
  };
  static absl::StatusOr<std::unique_ptr<Lock>> LockDir(const std::string& dir);
  ~Catalog();

  Batch NewBatch() { return Batch(this); }
  // Writes the batch durably (WAL fsync) and atomically.
  // `sync` false: durable once a later synced commit returns (RocksDB's WAL is ordered), for
  // statistics that may lag after a crash.
  absl::Status Commit(Batch& batch, bool sync = true);
  // Flushes every column family's memtable to SST files and compacts each whole, so that
  // RocksDB writes new SST, MANIFEST and WAL files (tests use it to check their modes).
  absl::Status FlushAndCompact();

  // Calls `fn` with every chunk's key and record, in key order, the records decoded without their
  // token ids (ChunkRecord::tokens is empty; GetChunk reads them). The record passed is reused
  // from call to call. Stops at, and returns, the first error: fn's, or DataLoss naming a chunk
  // whose key or record does not decode.
  using ChunkFn = std::function<absl::Status(const ChunkKey& key, const ChunkRecord& record)>;
  absl::Status ScanChunks(const ChunkFn& fn);
  // RocksDB's sequence number of the last write, and the database's identity: together they name
  // the catalog's state (the index snapshot is valid for one state only).
  uint64_t LatestSequence();
  std::string Identity();
  // RocksDB's estimate of the number of chunks (for sizing tables; may be off either way).
  uint64_t EstimateChunks();

  // One chunk's full record (token ids included), read from the catalog.
  absl::StatusOr<ChunkRecord> GetChunk(const ChunkKey& key);
  // The records of `keys`, decoded without their token ids, read in one batch (RocksDB's
  // MultiGet, through the block cache): calls `fn` with each key's index in `keys`, its status and
  // its record, in `keys`' order (the record passed is reused from call to call). A key's status
  // is OK, NotFound (no record) or DataLoss (its record does not decode; `record` is then
  // unspecified). Returns fn's first error, or the mapped I/O error of a read.
  using IndexedChunkFn = std::function<absl::Status(size_t index, const absl::Status& status,
                                                    const ChunkRecord& record)>;
  absl::Status GetChunks(std::span<const ChunkKey> keys, const IndexedChunkFn& fn);
  // Makes every write so far durable, those committed with sync = false included.
  absl::Status SyncWal();
  // Whether a Commit failed since the catalog was opened (the in-memory index may then disagree
  // with it: the index snapshot is not written).
  bool CommitFailed() const { return commit_failed_.load(std::memory_order_relaxed); }

  // RocksDB's block cache, shared by the column families: what Get and GetChunks read is kept
  // here, and nothing else of the catalog's records stays in memory.
  static constexpr size_t kBlockCacheBytes = size_t{32} << 20;

  // Bytes of RocksDB's table files plus memtables (an estimate, for reporting).
  uint64_t ApproximateBytes();

 private:
  Catalog() = default;
  static absl::Status CreateEmpty(const std::string& dir, io::FileSystem* fs, Clock* clock);
  static absl::StatusOr<std::unique_ptr<Catalog>> OpenDb(const std::string& dir, bool create,
                                                         io::FileSystem* fs,
                                                         bool read_only = false);
  absl::Status Load(Contents* contents);
  // RocksDB's Env with PrivateFileSystem (io/private_file_system.h): files 0600,
  // directories 0700. Declared before db_ so that it outlives the DB.
  std::unique_ptr<rocksdb::Env> env_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // indexes: see kCfIndex in catalog.cc
  std::string dir_;
  std::atomic<bool> commit_failed_{false};
};

// Maps a RocksDB status to absl, with `context` naming the operation.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view context);

}  // namespace ckv::storage

#endif  // CKV_STORAGE_CATALOG_H_
