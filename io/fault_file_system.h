// SPDX-License-Identifier: Apache-2.0
// io/fault_file_system.h: a FileSystem wrapper that injects I/O faults, for tests.
//
// FaultInjectingFileSystem forwards every call to a target FileSystem, as LevelDB's EnvWrapper
// does, and injects faults into the files whose path matches one of its rules, each with the
// rule's probability per operation, drawn from a generator seeded at construction: the same seed
// and the same sequence of operations inject the same faults.
//
//   fault           ops                      the op's Status                      effect
//   kReadEio        ReadAt, queued reads     DataLoss (EIO while reading)         nothing read
//   kShortRead      ReadAt, queued reads     DataLoss "short read of <path> at    the first X bytes
//                                            offset N: got X of Y bytes           are read, the
//                                            (injected)"                          rest untouched
//   kWriteEio       WriteAt, queued writes   Internal (EIO while writing)         nothing written
//   kWriteEnospc    WriteAt, writes, Allocate ResourceExhausted (ENOSPC)           nothing written
//   kTornWrite      WriteAt, queued writes   Internal (EIO), or OK when the rule  only the first X
//                                            says torn_write_reports_ok           bytes are written
//   kSyncFail       Sync                     ErrnoToStatus(rule.sync_errno)       no sync
//   kPunchHoleFail  PunchHole                ErrnoToStatus(rule.punch_hole_errno) nothing freed
//   kLatency        ReadAt, WriteAt, Sync,   unchanged                            the sleeper is
//                   PunchHole, queued ops                                         called first
//                                                                                 (by default it
//                                                                                 sleeps on the
//                                                                                 clock)
//
// X, the bytes a short read or torn write transfers, is a random multiple of 4 KiB (of the
// file's alignment when larger) below Y, the op's length: 0 when Y is at most 4 KiB. A short read
// is thus "fewer bytes, then DataLoss", as a truncated file gives. An op gets at most one fault
// besides latency; a read draws kReadEio then kShortRead, a write kWriteEio, kWriteEnospc then
// kTornWrite. Messages of injected faults contain "(injected)"; the context of a failed read
// starts with "read", so EIO maps to DataLoss as a real one does.
//
// Queues: NewIoQueue wraps a queue of the target (io_uring or the thread fallback: the one I/O
// layer of io/file_system.h, so faults reach whichever backend the store and the read engine
// use; queue_faults(backend) counts them by backend). The wrapper accepts only Files opened by
// this file system, translates them (and registered file slots) to the target's Files and
// applies faults per op, the op hook's (SetOpHook: a test's own errno, short transfer or latency
// for one op) first, then the rules': a partial
// transfer is delegated with the shortened length and its Status replaced on completion; an op
// that transfers nothing is not delegated, and its callback runs with the fault's Status from
// the wrapper's Drain or Reap (or from Submit when `depth` of them are waiting). Callbacks still
// run exactly once, never nested, never inside a submission.
//
// Power loss, simulated: ArmCrash(n) lets n more data operations (writes, queued writes, syncs,
// punches, allocations, file creations, directory fsyncs) through; the next one "crashes": it is
// not performed, and from then on every operation of this file system fails with Unavailable "...
// (simulated crash)", as if the process had died there. While armed, the file system remembers each
// write not yet covered by a completed Sync of its file, with the bytes it replaced (read just
// before it). Once the store is closed, ApplyCrash(seed) makes the files look as after a power loss
// at that point: each remembered write is dropped (its old bytes put back), torn (a random multiple
// of 4 KiB of its head kept, the rest put back) or kept, a third each, drawn from `seed`; then it
// disarms. Writes made before arming are not remembered (they count as synced).
//
// The catalog is behind the same seam (CatalogFileSystem): RocksDB's appends, syncs, file
// creations, renames and directory fsyncs count as data operations, so the crash can land inside
// a catalog commit, and after it every RocksDB write, sync, rename and delete fails too. While
// armed, the file system remembers each catalog file's bytes appended since its last Sync/Fsync,
// and the directory entries (files created, renames) in the catalog's and the segments'
// directories that no fsync of their directory has made durable, segment files included. At
// ApplyCrash each catalog file's unsynced tail is dropped, torn (a random number of its bytes
// kept) or kept, a third each; then a random number of the newest non-durable directory entries
// are undone, newest first (a created file is removed; a rename is moved back, restoring the
// file it replaced), since a journaling file system commits entries in order. As with a real
// power loss, a store that calls fsync where it must loses nothing it acknowledged. Not
// simulated: an unsynced punch coming undone (Open punches every free slot anyway), the loss of
// a segment file's unsynced size change, and a deleted file coming back.
//
// Crash seams: ArmCrashAt(seam) crashes at the named point of a Put (io/file_system.h:
// kSeamPutDataSynced, kSeamPutCommitted) instead of after a number of operations; everything
// else is as above. ApplyCrash with CrashOutcome::kDropAll drops every unsynced write and undoes
// every non-durable directory entry: the worst case a power loss allows, deterministically.
//
// Example:
//   FakeClock clock;  // injected latency advances it: tests never sleep
//   FaultInjectingFileSystem fs(PosixFileSystem(), /*seed=*/42, &clock);
//   fs.AddRule({.path_substring = "seg-", .read_eio = 0.01, .torn_write = 0.05});
//   store_options.file_system = &fs;  // an engine: OpenWithSeams(o, path, {.file_system = &fs})
//   ... run; then check fs.injected(FaultKind::kTornWrite) ...
//
// Thread-safety: every method is thread-safe (the Files and the rules share one mutex); a
// queue is used by one thread at a time. The target must outlive this file system, and this file
// system every File and queue it returns.
#ifndef CKV_IO_FAULT_FILE_SYSTEM_H_
#define CKV_IO_FAULT_FILE_SYSTEM_H_

