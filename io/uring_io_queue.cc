// SPDX-License-Identifier: Apache-2.0
// The io_uring IoQueue (see io/file_system.h and io/uring_io_queue.h): the one
// io_uring implementation of the I/O layer, for Put's writes and the read engine's reads alike.
//
// Life cycle of a ring. One UringIoQueue owns one ring, used by one thread at a time (Wake and
// file registration excepted, see IoQueue), so nothing here locks.
//  1. Set-up: io_uring_queue_init_params(depth + 1) maps a submission queue (SQ) of at least
//     depth + 1 entries (the extra one is the wake-up poll) and a completion queue (CQ) of twice
//     that. A fixed table of `depth` Requests is allocated with it; an op in the queue is a
//     Request from the table, so Submit does not allocate. An eventfd is made and a POLL_ADD on
//     it armed (user_data 0). Registration, asked for by the caller: ReserveFileSlots registers a
//     sparse file table (io_uring_register_files_sparse) that RegisterFile fills slot by slot
//     (io_uring_register_files_update; IOSQE_FIXED_FILE then names the file by index);
//     RegisterBuffers registers the caller's buffers (io_uring_register_buffers; ops naming a
//     buffer_index use READ_FIXED/WRITE_FIXED). Either failing (RLIMIT_MEMLOCK on old kernels) is
//     returned to the caller, and ops use plain descriptors and buffers.
//  2. Submit/SubmitBatch: at most `depth` ops are outstanding (in the kernel, or parked, or
//     waiting to be requeued). When the table is full, Submit first reaps: it waits for a
//     completion and processes it (step 3). Then the ops are parked at the back of a FIFO, the
//     FIFO is moved into SQEs while the SQ has room, and one io_uring_submit hands the batch to
//     the kernel (PrepareBatch leaves that to the next Reap, which submits and waits at once).
//     With at most `depth` ops and the poll in the kernel the CQ cannot overflow.
//  3. Reap: each CQE's user_data is its Request. A negative res is -errno: EINTR and EAGAIN park
//     the Request again (bounded retries); any other errno completes it with the mapped Status.
//     A positive res advances the Request; a short transfer parks it again for the remainder
//     (liburing's io_uring-cp.c does the same); a zero-byte read is a short read (DataLoss).
//     Finished Requests go back to the table and their callbacks, with their Status, to a
//     completion list. The poll's CQE drains the eventfd and re-arms the poll. Every CQE is
//     processed before any callback runs.
//  4. Callbacks: once the submission step or the reaping is over, the completion list runs in
//     order. A callback may Submit: the new op goes through steps 2-3, and any callback that
//     becomes ready meanwhile runs from the same loop after the current callback returns, so
//     callbacks never nest. A callback must not Drain or Reap.
//  5. Reap(wait): with ops in flight and nothing completed, the thread first polls the CQ for
//     up to the poll-before-sleep time when completions have been arriving at least twice that
//     often (small reads), then io_uring_submit_and_wait sleeps for one CQE: an op's, or the
//     poll's when another thread called Wake (eventfd_write). Then step 3 and step 4.
//  6. Drain: submits what is parked, waits for and reaps completions, runs callbacks, and repeats
//     until nothing is outstanding (callbacks may have submitted more).
//  7. Failure: io_uring_enter failing with anything but EINTR/EAGAIN/EBUSY means the ring cannot
//     be used (it does not happen on a healthy kernel). The queue is then broken: Submit returns
//     the error, and Drain and Reap complete every outstanding op with it and return it.
//  8. Destruction: waits until the kernel holds none of the queue's ops (the kernel writes into
//     caller buffers until then), drops the callbacks that have not run, then
//     io_uring_queue_exit unmaps the ring (cancelling the poll) and the eventfd is closed.
//     Callers Drain first.
#include "io/uring_io_queue.h"

#include <liburing.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "io/file_system.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace ckv::io {

