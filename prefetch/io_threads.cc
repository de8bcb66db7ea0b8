// SPDX-License-Identifier: Apache-2.0
// ReadEngine's I/O threads: each drives one queue of the I/O layer (io::IoQueue,
// made by the options' FileSystem: io_uring, or the thread fallback; the fault-injecting file
// system wraps either), so that the engine owns only scheduling, coalescing, cancellation and
// verification, and the disk mechanics (fixed buffers and files, the wake-up eventfd,
// poll-before-sleep, EINTR/EAGAIN retries, short-transfer requeues) live in storage/.
//
// Life cycle of an I/O thread.
//  1. Set-up (Start, on the creating thread): the queue of queue_depth ops; 2 x queue_depth
//     staging buffers of max_io_bytes (one arena per thread, pinned with the pin hook), so that
//     the device is refilled while landed reads are verified; with register_with_ring, the
//     buffers are registered with the queue (io_uring_register_buffers) and a table of max_files
//     file slots reserved (a sparse registered-file table); RegisterFile fills slot `FileId` of
//     every queue. A registration failing falls back to plain buffers or descriptors, logged
//     once.
//  2. Turn of the loop, under the engine's lock: the slots whose reads landed last turn are
//     released (their requests freed, their buffers back on the free list: only here, after the
//     queue's completion, is a buffer ever reused), then up to free-slot-count coalesced reads
//     are taken from the scheduler. Before unlocking, the thread says whether it will sleep with
//     room (free slots), so that a submitter knows to wake it.
//  3. Without the lock: the taken reads go to the queue in one batch (registered file slot,
//     registered buffer index, priority), prepared only (PrepareBatch); then Reap(wait) hands
//     them to the kernel and sleeps until a read lands or the thread is woken, in one system
//     call (not sleeping when a read already finished). Refills (step 5) are handed over at once.
//  4. The queue's completions (run inside Reap) only move the slot to the finished list with its
//     Status; every completion of the reap is in before any verification.
//  5. Finished reads are verified (checksums) and their callbacks run; the device is refilled
//     first, and between two verifications when more reads landed. The slots are released at
//     the next turn (step 2), so a callback's view of the buffer is valid while it runs.
//  6. Wake-up: Submit/Resume/shutdown, under the lock, call IoQueue::Wake of every thread that
//     sleeps with room.
//  7. Shutdown: the engine cancels what is queued and sets stopping_; a thread leaves its loop
//     only when none of its reads is in the queue; then the queue is destroyed and the arena
//     freed (after the pin hook's unpin).
//  8. A broken queue (a submission or a reap fails as a whole, not one op: it does not happen on a
//     healthy kernel): the thread verifies what already landed, fails the reads still in the
//     queue and everything queued in the engine, which refuses every later read with the same
//     error (BreakLocked), logs it, and leaves its loop. The kernel may still write into the
//     buffers of the reads it held, and the queue's destructor could wait on a ring that no
//     longer answers: the thread's queue, arena and slots are never freed (Abandon).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "prefetch/read_engine_internal.h"

namespace ckv::prefetch::internal {
namespace {

struct Slot {
  IoGroup group;
  std::byte* buffer = nullptr;
  uint32_t buffer_index = 0;
  absl::Status status;
  bool in_queue = false;  // its read is in the I/O queue: it lands once, then is set false
};

struct IoThread {
  std::unique_ptr<io::IoQueue> queue;
  io::AlignedBuffer arena;
  std::vector<Slot> slots;
  std::vector<Slot*> free;          // owned by the thread
  std::vector<Slot*> finished;      // landed this turn, filled by the queue's completions
  uint32_t taken = 0;               // slots not free
  uint32_t in_queue = 0;            // slots with a read in the queue (<= queue_depth)
  io::IoQueue::Counters counted{};  // the queue's counters already added to the stats
  bool sleeping_with_room = false;  // guarded by the engine's mu_
  bool wake_sent = false;           // guarded by the engine's mu_
  absl::Status broken;              // the queue's failure (step 8); owned by the thread
  std::thread thread;
};

// Keeps a thread whose queue broke alive until the process ends (step 8): reachable, so that a
// leak checker does not report it.
void Abandon(std::unique_ptr<IoThread> t) {
  static std::mutex mu;
  static auto* abandoned = new std::vector<std::unique_ptr<IoThread>>;
  std::lock_guard<std::mutex> lock(mu);
  abandoned->push_back(std::move(t));
}

class IoThreads final : public Backend {
 public:
  explicit IoThreads(ReadEngine::Impl* engine, io::FileSystem* fs)
      : engine_(engine), fs_(fs), register_(engine->options().register_with_ring) {}
  ~IoThreads() override {
    Join();
    for (auto& t : threads_) {
      if (!t->broken.ok()) {
        Abandon(std::move(t));
        continue;
      }
      t->queue.reset();  // waits for what the kernel holds before the arena goes
      if (pinned_ && engine_->options().unpin_memory) {
        engine_->options().unpin_memory(t->arena.data(), t->arena.size());
      }
    }
  }

