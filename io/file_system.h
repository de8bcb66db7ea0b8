// SPDX-License-Identifier: Apache-2.0
// io/file_system.h: the seam between ckv's data path and the operating system.
//
// Segment files are reached only through FileSystem and File, and their bulk reads and writes
// through an IoQueue, so that tests can substitute a fault-injecting wrapper (EIO, short reads,
// ENOSPC, torn writes) for the POSIX implementation, as LevelDB's Env and RocksDB's FileSystem do.
// The catalog (RocksDB) keeps RocksDB's own file system, but a FileSystem may put a layer over it
// (CatalogFileSystem), so that a fault-injecting wrapper covers the catalog's WAL, MANIFEST, SST
// files and directory entries as well as the segments. CrashSeam names the points of a Put where
// a test may stop the store deterministically.
//
// Thread-safety: FileSystem and File methods are thread-safe. An IoQueue is used by one thread at
// a time (see IoQueue for the exceptions).
#ifndef CKV_IO_FILE_SYSTEM_H_
#define CKV_IO_FILE_SYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ckv/io_backend.h"

namespace rocksdb {
class FileSystem;
}  // namespace rocksdb

namespace ckv::io {

// The named crash seams of the data path (FileSystem::CrashSeam), in the order a Put passes them.
// A Put's records are written and synced (fdatasync of every segment it wrote), its catalog batch
// is not committed yet: a crash here must leave nothing of the Put visible.
inline constexpr absl::string_view kSeamPutDataSynced = "put: data synced, catalog not committed";
// The Put's catalog batch is committed (synced), the Put has not returned: a crash here must
// leave the whole Put visible.
inline constexpr absl::string_view kSeamPutCommitted = "put: catalog committed, not returned";

// Alignment of buffers, offsets and lengths for direct I/O, unless a file says otherwise.
inline constexpr size_t kDirectIoAlignment = 4096;

// One piece of a gathered write (IoOp::gather, File::WriteGatherAt).
struct IoPiece {
  const std::byte* data = nullptr;
  size_t length = 0;
};
// Most pieces one gathered write may have (the kernel's IOV_MAX).
inline constexpr size_t kMaxIoPieces = 1024;

class File {
 public:
  virtual ~File() = default;
  // The path it was opened with.
  virtual const std::string& path() const = 0;
  // Alignment that direct I/O on this file needs for buffers, offsets and lengths (statx's
  // dio_offset_align where the kernel reports it, else 4096).
  virtual size_t alignment() const = 0;

