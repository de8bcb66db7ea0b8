// SPDX-License-Identifier: Apache-2.0
// The POSIX file system (see io/file_system.h): PosixFile, and PosixFileSystem, which picks
// the queue backend (io_uring, io/uring_io_queue.cc, or the thread fallback,
// io/thread_io_queue.cc).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckv/log.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "io/file_system.h"
#include "io/uring_io_queue.h"

namespace ckv::io {
namespace {

// Bounds the retries of a transfer that keeps failing with EINTR/EAGAIN without progress.
constexpr int kMaxTransferRetries = 1000;

// The direct-I/O alignment of `fd`: statx's dio_offset_align (and dio_mem_align, whichever is
// larger, since one number serves buffers, offsets and lengths) where the kernel reports it.
size_t DirectIoAlignment(int fd) {
#ifdef STATX_DIOALIGN
  struct statx stx {};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN) != 0 && stx.stx_dio_offset_align != 0) {
    return std::max<size_t>(stx.stx_dio_offset_align, stx.stx_dio_mem_align);
  }
#else
  (void)fd;
#endif
  return kDirectIoAlignment;
}

bool Misaligned(uint64_t value, size_t alignment) { return value % alignment != 0; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// PosixFile

PosixFile::PosixFile(std::string path, int fd, bool direct, size_t alignment)
    : path_(std::move(path)), fd_(fd), direct_(direct), alignment_(alignment) {}

PosixFile::~PosixFile() {
  // A close error cannot be acted on here: data that needed to be durable was synced by Sync().
  ::close(fd_);
}

absl::Status PosixFile::TransferError(int err, bool read, uint64_t offset, const void* buffer,
                                      size_t length) const {
  if (err == EINVAL && direct_ &&
      (Misaligned(offset, alignment_) || Misaligned(length, alignment_) ||
       Misaligned(reinterpret_cast<uintptr_t>(buffer), alignment_))) {
    return absl::InvalidArgumentError(
        absl::StrCat(read ? "read " : "write ", path_, " at offset ", offset, ": direct I/O of ",
                     length, " bytes needs buffer, offset and length aligned to ", alignment_));
  }
  return ErrnoToStatus(err, absl::StrCat(read ? "read " : "write ", path_, " at offset ", offset));
}

absl::Status PosixFile::ShortReadError(uint64_t offset, size_t got, size_t wanted) const {
  return absl::DataLossError(absl::StrCat("short read of ", path_, " at offset ", offset, ": got ",
                                          got, " of ", wanted, " bytes"));
}

absl::Status PosixFile::ReadAt(uint64_t offset, std::span<std::byte> out) {
  size_t done = 0;
  int retries = 0;
  while (done < out.size()) {
    const ssize_t n =
        ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n > 0) {
      done += static_cast<size_t>(n);
      retries = 0;
      continue;
    }
    if (n == 0) return ShortReadError(offset, done, out.size());
    const int err = errno;
    if ((err == EINTR || err == EAGAIN) && ++retries < kMaxTransferRetries) continue;
    return TransferError(err, /*read=*/true, offset + done, out.data() + done, out.size() - done);
  }
  return absl::OkStatus();
}

absl::Status PosixFile::WriteAt(uint64_t offset, std::span<const std::byte> data) {
  size_t done = 0;
  int retries = 0;
  while (done < data.size()) {
    const ssize_t n =
        ::pwrite(fd_, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n > 0) {
      done += static_cast<size_t>(n);
      retries = 0;
      continue;
    }
    if (n == 0) {  // not expected of a regular file; retrying could spin forever
      return absl::InternalError(absl::StrCat("write ", path_, " at offset ", offset + done,
                                              ": wrote 0 of ", data.size() - done, " bytes"));
    }
    const int err = errno;
    if ((err == EINTR || err == EAGAIN) && ++retries < kMaxTransferRetries) continue;
    return TransferError(err, /*read=*/false, offset + done, data.data() + done,
                         data.size() - done);
  }
  return absl::OkStatus();
}

