// FaultInjectingFileSystem (see storage/fault_file_system.h).
#include "storage/fault_file_system.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ckv/status.h"

namespace ckv::storage {
namespace {

// Partial transfers stop on a multiple of this (or of the file's alignment when larger), as a
// real torn write stops on a page or sector boundary.
constexpr size_t kPartialGranule = 4096;

}  // namespace

const char* FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kReadEio:
      return "read_eio";
    case FaultKind::kShortRead:
      return "short_read";
    case FaultKind::kWriteEio:
      return "write_eio";
    case FaultKind::kWriteEnospc:
      return "write_enospc";
    case FaultKind::kTornWrite:
      return "torn_write";
    case FaultKind::kSyncFail:
      return "sync_fail";
    case FaultKind::kPunchHoleFail:
      return "punch_hole_fail";
    case FaultKind::kLatency:
      return "latency";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// FaultFile: a target File plus the faults of its rule.

class FaultFile final : public File {
 public:
  using Decision = FaultInjectingFileSystem::Decision;

  // The Status an op with fault `d` reports in place of its own.
  static absl::Status FaultStatus(const Decision& d, const std::string& path, uint64_t offset,
                                  size_t length) {
    switch (*d.fault) {
      case FaultKind::kShortRead:
        return absl::DataLossError(absl::StrCat("short read of ", path, " at offset ", offset,
                                                ": got ", d.partial_bytes, " of ", length,
                                                " bytes (injected)"));
      case FaultKind::kTornWrite:
        if (d.torn_write_reports_ok) return absl::OkStatus();
        return ErrnoToStatus(d.err,
                             absl::StrCat("write ", path, " at offset ", offset, ": torn after ",
                                          d.partial_bytes, " of ", length, " bytes (injected)"));
      case FaultKind::kReadEio:
        return ErrnoToStatus(d.err,
                             absl::StrCat("read ", path, " at offset ", offset, " (injected)"));
      case FaultKind::kWriteEio:
      case FaultKind::kWriteEnospc:
        return ErrnoToStatus(d.err,
                             absl::StrCat("write ", path, " at offset ", offset, " (injected)"));
      case FaultKind::kSyncFail:
        return ErrnoToStatus(d.err, absl::StrCat("sync ", path, " (injected)"));
      case FaultKind::kPunchHoleFail:
        return ErrnoToStatus(d.err, absl::StrCat("punch hole in ", path, " at offset ", offset,
                                                 " length ", length, " (injected)"));
      case FaultKind::kLatency:
        break;
    }
    return absl::OkStatus();
  }

  static bool TransfersSomething(const Decision& d) {
    return (d.fault == FaultKind::kShortRead || d.fault == FaultKind::kTornWrite) &&
           d.partial_bytes > 0;
  }

  FaultFile(FaultInjectingFileSystem* fs, std::unique_ptr<File> inner)
      : fs_(fs), inner_(std::move(inner)) {}

  File* inner() const { return inner_.get(); }
  size_t granule() const { return std::max(kPartialGranule, inner_->alignment()); }

  const std::string& path() const override { return inner_->path(); }
  size_t alignment() const override { return inner_->alignment(); }

  absl::Status ReadAt(uint64_t offset, std::span<std::byte> out) override {
    CKV_RETURN_IF_ERROR(fs_->CrashPoint(absl::StrCat("read ", path()), /*counts=*/false));
    const Decision d =
        fs_->Decide(path(), FaultInjectingFileSystem::OpType::kRead, out.size(), granule());
    if (!d.fault) return inner_->ReadAt(offset, out);
    if (TransfersSomething(d)) {
      CKV_RETURN_IF_ERROR(inner_->ReadAt(offset, out.first(d.partial_bytes)));
    }
    return FaultStatus(d, path(), offset, out.size());
  }

