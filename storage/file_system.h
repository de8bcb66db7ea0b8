// storage/file_system.h: the seam between ckv's data path and the operating system.
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
// a time.
#ifndef CKV_STORAGE_FILE_SYSTEM_H_
#define CKV_STORAGE_FILE_SYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rocksdb {
class FileSystem;
}  // namespace rocksdb

namespace ckv::storage {

// The named crash seams of the data path (FileSystem::CrashSeam), in the order a Put passes them.
// A Put's records are written and synced (fdatasync of every segment it wrote), its catalog batch
// is not committed yet: a crash here must leave nothing of the Put visible.
inline constexpr absl::string_view kSeamPutDataSynced = "put: data synced, catalog not committed";
// The Put's catalog batch is committed (synced), the Put has not returned: a crash here must
// leave the whole Put visible.
inline constexpr absl::string_view kSeamPutCommitted = "put: catalog committed, not returned";

// Alignment of buffers, offsets and lengths for direct I/O, unless a file says otherwise.
inline constexpr size_t kDirectIoAlignment = 4096;

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

// One positioned read or write submitted to an IoQueue.
struct IoOp {
  enum class Kind : uint8_t { kRead, kWrite };
  Kind kind = Kind::kRead;
  File* file = nullptr;
  uint64_t offset = 0;
  // Aligned to file->alignment() in address and length for direct I/O.
  std::byte* buffer = nullptr;
  size_t length = 0;
};

// Runs positioned I/O with up to `depth` operations in flight (io_uring, or synchronously).
// Completion callbacks run on the submitting thread, from Submit (when it must reap to make room)
// or Drain, never while a submission is half-built.
class IoQueue {
 public:
  using Callback = std::function<void(const absl::Status&)>;
  virtual ~IoQueue() = default;
  // Queues `op`; `done` runs once it completes with OK (all bytes transferred, short transfers
  // requeued) or its error. Returns an error only when the queue itself failed; `done` then does
  // not run.
  virtual absl::Status Submit(const IoOp& op, Callback done) = 0;
  // Waits for every submitted operation and runs its callback.
  virtual absl::Status Drain() = 0;
  // "io_uring" or "threads".
  virtual const char* backend() const = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  enum class OpenMode : uint8_t {
    kReadWrite,      // must exist
    kCreateReadWrite // created when missing
  };
  // Opens for direct I/O (O_DIRECT) where the file system supports it.
  virtual absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) = 0;
  virtual absl::Status CreateDir(const std::string& path) = 0;  // OK when it exists
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) = 0;
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  // fsync of a directory, so that a created or deleted entry is durable.
  virtual absl::Status SyncDir(const std::string& path) = 0;
  virtual bool Exists(const std::string& path) = 0;

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

// The POSIX file system. `use_uring`: queues use io_uring when true and the kernel allows it;
// when it does not, Posix() falls back to synchronous queues and logs that once.
enum class QueueBackend { kAuto, kUring, kThreads };
// The process-wide POSIX file system for `backend`. Never destroyed.
FileSystem* PosixFileSystem(QueueBackend backend = QueueBackend::kAuto);
// True when io_uring can be set up in this process.
bool UringAvailable();

// Aligned heap buffer for direct I/O.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
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

}  // namespace ckv::storage

#endif  // CKV_STORAGE_FILE_SYSTEM_H_
