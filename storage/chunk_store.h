// SPDX-License-Identifier: Apache-2.0
// storage/chunk_store.h: the ContiguousChunk store: chunks on segment files, named by the catalog.
//
// ChunkStore keeps what ckv::Engine promises about data at rest (see include/ckv/engine.h; the
// engine owns a ChunkStore and forwards to it): dedup by hash-chained chunk keys,
// durable-before-visible Puts, checksums on every read, the hard disk cap with score-ordered
// eviction of leaves, and reclamation of orphaned space on open. It knows nothing of the Engine,
// its options or sessions: it is opened with StoreOptions and reports StoreStats.
//
// The implementation is split by concern: chunk_store.cc (open, lookup, pins, checked reads,
// listings), chunk_store_put.cc, chunk_store_evict.cc (capacity, eviction, removal, usage),
// chunk_store_reclaim.cc (the background reclaimer that evicts ahead of need, so step 1 below
// rarely has to evict), chunk_store_snapshot.cc (the index a clean close leaves), and the
// StoreChecker (store_checker.h: verify, repair, gc), a class of its own that works on the
// store's state under its lock.
//
// Life of a Put:
//   1. under mu_: find the stored leading chunks; mark the new ones in flight (a concurrent Put of
//      the same chunks waits); hold the parent so nothing removes it; take the free slots of
//      this model that the reclaimer freed without punching (to write over: their blocks exist
//      and are counted); evict to make room for the rest (one synced catalog batch, then the
//      slots are punched); allocate slots for the rest, creating segments.
//   2. unlocked: lease a lane of the store's staging pool (waiting while every lane is leased),
//      copy each record into its reused, pre-faulted buffers, checksum it, write with the lane's
//      IoQueue (io_uring with registered buffers, O_DIRECT), refilling a buffer as its write
//      completes (with put_direct_writes, aligned K/V go straight from the caller's tensors as
//      gathered writes instead); fdatasync every segment written. Staging memory is bounded by
//      put_staging_bytes whatever the Puts' number and size.
//   3. under mu_: one synced catalog batch names the chunks, the prefix and the counters; only
//      then are the chunks published in memory and visible to Lookup and reads.
// A failure at any step frees the slots (punched; slots taken from unpunched_ that were not yet
// written go back there) and leaves the catalog as it was.
//
// Readers pin the slot they read; a chunk removed while pinned keeps its slot until unpinned, so
// a slot is never reused under a reader.
//
// Thread-safety: thread-safe. mu_ guards the in-memory index; data I/O runs outside it.
#ifndef CKV_STORAGE_CHUNK_STORE_H_
#define CKV_STORAGE_CHUNK_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ckv/chunk_key.h"
#include "ckv/kv.h"
#include "ckv/log.h"
#include "ckv/model_spec.h"
#include "ckv/record_layout.h"
#include "ckv/reports.h"
#include "ckv/stats.h"
#include "common/clock.h"
#include "common/latency_window.h"
#include "io/file_system.h"
#include "io/staging_pool.h"
#include "storage/catalog.h"
#include "storage/chunk_table.h"
#include "storage/eviction_policy.h"
#include "storage/segment.h"

namespace ckv::storage {

// How a ChunkStore is opened: the storage part of ckv::EngineOptions, which documents each field
// (ckv/options.h); the engine fills it from the EngineOptions it was opened with.
struct StoreOptions {
  bool create_if_missing = true;
  bool error_if_exists = false;
  std::optional<uint64_t> max_disk_bytes;
  std::optional<RecordLayout> layout;
  uint32_t period_layers = 8;
  uint64_t segment_bytes = 16ull << 30;
  // Used when file_system is null: the backend of the POSIX file system.
  IoBackend io_backend = IoBackend::kAuto;
  uint32_t io_queue_depth = 16;
  uint32_t max_write_bytes = 2u << 20;
  // Staging memory of all Puts together (EngineOptions::put_staging_bytes).
  uint64_t put_staging_bytes = 32ull << 20;
  // Write aligned records straight from the caller's tensors (EngineOptions::put_direct_writes).
  bool put_direct_writes = false;
  // nullptr = the POSIX file system with io_backend. Not owned; must outlive the store.
  io::FileSystem* file_system = nullptr;
  // A read-only view of a store another process may hold for writing (Engine::OpenReadOnly):
  // the catalog as committed when the view opened, read through RocksDB's read-only instance;
  // segment files opened read-only; nothing created, written, punched or reclaimed, on open,
  // while open or on close. Put, Delete, Repair, Gc and usage updates fail with
  // FailedPrecondition. Ignores create_if_missing, error_if_exists, max_disk_bytes and layout.
  bool read_only = false;
  // nullptr = stderr. Not owned; must outlive the store.
  Logger* logger = nullptr;
  // The time the store reads: the creation times it records (catalog, segments, prefixes).
  // Sessions and the engine's read engine read it too. Not owned; must outlive the store.
  // Default (or nullptr): the real clock.
  Clock* clock = RealClock();