  const char* name() const override {
    return threads_.empty() ? "?" : threads_[0]->queue->backend();
  }
  bool fixed_buffers() const override { return fixed_buffers_ && fixed_files_; }

  absl::Status Start() override {
    const ReadEngineOptions& o = engine_->options();
    for (uint32_t i = 0; i < o.io_threads; ++i) {
      auto t = std::make_unique<IoThread>();
      CKV_RETURN_IF_ERROR(SetUp(*t));
      threads_.push_back(std::move(t));
    }
    if (o.pin_memory) {
      for (auto& t : threads_) CKV_RETURN_IF_ERROR(o.pin_memory(t->arena.data(), t->arena.size()));
      pinned_ = true;
    }
    for (auto& t : threads_) {
      IoThread* io = t.get();
      io->thread = std::thread([this, io] { Loop(*io); });
    }
    return absl::OkStatus();
  }

  absl::Status RegisterFile(FileId id, io::File* file) override {
    if (file->alignment() > io::kDirectIoAlignment) {
      return absl::InvalidArgumentError(absl::StrCat("RegisterFile ", file->path(), ": alignment ",
                                                     file->alignment(), " exceeds 4096"));
    }
    if (!register_) return absl::OkStatus();
    for (auto& t : threads_) CKV_RETURN_IF_ERROR(t->queue->RegisterFile(id, file));
    return absl::OkStatus();
  }

  void UnregisterFile(FileId id) override {
    if (!register_) return;
    for (auto& t : threads_) t->queue->UnregisterFile(id);
  }

  void WakeLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_->mu_) {
    const bool all = engine_->stopping_;
    for (auto& t : threads_) {
      // A callback submitting on a thread's own loop needs no wake-up: the thread takes the
      // work at its next turn.
      if (t.get() == current_ && !all) continue;
      if ((all || t->sleeping_with_room) && !t->wake_sent) {
        t->wake_sent = true;
        t->queue->Wake();
      }
    }
  }

  void Join() override {
    for (auto& t : threads_) {
      if (t->thread.joinable()) t->thread.join();
    }
  }

 private:
  absl::Status SetUp(IoThread& t) {
    const ReadEngineOptions& o = engine_->options();
    CKV_ASSIGN_OR_RETURN(t.queue, fs_->NewIoQueue(o.queue_depth));
    t.queue->SetPollBeforeSleep(o.poll_before_sleep_us);
    const uint32_t buffers = 2 * o.queue_depth;
    CKV_ASSIGN_OR_RETURN(t.arena, io::AlignedBuffer::Allocate(size_t{buffers} * o.max_io_bytes));
    t.slots.resize(buffers);
    std::vector<std::span<std::byte>> spans(buffers);
    for (uint32_t i = 0; i < buffers; ++i) {
      t.slots[i].buffer = t.arena.data() + size_t{i} * o.max_io_bytes;
      t.slots[i].buffer_index = i;
      spans[i] = {t.slots[i].buffer, o.max_io_bytes};
    }
    for (uint32_t i = buffers; i-- > 0;) t.free.push_back(&t.slots[i]);
    // Registration, when asked: file slots (a queue that cannot register files still maps slots
    // to descriptors) and the staging buffers. Without it, ops name their Files directly.
    Logger* logger = o.logger != nullptr ? o.logger : StderrLogger();
    static std::once_flag buffers_logged, files_logged;
    if (!register_) return absl::OkStatus();
    absl::Status files = t.queue->ReserveFileSlots(o.max_files);
    fixed_files_ = fixed_files_ && files.ok() && t.queue->fixed_files();
    if (!files.ok()) {
      std::call_once(files_logged, [&] {
        logger->Log(LogLevel::kWarning,
                    absl::StrCat("read engine: registering a file table failed (", files.message(),
                                 "); using plain descriptors"));
      });
    }
    absl::Status s = t.queue->RegisterBuffers(spans);
    fixed_buffers_ = fixed_buffers_ && s.ok();
    if (!s.ok() && !absl::IsUnimplemented(s)) {
      std::call_once(buffers_logged, [&] {
        logger->Log(LogLevel::kWarning,
                    absl::StrCat("read engine: registering ", buffers, " staging buffers failed (",
                                 s.message(), "); using plain reads"));
      });
    }
    return absl::OkStatus();
  }

