// The io_uring backend of ReadEngine.
//
// Life cycle of a ring. Each of the io_threads I/O threads owns one ring, one slice of the
// staging arena and one eventfd; nothing of a ring is touched by another thread except its
// sleeping/woken flags (under the engine's lock) and the eventfd (written by submitters).
//  1. Set-up (Start, on the creating thread): io_uring_queue_init_params with queue_depth + 1 SQ
//     entries (the extra one is the wake-up poll) and COOP_TASKRUN where the kernel has it; the
//     arena slice, queue_depth buffers of max_io_bytes, is registered with
//     io_uring_register_buffers (one iovec per buffer, read with IORING_OP_READ_FIXED and the
//     buffer's index); a sparse file table of max_files is registered with
//     io_uring_register_files_sparse, and RegisterFile fills slot `FileId` of every ring with
//     io_uring_register_files_update (IOSQE_FIXED_FILE then names the file by index). Either
//     registration failing (RLIMIT_MEMLOCK on old kernels) falls back to plain reads and fds,
//     logged once. A POLL_ADD on the eventfd is armed.
//  2. Turn of the loop, under the engine's lock: the slots whose reads landed last turn are
//     released (their requests freed, their buffers back on the free list: only here, after the
//     kernel's CQE, is a buffer ever reused), then up to free-slot-count coalesced reads are
//     taken from the scheduler. Before unlocking, the thread says whether it will sleep with room
//     (free slots), so that a submitter knows to wake it.
//  3. Without the lock: each taken read becomes an SQE (the fault hook may fail it, shorten it or
//     delay it first); io_uring_submit hands them over; with reads in flight the thread polls
//     the CQ for up to poll_before_sleep_us, then io_uring_submit_and_wait sleeps for one CQE
//     (not when a read already finished without the kernel, or the poll saw one).
//  4. Reap: every CQE is processed before any callback runs. Negative res is -errno: EINTR and
//     EAGAIN requeue the read (bounded), other errors fail it; a short read requeues the
//     remainder straight away (liburing's io_uring-cp.c); 0 bytes is an end of file (DataLoss).
//     The poll CQE drains the eventfd and re-arms the poll.
//  5. Finished reads are verified (checksums) and their callbacks run; the slots are released
//     at the next turn (step 2), so a callback's view of the buffer is valid while it runs.
//  6. Wake-up: Submit/Resume/shutdown, under the lock, write the eventfd of every ring that sleeps
//     with room; the armed poll completes and the ring's wait returns.
//  7. Shutdown: the engine cancels what is queued and sets stopping_; a ring thread leaves its
//     loop only when none of its reads is in the kernel, then the ring, the eventfd and the arena
//     are freed (after the pin hook's unpin).
#include <liburing.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "prefetch/read_engine_internal.h"
#include "storage/uring_io_queue.h"

namespace ckv::prefetch::internal {
namespace {

constexpr int kMaxRetries = 1000;
constexpr int kMaxEnterRetries = 100000;

struct Slot {
  IoGroup group;
  std::byte* buffer = nullptr;
  uint32_t buffer_index = 0;
  uint32_t done = 0;  // bytes landed
  int retries = 0;
  absl::Status status;
};

struct Ring {
  io_uring ring{};
  bool ring_ready = false;
  int efd = -1;
  storage::AlignedBuffer arena;
  std::vector<Slot> slots;
  std::vector<Slot*> free;  // owned by the ring's thread
  uint32_t taken = 0;       // slots not free
  uint32_t in_kernel = 0;   // slots with a read in the kernel or being requeued (<= queue_depth)
  std::chrono::steady_clock::time_point last_reap{};
  double gap_us = 0;        // moving average of the time between completions
  bool sleeping_with_room = false;  // guarded by the engine's mu_
  bool wake_sent = false;           // guarded by the engine's mu_
  std::thread thread;
};

class UringBackend final : public Backend {
 public:
  explicit UringBackend(ReadEngine::Impl* engine)
      : engine_(engine), fds_(engine->options().max_files, -1),
        poll_us_(engine->options().poll_before_sleep_us),
        fixed_buffers_(engine->options().register_with_ring),
        fixed_files_(engine->options().register_with_ring) {}
  ~UringBackend() override {
    Join();
    for (auto& r : rings_) {
      if (r->ring_ready) {
        storage::AnnotateRingGone(r->ring);
        io_uring_queue_exit(&r->ring);
      }
      if (r->efd >= 0) close(r->efd);
      if (pinned_ && engine_->options().unpin_memory) {
        engine_->options().unpin_memory(r->arena.data(), r->arena.size());
      }
    }
  }