#include <array>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "io/file_system.h"

namespace ckv::io {

enum class FaultKind : uint8_t {
  kReadEio,
  kShortRead,
  kWriteEio,
  kWriteEnospc,
  kTornWrite,
  kSyncFail,
  kPunchHoleFail,
  kLatency,
};
inline constexpr size_t kNumFaultKinds = 8;
// "read_eio", "short_read", ...
const char* FaultKindName(FaultKind kind);

// Which files a rule covers and how often each fault hits them. Probabilities are per operation,
// in [0, 1]: 0 never, 1 always.
struct FaultRule {
  // The rule covers files whose path contains this. Default: "" (every file).
  std::string path_substring = "";
  double read_eio = 0;
  double short_read = 0;
  double write_eio = 0;
  double write_enospc = 0;
  double torn_write = 0;
  double sync_fail = 0;
  double punch_hole_fail = 0;
  // errno of a failed Sync. Default: EIO (Internal).
  int sync_errno = EIO;
  // errno of a failed PunchHole; EOPNOTSUPP makes it Unimplemented. Default: EIO (Internal).
  int punch_hole_errno = EIO;
  // A torn write reports OK (the device lied) instead of Internal (EIO). Default: false.
  bool torn_write_reports_ok = false;
  // Added to every op on covered files through the sleeper, microseconds. Default: 0.
  uint64_t latency_us = 0;
  // write_enospc also fails the catalog's appends (RocksDB's WAL, MANIFEST, OPTIONS and SST
  // files, as NoSpace) under the rule's path_substring: a full disk the catalog shares.
  // Default: false (the catalog is left alone).
  bool catalog_writes = false;
  // When set, the rule covers its files only while this returns true (a disk that stays full
  // until something frees space on it); called under the file system's lock, so it must not
  // call back into this file system. Default: empty (always).
  std::function<bool()> applies = nullptr;
};

class FaultInjectingFileSystem final : public FileSystem {
 public:
  // Receives the latency to add to an op; by default it sleeps for it on the clock (so a
  // FakeClock makes latency pass without sleeping). A test installs its own to count or pick
  // the ops that are slow. Called without any lock held.
  using Sleeper = std::function<void(uint64_t latency_us)>;

  // `target` and `clock` are not owned; `clock` (nullptr: RealClock()) is what injected latency
  // sleeps on. No rule is set: everything is forwarded unchanged.
  explicit FaultInjectingFileSystem(FileSystem* target, uint64_t seed = 0, Clock* clock = nullptr);
  ~FaultInjectingFileSystem() override;

  FileSystem* target() const { return target_; }
  Clock* clock() const { return clock_; }

  // Adds a rule. An op uses the first rule, in the order added, that covers its file.
  void AddRule(FaultRule rule);
  void ClearRules();
  void SetSleeper(Sleeper sleeper);