  // Reads exactly out.size() bytes at `offset`, retrying short reads and EINTR. A read past the
  // end of the file is DataLoss ("short read").
  virtual absl::Status ReadAt(uint64_t offset, std::span<std::byte> out) = 0;
  // Writes all of `data` at `offset`, retrying short writes and EINTR.
  virtual absl::Status WriteAt(uint64_t offset, std::span<const std::byte> data) = 0;
  // Writes the pieces back to back from `offset`, as one write where the file can (pwritev),
  // retrying short writes and EINTR. Default: WriteAt of each piece in turn.
  virtual absl::Status WriteGatherAt(uint64_t offset, std::span<const IoPiece> pieces);
  // fdatasync.
  virtual absl::Status Sync() = 0;
  // Frees the blocks of [offset, offset + length) (FALLOC_FL_PUNCH_HOLE | KEEP_SIZE); reads of the
  // range return zeros. Unimplemented when the file system cannot.
  virtual absl::Status PunchHole(uint64_t offset, uint64_t length) = 0;
  // Allocates the blocks of [offset, offset + length) without writing them (fallocate mode 0; the
  // file's size grows to cover the range, and the range reads as zeros), so that later direct
  // writes into a hole need not allocate block by block. ResourceExhausted when the disk is full;
  // Unimplemented when the file system cannot.
  virtual absl::Status Allocate(uint64_t offset, uint64_t length) = 0;
  virtual absl::Status Truncate(uint64_t size) = 0;
  // Logical size.
  virtual absl::StatusOr<uint64_t> Size() = 0;
  // Bytes of disk blocks allocated to the file (st_blocks * 512).
  virtual absl::StatusOr<uint64_t> AllocatedBytes() = 0;
};

// A read of a File ready to hand to the I/O layer: `length` bytes at `offset`, both aligned to the
// file's alignment (the length padded up); the bytes wanted start `skip` bytes in. When
// checksum_bytes > 0, the XXH3-64 of the first checksum_bytes bytes read must be `checksum`
// (storage::VerifyRecordChecksum). A pinned chunk's record hands these out
// (PinnedChunks::ReadOf in storage/chunk_store.h).
struct FileRead {
  File* file = nullptr;
  uint64_t offset = 0;
  uint32_t length = 0;
  uint32_t skip = 0;
  uint64_t checksum = 0;
  uint32_t checksum_bytes = 0;
};

// Marks IoOp::file_slot / IoOp::buffer_index as not registered.
inline constexpr uint32_t kNoIoSlot = UINT32_MAX;

// One positioned read or write submitted to an IoQueue.
struct IoOp {
  enum class Kind : uint8_t { kRead, kWrite };
  Kind kind = Kind::kRead;
  File* file = nullptr;
  uint64_t offset = 0;
  // Aligned to file->alignment() in address and length for direct I/O.
  std::byte* buffer = nullptr;
  size_t length = 0;
  // The caller's priority for the op, a plain value carried with it (the read engine schedules
  // by priority before it submits; a queue issues what it is given in order). Default: 0.
  uint8_t priority = 0;
  // `file`'s slot in the queue's registered-file table (RegisterFile), or kNoIoSlot.
  uint32_t file_slot = kNoIoSlot;
  // The registered buffer (RegisterBuffers) that holds [buffer, buffer + length), or kNoIoSlot.
  uint32_t buffer_index = kNoIoSlot;
  // A gathered write: when not empty, a write's bytes are these pieces in order (1..kMaxIoPieces,
  // their lengths summing to `length`, each aligned like `buffer` in address and length), and
  // `buffer` and `buffer_index` are not used. The pieces (the array and the bytes) must stay
  // valid until the op completes. io_uring: one WRITEV; the thread fallback:
  // File::WriteGatherAt. Writes only.
  std::span<const IoPiece> gather = {};
};

// The one disk I/O layer: runs positioned reads and writes with up to `depth` operations in
// flight, on io_uring (NewIoQueue of PosixFileSystem) or on a pool of threads calling
// File::ReadAt/WriteAt (NewThreadIoQueue, any File). Each op reports its Status through its
// completion callback, with short transfers requeued for the remainder and EINTR/EAGAIN retried.
// Completion callbacks run on the thread that uses the queue, from Submit (when it must reap to
// make room), Reap or Drain, never while a submission is half-built, and never nested: a
// callback may Submit, and that op's callback runs after it returns.
//
// Thread-safety: a queue is used by one thread at a time, except Wake (any thread) and
// RegisterFile/UnregisterFile (any thread, while no op on that slot is outstanding; the caller
// publishes the registration to the queue's thread, e.g. under a lock both take).
class IoQueue {
 public:
  using Callback = std::function<void(const absl::Status&)>;
  virtual ~IoQueue() = default;
  // Queues `op`; `done` runs once it completes with OK (all bytes transferred, short transfers
  // requeued) or its error. Returns an error only when the queue itself failed; `done` then does
  // not run.
  virtual absl::Status Submit(const IoOp& op, Callback done) = 0;
  // Queues every op of `ops` (done[i] for ops[i]) and hands them to the kernel at once. As
  // Submit otherwise. REQUIRES: ops.size() == done.size().
  virtual absl::Status SubmitBatch(std::span<const IoOp> ops, std::span<Callback> done);
  // As SubmitBatch, but the ops may wait to be handed to the kernel until the next Reap, Drain
  // or submission, so that a caller about to Reap(true) hands them over and sleeps in one system
  // call. Default: SubmitBatch.
  virtual absl::Status PrepareBatch(std::span<const IoOp> ops, std::span<Callback> done) {
    return SubmitBatch(ops, done);
  }
  // Waits for every submitted operation and runs its callback. Not from a callback.
  virtual absl::Status Drain() = 0;
  // Runs the callbacks of the ops that have completed. With `wait`, first waits until at least
  // one op completes or Wake() is called (a queue may first poll for up to the poll-before-sleep
  // time, see SetPollBeforeSleep). Returns an error only when the queue itself failed. Not from
  // a callback.
  virtual absl::Status Reap(bool wait);
  // True when Reap(false) would run a callback now (cheap; no system call).
  virtual bool HasCompletions() const { return false; }
  // Makes a Reap(true) that waits, or the next one, return. Thread-safe.
  virtual void Wake() {}
  // With ops in flight and none completed, Reap(true) polls for up to `us` before sleeping in the
  // kernel when completions have been arriving at least twice that often. 0 never polls.
  // Default: 0.
  virtual void SetPollBeforeSleep(uint32_t /*us*/) {}

  // Registration, where the backend has it (io_uring's fixed files and buffers); elsewhere these
  // succeed and change nothing. ReserveFileSlots sets up a table of `slots` files (io_uring: a
  // sparse registered-file table); an error means ops use plain descriptors. RegisterFile puts
  // `file` (of the file system that made the queue) at `slot` < slots.
  virtual absl::Status ReserveFileSlots(uint32_t /*slots*/) { return absl::OkStatus(); }
  virtual absl::Status RegisterFile(uint32_t /*slot*/, File* /*file*/) { return absl::OkStatus(); }
  virtual void UnregisterFile(uint32_t /*slot*/) {}
  // Registers `buffers` (buffer_index i is buffers[i]): io_uring pins them and reads and writes
  // them with READ_FIXED/WRITE_FIXED. Unimplemented where the backend has no such thing; any
  // error means ops use plain buffers (IoOp::buffer_index is then ignored).
  virtual absl::Status RegisterBuffers(std::span<const std::span<std::byte>> /*buffers*/) {
    return absl::UnimplementedError("this I/O queue has no registered buffers");
  }
  // True when ops name their files by registered slot (io_uring fixed files).
  virtual bool fixed_files() const { return false; }