  absl::Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    CKV_RETURN_IF_ERROR(fs_->CrashPoint(absl::StrCat("write ", path())));
    fs_->Remember(inner_.get(), offset, data.size(), granule());
    const Decision d =
        fs_->Decide(path(), FaultInjectingFileSystem::OpType::kWrite, data.size(), granule());
    if (!d.fault) return inner_->WriteAt(offset, data);
    if (TransfersSomething(d)) {
      CKV_RETURN_IF_ERROR(inner_->WriteAt(offset, data.first(d.partial_bytes)));
    }
    return FaultStatus(d, path(), offset, data.size());
  }

  absl::Status Sync() override {
    CKV_RETURN_IF_ERROR(fs_->CrashPoint(absl::StrCat("sync ", path())));
    const uint64_t covers = fs_->NextWriteSeq();  // the writes made before it began
    const Decision d = fs_->Decide(path(), FaultInjectingFileSystem::OpType::kSync, 0, 0);
    if (d.fault) return FaultStatus(d, path(), 0, 0);
    CKV_RETURN_IF_ERROR(inner_->Sync());
    fs_->Forget(path(), covers);
    return absl::OkStatus();
  }

  absl::Status PunchHole(uint64_t offset, uint64_t length) override {
    CKV_RETURN_IF_ERROR(fs_->CrashPoint(absl::StrCat("punch hole in ", path())));
    const Decision d = fs_->Decide(path(), FaultInjectingFileSystem::OpType::kPunchHole, 0, 0);
    if (d.fault) return FaultStatus(d, path(), offset, length);
    return inner_->PunchHole(offset, length);
  }

  absl::Status Allocate(uint64_t offset, uint64_t length) override {
    CKV_RETURN_IF_ERROR(fs_->CrashPoint(absl::StrCat("allocate in ", path())));
    const Decision d = fs_->Decide(path(), FaultInjectingFileSystem::OpType::kAllocate, 0, 0);
    if (d.fault) return FaultStatus(d, path(), offset, length);
    return inner_->Allocate(offset, length);
  }

  absl::Status Truncate(uint64_t size) override {
    CKV_RETURN_IF_ERROR(fs_->CrashPoint(absl::StrCat("truncate ", path())));
    return inner_->Truncate(size);
  }
  absl::StatusOr<uint64_t> Size() override { return inner_->Size(); }
  absl::StatusOr<uint64_t> AllocatedBytes() override { return inner_->AllocatedBytes(); }

 private:
  FaultInjectingFileSystem* const fs_;
  const std::unique_ptr<File> inner_;
};

// ---------------------------------------------------------------------------------------------
// FaultIoQueue: a target queue plus per-op faults.

class FaultIoQueue final : public IoQueue {
 public:
  using Decision = FaultInjectingFileSystem::Decision;

  FaultIoQueue(FaultInjectingFileSystem* fs, std::unique_ptr<IoQueue> inner, uint32_t depth)
      : fs_(fs), inner_(std::move(inner)), depth_(depth) {}

