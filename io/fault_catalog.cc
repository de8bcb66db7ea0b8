// SPDX-License-Identifier: Apache-2.0
// The catalog behind FaultInjectingFileSystem's seam (see io/fault_file_system.h): the
// RocksDB FileSystem layer returned by FaultInjectingFileSystem::CatalogFileSystem.
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "io/fault_file_system.h"
#include "rocksdb/file_system.h"

namespace ckv::io {
namespace {

std::string StripSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

rocksdb::IOStatus ToIo(const absl::Status& s) {
  return rocksdb::IOStatus::IOError(std::string(s.message()));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The catalog behind the seam: a RocksDB FileSystem layer that counts RocksDB's appends, syncs,
// creations, renames and directory fsyncs as data operations, fails everything that changes a
// file once the crash happened, and tells the FaultInjectingFileSystem what is not durable yet.

class CatalogFaultFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  CatalogFaultFile(FaultInjectingFileSystem* fs, std::string path,
                   std::unique_ptr<rocksdb::FSWritableFile> target)
      : FSWritableFileOwnerWrapper(std::move(target)), fs_(fs), path_(std::move(path)) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           rocksdb::IODebugContext* dbg) override {
    return Appending(data.size(), UINT64_MAX, [&] { return target()->Append(data, o, dbg); });
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           const rocksdb::DataVerificationInfo& v,
                           rocksdb::IODebugContext* dbg) override {
    return Appending(data.size(), UINT64_MAX, [&] { return target()->Append(data, o, v, dbg); });
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& o,
                                     rocksdb::IODebugContext* dbg) override {
    return Appending(data.size(), offset,
                     [&] { return target()->PositionedAppend(data, offset, o, dbg); });
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& o,
                                     const rocksdb::DataVerificationInfo& v,
                                     rocksdb::IODebugContext* dbg) override {
    return Appending(data.size(), offset,
                     [&] { return target()->PositionedAppend(data, offset, o, v, dbg); });
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    return Syncing([&] { return target()->Sync(o, dbg); });
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    return Syncing([&] { return target()->Fsync(o, dbg); });
  }
  // sync_file_range makes nothing durable; it only fails once crashed.
  rocksdb::IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const rocksdb::IOOptions& o,
                              rocksdb::IODebugContext* dbg) override {
    absl::Status s = fs_->CrashPoint(absl::StrCat("catalog range sync ", path_), false);
    if (!s.ok()) return ToIo(s);
    return target()->RangeSync(offset, nbytes, o, dbg);
  }
  rocksdb::IOStatus Truncate(uint64_t size, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* dbg) override {
    absl::Status s = fs_->CrashPoint(absl::StrCat("catalog truncate ", path_), false);
    if (!s.ok()) return ToIo(s);
    return target()->Truncate(size, o, dbg);
  }

 private:
  template <typename Fn>
  rocksdb::IOStatus Appending(size_t bytes, uint64_t offset, Fn fn) {
    absl::Status s = fs_->CrashPoint(absl::StrCat("catalog append ", path_));
    if (!s.ok()) return ToIo(s);
    if (fs_->CatalogNoSpace(path_, bytes)) {
      return rocksdb::IOStatus::NoSpace(absl::StrCat("append ", bytes, " bytes to ", path_,
                                                     ": No space left on device "
                                                     "(injected)"));
    }
    const uint64_t before =
        offset != UINT64_MAX ? offset : target()->GetFileSize(rocksdb::IOOptions(), nullptr);
    rocksdb::IOStatus io = fn();
    if (io.ok()) fs_->NoteAppended(path_, before, bytes);
    return io;
  }
  template <typename Fn>
  rocksdb::IOStatus Syncing(Fn fn) {
    absl::Status s = fs_->CrashPoint(absl::StrCat("catalog sync ", path_));
    if (!s.ok()) return ToIo(s);
    rocksdb::IOStatus io = fn();
    if (io.ok()) fs_->NoteCatalogSynced(path_);
    return io;
  }

  FaultInjectingFileSystem* const fs_;
  const std::string path_;
};