// Under TSan, a ring's accesses are ordered on the start of each of its mappings (the CQ may
// share the SQ's: a second release or acquire there changes nothing).
#if defined(__SANITIZE_THREAD__)
void AnnotateNewRing(const io_uring& ring) {
  for (void* p : {ring.sq.ring_ptr, ring.cq.ring_ptr, static_cast<void*>(ring.sq.sqes)}) {
    __tsan_acquire(p);
  }
}

void AnnotateRingGone(const io_uring& ring) {
  for (void* p : {ring.sq.ring_ptr, ring.cq.ring_ptr, static_cast<void*>(ring.sq.sqes)}) {
    __tsan_release(p);
  }
}
#else
void AnnotateNewRing(const io_uring&) {}
void AnnotateRingGone(const io_uring&) {}
#endif

namespace {

// Bounds the resubmissions of one op that keeps failing with EINTR/EAGAIN without progress.
constexpr int kMaxRetries = 1000;
// Bounds io_uring_enter calls in a row that make no progress (EINTR, EAGAIN, EBUSY).
constexpr int kMaxEnterRetries = 10000;
// Largest transfer of one SQE: res is an int, and the kernel caps a read or write at about 2 GiB.
constexpr size_t kMaxSqeBytes = size_t{1} << 30;

class UringIoQueue final : public IoQueue {
 public:
  explicit UringIoQueue(uint32_t depth) : depth_(depth), requests_(depth) {
    free_.reserve(depth);
    for (Request& request : requests_) free_.push_back(&request);
  }

  // Step 1. Separate from the constructor so that its failure is a Status.
  absl::Status Init() {
    // No COOP_TASKRUN: completions must reach the CQ while Reap polls it in user space, which the
    // default task-work notification does.
    io_uring_params params{};
    const int ret = io_uring_queue_init_params(depth_ + 1, &ring_, &params);
    if (ret < 0) {
      return ErrnoToStatus(-ret, absl::StrCat("set up an io_uring of depth ", depth_ + 1));
    }
    ring_ready_ = true;
    AnnotateNewRing(ring_);
    efd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd_ < 0) return ErrnoToStatus(errno, "eventfd for an io_uring queue");
    ArmPoll();
    return absl::OkStatus();
  }

  ~UringIoQueue() override {
    if (ring_ready_) {
      // Step 8. Requeued remainders are not resubmitted: only what the kernel holds matters.
      shutting_down_ = true;
      while (in_flight_ > 0 && broken_.ok()) {
        if (!Enter(/*wait=*/true).ok()) break;
        ReapCqes();
      }
      AnnotateRingGone(ring_);
      io_uring_queue_exit(&ring_);
    }
    if (efd_ >= 0) close(efd_);
  }

  absl::Status Submit(const IoOp& op, Callback done) override {
    return SubmitBatch(std::span<const IoOp>(&op, 1), std::span<Callback>(&done, 1));
  }

  absl::Status SubmitBatch(std::span<const IoOp> ops, std::span<Callback> done) override {
    return Queue(ops, done, /*hand_over=*/true);
  }

  absl::Status PrepareBatch(std::span<const IoOp> ops, std::span<Callback> done) override {
    return Queue(ops, done, /*hand_over=*/false);
  }