  // ---- Background reclaimer (storage/chunk_store_reclaim.cc) ----
  // Free space, in bytes, the reclaimer keeps under max_disk_bytes by evicting ahead of need, so
  // that Puts rarely evict inline. Unset = max(64 MiB, 5% of the cap), at most 1/8 of the cap;
  // 0 = no reclaimer (every Put that needs room evicts inline). Ignored
  // without a cap. Default: unset.
  std::optional<uint64_t> reclaim_margin_bytes;
  // Run the reclaimer on a thread of the store's (woken when a Put leaves less than half the
  // margin free). false: rounds run only when ReclaimNow() is called (deterministic tests).
  // Default: true.
  bool reclaim_in_background = true;
};

// What the store has done and holds: the public ckv::StoreStats, the storage part of
// ckv::EngineStats; ckv/stats.h (CKV_STORE_STATS_FIELDS) lists and documents each field.
using StoreStats = ::ckv::StoreStats;

// Records a Put stores for each chunk besides its layers' records: the engine's key summaries.
// Storage does not interpret them; it places, checksums, reads and frees them with the chunk.
struct AuxRecords {
  // Bytes of each auxiliary record, in order. 1..16 records of 1 B..1 GiB each.
  std::vector<uint32_t> record_bytes;
  // Fills the auxiliary records of chunk `chunk` (its index in the Put's prefix): out[a] has
  // record_bytes[a] bytes. Called once per new chunk, on a thread of the store's, while the
  // Put's data is being written; the Put waits for it.
  std::function<void(size_t chunk, std::span<const std::span<std::byte>> out)> fill;
};

class ChunkStore;
class StoreChecker;

// Chunks pinned for reading: while the handle lives, their slots are not reused, even if the
// chunks are deleted or evicted meanwhile, so the locations it gives stay valid. Thread-safe to
// read from any thread; destroyed once (unpins).
class PinnedChunks {
 public:
  struct Chunk {
    ChunkKey key;
    Segment* segment = nullptr;
    uint32_t slot = 0;
    std::span<const uint64_t> checksums;  // per record: layers, then auxiliary records (read
                                          // from the catalog when pinned; the handle's)
    double importance = 0;                // I and F when pinned
    uint64_t loads = 0;
  };
  // Where one record is, and how to check it.
  struct Location {
    io::File* file = nullptr;
    uint64_t offset = 0;
    uint32_t length = 0;    // record bytes
    uint32_t stride = 0;    // bytes between this record and the next slot's same record
    uint64_t checksum = 0;  // XXH3-64 of the record bytes
  };

  ~PinnedChunks();
  PinnedChunks(const PinnedChunks&) = delete;
  PinnedChunks& operator=(const PinnedChunks&) = delete;

  const std::vector<Chunk>& chunks() const { return chunks_; }
  // REQUIRES: chunk < chunks().size(), record < that chunk's segment's records().
  Location RecordAt(size_t chunk, uint32_t record) const;
  // The record's read, ready for the I/O layer: its offset, its length padded to the file's
  // alignment, and its checksum over the record's bytes. Same REQUIRES as RecordAt.
  io::FileRead ReadOf(size_t chunk, uint32_t record) const;
  // Bytes [from, from + bytes) of the record, read as the aligned blocks around them (`skip` says
  // where they start); unverified: the record's checksum covers the whole record. REQUIRES as
  // RecordAt, and from + bytes <= the record's length.
  io::FileRead PartOf(size_t chunk, uint32_t record, uint32_t from, uint32_t bytes) const;

 private:
  friend class ChunkStore;
  friend class StoreChecker;
  PinnedChunks(ChunkStore* store, std::vector<Chunk> chunks)
      : store_(store), chunks_(std::move(chunks)) {}
  ChunkStore* store_;
  std::vector<Chunk> chunks_;
  std::vector<uint64_t> checksums_;  // what chunks_[i].checksums view
};

class ChunkStore {
 public:
  // Opens (or creates, per options) the store in directory `path`; errors as ckv::Engine::Open.
  static absl::StatusOr<std::unique_ptr<ChunkStore>> Open(const StoreOptions& options,
                                                          const std::string& path);
  ~ChunkStore();

  // The last resort of the tools that free space (kvctl rm and gc) on a file system too full
  // for the store to open (RocksDB writes a MANIFEST, an OPTIONS file and a WAL when it opens,
  // and this open may write the index snapshot's removal and a catalog batch). Under the store's
  // lock (the catalog's LOCK, as an open store holds it), with a read-only view of the catalog
  // and without writing a byte, it gives back blocks: those of every free slot that still holds
  // them, those of the chunks a DeletePrefix of each of `delete_prefixes` would remove (their
  // records read as zeros from then on: a read of one that is not removed after all is DataLoss,
  // never wrong bytes; Verify reports it and Repair removes it), and the index snapshot file
  // (the next open reads the catalog instead). Returns the bytes given back. Errors as Open, and
  // NotFound for a prefix not stored; Unavailable when another engine holds the store.
  static absl::StatusOr<uint64_t> FreeSpaceToOpen(const StoreOptions& options,
                                                  const std::string& path,
                                                  std::span<const ChunkKey> delete_prefixes);

