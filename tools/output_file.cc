// SPDX-License-Identifier: Apache-2.0
// tools/output_file.cc: see output_file.h.
#include "tools/output_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ckv/status.h"
#include "common/status_macros.h"

namespace ckv::tools {
namespace {

inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Largest single write: Linux moves at most ~2 GiB a call anyway.
constexpr size_t kWritePieceBytes = size_t{64} << 20;

absl::Status WriteAll(int fd, const std::string& name, std::span<const std::byte> data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), std::min(data.size(), kWritePieceBytes));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoToStatus(n < 0 ? errno : EIO, absl::StrCat("write ", name));
    data = data.subspan(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

std::string RandomSuffix() {
  uint64_t bits = 0;
  // getrandom of 8 bytes does not block once the pool is initialized, and is never short.
  if (::getrandom(&bits, sizeof(bits), 0) != static_cast<ssize_t>(sizeof(bits))) {
    // No entropy source: still unique enough with O_EXCL retrying.
    bits = static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^
           static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&bits));
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 0; i < 16; ++i) s[i] = kHex[(bits >> (4 * i)) & 0xf];
  return s;
}

// Writes to an existing character device or FIFO in place (see the header). O_NOFOLLOW: a link
// swapped in after the lstat is not followed. O_NONBLOCK: a FIFO with no reader fails the open
// (ENXIO) instead of waiting for one; the flag is cleared before writing, so that a slow reader
// is waited for as a pipe's writer should.
absl::Status WriteInPlace(const std::string& path,
                          const std::function<absl::Status(const OutputWriteFn&)>& produce) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && errno == ENXIO) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is a FIFO that no process reads; not waiting for one"));
  }
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  struct stat st;
  absl::Status status;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat("fcntl ", path));
  } else if (::fstat(fd, &st) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat("stat ", path));
  } else if (!S_ISCHR(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    // It was swapped for something else between the lstat and the open.
    status = absl::FailedPreconditionError(
        absl::StrCat(path, " changed while it was opened; not writing it"));
  } else {
    status = produce([&](std::span<const std::byte> bytes) { return WriteAll(fd, path, bytes); });
  }
  if (::close(fd) != 0 && status.ok()) status = ErrnoToStatus(errno, absl::StrCat("close ", path));
  return status;
}

// The descriptor `path` names when it is one of this process's streams (/dev/stdout,
// /dev/stderr, /proc/self/fd/N, /dev/fd/N); -1 otherwise.
int StreamDescriptor(const std::string& path) {
  if (path == "/dev/stdout") return STDOUT_FILENO;
  if (path == "/dev/stderr") return STDERR_FILENO;
  size_t digits = 0;
  for (std::string_view dir : {"/proc/self/fd/", "/dev/fd/"}) {
    if (path.starts_with(dir)) digits = dir.size();
  }
  if (digits == 0 || path.size() == digits || path.size() > digits + 9) return -1;
  int fd = 0;
  for (size_t i = digits; i < path.size(); ++i) {
    if (path[i] < '0' || path[i] > '9') return -1;
    fd = fd * 10 + (path[i] - '0');
  }
  return fd;
}

// Writes to a stream this process holds open, through a duplicate of its descriptor: whatever
// the stream is (a terminal, a pipe, a file the shell redirected to), the bytes go where the
// process's own writes to it go, at its offset. Nothing is opened by name.
absl::Status WriteToStream(const std::string& path, int stream,
                           const std::function<absl::Status(const OutputWriteFn&)>& produce) {
  const int fd = ::fcntl(stream, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("duplicate ", path));
  absl::Status status =
      produce([&](std::span<const std::byte> bytes) { return WriteAll(fd, path, bytes); });
  if (::close(fd) != 0 && status.ok()) status = ErrnoToStatus(errno, absl::StrCat("close ", path));
  return status;
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open directory ", dir));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoToStatus(err, absl::StrCat("sync directory ", dir));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteOutputFile(const std::string& path,
                             const std::function<absl::Status(const OutputWriteFn& write)>& produce,
                             const OutputFileOptions& options) {
  if (const int stream = StreamDescriptor(path); stream >= 0) {
    return WriteToStream(path, stream, produce);
  }
  // lstat, not stat: a link at `path` is replaced (below), never written through, whatever it
  // points to (a FIFO that would block, a device).
  if (struct stat st;
      ::lstat(path.c_str(), &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) {
    return WriteInPlace(path, produce);
  }
  const std::filesystem::path target(path);
  const std::string name = target.filename().string();
  if (name.empty() || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat(path, " does not name a file"));
  }
  // Not `dir = "."` after the fact: g++ 12 at -O3 warns falsely (-Wrestrict) on that assignment.
  const std::filesystem::path parent = target.parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();

  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < kMaxTempAttempts && fd < 0; ++attempt) {
    const std::string suffix = options.temp_suffix ? options.temp_suffix() : RandomSuffix();
    tmp = absl::StrCat(dir, "/.", Sv(name), ".", Sv(suffix), ".tmp");
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    // EEXIST: the name is taken (a file, or a link planted there: O_EXCL never follows one).
    if (fd < 0 && errno != EEXIST && errno != ELOOP) {
      return ErrnoToStatus(errno, absl::StrCat("create ", tmp));
    }
  }
  if (fd < 0) {
    return absl::AlreadyExistsError(absl::StrCat("create a temporary file for ", path, " in ", dir,
                                                 ": ", kMaxTempAttempts,
                                                 " random names were all taken"));
  }
  absl::Status status =
      produce([&](std::span<const std::byte> bytes) { return WriteAll(fd, tmp, bytes); });
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoToStatus(errno, absl::StrCat("sync ", tmp));
  if (::close(fd) != 0 && status.ok()) status = ErrnoToStatus(errno, absl::StrCat("close ", tmp));
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat("rename ", tmp, " to ", path));
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());  // best effort: the error being returned is the one that matters
    return status;
  }
  return SyncDirectory(dir);
}

absl::Status WriteOutputFile(const std::string& path, std::string_view contents,
                             const OutputFileOptions& options) {
  return WriteOutputFile(
      path,
      [contents](const OutputWriteFn& write) {
        return write(std::as_bytes(std::span(contents.data(), contents.size())));
      },
      options);
}

}  // namespace ckv::tools