  absl::Status Queue(std::span<const IoOp> ops, std::span<Callback> done, bool hand_over) {
    if (ops.size() != done.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("SubmitBatch: ", ops.size(), " ops but ", done.size(), " callbacks"));
    }
    if (!broken_.ok()) return broken_;
    // A bad op (InvalidArgument) refuses the whole batch before any of it is queued.
    batch_.clear();
    resolved_.resize(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      CKV_RETURN_IF_ERROR(Resolve(ops[i], resolved_[i].first, resolved_[i].second));
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const IoOp& op = ops[i];
      const auto [fd, fixed_file] = resolved_[i];
      // Step 2: make room by reaping; the callbacks wait until the submission is done.
      while (outstanding_ >= depth_) {
        if (absl::Status status = WaitAndReap(); !status.ok()) return Refuse(status);
      }
      Request* request = free_.back();
      free_.pop_back();
      CKV_DCHECK(!request->in_use);  // a table entry serves one op at a time
      *request = Request{op, fd, fixed_file, 0, 0, std::move(done[i]), true, {}};
      ++outstanding_;
      // At most `depth` ops outstanding: every table entry is either free or taken.
      CKV_DCHECK(outstanding_ <= depth_ && outstanding_ + free_.size() == depth_);
      parked_.push_back(request);
      batch_.push_back(request);
    }
    PrepParked();
    if (hand_over) {
      if (absl::Status status = Enter(/*wait=*/false); !status.ok()) return Refuse(status);
    }
    batch_.clear();
    // Step 4.
    RunCallbacks();
    return absl::OkStatus();
  }

  absl::Status Drain() override {
    if (running_callbacks_) {
      return absl::FailedPreconditionError("IoQueue(io_uring): Drain called from a callback");
    }
    while (true) {
      if (!broken_.ok()) {
        FailAll();
        RunCallbacks();
        return broken_;
      }
      if (outstanding_ > 0) {
        if (!WaitAndReap().ok()) continue;  // broken_ is set; handled above
      }
      if (completed_.empty() && outstanding_ == 0) return absl::OkStatus();
      RunCallbacks();
    }
  }

  absl::Status Reap(bool wait) override {
    if (running_callbacks_) {
      return absl::FailedPreconditionError("IoQueue(io_uring): Reap called from a callback");
    }
    if (broken_.ok()) {
      PrepParked();
      if (wait && completed_.empty() && io_uring_cq_ready(&ring_) == 0) PollBeforeSleep();
      const bool sleep = wait && completed_.empty() && io_uring_cq_ready(&ring_) == 0;
      if (Enter(sleep).ok()) {
        ReapCqes();
        PrepParked();  // requeued remainders
        if (io_uring_sq_ready(&ring_) > 0) (void)Enter(/*wait=*/false);
      }
    }
    if (!broken_.ok()) {
      FailAll();
      RunCallbacks();
      return broken_;
    }
    RunCallbacks();
    return absl::OkStatus();
  }

  bool HasCompletions() const override {
    return !completed_.empty() || io_uring_cq_ready(&ring_) > 0;
  }

  void Wake() override { eventfd_write(efd_, 1); }

  void SetPollBeforeSleep(uint32_t us) override { poll_us_ = us; }

  absl::Status ReserveFileSlots(uint32_t slots) override {
    fds_.assign(slots, -1);
    const int ret = io_uring_register_files_sparse(&ring_, slots);
    if (ret < 0) {
      return ErrnoToStatus(-ret,
                           absl::StrCat("io_uring_register_files_sparse of ", slots, " slots"));
    }
    fixed_files_ = true;
    return absl::OkStatus();
  }

  absl::Status RegisterFile(uint32_t slot, File* file) override {
    auto* posix = dynamic_cast<PosixFile*>(file);
    if (posix == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("IoQueue(io_uring): RegisterFile ",
                                                     file->path(),
                                                     ": not opened by the POSIX file system"));
    }
    if (slot >= fds_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("IoQueue(io_uring): RegisterFile ",
                                                     file->path(), ": slot ", slot, " of ",
                                                     fds_.size(), " reserved"));
    }
    int fd = posix->fd();
    if (fixed_files_) {
      const int ret = io_uring_register_files_update(&ring_, slot, &fd, 1);
      if (ret < 0) {
        return ErrnoToStatus(-ret, absl::StrCat("register ", file->path(), " with io_uring"));
      }
    }
    fds_[slot] = fd;
    return absl::OkStatus();
  }

  void UnregisterFile(uint32_t slot) override {
    if (slot >= fds_.size()) return;
    fds_[slot] = -1;
    if (!fixed_files_) return;
    int fd = -1;
    io_uring_register_files_update(&ring_, slot, &fd, 1);
  }

  absl::Status RegisterBuffers(std::span<const std::span<std::byte>> buffers) override {
    std::vector<iovec> iovs(buffers.size());
    for (size_t i = 0; i < buffers.size(); ++i) iovs[i] = {buffers[i].data(), buffers[i].size()};
    const int ret =
        io_uring_register_buffers(&ring_, iovs.data(), static_cast<unsigned>(iovs.size()));
    if (ret < 0) {
      return ErrnoToStatus(
          -ret, absl::StrCat("io_uring_register_buffers of ", buffers.size(), " buffers"));
    }
    fixed_buffers_ = true;
    return absl::OkStatus();
  }

  bool fixed_files() const override { return fixed_files_; }

  Counters counters() const override { return counters_; }

  const char* backend() const override { return "io_uring"; }

 private:
  struct Request {
    IoOp op;
    int fd = -1;
    bool fixed_file = false;  // fd is a registered-file index
    size_t done_bytes = 0;    // transferred so far
    int retries = 0;          // EINTR/EAGAIN in a row
    Callback callback;
    bool in_use = false;
    std::vector<iovec> iov;  // a gathered write's pieces not yet transferred (WRITEV)
  };

  // The queue broke during a batch: the call reports `status` instead of the batch's callbacks.
  absl::Status Refuse(absl::Status status) {
    for (Request* request : batch_) request->callback = nullptr;
    batch_.clear();
    return status;
  }

  // The descriptor (or registered index) an op's SQE names.
  absl::Status Resolve(const IoOp& op, int& fd, bool& fixed_file) const {
    if (op.file == nullptr) return absl::InvalidArgumentError("IoQueue(io_uring): op has no file");
    if (op.buffer == nullptr && op.gather.empty() && op.length > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("IoQueue(io_uring): op on ", op.file->path(), " has no buffer"));
    }
    if (!op.gather.empty() && (op.kind != IoOp::Kind::kWrite || op.gather.size() > kMaxIoPieces)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "IoQueue(io_uring): gathered op on ", op.file->path(), " with ", op.gather.size(),
          " pieces: only writes of 1..", kMaxIoPieces, " pieces gather"));
    }
    if (op.file_slot != kNoIoSlot && op.file_slot < fds_.size() && fds_[op.file_slot] >= 0) {
      fixed_file = fixed_files_;
      fd = fixed_files_ ? static_cast<int>(op.file_slot) : fds_[op.file_slot];
      return absl::OkStatus();
    }
    auto* file = dynamic_cast<PosixFile*>(op.file);
    if (file == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("IoQueue(io_uring): ", op.file->path(),
                                                     " was not opened by the POSIX file system"));
    }
    fd = file->fd();
    return absl::OkStatus();
  }

  void ArmPoll() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);  // the extra SQ entry keeps room for it
    poll_unarmed_ = sqe == nullptr;                // then armed by the next PrepParked
    if (poll_unarmed_) return;
    io_uring_prep_poll_add(sqe, efd_, POLLIN);
    io_uring_sqe_set_data(sqe, nullptr);
  }

  // Moves parked Requests into SQEs, in FIFO order, while the SQ has room. The SQ (depth + 1
  // entries or more) holds at most `depth` ops and the poll, so the poll can always be re-armed
  // and every parked op fits once the SQ's entries are handed to the kernel.
  void PrepParked() {
    if (poll_unarmed_ && !shutting_down_) ArmPoll();
    while (!parked_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) return;  // the rest waits for the next Enter
      Request* request = parked_.front();
      parked_.pop_front();
      const size_t remaining = request->op.length - request->done_bytes;
      const auto length = static_cast<unsigned>(std::min(remaining, kMaxSqeBytes));
      std::byte* buffer = request->op.buffer + request->done_bytes;
      const uint64_t offset = request->op.offset + request->done_bytes;
      const bool read = request->op.kind == IoOp::Kind::kRead;
      if (!request->op.gather.empty()) {
        GatherRemainder(*request);
        io_uring_prep_writev(sqe, request->fd, request->iov.data(),
                             static_cast<unsigned>(request->iov.size()), offset);
      } else if (fixed_buffers_ && request->op.buffer_index != kNoIoSlot) {
        const int index = static_cast<int>(request->op.buffer_index);
        if (read) {
          io_uring_prep_read_fixed(sqe, request->fd, buffer, length, offset, index);
        } else {
          io_uring_prep_write_fixed(sqe, request->fd, buffer, length, offset, index);
        }
      } else if (read) {
        io_uring_prep_read(sqe, request->fd, buffer, length, offset);
      } else {
        io_uring_prep_write(sqe, request->fd, buffer, length, offset);
      }
      if (request->fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data(sqe, request);
      ++in_flight_;
      // Only outstanding ops go into SQEs, each at most once at a time.
      CKV_DCHECK(request->in_use && in_flight_ <= outstanding_ && outstanding_ <= depth_);
      ++counters_.transfers;
    }
  }

  // The iovecs of what a gathered write has left to transfer: its pieces after done_bytes.
  static void GatherRemainder(Request& request) {
    request.iov.clear();
    size_t skip = request.done_bytes;
    for (const IoPiece& piece : request.op.gather) {
      if (skip >= piece.length) {
        skip -= piece.length;
        continue;
      }
      request.iov.push_back(
          {const_cast<std::byte*>(piece.data + skip), piece.length - skip});  // read, not written
      skip = 0;
    }
  }

  // Step 5: with ops in flight and nothing completed, polls the CQ before sleeping, when
  // completions have been arriving at least twice as often as the poll lasts: a sleep and
  // wake-up per completion leaves the device slot idle for the scheduler's wake-up latency.
  void PollBeforeSleep() {
    if (in_flight_ == 0 || poll_us_ == 0 || gap_us_ * 2 >= poll_us_) return;
    io_uring_submit(&ring_);
    // Real time, not a ckv::Clock: the spin races the device; a FakeClock would never end it.
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(poll_us_);
    while (io_uring_cq_ready(&ring_) == 0 && std::chrono::steady_clock::now() < until) {
    }
  }

  // Hands prepared SQEs to the kernel; with `wait`, also waits for a completion (a signal may cut
  // the wait short, which callers tolerate: they loop). Sets broken_ on a hard failure.
  absl::Status Enter(bool wait) {
    for (int attempt = 0;; ++attempt) {
      const int ret = wait ? io_uring_submit_and_wait(&ring_, 1) : io_uring_submit(&ring_);
      if (ret >= 0) return absl::OkStatus();
      const bool transient = ret == -EINTR || ret == -EAGAIN || ret == -EBUSY;
      if (transient && attempt < kMaxEnterRetries) {
        if (ret == -EINTR) {
          if (wait) return absl::OkStatus();  // the caller loops
          continue;
        }
        // The kernel is short of resources, or of CQ space: completions free both.
        if (io_uring_cq_ready(&ring_) > 0) return absl::OkStatus();
        if (!wait) return absl::OkStatus();  // the SQEs stay in the ring for the next Enter
        sched_yield();
        continue;
      }
      broken_ = ErrnoToStatus(-ret, "IoQueue(io_uring): io_uring_enter");
      return broken_;
    }
  }

  absl::Status WaitAndReap() {
    PrepParked();
    if (in_flight_ == 0) {
      // Cannot happen: outstanding Requests that are not in the kernel fit in the SQ.
      broken_ = absl::InternalError("IoQueue(io_uring): ops outstanding but none in the ring");
      return broken_;
    }
    CKV_RETURN_IF_ERROR(Enter(/*wait=*/true));
    ReapCqes();
    PrepParked();  // requeued remainders; the next Enter submits them
    return absl::OkStatus();
  }

  // Step 3 for every CQE in the ring; the wake-up poll's CQE drains the eventfd and re-arms it.
  void ReapCqes() {
    unsigned head;
    io_uring_cqe* cqe;
    unsigned seen = 0, ops = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      auto* request = static_cast<Request*>(io_uring_cqe_get_data(cqe));
      if (request == nullptr) {
        eventfd_t value;
        eventfd_read(efd_, &value);  // nonblocking; clears the counter
        if (!shutting_down_) ArmPoll();
        continue;
      }
      ++ops;
      HandleCompletion(request, cqe->res);
    }
    io_uring_cq_advance(&ring_, seen);
    if (ops > 0) {
      const auto now = std::chrono::steady_clock::now();  // the device's real cadence, as above
      const double gap = std::chrono::duration<double, std::micro>(now - last_reap_).count() / ops;
      last_reap_ = now;
      gap_us_ = 0.9 * gap_us_ + 0.1 * std::min(gap, 10000.0);
    }
  }

  void HandleCompletion(Request* request, int res) {
    // A CQE is for an op the ring holds: the count of ops in the kernel never goes negative.
    CKV_DCHECK(request->in_use && in_flight_ > 0);
    --in_flight_;
    const IoOp& op = request->op;
    const bool read = op.kind == IoOp::Kind::kRead;
    const size_t remaining = op.length - request->done_bytes;
    if (res < 0) {
      const int err = -res;
      if ((err == EINTR || err == EAGAIN) && ++request->retries < kMaxRetries) {
        Requeue(request);
        return;
      }
      Complete(request, TransferError(*request, err, read, remaining));
      return;
    }
    if (res == 0 && remaining > 0) {
      if (read) {  // end of file
        Complete(request, ShortReadError(*request));
      } else {  // not expected of a regular file; resubmitting could spin forever
        Complete(request, absl::InternalError(absl::StrCat("write ", op.file->path(), " at offset ",
                                                           op.offset + request->done_bytes,
                                                           ": wrote 0 of ", remaining, " bytes")));
      }
      return;
    }
    request->done_bytes += static_cast<size_t>(res);
    counters_.bytes += static_cast<uint64_t>(res);
    request->retries = 0;
    if (request->done_bytes < op.length) {
      Requeue(request);  // short transfer: the remainder goes round again
      return;
    }
    Complete(request, absl::OkStatus());
  }

  static absl::Status TransferError(const Request& r, int err, bool read, size_t remaining) {
    const uint64_t offset = r.op.offset + r.done_bytes;
    if (auto* file = dynamic_cast<PosixFile*>(r.op.file); file != nullptr) {
      return file->TransferError(err, read, offset, r.op.buffer + r.done_bytes, remaining);
    }
    return ErrnoToStatus(
        err, absl::StrCat(read ? "read " : "write ", r.op.file->path(), " at offset ", offset));
  }

  static absl::Status ShortReadError(const Request& r) {
    if (auto* file = dynamic_cast<PosixFile*>(r.op.file); file != nullptr) {
      return file->ShortReadError(r.op.offset, r.done_bytes, r.op.length);
    }
    return absl::DataLossError(absl::StrCat("short read of ", r.op.file->path(), " at offset ",
                                            r.op.offset, ": got ", r.done_bytes, " of ",
                                            r.op.length, " bytes"));
  }

  void Requeue(Request* request) {
    if (shutting_down_) {
      Release(request);
      return;
    }
    parked_.push_back(request);
  }

  void Complete(Request* request, absl::Status status) {
    if (request->callback && !shutting_down_) {
      completed_.emplace_back(std::move(request->callback), std::move(status));
    }
    Release(request);
  }

  void Release(Request* request) {
    // Each op is released once, so its callback is handed on at most once.
    CKV_DCHECK(request->in_use && outstanding_ > 0);
    *request = Request{};
    free_.push_back(request);
    --outstanding_;
  }

  // Step 7: every outstanding op completes with broken_.
  void FailAll() {
    parked_.clear();
    in_flight_ = 0;
    for (Request& request : requests_) {
      if (request.in_use) Complete(&request, broken_);
    }
  }

  // Step 4. The outermost call runs everything, including what callbacks add.
  void RunCallbacks() {
    if (running_callbacks_) return;
    running_callbacks_ = true;
    while (!completed_.empty()) {
      auto [callback, status] = std::move(completed_.front());
      completed_.pop_front();
      callback(status);
    }
    running_callbacks_ = false;
  }

  const uint32_t depth_;
  io_uring ring_{};
  bool ring_ready_ = false;
  int efd_ = -1;
  std::vector<Request> requests_;  // the table; never resized, so pointers stay valid
  std::vector<Request*> free_;
  std::deque<Request*> parked_;  // at most depth_
  std::deque<std::pair<Callback, absl::Status>> completed_;
  uint32_t outstanding_ = 0;  // Requests taken from the table
  uint32_t in_flight_ = 0;    // Requests in SQEs, submitted or not
  bool running_callbacks_ = false;
  bool shutting_down_ = false;
  absl::Status broken_;
  std::vector<int> fds_;                        // by registered slot; -1 when free
  std::vector<std::pair<int, bool>> resolved_;  // SubmitBatch's scratch: fd, fixed file
  std::vector<Request*> batch_;                 // SubmitBatch's scratch: the batch's Requests
  bool fixed_files_ = false;
  bool fixed_buffers_ = false;
  bool poll_unarmed_ = false;  // the wake-up poll found no SQ entry free
  uint32_t poll_us_ = 0;
  std::chrono::steady_clock::time_point last_reap_{};
  double gap_us_ = 0;  // moving average of the time between completions
  Counters counters_;
};