absl::Status PosixFile::WriteGatherAt(uint64_t offset, std::span<const IoPiece> pieces) {
  // pwritev of up to IOV_MAX pieces at a time; a short write resumes inside its piece.
  std::vector<iovec> iov;
  size_t piece = 0;
  size_t skip = 0;  // bytes of pieces[piece] already written
  int retries = 0;
  while (piece < pieces.size()) {
    iov.clear();
    for (size_t i = piece; i < pieces.size() && iov.size() < kMaxIoPieces; ++i) {
      const size_t from = i == piece ? skip : 0;
      iov.push_back({const_cast<std::byte*>(pieces[i].data + from), pieces[i].length - from});
    }
    const ssize_t n =
        ::pwritev(fd_, iov.data(), static_cast<int>(iov.size()), static_cast<off_t>(offset));
    if (n > 0) {
      offset += static_cast<uint64_t>(n);
      size_t left = static_cast<size_t>(n);
      while (left > 0 && piece < pieces.size()) {
        const size_t in_piece = pieces[piece].length - skip;
        if (left < in_piece) {
          skip += left;
          left = 0;
        } else {
          left -= in_piece;
          skip = 0;
          ++piece;
        }
      }
      retries = 0;
      continue;
    }
    if (n == 0) {
      return absl::InternalError(
          absl::StrCat("write ", path_, " at offset ", offset, ": wrote 0 bytes of a gather"));
    }
    const int err = errno;
    if ((err == EINTR || err == EAGAIN) && ++retries < kMaxTransferRetries) continue;
    return TransferError(err, /*read=*/false, offset, iov.front().iov_base, iov.front().iov_len);
  }
  return absl::OkStatus();
}

absl::Status PosixFile::Sync() {
  if (::fdatasync(fd_) != 0) return ErrnoToStatus(errno, absl::StrCat("sync ", path_));
  return absl::OkStatus();
}

absl::Status PosixFile::PunchHole(uint64_t offset, uint64_t length) {
  if (length == 0) return absl::OkStatus();  // fallocate rejects an empty range
  if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(length)) != 0) {
    // EOPNOTSUPP maps to Unimplemented, as the header promises.
    return ErrnoToStatus(
        errno, absl::StrCat("punch hole in ", path_, " at offset ", offset, " length ", length));
  }
  return absl::OkStatus();
}

absl::Status PosixFile::Allocate(uint64_t offset, uint64_t length) {
  if (length == 0) return absl::OkStatus();
  // Mode 0, which extends the file's size over the range: ext4 punches holes only below the size,
  // so blocks reserved past it with KEEP_SIZE could not be given back by PunchHole.
  if (::fallocate(fd_, 0, static_cast<off_t>(offset), static_cast<off_t>(length)) != 0) {
    return ErrnoToStatus(
        errno, absl::StrCat("allocate in ", path_, " at offset ", offset, " length ", length));
  }
  return absl::OkStatus();
}

absl::Status PosixFile::Truncate(uint64_t size) {
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("truncate ", path_, " to ", size, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PosixFile::Size() {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path_));
  return static_cast<uint64_t>(st.st_size);
}

absl::StatusOr<uint64_t> PosixFile::AllocatedBytes() {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path_));
  return static_cast<uint64_t>(st.st_blocks) * 512;  // st_blocks counts 512-byte units
}

// ---------------------------------------------------------------------------------------------
// The synchronous queue

// ---------------------------------------------------------------------------------------------
// PosixFileSystem

namespace {

void LogOnce(std::atomic<bool>& logged, const std::string& message) {
  if (!logged.exchange(true)) StderrLogger()->Log(LogLevel::kWarning, message);
}

std::atomic<bool> buffered_fallback_logged{false};
std::atomic<bool> uring_fallback_logged{false};

class PosixFileSystemImpl final : public FileSystem {
 public:
  explicit PosixFileSystemImpl(IoBackend backend) : backend_(backend) {}

  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) override {
    int flags = (mode == OpenMode::kReadOnly ? O_RDONLY : O_RDWR) | O_CLOEXEC;
    if (mode == OpenMode::kCreateReadWrite) flags |= O_CREAT;
    bool direct = true;
    int fd = OpenRetryingEintr(path, flags | O_DIRECT);
    if (fd < 0 && errno == EINVAL) {
      // The file system refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE and network file
      // systems): the page cache is better than no store at all.
      direct = false;
      fd = OpenRetryingEintr(path, flags);
      if (fd >= 0) {
        LogOnce(buffered_fallback_logged,
                absl::StrCat("the file system of ", path,
                             " does not support O_DIRECT; using buffered I/O for such files"));
      }
    }
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
    const size_t alignment = DirectIoAlignment(fd);
    return std::make_unique<PosixFile>(path, fd, direct, alignment);
  }