  // Steps 2 and 3a: releases `landed`, takes reads into free slots (at most queue_depth in the
  // queue) and submits them. Returns false when the thread should exit.
  bool TakeAndSubmit(IoThread& t, std::vector<Slot*>& landed, bool hand_over = true) {
    const uint32_t qd = engine_->options().queue_depth;
    size_t n = 0, first = 0;
    {
      absl::MutexLock lock(&engine_->mu_);
      // Every slot is free or taken (in the queue, landed, or called back and not released).
      CKV_DCHECK(t.taken + t.free.size() == t.slots.size() && t.in_queue <= t.taken);
      for (Slot* s : landed) {
        CKV_DCHECK(!s->in_queue && t.taken > 0);  // released once, after its read landed
        engine_->ReleaseLocked(s->group);
        t.free.push_back(s);
        --t.taken;
      }
      landed.clear();
      const io::IoQueue::Counters c = t.queue->counters();
      engine_->CountIoLocked(c.transfers - t.counted.transfers, c.bytes - t.counted.bytes);
      t.counted = c;
      t.wake_sent = false;
      const size_t room = std::min<size_t>(t.free.size(), qd - t.in_queue);
      if (room > 0 && engine_->HasWorkLocked()) {
        first = t.free.size() - room;
        groups_.clear();
        for (size_t i = first; i < t.free.size(); ++i) groups_.push_back(&t.free[i]->group);
        n = engine_->TakeLocked(groups_);
      }
      if (engine_->stopping_ && t.taken == 0 && n == 0) return false;
      t.sleeping_with_room = room > n;
    }
    if (n == 0) return true;
    // TakeLocked filled the groups of t.free[first .. first + n).
    ops_.clear();
    callbacks_.clear();
    for (size_t i = first; i < first + n; ++i) {
      Slot* s = t.free[i];
      const IoGroup& g = s->group;
      s->status = absl::OkStatus();
      ops_.push_back(io::IoOp{.kind = io::IoOp::Kind::kRead,
                              .file = g.file_ptr,
                              .offset = g.offset,
                              .buffer = s->buffer,
                              .length = g.length,
                              .priority = static_cast<uint8_t>(g.priority),
                              .file_slot = register_ ? g.file : io::kNoIoSlot,
                              .buffer_index = register_ ? s->buffer_index : io::kNoIoSlot});
      IoThread* tp = &t;
      callbacks_.emplace_back([tp, s](const absl::Status& status) {
        // Each read lands exactly once: a second completion would hand the slot's buffer to
        // two reads.
        CKV_DCHECK(s->in_queue && tp->in_queue > 0);
        s->in_queue = false;
        s->status = status;
        --tp->in_queue;
        tp->finished.push_back(s);
      });
      CKV_DCHECK(!s->in_queue);
      s->in_queue = true;
      ++t.taken;
      ++t.in_queue;
      CKV_DCHECK(t.in_queue <= qd);  // at most queue_depth reads in the queue
    }
    // Before a Reap(wait) the reads are only prepared: the Reap hands them over and sleeps in one
    // system call (io_uring_submit_and_wait).
    const absl::Status s = hand_over ? t.queue->SubmitBatch(ops_, callbacks_)
                                     : t.queue->PrepareBatch(ops_, callbacks_);
    if (!s.ok()) {
      // A refused batch (a file the queue cannot read, e.g. of another file system with
      // register_with_ring off): none of it was queued, so its reads fail with the error.
      // Any other failure is the queue's own (step 8).
      const bool queue_failed = !absl::IsInvalidArgument(s);
      if (queue_failed && t.broken.ok()) t.broken = s;
      const absl::Status failure = queue_failed ? QueueFailure(t) : s;
      for (size_t i = first; i < first + n; ++i) {
        Slot* slot = t.free[i];
        slot->status = failure;
        slot->in_queue = false;
        --t.in_queue;
        t.finished.push_back(slot);
      }
    }
    t.free.erase(t.free.begin() + static_cast<std::ptrdiff_t>(first),
                 t.free.begin() + static_cast<std::ptrdiff_t>(first + n));
    return true;
  }

