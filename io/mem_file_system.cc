// SPDX-License-Identifier: Apache-2.0
// The in-memory file system (see io/mem_file_system.h).
#include "io/mem_file_system.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "io/uring_io_queue.h"

namespace ckv::io {

// A sparse file: its logical size, and the 4096-byte blocks that hold storage. A block that was
// allocated but never written holds no memory (nullptr) and reads as zeros, as does a hole.
struct MemFileSystem::Usage {
  explicit Usage(uint64_t capacity_blocks) : capacity_blocks(capacity_blocks) {}
  const uint64_t capacity_blocks;  // 0: no bound
  std::atomic<uint64_t> blocks{0};
  // Takes `n` more blocks; false (nothing taken) when that passes the capacity.
  bool Take(uint64_t n) {
    const uint64_t before = blocks.fetch_add(n, std::memory_order_relaxed);
    if (capacity_blocks == 0 || before + n <= capacity_blocks) return true;
    blocks.fetch_sub(n, std::memory_order_relaxed);
    return false;
  }
  void Give(uint64_t n) { blocks.fetch_sub(n, std::memory_order_relaxed); }
};

struct MemFileSystem::Node {
  explicit Node(std::shared_ptr<Usage> usage) : usage(std::move(usage)) {}
  ~Node() { usage->Give(blocks.size()); }
  const std::shared_ptr<Usage> usage;
  absl::Mutex mu;
  uint64_t size ABSL_GUARDED_BY(mu) = 0;
  std::map<uint64_t, std::unique_ptr<std::byte[]>> blocks ABSL_GUARDED_BY(mu);
};

namespace {

constexpr uint64_t kBlock = kDirectIoAlignment;

// Without trailing slashes and repeated ones; "" stays "" (not found anywhere).
std::string Normalize(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (c == '/' && !out.empty() && out.back() == '/') continue;
    out.push_back(c);
  }
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

class MemFile final : public File {
 public:
  MemFile(std::string path, std::shared_ptr<MemFileSystem::Node> node)
      : path_(std::move(path)), node_(std::move(node)) {}

  const std::string& path() const override { return path_; }
  size_t alignment() const override { return kBlock; }

  absl::Status ReadAt(uint64_t offset, std::span<std::byte> out) override {
    CKV_RETURN_IF_ERROR(CheckAligned("read ", offset, out.data(), out.size()));
    absl::MutexLock lock(&node_->mu);
    const uint64_t size = node_->size;
    const size_t got =
        offset >= size ? 0 : static_cast<size_t>(std::min<uint64_t>(out.size(), size - offset));
    for (size_t done = 0; done < got; done += kBlock) {
      const size_t n = std::min<size_t>(kBlock, got - done);
      auto it = node_->blocks.find((offset + done) / kBlock);
      if (it == node_->blocks.end() || it->second == nullptr) {
        std::memset(out.data() + done, 0, n);
      } else {
        std::memcpy(out.data() + done, it->second.get(), n);
      }
    }
    if (got < out.size()) {
      return absl::DataLossError(absl::StrCat("short read of ", path_, " at offset ", offset,
                                              ": got ", got, " of ", out.size(), " bytes"));
    }
    return absl::OkStatus();
  }

  absl::Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    CKV_RETURN_IF_ERROR(CheckAligned("write ", offset, data.data(), data.size()));
    absl::MutexLock lock(&node_->mu);
    CKV_RETURN_IF_ERROR(TakeBlocksLocked("write ", offset, data.size()));
    for (size_t done = 0; done < data.size(); done += kBlock) {
      std::unique_ptr<std::byte[]>& block = node_->blocks[(offset + done) / kBlock];
      if (block == nullptr) block = std::make_unique<std::byte[]>(kBlock);
      std::memcpy(block.get(), data.data() + done, kBlock);
    }
    node_->size = std::max<uint64_t>(node_->size, offset + data.size());
    return absl::OkStatus();
  }

  absl::Status Sync() override { return absl::OkStatus(); }

  absl::Status PunchHole(uint64_t offset, uint64_t length) override {
    if (length == 0) return absl::OkStatus();
    absl::MutexLock lock(&node_->mu);
    const uint64_t end = offset + length;
    // Whole blocks are freed; the partial ones at either end are zeroed over the range and kept.
    const uint64_t first = (offset + kBlock - 1) / kBlock, last = end / kBlock;
    if (first < last) {
      EraseLocked(node_->blocks.lower_bound(first), node_->blocks.lower_bound(last));
    }
    ZeroLocked(offset, std::min(end, first * kBlock));
    ZeroLocked(std::max(offset, last * kBlock), end);
    return absl::OkStatus();
  }