  absl::Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0700) == 0) return absl::OkStatus();
    const int err = errno;
    if (err == EEXIST) {
      struct stat st {};
      if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return absl::OkStatus();
      return absl::AlreadyExistsError(
          absl::StrCat("create directory ", path, ": exists and is not a directory"));
    }
    return ErrnoToStatus(err, absl::StrCat("create directory ", path));
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return ErrnoToStatus(errno, absl::StrCat("list directory ", path));
    std::vector<std::string> names;
    int err = 0;
    while (true) {
      errno = 0;
      const struct dirent* entry = ::readdir(dir);
      if (entry == nullptr) {
        err = errno;
        break;
      }
      const std::string_view name = entry->d_name;
      if (name == "." || name == "..") continue;
      names.emplace_back(name);
    }
    ::closedir(dir);
    if (err != 0) return ErrnoToStatus(err, absl::StrCat("list directory ", path));
    // readdir's order is arbitrary; callers get a stable one.
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, absl::StrCat("delete ", path));
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& path) override {
    const int fd = OpenRetryingEintr(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open directory ", path));
    absl::Status status;
    if (::fsync(fd) != 0) status = ErrnoToStatus(errno, absl::StrCat("sync directory ", path));
    ::close(fd);
    return status;
  }

  bool Exists(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
  }

  absl::StatusOr<FileSystemSpace> Space(const std::string& path) override {
    struct statvfs fs {};
    if (::statvfs(path.c_str(), &fs) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("statvfs ", path));
    }
    return FileSystemSpace{uint64_t{fs.f_blocks} * fs.f_frsize,
                           uint64_t{fs.f_bavail} * fs.f_frsize};
  }

  absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(uint32_t depth) override {
    if (depth == 0 || depth > kMaxIoQueueDepth) {
      return absl::InvalidArgumentError(
          absl::StrCat("I/O queue depth ", depth, " is outside 1..", kMaxIoQueueDepth));
    }
    switch (backend_) {
      case IoBackend::kThreads:
        return NewThreadIoQueue(depth);
      case IoBackend::kUring:
        if (!UringAvailable()) {
          return absl::UnavailableError(
              absl::StrCat("io_uring is unavailable: ", UringUnavailableReason()));
        }
        return NewUringIoQueue(depth);
      case IoBackend::kAuto:
        break;
    }
    if (UringAvailable()) {
      absl::StatusOr<std::unique_ptr<IoQueue>> queue = NewUringIoQueue(depth);
      if (queue.ok()) return queue;
      // A ring that cannot be set up now (memlock limit, too many rings) is no reason to fail.
      LogOnce(uring_fallback_logged,
              absl::StrCat("cannot set up an io_uring queue (", queue.status().message(),
                           "); using the threads backend"));
    } else {
      LogOnce(uring_fallback_logged,
              absl::StrCat("io_uring is unavailable (", UringUnavailableReason(),
                           "); using the threads backend"));
    }
    return NewThreadIoQueue(depth);
  }

 private:
  static int OpenRetryingEintr(const std::string& path, int flags) {
    int fd;
    int attempts = 0;
    do {
      fd = ::open(path.c_str(), flags, 0600);
    } while (fd < 0 && errno == EINTR && ++attempts < kMaxTransferRetries);
    return fd;
  }

  const IoBackend backend_;
};

}  // namespace

FileSystem* PosixFileSystem(IoBackend backend) {
  // Leaked on purpose: files and queues may outlive static destruction order.
  static FileSystem* const auto_fs = new PosixFileSystemImpl(IoBackend::kAuto);
  static FileSystem* const uring_fs = new PosixFileSystemImpl(IoBackend::kUring);
  static FileSystem* const threads_fs = new PosixFileSystemImpl(IoBackend::kThreads);
  switch (backend) {
    case IoBackend::kUring:
      return uring_fs;
    case IoBackend::kThreads:
      return threads_fs;
    case IoBackend::kAuto:
      break;
  }
  return auto_fs;
}

}  // namespace ckv::io