  // The error every read gets once the thread's queue broke (step 8).
  static absl::Status QueueFailure(const IoThread& t) {
    return absl::Status(
        t.broken.code(),
        absl::StrCat("read engine: its I/O queue (", t.queue->backend(),
                     ") failed: ", t.broken.message(), "; every read fails from now on"));
  }

  // Reap, remembering a failure of the queue itself (step 8).
  void Reap(IoThread& t, bool wait) {
    if (!t.broken.ok()) return;
    if (absl::Status s = t.queue->Reap(wait); !s.ok()) t.broken = s;
  }

  // Step 8, after the reads that landed were verified and called back: fails the reads still in
  // the queue (their slots are never released: the kernel may still write into their buffers)
  // and, through the engine, everything queued and every later submission.
  void Stop(IoThread& t, std::vector<Slot*>& landed) {
    const absl::Status why = QueueFailure(t);
    const ReadEngineOptions& o = engine_->options();
    (o.logger != nullptr ? o.logger : StderrLogger())
        ->Log(LogLevel::kError, std::string(why.message()));
    std::vector<Completion> failed;
    std::vector<Slot*> held;
    for (Slot& s : t.slots) {
      if (s.in_queue) held.push_back(&s);
    }
    for (Slot* s : held) engine_->FinishGroup(s->group, nullptr, why, failed);
    {
      absl::MutexLock lock(&engine_->mu_);
      for (Slot* s : landed) engine_->ReleaseLocked(s->group);
      for (Slot* s : held) engine_->ReleaseLocked(s->group);
      engine_->BreakLocked(why, failed);
      t.sleeping_with_room = false;
    }
    landed.clear();
    ReadEngine::Impl::RunCallbacks(failed);
  }

  void Loop(IoThread& t) {
    current_ = &t;
    std::vector<Slot*> landed;  // verified and called back; released at the next take
    std::vector<Completion> completions;
    while (true) {
      if (!TakeAndSubmit(t, landed, /*hand_over=*/false)) break;
      // Step 3b: sleep until a read lands or a wake-up comes, unless one already finished.
      Reap(t, /*wait=*/t.finished.empty());
      // Refill the device before verifying: the slots that just landed keep their buffers until
      // their callbacks have run, so new reads go to the spare staging buffers.
      if (!t.finished.empty() && t.broken.ok()) {
        if (!TakeAndSubmit(t, landed)) break;
      }
      // Step 5: verify; reads that land meanwhile are reaped and the device refilled between two
      // verifications, not after the whole batch.
      for (size_t i = 0; i < t.finished.size(); ++i) {
        Slot* s = t.finished[i];
        engine_->FinishGroup(s->group, s->buffer, s->status, completions);
        landed.push_back(s);
        if (t.broken.ok() && t.queue->HasCompletions()) {
          const size_t before = t.finished.size();
          Reap(t, /*wait=*/false);
          if (t.broken.ok() && t.finished.size() > before) {
            std::vector<Slot*> none;  // nothing is released before its callback has run
            TakeAndSubmit(t, none);
          }
        }
      }
      t.finished.clear();
      ReadEngine::Impl::RunCallbacks(completions);
      if (!t.broken.ok()) {
        Stop(t, landed);
        break;
      }
    }
  }

  static thread_local IoThread* current_;
  ReadEngine::Impl* const engine_;
  io::FileSystem* const fs_;
  const bool register_;
  std::vector<std::unique_ptr<IoThread>> threads_;
  bool fixed_buffers_ = register_;  // every queue's buffers registered
  bool fixed_files_ = register_;    // every queue's file table registered
  bool pinned_ = false;
  // Scratch of TakeAndSubmit; thread_local because every I/O thread uses its own.
  static thread_local std::vector<IoGroup*> groups_;
  static thread_local std::vector<io::IoOp> ops_;
  static thread_local std::vector<io::IoQueue::Callback> callbacks_;
};

thread_local IoThread* IoThreads::current_ = nullptr;
thread_local std::vector<IoGroup*> IoThreads::groups_;
thread_local std::vector<io::IoOp> IoThreads::ops_;
thread_local std::vector<io::IoQueue::Callback> IoThreads::callbacks_;

}  // namespace

std::unique_ptr<Backend> NewIoThreads(ReadEngine::Impl* engine, io::FileSystem* fs) {
  return std::make_unique<IoThreads>(engine, fs);
}

}  // namespace ckv::prefetch::internal