  // A test's own choice of fault for each queued op (reads and writes of every IoQueue of this
  // file system, io_uring or threads alike), consulted before the rules: for faults a rule's
  // probabilities cannot say (this byte range, the first read only, hold a read until told).
  struct OpInfo {
    const std::string& path;
    bool read = true;
    uint64_t offset = 0;
    size_t length = 0;
  };
  struct OpFault {
    // errno the op fails with instead of being issued ("(injected)" in the message; a read's
    // EIO is DataLoss, a write's ENOSPC ResourceExhausted). EINTR/EAGAIN are retried, the hook
    // asked again, as the queue retries a real one. Default: 0 (none).
    int error = 0;
    // When >= 0, the op transfers at most this many bytes, as a short transfer from the kernel
    // would, and its remainder is requeued (the hook asked again for it); 0 ends it: a read with
    // DataLoss "short read", a write with Internal. Must keep the file's alignment. Default: -1.
    int64_t transfer_limit = -1;
    // Passed to the sleeper before the op is issued, on the submitting thread. Default: 0.
    uint64_t latency_us = 0;
  };
  // Called on the thread that submits, without a lock held; must be thread-safe (several queues
  // call it). Empty (the default) consults only the rules.
  using OpHook = std::function<OpFault(const OpInfo&)>;
  void SetOpHook(OpHook hook);

  // Breaks every queue of this file system, made before or after: from now on each Submit,
  // SubmitBatch, Reap and Drain fails with `status` (it must not be OK), as a queue whose ring
  // the kernel no longer serves would (io_uring_enter failing with EBADF, say). The ops already
  // in a queue stay there, unreaped: their buffers may still be written, as a kernel's could.
  void BreakIoQueues(absl::Status status);
  // OK until BreakIoQueues.
  absl::Status io_queues_broken() const;

  // Faults injected into queued ops (rules' and the hook's, latency included), by the backend of
  // the queue they went through ("io_uring", "threads"): which I/O path the faults reached.
  struct QueueFaults {
    uint64_t reads = 0;
    uint64_t writes = 0;
  };
  QueueFaults queue_faults(absl::string_view backend) const;

  // Faults injected so far, per kind and in all.
  uint64_t injected(FaultKind kind) const;
  uint64_t total_injected() const;
  void ResetCounters();

  // Simulated power loss (see the top of this file). `ops`: data operations let through before
  // the crash; with `catalog_only`, only the catalog's count, so that the crash lands inside a
  // catalog operation. Forgets the writes remembered so far (they count as synced).
  void ArmCrash(uint64_t ops, bool catalog_only = false);
  // As ArmCrash, but the crash happens at the crash seam named `seam` (CrashSeam), however many
  // operations come before it.
  void ArmCrashAt(absl::string_view seam);
  // What the crash interrupted: "write <path>", "catalog append <path>", a seam's name...; empty
  // before the crash.
  std::string crash_point() const;
  // True once the armed crash happened.
  bool crashed() const;
  // What ApplyCrash did with the writes not covered by a sync.
  struct CrashReport {
    uint64_t writes_dropped = 0;
    uint64_t writes_torn = 0;
    uint64_t writes_kept = 0;
    // Catalog files whose unsynced tail was dropped, torn or kept.
    uint64_t catalog_tails_dropped = 0;
    uint64_t catalog_tails_torn = 0;
    uint64_t catalog_tails_kept = 0;
    // Directory entries not made durable by a directory fsync: undone, and kept.
    uint64_t entries_undone = 0;
    uint64_t entries_kept = 0;
  };
  enum class CrashOutcome {
    kRandom,   // each unsynced write dropped, torn or kept; a random number of entries undone
    kDropAll,  // every unsynced write dropped, every non-durable entry undone
  };
  // REQUIRES: no File or queue of this file system is in use, and no catalog opened over it is
  // open. Puts the unsynced writes' old bytes back through the target (dropped or torn writes),
  // cuts the catalog files' unsynced tails, undoes directory entries, syncs, and disarms.
  absl::StatusOr<CrashReport> ApplyCrash(uint64_t seed,
                                         CrashOutcome outcome = CrashOutcome::kRandom);

  // The catalog behind the seam (io/file_system.h). The layer refers to this file system,
  // which must outlive it.
  std::shared_ptr<rocksdb::FileSystem> CatalogFileSystem(
      std::shared_ptr<rocksdb::FileSystem> base) override;
  // Crashes here when armed for `seam` (ArmCrashAt); fails once crashed.
  absl::Status CrashSeam(absl::string_view seam) override;

