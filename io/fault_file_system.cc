// SPDX-License-Identifier: Apache-2.0
// FaultInjectingFileSystem (see io/fault_file_system.h).
#include "io/fault_file_system.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "io/io_op_narrow.h"
#include "rocksdb/file_system.h"

namespace ckv::io {
namespace {

// Partial transfers stop on a multiple of this (or of the file's alignment when larger), as a
// real torn write stops on a page or sector boundary.
constexpr size_t kPartialGranule = 4096;

// The directory a path's entry lives in ("a/b/c" -> "a/b").
std::string ParentOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string StripSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::optional<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

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
    CKV_RETURN_IF_ERROR(fs_->io_queues_broken());
    if (op.file == nullptr) return absl::InvalidArgumentError("IoQueue(fault): op has no file");
    FaultFile* file = Unwrap(op.file);
    if (file == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("IoQueue(fault): ", op.file->path(),
                       " was not opened by the fault-injecting file system"));
    }
    const bool read = op.kind == IoOp::Kind::kRead;
    absl::Status crash = fs_->CrashPoint(absl::StrCat(read ? "read " : "write ", file->path()),
                                         /*counts=*/!read);
    if (!crash.ok()) {
      Defer(std::move(done), std::move(crash));  // like an injected fault
      return absl::OkStatus();
    }
    if (!read) fs_->Remember(file->inner(), op.offset, op.length, file->granule());
    IoOp inner_op = op;
    inner_op.file = file->inner();
    return SubmitPiece(file, inner_op, std::make_shared<Callback>(std::move(done)));
  }

  absl::Status SubmitBatch(std::span<const IoOp> ops, std::span<Callback> done) override {
    CKV_RETURN_IF_ERROR(fs_->io_queues_broken());
    // A file of another file system (InvalidArgument) refuses the whole batch before any of it
    // is queued.
    for (const IoOp& op : ops) {
      if (op.file == nullptr || Unwrap(op.file) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "IoQueue(fault): ", op.file == nullptr
                                    ? std::string("an op has no file")
                                    : op.file->path() + " was not opened by the fault-injecting "
                                                        "file system"));
      }
    }
    return IoQueue::SubmitBatch(ops, done);
  }

  absl::Status Drain() override {
    if (callback_depth_ > 0) {
      return absl::FailedPreconditionError("IoQueue(fault): Drain called from a callback");
    }
    // Callbacks of either kind may submit more of either kind.
    while (true) {
      CKV_RETURN_IF_ERROR(fs_->io_queues_broken());
      CKV_RETURN_IF_ERROR(inner_->Drain());
      if (injected_.empty()) return absl::OkStatus();
      RunInjected();
    }
  }

  absl::Status Reap(bool wait) override {
    CKV_RETURN_IF_ERROR(fs_->io_queues_broken());
    // An op failed here completes without the target queue: do not sleep while one waits.
    absl::Status status = inner_->Reap(wait && injected_.empty());
    RunInjected();
    return status;
  }
  bool HasCompletions() const override { return !injected_.empty() || inner_->HasCompletions(); }
  void Wake() override { inner_->Wake(); }
  void SetPollBeforeSleep(uint32_t us) override { inner_->SetPollBeforeSleep(us); }
  absl::Status ReserveFileSlots(uint32_t slots) override { return inner_->ReserveFileSlots(slots); }
  absl::Status RegisterFile(uint32_t slot, File* file) override {
    FaultFile* f = Unwrap(file);
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("IoQueue(fault): RegisterFile ", file->path(),
                       ": not opened by the fault-injecting file system"));
    }
    return inner_->RegisterFile(slot, f->inner());
  }
  void UnregisterFile(uint32_t slot) override { inner_->UnregisterFile(slot); }
  absl::Status RegisterBuffers(std::span<const std::span<std::byte>> buffers) override {
    return inner_->RegisterBuffers(buffers);
  }
  bool fixed_files() const override { return inner_->fixed_files(); }
  Counters counters() const override { return inner_->counters(); }
  const char* backend() const override { return inner_->backend(); }

 private:
  using SharedCallback = std::shared_ptr<Callback>;

  static FaultFile* Unwrap(File* file) { return dynamic_cast<FaultFile*>(file); }

  // The pieces of a narrowed gathered op (NarrowIoOp), kept alive by the callbacks that outlive it.
  using Pieces = std::shared_ptr<std::vector<IoPiece>>;
  static IoOp Narrow(const IoOp& op, size_t from, size_t length, Pieces* pieces) {
    *pieces = std::make_shared<std::vector<IoPiece>>();
    return NarrowIoOp(op, from, length, pieces->get());
  }

  // One piece of an op (all of it, or the remainder after an injected short transfer), with
  // `op.file` the target's File: the op hook first, then the rules.
  absl::Status SubmitPiece(FaultFile* file, const IoOp& op, SharedCallback done) {
    const bool read = op.kind == IoOp::Kind::kRead;
    const std::string& path = file->path();
    if (std::optional<FaultInjectingFileSystem::OpFault> f =
            fs_->HookFault(path, read, op.offset, op.length, inner_->backend())) {
      if (f->error != 0) {
        Defer(std::move(*done),
              ErrnoToStatus(f->error, absl::StrCat(read ? "read " : "write ", path, " at offset ",
                                                   op.offset, " (injected)")));
        return absl::OkStatus();
      }
      if (f->transfer_limit == 0) {
        Defer(std::move(*done), read ? absl::DataLossError(absl::StrCat(
                                           "short read of ", path, " at offset ", op.offset,
                                           ": got 0 of ", op.length, " bytes (injected)"))
                                     : absl::InternalError(absl::StrCat(
                                           "write ", path, " at offset ", op.offset,
                                           ": wrote 0 of ", op.length, " bytes (injected)")));
        return absl::OkStatus();
      }
      if (f->transfer_limit > 0 && static_cast<uint64_t>(f->transfer_limit) < op.length) {
        // A short transfer: the head goes to the target; the remainder is requeued when it lands,
        // as a queue requeues a real one.
        const auto head = static_cast<size_t>(f->transfer_limit);
        Pieces first_pieces, rest_pieces;
        const IoOp first = Narrow(op, 0, head, &first_pieces);
        const IoOp rest = Narrow(op, head, op.length - head, &rest_pieces);
        return inner_->Submit(
            first, [this, file, rest, rest_pieces, first_pieces, done](const absl::Status& status) {
              if (!status.ok()) {
                Invoke(*done, status);
                return;
              }
              if (absl::Status s = SubmitPiece(file, rest, done); !s.ok()) Invoke(*done, s);
            });
      }
    }
    const Decision d = fs_->Decide(
        path,
        read ? FaultInjectingFileSystem::OpType::kRead : FaultInjectingFileSystem::OpType::kWrite,
        op.length, file->granule());
    if (d.fault || d.latency_us > 0) fs_->CountQueueFault(inner_->backend(), read);
    if (!d.fault) {
      return inner_->Submit(op,
                            [this, done](const absl::Status& status) { Invoke(*done, status); });
    }
    absl::Status fault_status = FaultFile::FaultStatus(d, path, op.offset, op.length);
    if (FaultFile::TransfersSomething(d)) {
      Pieces partial_pieces;
      const IoOp partial = Narrow(op, 0, d.partial_bytes, &partial_pieces);
      return inner_->Submit(
          partial,
          [this, done, partial_pieces, fault_status = std::move(fault_status)](
              const absl::Status& status) { Invoke(*done, status.ok() ? fault_status : status); });
    }
    // Nothing to transfer: the op completes with its fault at the next reap point.
    Defer(std::move(*done), std::move(fault_status));
    return absl::OkStatus();
  }

  // Completes an op that does not reach the target queue at the next reap point (or now, when
  // `depth` of them wait: bounded, like a full ring).
  void Defer(Callback done, absl::Status status) {
    injected_.emplace_back(std::move(done), std::move(status));
    if (injected_.size() >= depth_) RunInjected();
  }

  void Invoke(const Callback& done, const absl::Status& status) {
    ++callback_depth_;
    if (done) done(status);
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

FaultInjectingFileSystem::FaultInjectingFileSystem(FileSystem* target, uint64_t seed, Clock* clock)
    : target_(target),
      clock_(clock != nullptr ? clock : RealClock()),
      rng_(seed),
      sleeper_([clock = clock_](uint64_t latency_us) {
        clock->SleepFor(absl::Microseconds(static_cast<int64_t>(latency_us)));
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

void FaultInjectingFileSystem::SetOpHook(OpHook hook) {
  absl::MutexLock lock(&mu_);
  op_hook_ = std::move(hook);
}

void FaultInjectingFileSystem::BreakIoQueues(absl::Status status) {
  CKV_CHECK(!status.ok());
  absl::MutexLock lock(&mu_);
  queues_broken_ = std::move(status);
}

absl::Status FaultInjectingFileSystem::io_queues_broken() const {
  absl::MutexLock lock(&mu_);
  return queues_broken_;
}

std::optional<FaultInjectingFileSystem::OpFault> FaultInjectingFileSystem::HookFault(
    const std::string& path, bool read, uint64_t offset, size_t length, absl::string_view backend) {
  OpHook hook;
  Sleeper sleeper;
  {
    absl::MutexLock lock(&mu_);
    if (!op_hook_) return std::nullopt;
    hook = op_hook_;
    sleeper = sleeper_;
  }
  // EINTR and EAGAIN are retried as a queue retries a real one (bounded), asking the hook again.
  constexpr int kMaxTransientRetries = 1000;
  for (int attempt = 0;; ++attempt) {
    const OpFault f = hook(OpInfo{path, read, offset, length});
    if (f.latency_us > 0 && sleeper) sleeper(f.latency_us);
    const bool any = f.error != 0 || f.transfer_limit >= 0 || f.latency_us > 0;
    if (any) CountQueueFault(backend, read);
    if ((f.error == EINTR || f.error == EAGAIN) && attempt < kMaxTransientRetries) continue;
    if (!any) return std::nullopt;
    return f;
  }
}

void FaultInjectingFileSystem::CountQueueFault(absl::string_view backend, bool read) {
  absl::MutexLock lock(&mu_);
  QueueFaults& q = queue_faults_[std::string(backend)];
  ++(read ? q.reads : q.writes);
}

FaultInjectingFileSystem::QueueFaults FaultInjectingFileSystem::queue_faults(
    absl::string_view backend) const {
  absl::MutexLock lock(&mu_);
  auto it = queue_faults_.find(std::string(backend));
  return it == queue_faults_.end() ? QueueFaults{} : it->second;
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

bool FaultInjectingFileSystem::CatalogNoSpace(const std::string& path, size_t length) {
  {
    absl::MutexLock lock(&mu_);
    const auto rule = std::find_if(rules_.begin(), rules_.end(), [&](const FaultRule& r) {
      return path.find(r.path_substring) != std::string::npos && (!r.applies || r.applies());
    });
    if (rule == rules_.end() || !rule->catalog_writes || rule->write_enospc <= 0) return false;
  }
  return Decide(path, OpType::kAllocate, length, 1).fault == FaultKind::kWriteEnospc;
}

FaultInjectingFileSystem::Decision FaultInjectingFileSystem::Decide(const std::string& path,
                                                                    OpType type, size_t length,
                                                                    size_t granule) {
  Decision d;
  Sleeper sleeper;
  {
    absl::MutexLock lock(&mu_);
    const auto rule = std::find_if(rules_.begin(), rules_.end(), [&](const FaultRule& r) {
      return path.find(r.path_substring) != std::string::npos && (!r.applies || r.applies());
    });
    if (rule == rules_.end()) return d;
    // One draw per configured probability, so that a rule's faults do not shift the draws of
    // kinds it does not configure. 53 random bits make a double in [0, 1), the same with every
    // standard library.
    auto hit = [&](double probability) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (probability <= 0) return false;
      return static_cast<double>(rng_() >> 11) * 0x1.0p-53 < probability;
    };
    auto fault = [&](FaultKind kind, int err) {
      d.fault = kind;
      d.err = err;
    };
    // X: a multiple of the granule below `length`.
    auto partial = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> size_t {
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
  const bool creates = mode == OpenMode::kCreateReadWrite && !target_->Exists(path);
  // Creating a file changes its directory: a data operation, as a directory fsync is.
  CKV_RETURN_IF_ERROR(
      CrashPoint(absl::StrCat(creates ? "create " : "open ", path), /*counts=*/creates));
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<File> inner, target_->Open(path, mode));
  if (creates) NoteCreated(path);
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
  CKV_RETURN_IF_ERROR(CrashPoint(absl::StrCat("sync directory ", path)));
  CKV_RETURN_IF_ERROR(target_->SyncDir(path));
  NoteDirSynced(path);
  return absl::OkStatus();
}

bool FaultInjectingFileSystem::Exists(const std::string& path) { return target_->Exists(path); }

absl::StatusOr<FileSystemSpace> FaultInjectingFileSystem::Space(const std::string& path) {
  {
    absl::MutexLock lock(&mu_);
    if (space_.has_value()) return *space_;
  }
  return target_->Space(path);
}

void FaultInjectingFileSystem::SetSpace(std::optional<FileSystemSpace> space) {
  absl::MutexLock lock(&mu_);
  space_ = space;
}

absl::StatusOr<std::unique_ptr<IoQueue>> FaultInjectingFileSystem::NewIoQueue(uint32_t depth) {
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> inner, target_->NewIoQueue(depth));
  return std::unique_ptr<IoQueue>(std::make_unique<FaultIoQueue>(this, std::move(inner), depth));
}

// ---------------------------------------------------------------------------------------------
// Simulated power loss

void FaultInjectingFileSystem::ArmCrash(uint64_t ops, bool catalog_only) {
  absl::MutexLock lock(&mu_);
  armed_ = true;
  crashed_ = false;
  crash_in_catalog_only_ = catalog_only;
  ops_before_crash_ = ops;
  crash_seam_.clear();
  crash_point_.clear();
  unsynced_.clear();
  pending_entries_.clear();
  catalog_tails_.clear();
}

void FaultInjectingFileSystem::ArmCrashAt(absl::string_view seam) {
  ArmCrash(UINT64_MAX);
  absl::MutexLock lock(&mu_);
  crash_seam_ = std::string(seam);
}

std::string FaultInjectingFileSystem::crash_point() const {
  absl::MutexLock lock(&mu_);
  return crash_point_;
}

absl::Status FaultInjectingFileSystem::CrashSeam(absl::string_view seam) {
  absl::MutexLock lock(&mu_);
  if (armed_ && !crashed_ && !crash_seam_.empty() && seam == crash_seam_) {
    crashed_ = true;
    crash_point_ = std::string(seam);
  }
  if (!crashed_) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(seam, ": the process is gone (simulated crash)"));
}

void FaultInjectingFileSystem::NoteCreated(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (!armed_) return;
  pending_entries_.push_back(PendingEntry{path, "", std::nullopt});
}

void FaultInjectingFileSystem::NoteRenamed(const std::string& from, const std::string& to) {
  std::optional<std::string> replaced = ReadWhole(to);
  absl::MutexLock lock(&mu_);
  if (!armed_) return;
  pending_entries_.push_back(PendingEntry{to, from, std::move(replaced)});
  auto tail = catalog_tails_.find(from);
  if (tail != catalog_tails_.end()) {
    catalog_tails_[to] = tail->second;
    catalog_tails_.erase(from);
  }
}

void FaultInjectingFileSystem::NoteDirSynced(const std::string& dir_in) {
  const std::string dir = StripSlashes(dir_in);
  absl::MutexLock lock(&mu_);
  std::erase_if(pending_entries_, [&](const PendingEntry& e) {
    return ParentOf(e.path) == dir && (e.from.empty() || ParentOf(e.from) == dir);
  });
}

void FaultInjectingFileSystem::NoteAppended(const std::string& path, uint64_t size_before,
                                            uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (!armed_) return;
  // Bytes appended before arming count as synced, as writes do.
  auto [it, inserted] = catalog_tails_.try_emplace(path, CatalogTail{size_before, size_before});
  it->second.size = std::max(it->second.size, size_before + bytes);
}

void FaultInjectingFileSystem::NoteCatalogSynced(const std::string& path) {
  absl::MutexLock lock(&mu_);
  auto it = catalog_tails_.find(path);
  if (it != catalog_tails_.end()) it->second.synced = it->second.size;
}

bool FaultInjectingFileSystem::crashed() const {
  absl::MutexLock lock(&mu_);
  return crashed_;
}

absl::Status FaultInjectingFileSystem::CrashPoint(const std::string& what, bool counts) {
  absl::MutexLock lock(&mu_);
  const bool counted = counts && (!crash_in_catalog_only_ || what.rfind("catalog", 0) == 0);
  if (!crashed_ && armed_ && counted && ops_before_crash_-- == 0) {
    crashed_ = true;
    crash_point_ = what;
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
  // The write is aligned for direct I/O, so the same range reads back with an aligned buffer (of
  // the size of a write just made; this file system is a test seam, where running out of memory
  // is a CKV_CHECK failure).
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
  std::erase_if(unsynced_,
                [&](const UnsyncedWrite& w) { return w.path == path && w.seq < before; });
}

absl::StatusOr<FaultInjectingFileSystem::CrashReport> FaultInjectingFileSystem::ApplyCrash(
    uint64_t seed, CrashOutcome outcome) {
  std::vector<UnsyncedWrite> writes;
  std::vector<PendingEntry> entries;
  std::map<std::string, CatalogTail> tails;
  {
    absl::MutexLock lock(&mu_);
    writes = std::move(unsynced_);
    unsynced_.clear();
    entries = std::move(pending_entries_);
    pending_entries_.clear();
    tails = std::move(catalog_tails_);
    catalog_tails_.clear();
    armed_ = false;
    crashed_ = false;
    crash_seam_.clear();
  }
  const bool drop_all = outcome == CrashOutcome::kDropAll;
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
    const uint64_t draw = drop_all ? 0 : rng() % 3;
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
    CKV_ASSIGN_OR_RETURN(
        AlignedBuffer buf,
        AlignedBuffer::Allocate(n, std::max(file->alignment(), kDirectIoAlignment)));
    std::copy(w.old_bytes.begin() + static_cast<std::ptrdiff_t>(kept), w.old_bytes.end(),
              buf.data());
    CKV_RETURN_IF_ERROR(file->WriteAt(w.offset + kept, buf.span()));
  }
  for (auto& [path, f] : files) CKV_RETURN_IF_ERROR(f->Sync());
  files.clear();

  // The catalog files' unsynced tails (appends only: cutting them is the whole story).
  for (const auto& [path, t] : tails) {
    if (t.size <= t.synced) continue;
    const uint64_t draw = drop_all ? 0 : rng() % 3;
    if (draw == 2) {
      ++report.catalog_tails_kept;
      continue;
    }
    uint64_t keep = t.synced;
    if (draw == 1) {
      keep += rng() % (t.size - t.synced);
      ++report.catalog_tails_torn;
    } else {
      ++report.catalog_tails_dropped;
    }
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      std::filesystem::resize_file(path, keep, ec);
      if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cut the unsynced tail of ", path));
    }
  }

  // Directory entries: a journaling file system commits them in order, so the oldest ones
  // survive and the newest `undo` are lost, newest first.
  const size_t undo = drop_all ? entries.size() : rng() % (entries.size() + 1);
  report.entries_kept = entries.size() - undo;
  for (size_t i = 0; i < undo; ++i) {
    const PendingEntry& e = entries[entries.size() - 1 - i];
    std::error_code ec;
    ++report.entries_undone;
    if (e.from.empty()) {
      std::filesystem::remove(e.path, ec);  // already deleted by the store: nothing to undo
      continue;
    }
    if (!std::filesystem::exists(e.path, ec)) continue;
    std::filesystem::rename(e.path, e.from, ec);
    if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("undo rename to ", e.path));
    if (e.replaced.has_value()) {
      std::ofstream out(e.path, std::ios::binary | std::ios::trunc);
      out.write(e.replaced->data(), static_cast<std::streamsize>(e.replaced->size()));
      if (!out) return absl::InternalError(absl::StrCat("restore ", e.path));
    }
  }
  return report;
}

}  // namespace ckv::io