  absl::Status Submit(const IoOp& op, Callback done) override {
    if (op.file == nullptr) return absl::InvalidArgumentError("IoQueue(fault): op has no file");
    auto* file = dynamic_cast<FaultFile*>(op.file);
    if (file == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("IoQueue(fault): ", op.file->path(),
                       " was not opened by the fault-injecting file system"));
    }
    const bool read = op.kind == IoOp::Kind::kRead;
    absl::Status crash = fs_->CrashPoint(absl::StrCat(read ? "read " : "write ", file->path()),
                                         /*counts=*/!read);
    if (!crash.ok()) {
      // Completes with the crash's error at the next reap point, like an injected fault.
      injected_.emplace_back(std::move(done), std::move(crash));
      if (injected_.size() >= depth_) RunInjected();
      return absl::OkStatus();
    }
    if (!read) fs_->Remember(file->inner(), op.offset, op.length, file->granule());
    const Decision d = fs_->Decide(
        file->path(),
        read ? FaultInjectingFileSystem::OpType::kRead : FaultInjectingFileSystem::OpType::kWrite,
        op.length, file->granule());
    IoOp inner_op = op;
    inner_op.file = file->inner();
    if (!d.fault) {
      return inner_->Submit(inner_op, [this, done = std::move(done)](const absl::Status& status) {
        Invoke(done, status);
      });
    }
    absl::Status fault_status = FaultFile::FaultStatus(d, file->path(), op.offset, op.length);
    if (FaultFile::TransfersSomething(d)) {
      inner_op.length = d.partial_bytes;
      return inner_->Submit(
          inner_op,
          [this, done = std::move(done), fault_status = std::move(fault_status)](
              const absl::Status& status) { Invoke(done, status.ok() ? fault_status : status); });
    }
    // Nothing to transfer: the op completes with its fault at the next reap point.
    injected_.emplace_back(std::move(done), std::move(fault_status));
    if (injected_.size() >= depth_) RunInjected();  // bounded, like a full ring
    return absl::OkStatus();
  }

  absl::Status Drain() override {
    if (callback_depth_ > 0) {
      return absl::FailedPreconditionError("IoQueue(fault): Drain called from a callback");
    }
    // Callbacks of either kind may submit more of either kind.
    while (true) {
      CKV_RETURN_IF_ERROR(inner_->Drain());
      if (injected_.empty()) return absl::OkStatus();
      RunInjected();
    }
  }

  const char* backend() const override { return inner_->backend(); }

 private:
  void Invoke(const Callback& done, const absl::Status& status) {
    ++callback_depth_;
    done(status);
    --callback_depth_;
  }

  // Runs the ops that failed without reaching the target queue, unless a callback is running
  // (the outermost RunInjected or Drain then picks them up), so callbacks never nest.
  void RunInjected() {
    if (callback_depth_ > 0) return;
    while (!injected_.empty()) {
      auto [done, status] = std::move(injected_.front());
      injected_.pop_front();
      Invoke(done, status);
    }
  }

  FaultInjectingFileSystem* const fs_;
  const std::unique_ptr<IoQueue> inner_;
  const uint32_t depth_;
  std::deque<std::pair<Callback, absl::Status>> injected_;
  int callback_depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// FaultInjectingFileSystem

FaultInjectingFileSystem::FaultInjectingFileSystem(FileSystem* target, uint64_t seed)
    : target_(target), rng_(seed), sleeper_([](uint64_t latency_us) {
        absl::SleepFor(absl::Microseconds(static_cast<int64_t>(latency_us)));
      }) {}

FaultInjectingFileSystem::~FaultInjectingFileSystem() = default;

void FaultInjectingFileSystem::AddRule(FaultRule rule) {
  absl::MutexLock lock(&mu_);
  rules_.push_back(std::move(rule));
}

void FaultInjectingFileSystem::ClearRules() {
  absl::MutexLock lock(&mu_);
  rules_.clear();
}

void FaultInjectingFileSystem::SetSleeper(Sleeper sleeper) {
  absl::MutexLock lock(&mu_);
  sleeper_ = std::move(sleeper);
}

uint64_t FaultInjectingFileSystem::injected(FaultKind kind) const {
  absl::MutexLock lock(&mu_);
  return injected_[static_cast<size_t>(kind)];
}

uint64_t FaultInjectingFileSystem::total_injected() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (uint64_t count : injected_) total += count;
  return total;
}

void FaultInjectingFileSystem::ResetCounters() {
  absl::MutexLock lock(&mu_);
  injected_.fill(0);
}