  // `aux` (optional) adds auxiliary records to each new chunk. Chunks are placed only in
  // segments whose auxiliary records have the same sizes. Put times itself, from call to return,
  // into the put latency of Stats() when it returns OK; `latency_ns` (optional) then receives that
  // same measurement, for a caller that reports Put latency too (Engine::Put's histogram), so
  // that both report one timing.
  absl::StatusOr<PutResult> Put(const ModelSpec& spec, std::span<const int32_t> tokens,
                                const KvTensors& kv, const AuxRecords* aux = nullptr,
                                int64_t* latency_ns = nullptr);
  // The leading whole chunks of `tokens` stored. `touch` marks them used now (their recency, which
  // eviction reads); Engine::Probe, which must change nothing, passes false.
  absl::StatusOr<uint64_t> Lookup(const ModelSpec& spec, std::span<const int32_t> tokens,
                                  bool touch = true);
  absl::Status ReadRecord(const ModelSpec& spec, const ChunkKey& key, uint32_t layer,
                          std::span<std::byte> out);
  absl::Status Delete(const ModelSpec& spec, std::span<const int32_t> tokens);
  absl::Status DeletePrefix(const ChunkKey& prefix_id);
  std::vector<PrefixInfo> ListPrefixes();
  absl::StatusOr<std::vector<ChunkKey>> PrefixChunks(const ChunkKey& prefix_id, ModelSpec* spec);
  absl::StatusOr<PrefixDescription> DescribePrefix(const ChunkKey& prefix_id);
  // Verify, Repair and Gc run a StoreChecker (storage/store_checker.h).
  absl::StatusOr<VerifyReport> Verify(const ProgressFn& progress);
  // Verify, with `failed` given the chunks that failed a check (a read-only view checks them
  // again against a newer view: the writer may have evicted them while they were read).
  absl::StatusOr<VerifyReport> Verify(const ProgressFn& progress,
                                      absl::flat_hash_set<ChunkKey>* failed);
  absl::StatusOr<RepairReport> Repair(const ProgressFn& progress);
  absl::StatusOr<GcReport> Gc();
  StoreStats Stats();
  // Moves the use clock `ticks` uses on, as that many uses would (for tests of its rebase).
  void SkipUseTicksForTesting(uint64_t ticks);
  // Called by ReadChecksums (every pin: Pin, PinLeading, ReadRecord, Verify) between pinning
  // (under the store's lock) and reading the checksums from the catalog (without it), for tests
  // of what happens in that window. Set it before any pin; null = none.
  void SetPinWindowHookForTesting(std::function<void()> hook) {
    pin_window_hook_ = std::move(hook);
  }
  // The clock the store reads (StoreOptions::clock); never null.
  Clock* clock() const { return options_.clock; }

  // Reads auxiliary record `aux` of each chunk in `keys` into `out` (keys.size() records of
  // the same size, back to back) and verifies their checksums. Records of consecutive slots are
  // read together, up to max_io_bytes per read, queue depth reads in flight: the summaries of a
  // prefix written by one Put take a few large reads. Errors: NotFound for a chunk not stored or
  // stored without auxiliary record `aux`; FailedPrecondition for a chunk of another spec;
  // InvalidArgument when the records differ in size or `out` has the wrong size; DataLoss on a
  // checksum mismatch.
  absl::Status ReadAux(const ModelSpec& spec, std::span<const ChunkKey> keys, uint32_t aux,
                       std::span<std::byte> out, uint64_t max_io_bytes = 1 << 20);
  // As above, for chunks `which` (indices into pinned.chunks()) of chunks already pinned under
  // `spec`: no second lookup, so a Delete since the pin cannot fail the read. Errors as above,
  // less NotFound for a chunk not stored and FailedPrecondition.
  absl::Status ReadAux(const ModelSpec& spec, const PinnedChunks& pinned,
                       std::span<const size_t> which, uint32_t aux, std::span<std::byte> out,
                       uint64_t max_io_bytes = 1 << 20);
  // Pins `keys` (a prefix's chunks, say) for reading. Errors: NotFound naming the first chunk not
  // stored; FailedPrecondition for one stored under another spec.
  absl::StatusOr<std::unique_ptr<PinnedChunks>> Pin(const ModelSpec& spec,
                                                    std::span<const ChunkKey> keys);
  // Pins the longest stored leading run of `keys` (a prompt's chunk keys), atomically: no Delete
  // can slip between finding the chunks and pinning them.
  absl::StatusOr<std::unique_ptr<PinnedChunks>> PinLeading(const ModelSpec& spec,
                                                           std::span<const ChunkKey> keys);

  // Adds attention importance (I) and loads (F) to chunks, in memory and in the catalog (one
  // batch, not synced: a crash may lose the latest additions, never a chunk). Chunks no longer
  // stored are skipped.
  struct Usage {
    ChunkKey key;
    double importance = 0;
    uint64_t loads = 0;
  };
  absl::Status AddUsage(std::span<const Usage> usage);
  // Sets every chunk's I and F back to 0 (one synced batch): the benchmark harness starts each
  // system from the same history. Returns the number of chunks it changed.
  absl::StatusOr<uint64_t> ResetUsage();

  // Called with each chunk that leaves the store (Delete, eviction to make room, Repair) once its
  // removal is committed, under the store's lock: it must be quick and must not call back into
  // the ChunkStore. The engine erases the chunk from its tiers with it. Replaces any earlier
  // listener; nullptr removes it.
  using RemovalListener = std::function<void(const ChunkKey&)>;
  void SetRemovalListener(RemovalListener listener);