  // FileSystem. Open wraps the target's File; the other calls are forwarded unchanged.
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) override;
  absl::Status CreateDir(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;
  absl::Status DeleteFile(const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  bool Exists(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(uint32_t depth) override;
  // The target's answer, or the size a test stated (SetSpace).
  absl::StatusOr<FileSystemSpace> Space(const std::string& path) override;
  // States the size Space reports from now on (a small disk around faults that make it full);
  // std::nullopt goes back to the target's answer.
  void SetSpace(std::optional<FileSystemSpace> space);

 private:
  friend class FaultFile;
  friend class FaultIoQueue;
  friend class CatalogFaultFileSystem;
  friend class CatalogFaultFile;
  friend class CatalogFaultDirectory;

  // What to do with one op.
  struct Decision {
    std::optional<FaultKind> fault;  // the fault besides latency, if any
    uint64_t latency_us = 0;
    size_t partial_bytes = 0;  // X of a short read or torn write
    int err = 0;               // errno of the fault
    bool torn_write_reports_ok = false;
  };
  enum class OpType : uint8_t { kRead, kWrite, kSync, kPunchHole, kAllocate };
  // Whether a catalog append to `path` fails for a full disk (a rule with catalog_writes whose
  // write_enospc hits); counted as kWriteEnospc.
  bool CatalogNoSpace(const std::string& path, size_t length);
  // Draws the faults of an op on `path` and counts them; `length` and `granule` (the unit of X)
  // matter for reads and writes. Then calls the sleeper for the latency.
  Decision Decide(const std::string& path, OpType type, size_t length, size_t granule);

  // The hook's fault for a queued op (after its EINTR/EAGAIN retries and latency), if any.
  std::optional<OpFault> HookFault(const std::string& path, bool read, uint64_t offset,
                                   size_t length, absl::string_view backend);
  void CountQueueFault(absl::string_view backend, bool read);

  // Power loss. CrashPoint: called before every data op on `path`; the simulated crash's error
  // once it happened. Remember: saves the bytes `inner` holds where a write is about to go.
  // `counts`: a data op, which counts towards the armed crash (reads and namespace ops only
  // fail once it happened).
  absl::Status CrashPoint(const std::string& what, bool counts = true);
  void Remember(File* inner, uint64_t offset, size_t length, size_t granule);
  // The writes to `path` remembered before sequence number `before` are durable (synced) or
  // gone (deleted).
  void Forget(const std::string& path, uint64_t before);
  uint64_t NextWriteSeq() const;
  // Directory entries and catalog tails (see the top of this file). NoteCreated: `path` is
  // about to be created (it does not exist). NoteRenamed: `from` is about to replace `to`.
  // NoteDirSynced: the entries in `dir` are durable.
  void NoteCreated(const std::string& path);
  void NoteRenamed(const std::string& from, const std::string& to);
  void NoteDirSynced(const std::string& dir);
  void NoteAppended(const std::string& path, uint64_t size_before, uint64_t bytes);
  void NoteCatalogSynced(const std::string& path);

  struct UnsyncedWrite {
    uint64_t seq = 0;
    std::string path;
    uint64_t offset = 0;
    std::vector<std::byte> old_bytes;  // empty when they could not be read (kept at a crash)
    size_t length = 0;
    size_t granule = 0;
  };

  // A directory entry no directory fsync has made durable.
  struct PendingEntry {
    std::string path;                     // the file created, or the rename's target
    std::string from;                     // a rename's source; empty for a creation
    std::optional<std::string> replaced;  // the bytes of the file a rename replaced
  };
  struct CatalogTail {
    uint64_t synced = 0;  // bytes made durable by the last Sync/Fsync
    uint64_t size = 0;    // bytes appended so far
  };

  FileSystem* const target_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::string crash_seam_ ABSL_GUARDED_BY(mu_);   // armed for this seam when not empty
  std::string crash_point_ ABSL_GUARDED_BY(mu_);  // what the crash interrupted
  std::vector<PendingEntry> pending_entries_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, CatalogTail> catalog_tails_ ABSL_GUARDED_BY(mu_);
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  bool crash_in_catalog_only_ ABSL_GUARDED_BY(mu_) = false;  // ArmCrash's catalog_only
  uint64_t ops_before_crash_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<UnsyncedWrite> unsynced_ ABSL_GUARDED_BY(mu_);
  uint64_t write_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::vector<FaultRule> rules_ ABSL_GUARDED_BY(mu_);
  std::optional<FileSystemSpace> space_ ABSL_GUARDED_BY(mu_);  // SetSpace
  Sleeper sleeper_ ABSL_GUARDED_BY(mu_);
  OpHook op_hook_ ABSL_GUARDED_BY(mu_);
  absl::Status queues_broken_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, QueueFaults> queue_faults_ ABSL_GUARDED_BY(mu_);
  std::array<uint64_t, kNumFaultKinds> injected_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace ckv::io

#endif  // CKV_IO_FAULT_FILE_SYSTEM_H_
