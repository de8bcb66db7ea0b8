// SPDX-License-Identifier: Apache-2.0
// io/uring_io_queue.h: internals of the POSIX file system, shared by posix_file_system.cc
// (PosixFile, PosixFileSystem) and uring_io_queue.cc (the io_uring queue).
// Not part of the public API: everything else reaches files through io/file_system.h.
//
// Thread-safety: PosixFile is thread-safe (positioned I/O on one descriptor). A queue is used by
// one thread at a time, as every IoQueue.
#ifndef CKV_IO_URING_IO_QUEUE_H_
#define CKV_IO_URING_IO_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "io/file_system.h"

struct io_uring;

namespace ckv::io {

// For ThreadSanitizer builds (no-ops in others): call AnnotateNewRing after io_uring_queue_init*
// and AnnotateRingGone before io_uring_queue_exit. liburing maps and unmaps rings with raw
// system calls that TSan does not see, so when a thread's new ring lands where another thread's
// old one was, TSan takes the two rings' accesses for a race. These order the old ring's
// accesses before the new ring's (a release on the ring's addresses when it goes, an acquire
// when a ring appears there); GCC 12's TSan has no working call to forget a range.
void AnnotateNewRing(const io_uring& ring);
void AnnotateRingGone(const io_uring& ring);

// A file opened by PosixFileSystem. The io_uring queue accepts only these (it needs the fd).
class PosixFile final : public File {
 public:
  // Takes ownership of `fd`. `direct`: opened with O_DIRECT. `alignment`: see File::alignment().
  PosixFile(std::string path, int fd, bool direct, size_t alignment);
  ~PosixFile() override;
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;

  const std::string& path() const override { return path_; }
  size_t alignment() const override { return alignment_; }
  absl::Status ReadAt(uint64_t offset, std::span<std::byte> out) override;
  absl::Status WriteAt(uint64_t offset, std::span<const std::byte> data) override;
  absl::Status WriteGatherAt(uint64_t offset, std::span<const IoPiece> pieces) override;
  absl::Status Sync() override;
  absl::Status PunchHole(uint64_t offset, uint64_t length) override;
  absl::Status Allocate(uint64_t offset, uint64_t length) override;
  absl::Status Truncate(uint64_t size) override;
  absl::StatusOr<uint64_t> Size() override;
  absl::StatusOr<uint64_t> AllocatedBytes() override;

  int fd() const { return fd_; }
  // False when the file system refused O_DIRECT and the file uses the page cache.
  bool direct() const { return direct_; }

  // The Status for errno `err` from a transfer of `length` bytes at `offset` (of the whole
  // request that started at `request_offset`): InvalidArgument naming the alignment when a
  // direct-I/O EINVAL comes from a misaligned buffer, offset or length; otherwise ErrnoToStatus
  // with the context "read <path> at offset N" / "write <path> at offset N".
  absl::Status TransferError(int err, bool read, uint64_t offset, const void* buffer,
                             size_t length) const;
  // DataLoss "short read of <path> at offset N: got X of Y bytes".
  absl::Status ShortReadError(uint64_t offset, size_t got, size_t wanted) const;

 private:
  const std::string path_;
  const int fd_;
  const bool direct_;
  const size_t alignment_;
};

// An io_uring queue with a ring of `depth` entries (1..kMaxIoQueueDepth) and one more for the
// wake-up poll. Accepts only PosixFiles. Fails with the ring set-up's errno mapped by
// ErrnoToStatus.
absl::StatusOr<std::unique_ptr<IoQueue>> NewUringIoQueue(uint32_t depth);

}  // namespace ckv::io

#endif  // CKV_IO_URING_IO_QUEUE_H_