  const char* name() const override { return "io_uring"; }
  bool fixed_buffers() const override { return fixed_buffers_ && fixed_files_; }

  absl::Status Start() override {
    const ReadEngineOptions& o = engine_->options();
    for (uint32_t t = 0; t < o.io_threads; ++t) {
      auto r = std::make_unique<Ring>();
      CKV_RETURN_IF_ERROR(SetUp(*r));
      rings_.push_back(std::move(r));
    }
    if (o.pin_memory) {
      for (auto& r : rings_) CKV_RETURN_IF_ERROR(o.pin_memory(r->arena.data(), r->arena.size()));
      pinned_ = true;
    }
    for (auto& r : rings_) {
      Ring* ring = r.get();
      ring->thread = std::thread([this, ring] { Loop(*ring); });
    }
    return absl::OkStatus();
  }

  absl::Status RegisterFile(FileId id, storage::File* file) override {
    auto* posix = dynamic_cast<storage::PosixFile*>(file);
    if (posix == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RegisterFile ", file->path(),
          ": the io_uring backend needs a file opened by the POSIX file system (use the threads "
          "backend for wrapped files)"));
    }
    if (file->alignment() > storage::kDirectIoAlignment) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RegisterFile ", file->path(), ": alignment ", file->alignment(), " exceeds 4096"));
    }
    int fd = posix->fd();
    if (fixed_files_) {
      for (auto& r : rings_) {
        const int ret = io_uring_register_files_update(&r->ring, id, &fd, 1);
        if (ret < 0) {
          return ErrnoToStatus(-ret, absl::StrCat("register ", file->path(), " with io_uring"));
        }
      }
    }
    fds_[id] = fd;  // published to the ring threads by the engine's lock
    return absl::OkStatus();
  }

  void UnregisterFile(FileId id) override {
    fds_[id] = -1;
    if (!fixed_files_) return;
    int fd = -1;
    for (auto& r : rings_) io_uring_register_files_update(&r->ring, id, &fd, 1);
  }

  void WakeLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_->mu_) {
    const bool all = engine_->stopping_;
    for (auto& r : rings_) {
      // A callback submitting on a ring's own thread needs no wake-up: the thread takes the
      // work at its next turn.
      if (r.get() == current_ring_ && !all) continue;
      if ((all || r->sleeping_with_room) && !r->wake_sent) {
        r->wake_sent = true;
        eventfd_write(r->efd, 1);
      }
    }
  }

  void Join() override {
    for (auto& r : rings_) {
      if (r->thread.joinable()) r->thread.join();
    }
  }

 private:
  absl::Status SetUp(Ring& r) {
    const ReadEngineOptions& o = engine_->options();
    // No COOP_TASKRUN: completions must reach the CQ while the thread polls it in user space
    // (step 3), which the default task-work notification does.
    io_uring_params params{};
    int ret = io_uring_queue_init_params(o.queue_depth + 1, &r.ring, &params);
    if (ret < 0) {
      return ErrnoToStatus(-ret, absl::StrCat("set up an io_uring of depth ", o.queue_depth + 1));
    }
    r.ring_ready = true;
    storage::AnnotateNewRing(r.ring);
    r.efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r.efd < 0) return ErrnoToStatus(errno, "eventfd for the read engine");

    // Twice queue_depth buffers: the device is refilled while landed reads are being verified.
    const uint32_t buffers = 2 * o.queue_depth;
    r.arena = storage::AlignedBuffer(size_t{buffers} * o.max_io_bytes, storage::kDirectIoAlignment);
    r.slots.resize(buffers);
    std::vector<iovec> iovs(buffers);
    for (uint32_t i = 0; i < buffers; ++i) {
      r.slots[i].buffer = r.arena.data() + size_t{i} * o.max_io_bytes;
      r.slots[i].buffer_index = i;
      iovs[i] = {r.slots[i].buffer, o.max_io_bytes};
    }
    for (uint32_t i = buffers; i-- > 0;) r.free.push_back(&r.slots[i]);

    Logger* logger = o.logger != nullptr ? o.logger : StderrLogger();
    static std::once_flag buffers_logged, files_logged;
    if (fixed_buffers_) {
      ret = io_uring_register_buffers(&r.ring, iovs.data(), static_cast<unsigned>(iovs.size()));
      if (ret < 0) {
        fixed_buffers_ = false;
        std::call_once(buffers_logged, [&] {
          logger->Log(LogLevel::kWarning,
                      absl::StrCat("io_uring: registering ", buffers, " staging buffers failed (",
                                   ErrnoToStatus(-ret, "io_uring_register_buffers").message(),
                                   "); using plain reads"));
        });
      }
    }
    if (fixed_files_) {
      ret = io_uring_register_files_sparse(&r.ring, o.max_files);
      if (ret < 0) {
        fixed_files_ = false;
        std::call_once(files_logged, [&] {
          logger->Log(LogLevel::kWarning,
                      absl::StrCat("io_uring: registering a file table failed (",
                                   ErrnoToStatus(-ret, "io_uring_register_files_sparse").message(),
                                   "); using plain descriptors"));
        });
      }
    }
    ArmPoll(r);
    return absl::OkStatus();
  }

  void ArmPoll(Ring& r) {
    io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);  // the extra SQ entry keeps room for it
    io_uring_prep_poll_add(sqe, r.efd, POLLIN);
    io_uring_sqe_set_data(sqe, nullptr);
  }

  // Puts the remainder of the slot's read into an SQE, or finishes it without the kernel when
  // the fault hook says so (then it goes to `finished`).
  void Prep(Ring& r, Slot* s, std::vector<Slot*>& finished, uint64_t& ios) {
    const IoGroup& g = s->group;
    uint32_t length = g.length - s->done;
    const uint64_t offset = g.offset + s->done;
    if (const FaultHook& hook = engine_->options().fault_hook) {
      while (true) {
        const IoFault fault = hook(g.file_ptr->path(), offset, length);
        if (fault.latency_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(fault.latency_us));
        if (fault.error != 0) {
          ++ios;
          if ((fault.error == EINTR || fault.error == EAGAIN) && ++s->retries < kMaxRetries) continue;
          s->status = ErrnoToStatus(fault.error, absl::StrCat(ReadEngine::Impl::Describe(g), " (injected)"));
          --r.in_kernel;
          finished.push_back(s);
          return;
        }
        if (fault.transfer_limit >= 0 && fault.transfer_limit < length) {
          length = static_cast<uint32_t>(fault.transfer_limit);
          if (length == 0) {
            ++ios;
            s->status = absl::DataLossError(absl::StrCat("short read: ", ReadEngine::Impl::Describe(g),
                                                         ": got ", s->done, " of ", g.length,
                                                         " bytes (injected end of file)"));
            --r.in_kernel;
            finished.push_back(s);
            return;
          }
        }
        break;
      }
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);
    // Cannot be null: at most queue_depth reads and one poll are outstanding in queue_depth + 1.
    const int fd = fixed_files_ ? static_cast<int>(g.file) : fds_[g.file];
    if (fixed_buffers_) {
      io_uring_prep_read_fixed(sqe, fd, s->buffer + s->done, length, offset,
                               static_cast<int>(s->buffer_index));
    } else {
      io_uring_prep_read(sqe, fd, s->buffer + s->done, length, offset);
    }
    if (fixed_files_) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, s);
    ++ios;
  }

  void HandleCqe(Ring& r, Slot* s, int res, std::vector<Slot*>& finished, uint64_t& ios,
                 uint64_t& bytes) {
    const IoGroup& g = s->group;
    if (res < 0) {
      const int err = -res;
      if ((err == EINTR || err == EAGAIN) && ++s->retries < kMaxRetries) {
        Prep(r, s, finished, ios);
        return;
      }
      s->status = ErrnoToStatus(err, ReadEngine::Impl::Describe(g));
      --r.in_kernel;
      finished.push_back(s);
      return;
    }
    if (res == 0) {
      s->status = absl::DataLossError(absl::StrCat("short read: ", ReadEngine::Impl::Describe(g),
                                                   ": got ", s->done, " of ", g.length, " bytes"));
      --r.in_kernel;
      finished.push_back(s);
      return;
    }
    s->done += static_cast<uint32_t>(res);
    bytes += static_cast<uint64_t>(res);
    s->retries = 0;
    if (s->done < g.length) {
      Prep(r, s, finished, ios);  // short read: the remainder goes round again
      return;
    }
    --r.in_kernel;
    finished.push_back(s);
  }

  // Steps 2 and 3a: releases `landed`, takes reads into free slots (at most queue_depth in the
  // kernel) and prepares their SQEs. Returns false when the thread should exit.
  bool TakeAndPrep(Ring& r, std::vector<Slot*>& landed, std::vector<Slot*>& finished,
                   std::vector<IoGroup*>& groups, uint64_t& ios, uint64_t& bytes) {
    const uint32_t qd = engine_->options().queue_depth;
    size_t n = 0, first = 0;
    {
      absl::MutexLock lock(&engine_->mu_);
      for (Slot* s : landed) {
        engine_->ReleaseLocked(s->group);
        r.free.push_back(s);
        --r.taken;
      }
      landed.clear();
      engine_->CountIoLocked(ios, bytes);
      ios = bytes = 0;
      r.wake_sent = false;
      const size_t room = std::min<size_t>(r.free.size(), qd - r.in_kernel);
      if (room > 0 && engine_->HasWorkLocked()) {
        first = r.free.size() - room;
        groups.clear();
        for (size_t i = first; i < r.free.size(); ++i) groups.push_back(&r.free[i]->group);
        n = engine_->TakeLocked(groups);
      }
      if (engine_->stopping_ && r.taken == 0 && n == 0) return false;
      r.sleeping_with_room = room > n;
    }
    // TakeLocked filled the groups of r.free[first .. first + n).
    for (size_t i = first; i < first + n; ++i) {
      Slot* s = r.free[i];
      s->done = 0;
      s->retries = 0;
      s->status = absl::OkStatus();
      ++r.taken;
      ++r.in_kernel;
      Prep(r, s, finished, ios);
    }
    r.free.erase(r.free.begin() + static_cast<std::ptrdiff_t>(first),
                 r.free.begin() + static_cast<std::ptrdiff_t>(first + n));
    return true;
  }

  void Loop(Ring& r) {
    current_ring_ = &r;
    std::vector<Slot*> landed;    // verified and called back; released at the next take
    std::vector<Slot*> finished;  // finished this turn (in_kernel already decremented)
    std::vector<IoGroup*> groups;
    std::vector<Completion> completions;
    uint64_t ios = 0, bytes = 0;
    int enter_failures = 0;
    while (true) {
      if (!TakeAndPrep(r, landed, finished, groups, ios, bytes)) break;

      unsigned wait_nr = finished.empty() ? 1 : 0;
      // Polling pays only when completions come faster than the poll lasts (small reads); for
      // large reads it would mostly burn CPU.
      if (wait_nr == 1 && r.in_kernel > 0 && poll_us_ > 0 && r.gap_us * 2 < poll_us_) {
        // Poll the CQ briefly before sleeping: a sleep and wake-up per completion leaves the
        // device slot idle for the scheduler's wake-up latency (large on a shared VM).
        io_uring_submit(&r.ring);
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(poll_us_);
        while (io_uring_cq_ready(&r.ring) == 0 && std::chrono::steady_clock::now() < until) {
        }
        if (io_uring_cq_ready(&r.ring) > 0) wait_nr = 0;
      }
      const int ret = io_uring_submit_and_wait(&r.ring, wait_nr);
      if (ret < 0 && ret != -EINTR) {
        // EAGAIN/EBUSY: the kernel is short of resources or CQ room; reaping frees both.
        if (++enter_failures > kMaxEnterRetries) {
          std::fprintf(stderr, "ckv: read engine: io_uring_enter keeps failing (errno %d)\n", -ret);
          std::abort();  // cannot fail reads the kernel may still be writing into
        }
        if (io_uring_cq_ready(&r.ring) == 0) sched_yield();
      } else {
        enter_failures = 0;
      }
      // Step 4: every CQE is processed before any callback runs.
      Reap(r, finished, ios, bytes);
      // Refill the device before verifying: the slots that just landed keep their buffers until
      // their callbacks have run, so new reads go to the spare staging buffers.
      if (!finished.empty()) {
        if (!TakeAndPrep(r, landed, finished, groups, ios, bytes)) break;
        io_uring_submit(&r.ring);
      }
      // Step 5: verify; completions that land meanwhile are reaped and the device refilled
      // between two verifications, not after the whole batch.
      for (size_t i = 0; i < finished.size(); ++i) {
        Slot* s = finished[i];
        engine_->FinishGroup(s->group, s->buffer, s->status, completions);
        landed.push_back(s);
        if (io_uring_cq_ready(&r.ring) > 0) {
          const size_t before = finished.size();
          Reap(r, finished, ios, bytes);
          if (finished.size() > before) {
            std::vector<Slot*> none;  // nothing is released before its callback has run
            TakeAndPrep(r, none, finished, groups, ios, bytes);
            io_uring_submit(&r.ring);
          }
        }
      }
      finished.clear();
      ReadEngine::Impl::RunCallbacks(completions);
    }
  }

  // Processes every CQE in the ring (step 4) and tracks the gap between completions.
  void Reap(Ring& r, std::vector<Slot*>& finished, uint64_t& ios, uint64_t& bytes) {
    unsigned head;
    io_uring_cqe* cqe;
    unsigned seen = 0, reads = 0;
    io_uring_for_each_cqe(&r.ring, head, cqe) {
      ++seen;
      auto* s = static_cast<Slot*>(io_uring_cqe_get_data(cqe));
      if (s == nullptr) {
        eventfd_t value;
        eventfd_read(r.efd, &value);  // nonblocking; clears the counter
        ArmPoll(r);
        continue;
      }
      ++reads;
      HandleCqe(r, s, cqe->res, finished, ios, bytes);
    }
    io_uring_cq_advance(&r.ring, seen);
    if (reads > 0) {
      const auto now = std::chrono::steady_clock::now();
      const double gap_us = std::chrono::duration<double, std::micro>(now - r.last_reap).count() / reads;
      r.last_reap = now;
      r.gap_us = 0.9 * r.gap_us + 0.1 * std::min(gap_us, 10000.0);
    }
  }

  static thread_local Ring* current_ring_;
  ReadEngine::Impl* const engine_;
  std::vector<std::unique_ptr<Ring>> rings_;
  std::vector<int> fds_;  // by FileId; written under registration, read by ring threads
  const uint32_t poll_us_;
  bool fixed_buffers_;
  bool fixed_files_;
  bool pinned_ = false;
};

thread_local Ring* UringBackend::current_ring_ = nullptr;

}  // namespace

std::unique_ptr<Backend> NewUringBackend(ReadEngine::Impl* engine) {
  return std::make_unique<UringBackend>(engine);
}

}  // namespace ckv::prefetch::internal
