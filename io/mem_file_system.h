// SPDX-License-Identifier: Apache-2.0
// io/mem_file_system.h: a FileSystem in memory, for tests (ckv/options.h promises one).
//
// Files, directories and their contents live in this object and vanish with it; nothing touches
// the disk. The semantics are the POSIX file system's as io/file_system.h states them, with
// the errors it returns (ErrnoToStatus of the errno the kernel would give, the same messages):
// reads past the end are DataLoss ("short read"), offsets, lengths and buffers must be aligned to
// alignment() (4096) as O_DIRECT requires, PunchHole and Allocate work on whole 4096-byte blocks
// the way ext4 does, and AllocatedBytes counts the blocks a file holds. Files are sparse: holes
// and blocks allocated but never written take no memory, so a store sizes its segments as it does
// on disk. A deleted file stays readable through the Files already open on it. Sync and SyncDir
// only check that their target exists: memory has no power loss to survive. NewIoQueue gives the
// synchronous queue ("threads").
//
// The catalog is not in memory. RocksDB could keep it there (rocksdb::NewMemEnv, returned from
// CatalogFileSystem), but Catalog (storage/catalog.cc) creates, renames and chmods its directory
// through the real file system (std::filesystem, rename(2)), outside this seam. So a store on a
// MemFileSystem keeps its catalog in a real directory (a temporary one in tests) and its segments
// here; CreateDirs makes the store's directory in memory first, as `mkdir -p` would.
//
// Thread-safety: all methods are thread-safe.
#ifndef CKV_IO_MEM_FILE_SYSTEM_H_
#define CKV_IO_MEM_FILE_SYSTEM_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "io/file_system.h"

namespace ckv::io {

class MemFileSystem final : public FileSystem {
 public:
  // One file's bytes and allocated blocks, shared by the Files open on it.
  struct Node;

  // "/" exists from the start. `capacity_bytes`: the blocks its files may hold (rounded down to
  // 4096-byte blocks); 0 = no bound.
  explicit MemFileSystem(uint64_t capacity_bytes = 0);
  ~MemFileSystem() override;

  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) override;
  absl::Status CreateDir(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;
  absl::Status DeleteFile(const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  bool Exists(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(uint32_t depth) override;
  // {capacity, capacity less the blocks held}; Unimplemented without a capacity.
  absl::StatusOr<FileSystemSpace> Space(const std::string& path) override;
  // Bytes of blocks its files hold now.
  uint64_t used_bytes() const;

  // The blocks every file holds, shared with the files (which may outlive a deletion).
  struct Usage;

  // `path` and every missing directory above it (mkdir -p). Absolute paths only.
  absl::Status CreateDirs(const std::string& path);

 private:
  bool IsDirLocked(const std::string& path) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<Usage> usage_;
  absl::Mutex mu_;
  std::set<std::string> dirs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Node>> files_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckv::io

#endif  // CKV_IO_MEM_FILE_SYSTEM_H_