  absl::Status Allocate(uint64_t offset, uint64_t length) override {
    if (length == 0) return absl::OkStatus();
    absl::MutexLock lock(&node_->mu);
    CKV_RETURN_IF_ERROR(TakeBlocksLocked("allocate ", offset, length));
    const uint64_t end = (offset + length + kBlock - 1) / kBlock;
    for (uint64_t b = offset / kBlock; b < end; ++b) node_->blocks.try_emplace(b, nullptr);
    node_->size = std::max(node_->size, offset + length);
    return absl::OkStatus();
  }

  absl::Status Truncate(uint64_t size) override {
    absl::MutexLock lock(&node_->mu);
    // What lies past the new end is gone: a later extension reads zeros there.
    EraseLocked(node_->blocks.lower_bound((size + kBlock - 1) / kBlock), node_->blocks.end());
    ZeroLocked(size, (size + kBlock - 1) / kBlock * kBlock);
    node_->size = size;
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Size() override {
    absl::MutexLock lock(&node_->mu);
    return node_->size;
  }

  absl::StatusOr<uint64_t> AllocatedBytes() override {
    absl::MutexLock lock(&node_->mu);
    return node_->blocks.size() * kBlock;
  }

 private:
  // O_DIRECT's rule, with PosixFile's message for it.
  absl::Status CheckAligned(const char* what, uint64_t offset, const void* buffer,
                            size_t length) const {
    if (offset % kBlock == 0 && length % kBlock == 0 &&
        reinterpret_cast<uintptr_t>(buffer) % kBlock == 0) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what, path_, " at offset ", offset, ": direct I/O of ", length,
                     " bytes needs buffer, offset and length aligned to ", kBlock));
  }

  // Counts the blocks of [offset, offset + length) the file does not hold yet against the
  // capacity: ENOSPC, nothing taken, when they do not fit. The caller then adds them all.
  absl::Status TakeBlocksLocked(const char* what, uint64_t offset, uint64_t length)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_->mu) {
    uint64_t missing = 0;
    const uint64_t end = (offset + length + kBlock - 1) / kBlock;
    for (uint64_t b = offset / kBlock; b < end; ++b) missing += !node_->blocks.contains(b);
    if (node_->usage->Take(missing)) return absl::OkStatus();
    return ErrnoToStatus(ENOSPC,
                         absl::StrCat(what, path_, " at offset ", offset, " (", length, " bytes)"));
  }
  using BlockIt = std::map<uint64_t, std::unique_ptr<std::byte[]>>::iterator;
  void EraseLocked(BlockIt first, BlockIt last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_->mu) {
    node_->usage->Give(static_cast<uint64_t>(std::distance(first, last)));
    node_->blocks.erase(first, last);
  }

  // Zeros [begin, end), which lies within one block, where that block holds memory.
  void ZeroLocked(uint64_t begin, uint64_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_->mu) {
    if (begin >= end) return;
    CKV_DCHECK(begin / kBlock == (end - 1) / kBlock);
    auto it = node_->blocks.find(begin / kBlock);
    if (it == node_->blocks.end() || it->second == nullptr) return;
    std::memset(it->second.get() + begin % kBlock, 0, end - begin);
  }

  const std::string path_;
  const std::shared_ptr<MemFileSystem::Node> node_;
};

}  // namespace

MemFileSystem::MemFileSystem(uint64_t capacity_bytes)
    : usage_(std::make_shared<Usage>(capacity_bytes / kBlock)), dirs_{"/", "."} {}
MemFileSystem::~MemFileSystem() = default;

bool MemFileSystem::IsDirLocked(const std::string& path) const { return dirs_.contains(path); }

absl::StatusOr<std::unique_ptr<File>> MemFileSystem::Open(const std::string& raw, OpenMode mode) {
  const std::string path = Normalize(raw);
  absl::MutexLock lock(&mu_);
  if (IsDirLocked(path)) return ErrnoToStatus(EISDIR, absl::StrCat("open ", raw));
  auto it = files_.find(path);
  if (it == files_.end()) {
    if (mode != OpenMode::kCreateReadWrite || !IsDirLocked(ParentOf(path))) {
      return ErrnoToStatus(ENOENT, absl::StrCat("open ", raw));
    }
    it = files_.emplace(path, std::make_shared<Node>(usage_)).first;
  }
  return std::make_unique<MemFile>(raw, it->second);
}