FaultInjectingFileSystem::Decision FaultInjectingFileSystem::Decide(const std::string& path,
                                                                    OpType type, size_t length,
                                                                    size_t granule) {
  Decision d;
  Sleeper sleeper;
  {
    absl::MutexLock lock(&mu_);
    const auto rule = std::find_if(rules_.begin(), rules_.end(), [&](const FaultRule& r) {
      return path.find(r.path_substring) != std::string::npos;
    });
    if (rule == rules_.end()) return d;
    // One draw per configured probability, so that a rule's faults do not shift the draws of
    // kinds it does not configure. 53 random bits make a double in [0, 1), the same with every
    // standard library.
    auto hit = [&](double probability) {
      if (probability <= 0) return false;
      return static_cast<double>(rng_() >> 11) * 0x1.0p-53 < probability;
    };
    auto fault = [&](FaultKind kind, int err) {
      d.fault = kind;
      d.err = err;
    };
    // X: a multiple of the granule below `length`.
    auto partial = [&]() -> size_t {
      const uint64_t multiples = (length - 1) / granule + 1;  // 0, g, ..., below length
      return static_cast<size_t>(rng_() % multiples) * granule;
    };
    switch (type) {
      case OpType::kRead:
        if (hit(rule->read_eio)) {
          fault(FaultKind::kReadEio, EIO);
        } else if (length > 0 && hit(rule->short_read)) {
          fault(FaultKind::kShortRead, 0);
          d.partial_bytes = partial();
        }
        break;
      case OpType::kWrite:
        if (hit(rule->write_eio)) {
          fault(FaultKind::kWriteEio, EIO);
        } else if (hit(rule->write_enospc)) {
          fault(FaultKind::kWriteEnospc, ENOSPC);
        } else if (length > 0 && hit(rule->torn_write)) {
          fault(FaultKind::kTornWrite, EIO);
          d.partial_bytes = partial();
          d.torn_write_reports_ok = rule->torn_write_reports_ok;
        }
        break;
      case OpType::kSync:
        if (hit(rule->sync_fail)) fault(FaultKind::kSyncFail, rule->sync_errno);
        break;
      case OpType::kAllocate:
        // A full disk shows up first where a Put reserves its blocks.
        if (hit(rule->write_enospc)) fault(FaultKind::kWriteEnospc, ENOSPC);
        break;
      case OpType::kPunchHole:
        if (hit(rule->punch_hole_fail)) fault(FaultKind::kPunchHoleFail, rule->punch_hole_errno);
        break;
    }
    if (d.fault) ++injected_[static_cast<size_t>(*d.fault)];
    if (rule->latency_us > 0) {
      d.latency_us = rule->latency_us;
      ++injected_[static_cast<size_t>(FaultKind::kLatency)];
      sleeper = sleeper_;
    }
  }
  if (d.latency_us > 0 && sleeper) sleeper(d.latency_us);
  return d;
}

absl::StatusOr<std::unique_ptr<File>> FaultInjectingFileSystem::Open(const std::string& path,
                                                                     OpenMode mode) {
  CKV_RETURN_IF_ERROR(CrashPoint(absl::StrCat("open ", path), /*counts=*/false));
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<File> inner, target_->Open(path, mode));
  return std::unique_ptr<File>(std::make_unique<FaultFile>(this, std::move(inner)));
}

absl::Status FaultInjectingFileSystem::CreateDir(const std::string& path) {
  CKV_RETURN_IF_ERROR(CrashPoint(absl::StrCat("create directory ", path), /*counts=*/false));
  return target_->CreateDir(path);
}

absl::StatusOr<std::vector<std::string>> FaultInjectingFileSystem::ListDir(
    const std::string& path) {
  return target_->ListDir(path);
}

absl::Status FaultInjectingFileSystem::DeleteFile(const std::string& path) {
  CKV_RETURN_IF_ERROR(CrashPoint(absl::StrCat("delete ", path), /*counts=*/false));
  CKV_RETURN_IF_ERROR(target_->DeleteFile(path));
  Forget(path, UINT64_MAX);
  return absl::OkStatus();
}

absl::Status FaultInjectingFileSystem::SyncDir(const std::string& path) {
  CKV_RETURN_IF_ERROR(CrashPoint(absl::StrCat("sync directory ", path), /*counts=*/false));
  return target_->SyncDir(path);
}

bool FaultInjectingFileSystem::Exists(const std::string& path) { return target_->Exists(path); }

absl::StatusOr<std::unique_ptr<IoQueue>> FaultInjectingFileSystem::NewIoQueue(uint32_t depth) {
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> inner, target_->NewIoQueue(depth));
  return std::unique_ptr<IoQueue>(std::make_unique<FaultIoQueue>(this, std::move(inner), depth));
}

// ---------------------------------------------------------------------------------------------
// Simulated power loss