struct UringProbe {
  bool available = false;
  std::string reason;
};

UringProbe ProbeUring() {
  // kernel.io_uring_disabled (Linux 6.6+): 0 allows all, 1 only io_uring_group members and
  // CAP_SYS_ADMIN (set-up then fails with EPERM), 2 nobody.
  if (std::ifstream sysctl("/proc/sys/kernel/io_uring_disabled"); sysctl) {
    int disabled = 0;
    if (sysctl >> disabled && disabled == 2) {
      return {false, "disabled by the sysctl kernel.io_uring_disabled=2"};
    }
  }
  io_uring ring{};
  const int ret = io_uring_queue_init(2, &ring, 0);
  if (ret < 0) {
    std::string reason(ErrnoToStatus(-ret, "io_uring_queue_init").message());
    if (ret == -EPERM) {
      absl::StrAppend(&reason, "; kernel.io_uring_disabled or a seccomp profile forbids it");
    }
    return {false, std::move(reason)};
  }
  UringProbe result{true, ""};
  if (io_uring_probe* probe = io_uring_get_probe_ring(&ring); probe != nullptr) {
    if (!io_uring_opcode_supported(probe, IORING_OP_READ) ||
        !io_uring_opcode_supported(probe, IORING_OP_WRITE)) {
      result = {false, "the kernel's io_uring lacks IORING_OP_READ/IORING_OP_WRITE (Linux < 5.6)"};
    }
    io_uring_free_probe(probe);
  }
  io_uring_queue_exit(&ring);
  return result;
}

const UringProbe& CachedProbe() {
  static const UringProbe* const probe = new UringProbe(ProbeUring());
  return *probe;
}

}  // namespace

absl::StatusOr<std::unique_ptr<IoQueue>> NewUringIoQueue(uint32_t depth) {
  if (depth == 0 || depth > kMaxIoQueueDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("I/O queue depth ", depth, " is outside 1..", kMaxIoQueueDepth));
  }
  auto queue = std::make_unique<UringIoQueue>(depth);
  CKV_RETURN_IF_ERROR(queue->Init());
  return queue;
}

bool UringAvailable() { return CachedProbe().available; }

std::string UringUnavailableReason() { return CachedProbe().reason; }

}  // namespace ckv::io
