// SPDX-License-Identifier: Apache-2.0
// PrivateFileSystem (see io/private_file_system.h).
#include "io/private_file_system.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "io/file_system.h"
#include "rocksdb/file_system.h"

namespace ckv::io {
namespace {

constexpr mode_t kFileMode = 0600;
constexpr mode_t kDirMode = 0700;

rocksdb::IOStatus ErrnoStatus(const std::string& what, const std::string& path, int err) {
  return rocksdb::IOStatus::IOError(what + " " + path, std::strerror(err));
}

// Creates `path` 0600 when missing and makes it 0600 when it exists.
rocksdb::IOStatus CreatePrivateFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, kFileMode);
  if (fd < 0) return ErrnoStatus("create", path, errno);
  const int rc = ::fchmod(fd, kFileMode);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus("chmod 0600", path, err);
  return rocksdb::IOStatus::OK();
}

// Creates `path` 0700 when missing (mkdir's mode is masked by the umask, so it is set again).
rocksdb::IOStatus CreatePrivateDir(const std::string& path) {
  if (::mkdir(path.c_str(), kDirMode) != 0 && errno != EEXIST) {
    return ErrnoStatus("mkdir", path, errno);
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("stat", path, errno);
  if (!S_ISDIR(st.st_mode)) return rocksdb::IOStatus::IOError(path + " is not a directory");
  if ((st.st_mode & 07777) != kDirMode && ::chmod(path.c_str(), kDirMode) != 0) {
    return ErrnoStatus("chmod 0700", path, errno);
  }
  return rocksdb::IOStatus::OK();
}

class PrivateFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  explicit PrivateFileSystem(const std::shared_ptr<rocksdb::FileSystem>& target)
      : FileSystemWrapper(target) {}

  static const char* kClassName() { return "CkvPrivateFileSystem"; }
  const char* Name() const override { return kClassName(); }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = CreatePrivateFile(f);
    if (!s.ok()) return s;
    return target()->NewWritableFile(f, o, r, dbg);
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = CreatePrivateFile(f);
    if (!s.ok()) return s;
    return target()->ReopenWritableFile(f, o, r, dbg);
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old_f,
                                      const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    // Renames old_f to f: the mode comes with it; make sure it is ours.
    rocksdb::IOStatus s = target()->ReuseWritableFile(f, old_f, o, r, dbg);
    if (!s.ok()) return s;
    return CreatePrivateFile(f);
  }
  rocksdb::IOStatus NewRandomRWFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSRandomRWFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = CreatePrivateFile(f);
    if (!s.ok()) return s;
    return target()->NewRandomRWFile(f, o, r, dbg);
  }
  rocksdb::IOStatus LockFile(const std::string& f, const rocksdb::IOOptions& o,
                             rocksdb::FileLock** l, rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = CreatePrivateFile(f);
    if (!s.ok()) return s;
    return target()->LockFile(f, o, l, dbg);
  }
  rocksdb::IOStatus NewLogger(const std::string& f, const rocksdb::IOOptions& o,
                              std::shared_ptr<rocksdb::Logger>* r,
                              rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = CreatePrivateFile(f);
    if (!s.ok()) return s;
    return target()->NewLogger(f, o, r, dbg);
  }
  rocksdb::IOStatus CreateDir(const std::string& d, const rocksdb::IOOptions& o,
                              rocksdb::IODebugContext* dbg) override {
    if (::mkdir(d.c_str(), kDirMode) != 0) {
      if (errno == EEXIST) return target()->CreateDir(d, o, dbg);  // its error, as before
      return ErrnoStatus("mkdir", d, errno);
    }
    return CreatePrivateDir(d);
  }
  rocksdb::IOStatus CreateDirIfMissing(const std::string& d, const rocksdb::IOOptions& o,
                                       rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = CreatePrivateDir(d);
    if (!s.ok()) return s;
    return target()->CreateDirIfMissing(d, o, dbg);
  }
};

}  // namespace

std::unique_ptr<rocksdb::Env> NewPrivateEnv(FileSystem* wrapper) {
  std::shared_ptr<rocksdb::FileSystem> fs =
      std::make_shared<PrivateFileSystem>(rocksdb::FileSystem::Default());
  // The wrapper goes outside: it must see whether a file exists before PrivateFileSystem
  // creates it.
  if (wrapper != nullptr) fs = wrapper->CatalogFileSystem(std::move(fs));
  return rocksdb::NewCompositeEnv(std::move(fs));
}

rocksdb::Status TightenModes(const std::string& dir) {
  std::error_code ec;
  if (::chmod(dir.c_str(), kDirMode) != 0) return ErrnoStatus("chmod 0700", dir, errno);
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::string path = it->path().string();
    if (it->is_symlink(ec) || ec) continue;  // RocksDB makes none; never chmod through one
    const bool is_dir = it->is_directory(ec);
    if (ec) break;
    if (::chmod(path.c_str(), is_dir ? kDirMode : kFileMode) != 0) {
      return ErrnoStatus(is_dir ? "chmod 0700" : "chmod 0600", path, errno);
    }
  }
  if (ec) return rocksdb::IOStatus::IOError("list " + dir, ec.message());
  return rocksdb::Status::OK();
}

}  // namespace ckv::io