class CatalogFaultDirectory final : public rocksdb::FSDirectoryWrapper {
 public:
  CatalogFaultDirectory(FaultInjectingFileSystem* fs, std::string path,
                        std::unique_ptr<rocksdb::FSDirectory> target)
      : FSDirectoryWrapper(std::move(target)), fs_(fs), path_(std::move(path)) {}

  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    return Syncing([&] { return FSDirectoryWrapper::Fsync(o, dbg); });
  }
  rocksdb::IOStatus FsyncWithDirOptions(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg,
                                        const rocksdb::DirFsyncOptions& d) override {
    return Syncing([&] { return FSDirectoryWrapper::FsyncWithDirOptions(o, dbg, d); });
  }

 private:
  template <typename Fn>
  rocksdb::IOStatus Syncing(Fn fn) {
    absl::Status s = fs_->CrashPoint(absl::StrCat("catalog fsync directory ", path_));
    if (!s.ok()) return ToIo(s);
    rocksdb::IOStatus io = fn();
    if (io.ok()) fs_->NoteDirSynced(path_);
    return io;
  }

  FaultInjectingFileSystem* const fs_;
  const std::string path_;
};

class CatalogFaultFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  CatalogFaultFileSystem(FaultInjectingFileSystem* fs, std::shared_ptr<rocksdb::FileSystem> base)
      : FileSystemWrapper(std::move(base)), fs_(fs) {}

  static const char* kClassName() { return "CkvCatalogFaultFileSystem"; }
  const char* Name() const override { return kClassName(); }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    return Creating(f, r, [&] { return target()->NewWritableFile(f, o, r, dbg); });
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override {
    return Creating(f, r, [&] { return target()->ReopenWritableFile(f, o, r, dbg); });
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old_f,
                                      const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    absl::Status s = fs_->CrashPoint(absl::StrCat("catalog reuse ", old_f, " as ", f));
    if (!s.ok()) return ToIo(s);
    fs_->NoteRenamed(old_f, f);
    rocksdb::IOStatus io = target()->ReuseWritableFile(f, old_f, o, r, dbg);
    if (io.ok()) *r = std::make_unique<CatalogFaultFile>(fs_, f, std::move(*r));
    return io;
  }
  rocksdb::IOStatus RenameFile(const std::string& src, const std::string& dst,
                               const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    absl::Status s = fs_->CrashPoint(absl::StrCat("catalog rename ", src, " to ", dst));
    if (!s.ok()) return ToIo(s);
    fs_->NoteRenamed(src, dst);
    return target()->RenameFile(src, dst, o, dbg);
  }
  rocksdb::IOStatus DeleteFile(const std::string& f, const rocksdb::IOOptions& o,
                               rocksdb::IODebugContext* dbg) override {
    absl::Status s = fs_->CrashPoint(absl::StrCat("catalog delete ", f), false);
    if (!s.ok()) return ToIo(s);
    return target()->DeleteFile(f, o, dbg);
  }
  rocksdb::IOStatus NewDirectory(const std::string& name, const rocksdb::IOOptions& o,
                                 std::unique_ptr<rocksdb::FSDirectory>* r,
                                 rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus io = target()->NewDirectory(name, o, r, dbg);
    if (io.ok()) {
      *r = std::make_unique<CatalogFaultDirectory>(fs_, StripSlashes(name), std::move(*r));
    }
    return io;
  }

 private:
  template <typename Fn>
  rocksdb::IOStatus Creating(const std::string& f, std::unique_ptr<rocksdb::FSWritableFile>* r,
                             Fn fn) {
    absl::Status s = fs_->CrashPoint(absl::StrCat("catalog create ", f));
    if (!s.ok()) return ToIo(s);
    const bool existed = target()->FileExists(f, rocksdb::IOOptions(), nullptr).ok();
    rocksdb::IOStatus io = fn();
    if (!io.ok()) return io;
    if (!existed) fs_->NoteCreated(f);
    *r = std::make_unique<CatalogFaultFile>(fs_, f, std::move(*r));
    return io;
  }

  FaultInjectingFileSystem* const fs_;
};

std::shared_ptr<rocksdb::FileSystem> FaultInjectingFileSystem::CatalogFileSystem(
    std::shared_ptr<rocksdb::FileSystem> base) {
  return std::make_shared<CatalogFaultFileSystem>(this, std::move(base));
}

}  // namespace ckv::io