void FaultInjectingFileSystem::ArmCrash(uint64_t ops) {
  absl::MutexLock lock(&mu_);
  armed_ = true;
  crashed_ = false;
  ops_before_crash_ = ops;
  unsynced_.clear();
}

bool FaultInjectingFileSystem::crashed() const {
  absl::MutexLock lock(&mu_);
  return crashed_;
}

absl::Status FaultInjectingFileSystem::CrashPoint(const std::string& what, bool counts) {
  absl::MutexLock lock(&mu_);
  if (!crashed_ && armed_ && counts) {
    if (ops_before_crash_ == 0) {
      crashed_ = true;
    } else {
      --ops_before_crash_;
    }
  }
  if (!crashed_) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": the process is gone (simulated crash)"));
}

uint64_t FaultInjectingFileSystem::NextWriteSeq() const {
  absl::MutexLock lock(&mu_);
  return write_seq_;
}

void FaultInjectingFileSystem::Remember(File* inner, uint64_t offset, size_t length,
                                        size_t granule) {
  {
    absl::MutexLock lock(&mu_);
    if (!armed_ || length == 0) return;
  }
  UnsyncedWrite w;
  w.path = inner->path();
  w.offset = offset;
  w.length = length;
  w.granule = granule;
  // The write is aligned for direct I/O, so the same range reads back with an aligned buffer.
  AlignedBuffer old(length, std::max(inner->alignment(), kDirectIoAlignment));
  if (inner->ReadAt(offset, old.span()).ok()) {
    w.old_bytes.assign(old.data(), old.data() + length);
  }
  absl::MutexLock lock(&mu_);
  w.seq = write_seq_++;
  unsynced_.push_back(std::move(w));
}

void FaultInjectingFileSystem::Forget(const std::string& path, uint64_t before) {
  absl::MutexLock lock(&mu_);
  std::erase_if(unsynced_, [&](const UnsyncedWrite& w) { return w.path == path && w.seq < before; });
}

absl::StatusOr<FaultInjectingFileSystem::CrashReport> FaultInjectingFileSystem::ApplyCrash(
    uint64_t seed) {
  std::vector<UnsyncedWrite> writes;
  {
    absl::MutexLock lock(&mu_);
    writes = std::move(unsynced_);
    unsynced_.clear();
    armed_ = false;
    crashed_ = false;
  }
  std::mt19937_64 rng(seed);
  CrashReport report;
  std::vector<std::pair<std::string, std::unique_ptr<File>>> files;
  auto file_of = [&](const std::string& path) -> absl::StatusOr<File*> {
    for (auto& [p, f] : files) {
      if (p == path) return f.get();
    }
    CKV_ASSIGN_OR_RETURN(std::unique_ptr<File> f, target_->Open(path, OpenMode::kReadWrite));
    files.emplace_back(path, std::move(f));
    return files.back().second.get();
  };
  // Newest first, so that overlapping writes put back the oldest bytes last.
  for (auto it = writes.rbegin(); it != writes.rend(); ++it) {
    const UnsyncedWrite& w = *it;
    const uint64_t draw = rng() % 3;
    if (draw == 2 || w.old_bytes.empty()) {
      ++report.writes_kept;
      continue;
    }
    size_t kept = 0;  // bytes of the write's head that reached the disk
    if (draw == 1) {
      const uint64_t multiples = (w.length - 1) / w.granule + 1;
      kept = static_cast<size_t>(rng() % multiples) * w.granule;
      ++report.writes_torn;
    } else {
      ++report.writes_dropped;
    }
    if (kept == w.length) continue;
    CKV_ASSIGN_OR_RETURN(File * file, file_of(w.path));
    const size_t n = w.length - kept;
    AlignedBuffer buf(n, std::max(file->alignment(), kDirectIoAlignment));
    std::copy(w.old_bytes.begin() + static_cast<std::ptrdiff_t>(kept), w.old_bytes.end(),
              buf.data());
    CKV_RETURN_IF_ERROR(file->WriteAt(w.offset + kept, buf.span()));
  }
  for (auto& [path, f] : files) CKV_RETURN_IF_ERROR(f->Sync());
  return report;
}

}  // namespace ckv::storage