  // Test-only event stream of removals (the eviction ledger of the crash tests): every batch of
  // chunks that leaves the store (eviction to make room, Delete, Repair) is reported twice, under
  // the store's lock, with the same keys: kCommitting just before its catalog batch is committed,
  // kCommitted once it is. After a crash, a chunk that is gone must be in a batch reported
  // kCommitting, and a batch reported kCommitting but not kCommitted is entirely gone or entirely
  // there. The observer must be quick and must not call back into the ChunkStore. Replaces any
  // earlier observer; nullptr removes it.
  struct RemovalEvent {
    enum class Phase { kCommitting, kCommitted };
    Phase phase;
    const std::vector<ChunkKey>& keys;
  };
  using RemovalObserver = std::function<void(const RemovalEvent&)>;
  void SetRemovalObserver(RemovalObserver observer);

  // Bytes of auxiliary record `aux` of chunk `key`, or NotFound.
  absl::StatusOr<uint32_t> AuxBytes(const ChunkKey& key, uint32_t aux);

  // Where a chunk's record lives (for tests that corrupt a byte and for kvctl show). `record` is
  // a layer, or layers + a for auxiliary record a.
  struct RecordLocation {
    std::string segment_path;
    uint64_t offset = 0;
    uint64_t length = 0;  // record bytes (without padding)
  };
  absl::StatusOr<RecordLocation> LocateRecord(const ChunkKey& key, uint32_t record);

  // ---- Background reclaimer (storage/chunk_store_reclaim.cc) ----
  // Runs reclaim rounds on the calling thread (after any round in progress) until the margin is
  // free or nothing more can be evicted; returns the bytes freed (kept for Puts to write over,
  // not punched: see chunk_store_reclaim.cc). A no-op without a cap or
  // with a margin of 0. For tests and tools; the store's own thread does this after Puts.
  absl::StatusOr<uint64_t> ReclaimNow();
  // Blocks until the reclaimer thread has no round running and no wake-up pending (returns at
  // once without the thread). For tests: after it, Stats() shows the margin kept.
  void WaitForReclaimIdle();

 private:
  friend class StoreChecker;  // Verify, Repair and Gc (storage/store_checker.h)
  // One per stored chunk, 32 bytes (48 with its key in chunks_): what lookup, eviction order and
  // the cap need, and nothing else. The records' checksums are not kept in memory: a read takes
  // them from the catalog (ReadChecksums); nor is the depth, which the parent links give. Puts
  // extending a chunk pin it in put_pins_.
  struct ChunkEntry {
    static constexpr uint32_t kRoot = UINT32_MAX;            // the first chunk of its prefixes
    static constexpr uint32_t kLostParent = UINT32_MAX - 1;  // its parent is not stored: the
                                                             // key is in lost_parents_
    uint32_t last_use = 0;    // when last used: UseTickLocked's stamp
    uint32_t parent = kRoot;  // the parent's id in chunks_ (ParentKeyLocked)
    uint32_t segment = 0;
    uint32_t slot = 0;
    uint32_t children = 0;    // stored chunks whose parent this is (derived on open)
    float importance = 0;     // I (the catalog's record holds it as a double)
    uint32_t loads = 0;       // F, saturating
    uint16_t spec = 0;        // its spec's fingerprint, as an ordinal (FingerprintOf)
    bool prefix_end = false;  // a stored prefix ends here
  };
  static_assert(sizeof(ChunkEntry) <= 32, "the index's entry grew (64 B per chunk)");
  struct PrefixEntry {
    ChunkKey fingerprint;
    uint64_t chunks = 0;
    int64_t created_unix_ms = 0;
  };
  // A run of slots in one segment holding new chunks [first, first + run.count) of a Put.
  struct PlannedRun {
    Segment* segment = nullptr;
    SlotRun run;
    size_t first = 0;   // index into the Put's new chunks
    bool kept = false;  // unpunched slots written over: their blocks are allocated already
  };
  struct SegmentRun {
    Segment* segment = nullptr;
    SlotRun run;
  };
  using SlotId = std::pair<uint32_t, uint32_t>;  // segment, slot

  ChunkStore(const StoreOptions& options, std::string path, io::FileSystem* fs, Logger* logger);
  // Open's read-only path (StoreOptions::read_only).
  static absl::StatusOr<std::unique_ptr<ChunkStore>> OpenReadOnly(const StoreOptions& options,
                                                                  const std::string& path);
  // FailedPrecondition naming `op` when this is a read-only view; OK otherwise.
  absl::Status RefuseIfReadOnly(std::string_view op) const;