  // Device transfers issued (each SQE or ReadAt/WriteAt, requeued remainders and retries
  // included) and bytes they moved, since the queue was made.
  struct Counters {
    uint64_t transfers = 0;
    uint64_t bytes = 0;
  };
  virtual Counters counters() const { return {}; }

  // "io_uring" or "threads".
  virtual const char* backend() const = 0;
};

// The thread fallback: up to `depth` (1..kMaxIoQueueDepth) ops in flight on a pool of worker
// threads (started as ops need them, at most `depth`), each performing its op with
// File::ReadAt/WriteAt. Works with any File. Backend "threads".
absl::StatusOr<std::unique_ptr<IoQueue>> NewThreadIoQueue(uint32_t depth);

// Largest depth a queue accepts.
inline constexpr uint32_t kMaxIoQueueDepth = 4096;

// The size of the file system that holds a path (statvfs), so that a store can tell a write that
// can never fit from one that needs room made first.
struct FileSystemSpace {
  uint64_t total_bytes = 0;      // the file system's size: f_blocks * f_frsize
  uint64_t available_bytes = 0;  // what this process may still allocate: f_bavail * f_frsize
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  enum class OpenMode : uint8_t {
    kReadWrite,        // must exist
    kCreateReadWrite,  // created when missing
    kReadOnly          // must exist; writes fail (a read-only store: another process writes it)
  };
  // Opens for direct I/O (O_DIRECT) where the file system supports it.
  virtual absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) = 0;
  virtual absl::Status CreateDir(const std::string& path) = 0;  // OK when it exists
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) = 0;
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  // fsync of a directory, so that a created or deleted entry is durable.
  virtual absl::Status SyncDir(const std::string& path) = 0;
  virtual bool Exists(const std::string& path) = 0;
  // The size of the file system holding `path` and what is still free on it. Unimplemented when
  // this file system cannot say (the default; a MemFileSystem without a capacity).
  virtual absl::StatusOr<FileSystemSpace> Space(const std::string& path) {
    return absl::UnimplementedError(
        absl::StrCat("the file system holding ", path, " does not state its size"));
  }

  // A queue with up to `depth` operations in flight.
  virtual absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(uint32_t depth) = 0;

  // The file system the catalog's RocksDB uses, given `base` (RocksDB's own, already wrapped so
  // that store files are private). A wrapper that injects faults or simulates a power loss puts
  // its own layer over `base`. Default: `base`, unchanged. Called once per catalog open; the
  // result must not outlive this FileSystem.
  virtual std::shared_ptr<rocksdb::FileSystem> CatalogFileSystem(
      std::shared_ptr<rocksdb::FileSystem> base) {
    return base;
  }
  // Called by the store at the named point `seam` (kSeam* above). A test wrapper may "crash"
  // there: return an error that the caller returns at once. Default: OK, nothing happens.
  virtual absl::Status CrashSeam(absl::string_view /*seam*/) { return absl::OkStatus(); }
};

// The process-wide POSIX file system whose queues use `backend`: kUring queues are io_uring's
// (NewIoQueue fails when it is unavailable); kAuto falls back to the thread queue when io_uring
// cannot be set up, logged once; kThreads queues are the thread fallback. Never destroyed.
FileSystem* PosixFileSystem(IoBackend backend = IoBackend::kAuto);
// True when io_uring can be set up in this process.
bool UringAvailable();
// Why UringAvailable() is false ("" when it is true).
std::string UringUnavailableReason();

// Aligned heap buffer for direct I/O: its size is rounded up to `alignment`, and its memory
// starts on a boundary of `alignment` and of at least 4 KiB (see aligned_buffer.cc: ext4
// serialises direct writes from buffers aligned below its block size).
class AlignedBuffer {
 public:
  // A buffer of `size` bytes rounded up to `alignment` (0 bytes: an empty buffer), or
  // ResourceExhausted naming the size when the memory cannot be had. How the library sizes its
  // buffers: a size from options, a file or a request may be more than the machine has.
  static absl::StatusOr<AlignedBuffer> Allocate(size_t size, size_t alignment = kDirectIoAlignment);

  AlignedBuffer() = default;
  // As Allocate, where running out of memory is a CKV_CHECK failure: for fixed small buffers
  // and tests, never for a size the library is handed.
  explicit AlignedBuffer(size_t size, size_t alignment = kDirectIoAlignment);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> span() const { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ckv::io

#endif  // CKV_IO_FILE_SYSTEM_H_