absl::Status MemFileSystem::CreateDir(const std::string& raw) {
  const std::string path = Normalize(raw);
  absl::MutexLock lock(&mu_);
  if (IsDirLocked(path)) return absl::OkStatus();
  if (files_.contains(path)) {
    return absl::AlreadyExistsError(
        absl::StrCat("create directory ", raw, ": exists and is not a directory"));
  }
  if (!IsDirLocked(ParentOf(path))) {
    return ErrnoToStatus(ENOENT, absl::StrCat("create directory ", raw));
  }
  dirs_.insert(path);
  return absl::OkStatus();
}

absl::Status MemFileSystem::CreateDirs(const std::string& raw) {
  const std::string path = Normalize(raw);
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("create directories ", raw, ": not absolute"));
  }
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    CKV_RETURN_IF_ERROR(CreateDir(path.substr(0, slash)));
    if (slash == std::string::npos) return absl::OkStatus();
  }
}

absl::StatusOr<std::vector<std::string>> MemFileSystem::ListDir(const std::string& raw) {
  const std::string path = Normalize(raw);
  absl::MutexLock lock(&mu_);
  if (!IsDirLocked(path)) {
    return ErrnoToStatus(files_.contains(path) ? ENOTDIR : ENOENT,
                         absl::StrCat("list directory ", raw));
  }
  // Sorted, as PosixFileSystem's: both maps are ordered, and the merge keeps the order.
  std::set<std::string> names;
  auto add = [&](const std::string& entry) {
    if (entry != path && ParentOf(entry) == path) names.insert(entry.substr(entry.rfind('/') + 1));
  };
  for (const std::string& d : dirs_) add(d);
  for (const auto& [f, node] : files_) add(f);
  return std::vector<std::string>(names.begin(), names.end());
}

absl::Status MemFileSystem::DeleteFile(const std::string& raw) {
  const std::string path = Normalize(raw);
  absl::MutexLock lock(&mu_);
  if (IsDirLocked(path)) return ErrnoToStatus(EISDIR, absl::StrCat("delete ", raw));
  // Open Files keep the Node, as an unlinked inode outlives its name.
  if (files_.erase(path) == 0) return ErrnoToStatus(ENOENT, absl::StrCat("delete ", raw));
  return absl::OkStatus();
}

absl::Status MemFileSystem::SyncDir(const std::string& raw) {
  const std::string path = Normalize(raw);
  absl::MutexLock lock(&mu_);
  if (IsDirLocked(path)) return absl::OkStatus();
  return ErrnoToStatus(files_.contains(path) ? ENOTDIR : ENOENT,
                       absl::StrCat("open directory ", raw));
}

bool MemFileSystem::Exists(const std::string& raw) {
  const std::string path = Normalize(raw);
  absl::MutexLock lock(&mu_);
  return IsDirLocked(path) || files_.contains(path);
}

absl::StatusOr<std::unique_ptr<IoQueue>> MemFileSystem::NewIoQueue(uint32_t depth) {
  if (depth == 0 || depth > kMaxIoQueueDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("I/O queue depth ", depth, " is outside 1..", kMaxIoQueueDepth));
  }
  return NewThreadIoQueue(depth);
}

absl::StatusOr<FileSystemSpace> MemFileSystem::Space(const std::string& path) {
  if (usage_->capacity_blocks == 0) {
    return absl::UnimplementedError(
        absl::StrCat("the in-memory file system holding ", path, " has no capacity"));
  }
  if (!Exists(path)) return ErrnoToStatus(ENOENT, absl::StrCat("statvfs ", path));
  const uint64_t used =
      std::min(usage_->blocks.load(std::memory_order_relaxed), usage_->capacity_blocks);
  return FileSystemSpace{usage_->capacity_blocks * kBlock,
                         (usage_->capacity_blocks - used) * kBlock};
}

uint64_t MemFileSystem::used_bytes() const {
  return usage_->blocks.load(std::memory_order_relaxed) * kBlock;
}

}  // namespace ckv::io