  // Indexes the catalog's chunks: from the index snapshot when `use_snapshot` and it matches the
  // catalog, else by a scan. *snapshot_failed: the snapshot matched but did not load (the store
  // is then half-loaded; Open starts again without it).
  absl::Status Load(const Catalog::Contents& contents, bool use_snapshot, bool* snapshot_failed);
  // The index snapshot (storage/chunk_store_snapshot.cc). Write: at a clean close, when the index
  // is sound. Load: *loaded false when there is none or it does not match the catalog (nothing
  // changed); an error when it matched but a record did not fit (the index is half-built).
  std::string SnapshotPath() const;
  absl::Status WriteIndexSnapshot() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LoadIndexSnapshotLocked(bool* loaded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool snapshot_on_close_ = false;         // set once Open succeeded
  std::function<void()> pin_window_hook_;  // SetPinWindowHookForTesting
  bool index_from_snapshot_ = false;       // set by Load
  // Load's scan of the catalog: every chunk's record, indexed, then linked to its parent.
  absl::Status ScanCatalogLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What Load keeps of a chunk's record until every chunk is in, by its id in chunks_.
  struct LoadLink {
    ChunkKey parent;
    uint64_t put_seq = 0;  // the initial use order
  };
  // Indexes one chunk of the catalog, or records why it cannot be served; its LoadLink goes to
  // links[its id in chunks_].
  void LoadChunkLocked(const ChunkKey& key, const ChunkRecord& record, std::vector<LoadLink>& links)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReclaimOrphans();
  // Punches the free runs of `segment` when it holds more blocks than its live chunks need;
  // returns the bytes given back. REQUIRES: mu_ held (the free runs must not change).
  static absl::StatusOr<uint64_t> PunchFreeRuns(Segment& segment);
  static absl::Status ValidatePut(const ModelSpec& spec, std::span<const int32_t> tokens,
                                  const KvTensors& kv);
  static absl::Status ValidateAux(const AuxRecords* aux);

  // The steps of a Put (see "Life of a Put" above), in chunk_store_put.cc.
  struct PendingPut;
  // Step 1: waits for Puts of the same chunks, finds the stored leading ones, and reserves room
  // and slots for the rest (marked in flight, the parent pinned). With every chunk stored it
  // records the prefix end and sets *all_stored instead.
  absl::Status ReservePutLocked(PendingPut& put, bool* all_stored)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommitStoredPrefixLocked(PendingPut& put) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Step 2, unlocked: computes the auxiliary records, writes all records and syncs them.
  // *still_needed: set, when the file system is full, to the bytes of blocks the Put had not
  // reserved yet.
  absl::Status WritePut(const PendingPut& put, const KvTensors& kv, const AuxRecords* aux,
                        std::vector<std::vector<uint64_t>>* checksums, uint64_t* bytes_written,
                        uint64_t* still_needed);
  // Step 3: when `written` is OK, commits the catalog batch naming the chunks and publishes
  // them; otherwise, or when the commit fails, frees the plan's slots. Ends the in-flight mark.
  absl::StatusOr<PutResult> CommitPutLocked(PendingPut& put, absl::Status written,
                                            std::vector<std::vector<uint64_t>>& checksums,
                                            uint64_t bytes_written)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The bytes of chunk data that fit under max_disk_bytes once the file system's metadata for
  // the segment files is allowed for. REQUIRES: max_disk_bytes_ > 0.
  uint64_t DataCapLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The segments a Put of one model writes into: its fingerprint, the store's layout and the
  // model's auxiliary records.
  struct SlotOwner {
    ChunkKey fingerprint;
    const std::vector<uint32_t>* aux_bytes = nullptr;
    size_t slots = 0;  // how many slots the Put still needs (MakeRoomLocked keeps at most these)
  };
  bool OwnsLocked(const SlotOwner& owner, const Segment& segment) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts leaves until `need` more bytes fit under the cap. Commits the removal. With `owner`
  // (a Put's), up to owner->slots evicted slots of the owner's segments are not punched but kept
  // (unpunched_) for that Put to write over, and count as room for it; the rest are punched.
  absl::Status MakeRoomLocked(uint64_t need, uint64_t* evicted, const SlotOwner* owner = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `victims` (each a leaf once the ones before it are gone) from the catalog and from
  // memory, moving prefix ends to parents that become leaves. `batch` may carry more changes.
  // Why chunks go: eviction and repair hand a removed prefix end on to the surviving parent; a
  // delete does not. Eviction counts as evicted, the others as deleted.
  enum class Removal { kEvict, kDelete, kRepair };
  // The removed chunks' slots are punched and freed (batched per run), or, with `unpunched`,
  // left allocated and appended there for the caller (the reclaimer keeps them unpunched).
  absl::Status RemoveChunksLocked(const std::vector<ChunkKey>& victims, Catalog::Batch& batch,
                                  Removal why, std::vector<SlotId>* unpunched = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeSlotLocked(uint32_t segment, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when a Put extends the chunk, a Put is writing it, or a reader holds its slot.
  bool HeldLocked(const ChunkKey& key, const ChunkEntry& e) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: the record's fingerprint has an ordinal (FingerprintOrdinalLocked).
  ChunkEntry EntryFromRecordLocked(const ChunkRecord& record, uint32_t last_use)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fingerprints of the specs chunks are stored under, by ordinal (ChunkEntry::spec): a
  // chunk's entry holds 2 bytes instead of 16. The ordinal of `fp`, given one if it has none;
  // ResourceExhausted when 65,536 fingerprints have one already.
  absl::StatusOr<uint16_t> FingerprintOrdinalLocked(const ChunkKey& fp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when `fp` has an ordinal or one is left for it; the error FingerprintOrdinalLocked would
  // give otherwise. Gives none.
  absl::Status CheckFingerprintOrdinalLocked(const ChunkKey& fp) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const ChunkKey& FingerprintOf(const ChunkEntry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return fingerprints_[e.spec];
  }
  // The key of the parent of chunk `key` (entry `e`): zero for a first chunk; for a chunk whose
  // parent is not stored (a damaged catalog), the key its record names.
  ChunkKey ParentKeyLocked(const ChunkKey& key, const ChunkEntry& e) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The chunks from the first of its prefixes to `key`, `key` included, as the parent links give
  // them (up to a lost parent): O(that length). 0 when `key` is not stored.
  uint64_t ChainLengthLocked(const ChunkKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts extending a chunk (it must not be removed meanwhile), by chunk; absent = none.
  absl::flat_hash_map<ChunkKey, uint32_t> put_pins_ ABSL_GUARDED_BY(mu_);
  void PutUnpinLocked(const ChunkKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases a Put's pin of keys[m - 1] (m > 0), or, when `s` says the file system was full,
  // keeps it and sets put.pin_handed_over (RetryOnFullDisk releases it once its retries are done).
  void ReleaseOrHandOverPinLocked(PendingPut& put, const absl::Status& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The parents named by chunks whose parent is not stored (ChunkEntry::kLostParent).
  absl::flat_hash_map<ChunkKey, ChunkKey> lost_parents_ ABSL_GUARDED_BY(mu_);
  // Counts the removals of chunks. A chunk stored again after a removal may sit in the same slot
  // under the same key: a usage update that read records before a removal reads them again.
  uint64_t removals_ ABSL_GUARDED_BY(mu_) = 0;
  // The catalog's full records of `keys`, as (index in keys, record); those not found skipped.
  absl::StatusOr<std::vector<std::pair<size_t, ChunkRecord>>> ReadRecords(
      std::span<const ChunkKey> keys);
  // ReadRecords for an update of the records under mu_: reads them with mu_ released, and again
  // with it held when a chunk was removed meanwhile (removals_), so that each record read is the
  // one of the chunk stored now. REQUIRES: mu_ held (released and taken again).
  absl::Status ReadRecordsForUpdateLocked(std::span<const ChunkKey> keys,
                                          std::vector<std::pair<size_t, ChunkRecord>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<ChunkKey> fingerprints_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ChunkKey, uint16_t> fingerprint_ordinals_ ABSL_GUARDED_BY(mu_);
  absl::Status AllocateLocked(const ModelSpec& spec, const std::vector<uint32_t>& aux_bytes,
                              size_t count, std::vector<PlannedRun>* plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Segment*> NewSegmentLocked(const ModelSpec& spec,
                                            const std::vector<uint32_t>& aux_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the slots of a Put's plan and punches them. `counted`: the plan's bytes are in
  // used_bytes_ (the Put had reserved them); they leave it, except for runs whose punch failed,
  // which stay counted and wait in unpunched_. Not counted: kept runs (taken from unpunched_,
  // not written yet) go back to unpunched_ unpunched, counted again.
  void ReleasePlanLocked(const std::vector<PlannedRun>& plan, bool counted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Punches free slots that still hold blocks (unpunched_), one PunchSlots per run, until at
  // least `enough` bytes are given back (all of them by default); each run that succeeds leaves
  // used_bytes_. Returns the bytes given back, or the first error.
  absl::StatusOr<uint64_t> RetryPunchesLocked(uint64_t enough = UINT64_MAX)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // `aux_data[a]` holds auxiliary record a of every new chunk, back to back; `aux_ready` is
  // waited for before the first auxiliary band is written.
  absl::Status WriteChunks(const ModelSpec& spec, const KvTensors& kv, size_t first_chunk,
                           const std::vector<PlannedRun>& plan,
                           const std::vector<std::vector<std::byte>>& aux_data,
                           const std::function<void()>& aux_ready,
                           std::vector<std::vector<uint64_t>>* checksums, uint64_t* bytes_written,
                           uint64_t* still_needed);

  friend class PinnedChunks;
  absl::StatusOr<std::unique_ptr<PinnedChunks>> PinLocked(const ModelSpec& spec,
                                                          std::span<const ChunkKey> keys)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pins / unpins the slot of a chunk being read.
  void PinLocked(SlotId slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the records' checksums of `pinned`'s chunks from the catalog, in one batch, into the
  // handle. The chunks whose checksums it could not give go to *unusable, in order, with why:
  // NotFound for one removed since it was pinned (its record is gone, or names another slot, and
  // the index no longer holds it at the pinned slot); DataLoss for a damaged record (one that
  // does not decode, names another slot or holds another number of checksums than its segment
  // has records, while the index holds the chunk at the pinned slot). Errors: the catalog's I/O
  // errors. REQUIRES: mu_ not held.
  absl::Status ReadChecksums(PinnedChunks& pinned,
                             std::vector<std::pair<size_t, absl::Status>>* unusable)
      ABSL_LOCKS_EXCLUDED(mu_);
  // DataLoss unless `record`, the catalog's for `key`, places it at `slot` of `segment` with one
  // checksum per record of the segment.
  static absl::Status CheckPlace(const ChunkKey& key, const ChunkRecord& record,
                                 const Segment& segment, uint32_t slot);
  void Unpin(SlotId slot);
  // "9f3c…/L7" or "9f3c…/aux0".
  static std::string RecordName(const Segment& seg, const ChunkKey& key, uint32_t record);
  // Checks a record's bytes against its checksum; DataLoss naming it on a mismatch.
  absl::Status CheckRecord(const Segment& seg, uint32_t slot, uint32_t record, uint64_t expected,
                           const ChunkKey& key, const std::byte* data);
  // One band of one chunk to read and check (ReadBands).
  struct BandRead {
    Segment* seg = nullptr;
    uint32_t slot = 0;
    uint32_t band = 0;
    const ChunkKey* key = nullptr;
    std::span<const uint64_t> checksums;  // the chunk's, all records
    size_t tag = 0;                       // the caller's
  };
  // Called for every record of every band read: its status (the read's error, `read_failed`
  // true, or the checksum check's result) and, when OK, its bytes.
  using RecordFn =
      std::function<void(const BandRead& read, uint32_t record, const absl::Status& status,
                         bool read_failed, const std::byte* data)>;
  // Reads the given bands, the bands of consecutive slots of one segment together (up to
  // max_io_bytes per read, io_queue_depth reads in flight), and checks every record. The caller
  // pins the slots. Returns an error only when the reads could not be issued.
  absl::Status ReadBands(std::vector<BandRead> reads, uint64_t max_io_bytes,
                         const RecordFn& on_record);
  absl::Status ReadAndVerify(Segment* segment, uint32_t slot, uint32_t record,
                             uint64_t expected_checksum, const ChunkKey& key,
                             std::span<std::byte> out);

  // Bytes a chunk of `spec` with auxiliary records of `aux_bytes` occupies in a new segment.
  uint64_t ChunkBytesOf(const ModelSpec& spec, const std::vector<uint32_t>& aux_bytes) const;
  std::string SegmentPath(uint32_t id) const;
  // Wall-clock milliseconds since the Unix epoch, from options_.clock (catalog timestamps).
  int64_t NowMs() const { return absl::ToUnixMillis(options_.clock->Now()); }
  PrefixInfo MakePrefixInfo(const ChunkKey& id, const PrefixEntry& p) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StoreOptions options_;
  const std::string path_;
  io::FileSystem* const fs_;
  Logger* const logger_;
  std::unique_ptr<Catalog> catalog_;

  mutable absl::Mutex mu_;
  RemovalListener removal_listener_ ABSL_GUARDED_BY(mu_);
  RemovalObserver removal_observer_ ABSL_GUARDED_BY(mu_);
  absl::CondVar inflight_cv_;
  ChunkTable<ChunkEntry> chunks_ ABSL_GUARDED_BY(mu_);
  // The stored chunks no stored chunk names as its parent (children == 0): the only chunks
  // eviction may remove, so that planning an eviction looks at them and not at every chunk.
  absl::flat_hash_set<ChunkKey> leaves_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ChunkKey, PrefixEntry> prefixes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ChunkKey, ModelSpec> specs_ ABSL_GUARDED_BY(mu_);  // by fingerprint
  absl::flat_hash_map<uint32_t, std::unique_ptr<Segment>> segments_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<ChunkKey> inflight_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SlotId, uint32_t> read_pins_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<SlotId> deferred_free_ ABSL_GUARDED_BY(mu_);  // removed while pinned
  // Free slots that still hold their blocks: the reclaimer's (kept for the next Puts of their
  // model to write over) and those whose punch failed. They stay counted in used_bytes_ (the cap
  // is on allocated bytes) until a Put reuses them or a punch gives them back.
  absl::flat_hash_set<SlotId> unpunched_ ABSL_GUARDED_BY(mu_);
  uint64_t unpunched_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // their bytes
  // Adds / removes unpunched slots, keeping unpunched_bytes_. Take of a slot returns whether it
  // was one; take of a run requires that every slot of it was.
  void KeepUnpunchedLocked(const Segment& segment, SlotRun run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool TakeUnpunchedLocked(const Segment& segment, uint32_t slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeUnpunchedLocked(const Segment& segment, SlotRun run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Plans up to `count` of the unpunched slots of the owner's segments for a Put (longest runs
  // first), takes them out of unpunched_ and used_bytes_, and returns how many.
  size_t PlanUnpunchedLocked(const SlotOwner& owner, size_t count, std::vector<PlannedRun>* plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The runs of consecutive slots of one segment in `slots`.
  std::vector<SegmentRun> RunsOfLocked(std::vector<SlotId> slots) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string last_punch_error_ ABSL_GUARDED_BY(mu_);  // for the refusal's message
  uint32_t next_segment_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Live chunks + in-flight reservations + unpunched_ slots.
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_disk_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  RecordLayout layout_ ABSL_GUARDED_BY(mu_) = RecordLayout::kLayerMajor;
  // The use clock: one tick per use of the store (a Put, Pin, Lookup or read). Entries hold
  // 32-bit stamps, use_clock_ - use_base_; when the clock runs 2^32 ticks past the base, the base
  // moves 2^31 ticks on (RebaseUseLocked) and stamps older than the new base become 0: chunks
  // unused for over 2^31 uses tie as the least recent, and the eviction order breaks the tie.
  uint64_t use_clock_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t use_base_ ABSL_GUARDED_BY(mu_) = 0;
  static constexpr uint64_t kUseRebase = uint64_t{1} << 31;
  // Advances the clock by one tick and returns its stamp.
  uint32_t UseTickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stamp of tick `tick` (0 when before the base).
  uint32_t UseStampLocked(uint64_t tick) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return tick <= use_base_ ? 0 : static_cast<uint32_t>(tick - use_base_);
  }
  void RebaseUseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t put_seq_ ABSL_GUARDED_BY(mu_) = 0;
  StoredCounters counters_ ABSL_GUARDED_BY(mu_);
  uint64_t orphan_bytes_reclaimed_ = 0;       // set during Open
  std::vector<VerifyProblem> open_problems_;  // found while loading; reported by Verify
  // Catalog entries Load could not serve (damaged); Repair deletes them.
  std::vector<ChunkKey> dropped_chunks_ ABSL_GUARDED_BY(mu_);
  std::vector<ChunkKey> dropped_prefixes_ ABSL_GUARDED_BY(mu_);  // ending at no stored chunk

  // ---- Background reclaimer (storage/chunk_store_reclaim.cc) ----
  // Evicts ahead of need: one round, under mu_, picks up to kMaxReclaimVictims leaves in
  // EvictionPolicy order, commits their removal in one synced catalog batch, and frees their
  // slots without punching them (unpunched_), for the next Puts to write over.
  static constexpr size_t kMaxReclaimVictims = 4096;
  // Victims in EvictionPolicy order freeing at least `bytes` where possible, at most
  // `max_victims`. Scans the leaves (leaves_) once into a bounded heap:
  // O(leaves x log max_victims).
  struct EvictionPlan {
    std::vector<ChunkKey> victims;
    uint64_t bytes = 0;
    bool exhausted = false;  // no leaf is left that could be evicted after these
  };
  EvictionPlan PlanEvictionLocked(uint64_t bytes, size_t max_victims) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The margin in force (0 = none).
  uint64_t ReclaimMarginLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether used bytes passed the wake-up mark (less than half the margin free).
  bool ReclaimWantedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the reclaimer thread when ReclaimWantedLocked.
  void KickReclaimerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Punches `slots` (free in no segment yet) one PunchSlots per contiguous run, then frees them
  // and takes their bytes out of used_bytes_; a run whose punch failed stays counted (unpunched_).
  void FreeSlotsLocked(std::vector<SlotId> slots) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One round (see above); `*more` says whether another round could evict more.
  // REQUIRES: reclaim_running_ set by the caller.
  absl::StatusOr<uint64_t> ReclaimRoundLocked(bool* more) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartReclaimer();
  void StopReclaimer();
  void ReclaimLoop();
  absl::CondVar reclaim_cv_;  // signalled on kicks, stop and round ends
  std::thread reclaimer_;
  bool reclaim_stop_ ABSL_GUARDED_BY(mu_) = false;
  bool reclaim_running_ ABSL_GUARDED_BY(mu_) = false;  // a round is in progress
  uint64_t reclaim_kicks_ ABSL_GUARDED_BY(mu_) = 0;    // wake-ups asked for
  uint64_t reclaim_seen_ ABSL_GUARDED_BY(mu_) = 0;     // wake-ups the thread has taken
  uint64_t reclaim_rounds_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reclaim_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reclaim_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t inline_evictions_ ABSL_GUARDED_BY(mu_) = 0;
  // ---- end of the background reclaimer ----
  // ---- Put staging and latency (chunk_store_put.cc) ----
  // What one try of a Put needed: the bytes of the chunks it had to write (0 before it knew),
  // and of those, the ones it had found no room for when the file system said it was full (all
  // of them unless the block reservation got part of the way).
  // A try that failed so (IsNoSpace) with stored leading chunks leaves the last of them pinned
  // (put_pins_) and names it in `pinned`: the caller releases it (PutUnpinLocked).
  struct PutShortfall {
    uint64_t need = 0;
    uint64_t still_needed = 0;
    std::optional<ChunkKey> pinned;
  };
  // One try of a Put: validates it, reserves room (evicting under the cap), writes and commits.
  absl::StatusOr<PutResult> TryPut(const ModelSpec& spec, std::span<const int32_t> tokens,
                                   const KvTensors& kv, const AuxRecords* aux,
                                   PutShortfall* shortfall);
  // Put's one retry policy: runs `try_put`, and while it fails because the file system is full
  // (IsNoSpace) with bytes still to place, gives back about that much disk (FreeDiskLocked) and
  // runs it again, up to kNoSpaceRetries times. Keeps the chains a failed try pinned until it
  // returns. Put times the whole of it.
  absl::StatusOr<PutResult> RetryOnFullDisk(
      const ModelSpec& spec, absl::FunctionRef<absl::StatusOr<PutResult>(PutShortfall*)> try_put);
  // After a Put found the file system full (IsNoSpace): gives back the blocks of about `bytes`
  // bytes, first from free slots that still hold them, then by evicting chunks in score order
  // (their slots punched). Evicts nothing when eviction could not reach `at_least` bytes
  // (ResourceExhausted saying so). Returns the bytes given back; `evicted` counts the chunks
  // evicted.
  absl::StatusOr<uint64_t> FreeDiskLocked(uint64_t bytes, uint64_t at_least, uint64_t* evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t no_space_puts_ ABSL_GUARDED_BY(mu_) = 0;       // Puts that found the disk full
  uint64_t no_space_recovered_ ABSL_GUARDED_BY(mu_) = 0;  // of those, retried and stored
  uint64_t no_space_evictions_ ABSL_GUARDED_BY(mu_) = 0;  // chunks evicted for them
  // Staging buffers and write queues of every Put (io/staging_pool.h).
  std::unique_ptr<io::StagingPool> staging_;
  // Latency of the Puts that returned OK.
  LatencyWindow put_latency_;
  // Bytes written straight from callers' tensors (gathered writes), since Open.
  std::atomic<uint64_t> put_direct_bytes_{0};
  // ---- end of Put staging and latency ----

  std::atomic<uint64_t> records_read_{0};
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> checksum_failures_{0};
};

}  // namespace ckv::storage

#endif  // CKV_STORAGE_CHUNK_STORE_H_
