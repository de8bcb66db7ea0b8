// The io_uring IoQueue (see storage/file_system.h and storage/uring_io_queue.h).
//
// Life cycle of a ring. One UringIoQueue owns one ring, used by one thread at a time, so nothing
// here locks.
//  1. Set-up: io_uring_queue_init(depth) maps a submission queue (SQ) of at least `depth` entries
//     and a completion queue (CQ) of twice that. A fixed table of `depth` Requests is allocated
//     with it; an op in the queue is a Request from the table, so Submit does not allocate.
//  2. Submit: at most `depth` ops are outstanding (in the kernel, or parked, or waiting to be
//     requeued). When the table is full, Submit first reaps: it waits for a completion and
//     processes it (step 3). Then the op is parked at the back of a FIFO, the FIFO is moved into
//     SQEs while io_uring_get_sqe has room, and io_uring_submit hands them to the kernel. With at
//     most `depth` ops in the kernel the CQ (2 x depth) cannot overflow. The FIFO holds at most
//     `depth` Requests; an op waits there when the SQ is full or it is being requeued.
//  3. Reap: each CQE's user_data is its Request. A negative res is -errno: EINTR and EAGAIN park
//     the Request again (bounded retries); any other errno completes it with the mapped Status.
//     A positive res advances the Request; a short transfer parks it again for the remainder
//     (liburing's io_uring-cp.c does the same); a zero-byte read is a short read (DataLoss).
//     Finished Requests go back to the table and their callbacks, with their Status, to a
//     completion list. No callback runs while CQEs are being processed or SQEs are being built.
//  4. Callbacks: once the submission step or the reaping is over, the completion list runs in
//     order. A callback may Submit: the new op goes through steps 2-3, and any callback that
//     becomes ready meanwhile runs from the same loop after the current callback returns, so
//     callbacks never nest. A callback must not Drain.
//  5. Drain: submits what is parked, waits for and reaps completions, runs callbacks, and repeats
//     until nothing is outstanding (callbacks may have submitted more).
//  6. Failure: io_uring_enter failing with anything but EINTR/EAGAIN/EBUSY means the ring cannot
//     be used (it does not happen on a healthy kernel). The queue is then broken: Submit returns
//     the error, and Drain completes every outstanding op with it and returns it.
//  7. Destruction: waits until the kernel holds none of the queue's ops (the kernel writes into
//     caller buffers until then), drops the callbacks that have not run, then
//     io_uring_queue_exit unmaps the ring. Callers Drain first.
#include "storage/uring_io_queue.h"

#include <liburing.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "storage/file_system.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace ckv::storage {

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
    const int ret = io_uring_queue_init(depth_, &ring_, 0);
    if (ret < 0) {
      return ErrnoToStatus(-ret, absl::StrCat("set up an io_uring of depth ", depth_));
    }
    ring_ready_ = true;
    AnnotateNewRing(ring_);
    return absl::OkStatus();
  }

  ~UringIoQueue() override {
    if (!ring_ready_) return;
    // Step 7. Requeued remainders are not resubmitted: only what the kernel holds matters.
    shutting_down_ = true;
    while (in_flight_ > 0 && broken_.ok()) {
      if (!Enter(/*wait=*/true).ok()) break;
      Reap();
    }
    AnnotateRingGone(ring_);
    io_uring_queue_exit(&ring_);
  }

  absl::Status Submit(const IoOp& op, Callback done) override {
    if (!broken_.ok()) return broken_;
    if (op.file == nullptr) return absl::InvalidArgumentError("IoQueue(io_uring): op has no file");
    auto* file = dynamic_cast<PosixFile*>(op.file);
    if (file == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("IoQueue(io_uring): ", op.file->path(),
                                                     " was not opened by the POSIX file system"));
    }
    if (op.buffer == nullptr && op.length > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("IoQueue(io_uring): op on ", file->path(), " has no buffer"));
    }

    // Step 2: make room by reaping; the callbacks wait until the submission is done.
    while (outstanding_ >= depth_) CKV_RETURN_IF_ERROR(WaitAndReap());

    Request* request = free_.back();
    free_.pop_back();
    *request = Request{op, file, 0, 0, std::move(done), true};
    ++outstanding_;
    parked_.push_back(request);
    PrepParked();
    if (absl::Status status = Enter(/*wait=*/false); !status.ok()) {
      request->callback = nullptr;  // not accepted: Submit reports the failure instead
      return status;
    }

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

  const char* backend() const override { return "io_uring"; }

 private:
  struct Request {
    IoOp op;
    PosixFile* file = nullptr;
    size_t done_bytes = 0;  // transferred so far
    int retries = 0;        // EINTR/EAGAIN in a row
    Callback callback;
    bool in_use = false;
  };

  // Moves parked Requests into SQEs, in FIFO order, while the SQ has room.
  void PrepParked() {
    while (!parked_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) return;  // SQ full: the rest stays parked until the next reap
      Request* request = parked_.front();
      parked_.pop_front();
      const size_t remaining = request->op.length - request->done_bytes;
      const auto length = static_cast<unsigned>(std::min(remaining, kMaxSqeBytes));
      std::byte* buffer = request->op.buffer + request->done_bytes;
      const uint64_t offset = request->op.offset + request->done_bytes;
      if (request->op.kind == IoOp::Kind::kRead) {
        io_uring_prep_read(sqe, request->file->fd(), buffer, length, offset);
      } else {
        io_uring_prep_write(sqe, request->file->fd(), buffer, length, offset);
      }
      io_uring_sqe_set_data(sqe, request);
      ++in_flight_;
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
        if (ret == -EINTR) continue;
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
    Reap();
    PrepParked();  // requeued remainders; the next Enter submits them
    return absl::OkStatus();
  }

  // Step 3 for every CQE in the ring.
  void Reap() {
    unsigned head;
    io_uring_cqe* cqe;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      HandleCompletion(static_cast<Request*>(io_uring_cqe_get_data(cqe)), cqe->res);
    }
    io_uring_cq_advance(&ring_, seen);
  }

  void HandleCompletion(Request* request, int res) {
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
      Complete(request, request->file->TransferError(err, read, op.offset + request->done_bytes,
                                                     op.buffer + request->done_bytes, remaining));
      return;
    }
    if (res == 0 && remaining > 0) {
      if (read) {  // end of file
        Complete(request, request->file->ShortReadError(op.offset, request->done_bytes, op.length));
      } else {  // not expected of a regular file; resubmitting could spin forever
        Complete(request,
                 absl::InternalError(absl::StrCat("write ", request->file->path(), " at offset ",
                                                  op.offset + request->done_bytes, ": wrote 0 of ",
                                                  remaining, " bytes")));
      }
      return;
    }
    request->done_bytes += static_cast<size_t>(res);
    request->retries = 0;
    if (request->done_bytes < op.length) {
      Requeue(request);  // short transfer: the remainder goes round again
      return;
    }
    Complete(request, absl::OkStatus());
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
    *request = Request{};
    free_.push_back(request);
    --outstanding_;
  }

  // Step 6: every outstanding op completes with broken_.
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
  std::vector<Request> requests_;  // the table; never resized, so pointers stay valid
  std::vector<Request*> free_;
  std::deque<Request*> parked_;  // at most depth_
  std::deque<std::pair<Callback, absl::Status>> completed_;
  uint32_t outstanding_ = 0;  // Requests taken from the table
  uint32_t in_flight_ = 0;    // Requests in SQEs, submitted or not
  bool running_callbacks_ = false;
  bool shutting_down_ = false;
  absl::Status broken_;
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

}  // namespace ckv::storage
