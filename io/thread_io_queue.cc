// SPDX-License-Identifier: Apache-2.0
// The thread fallback of the I/O layer (NewThreadIoQueue, io/file_system.h), and the
// defaults of IoQueue's batched and reaping calls.
//
// Life cycle. Submit takes a Request from a fixed table of `depth` entries (reaping first when
// the table is full), queues it for the workers and, when no worker is idle and fewer than
// `depth` run, starts one. A worker performs the op with File::ReadAt/WriteAt (which retry
// EINTR and short transfers), stores its Status and moves the Request to the completed list.
// Reap, Drain and a Submit that must make room move the completed Requests out under the lock,
// release their table entries, and run their callbacks on the queue's thread without the lock,
// in completion order; a callback that submits has its op's callback run after it returns.
// Wake sets a flag under the lock that ends a Reap's wait. The destructor waits for the ops
// the workers hold (they write into caller buffers until then), then stops the workers.
#include <deque>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "io/file_system.h"

namespace ckv::io {

absl::Status IoQueue::SubmitBatch(std::span<const IoOp> ops, std::span<Callback> done) {
  if (ops.size() != done.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SubmitBatch: ", ops.size(), " ops but ", done.size(), " callbacks"));
  }
  // A bad op (InvalidArgument) refuses the whole batch before any of it is queued.
  for (const IoOp& op : ops) {
    if (op.file == nullptr || (op.buffer == nullptr && op.gather.empty() && op.length > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SubmitBatch: an op has no ", op.file == nullptr ? "file" : "buffer"));
    }
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (absl::Status s = Submit(ops[i], std::move(done[i])); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status IoQueue::Reap(bool wait) { return wait ? Drain() : absl::OkStatus(); }

absl::Status File::WriteGatherAt(uint64_t offset, std::span<const IoPiece> pieces) {
  for (const IoPiece& piece : pieces) {
    CKV_RETURN_IF_ERROR(WriteAt(offset, {piece.data, piece.length}));
    offset += piece.length;
  }
  return absl::OkStatus();
}

namespace {

class ThreadIoQueue final : public IoQueue {
 public:
  explicit ThreadIoQueue(uint32_t depth) : depth_(depth), table_(depth) {
    for (Request& r : table_) free_.push_back(&r);
    workers_.reserve(depth);
  }

  ~ThreadIoQueue() override {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadIoQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) {
            return q->pending_.empty() && q->running_ == 0;
          },
          this));
      stopping_ = true;
    }
    for (std::thread& t : workers_) t.join();
  }

  absl::Status Submit(const IoOp& op, Callback done) override {
    if (op.file == nullptr) return absl::InvalidArgumentError("IoQueue(threads): op has no file");
    if (op.buffer == nullptr && op.gather.empty() && op.length > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("IoQueue(threads): op on ", op.file->path(), " has no buffer"));
    }
    while (free_.empty()) Collect(/*wait=*/true);  // make room; callbacks run below
    Request* r = free_.back();
    free_.pop_back();
    CKV_DCHECK(!r->callback);  // a free table entry holds no callback still to run
    r->op = op;
    r->callback = std::move(done);
    {
      absl::MutexLock lock(&mu_);
      pending_.push_back(r);
      // Every table entry is in exactly one place, so at most `depth` ops are outstanding.
      CKV_DCHECK(free_.size() + pending_.size() + running_ + completed_.size() == depth_);
      CKV_DCHECK(workers_.size() <= depth_);
      if (idle_ == 0 && workers_.size() < depth_) {
        workers_.emplace_back([this] { Work(); });
      }
    }
    RunCallbacks();
    return absl::OkStatus();
  }

  absl::Status Drain() override {
    if (running_callbacks_) {
      return absl::FailedPreconditionError("IoQueue(threads): Drain called from a callback");
    }
    while (true) {
      RunCallbacks();
      if (free_.size() == depth_ && ready_.empty()) return absl::OkStatus();
      Collect(/*wait=*/true);
    }
  }

  absl::Status Reap(bool wait) override {
    Collect(wait && ready_.empty());  // with nothing outstanding, waits for a Wake
    RunCallbacks();
    return absl::OkStatus();
  }

  bool HasCompletions() const override {
    absl::MutexLock lock(&mu_);
    return !completed_.empty();
  }

  void Wake() override {
    absl::MutexLock lock(&mu_);
    woken_ = true;
  }

  Counters counters() const override {
    absl::MutexLock lock(&mu_);
    return counters_;
  }

  const char* backend() const override { return "threads"; }

 private:
  struct Request {
    IoOp op;
    Callback callback;
    absl::Status status;
  };

  void Work() {
    absl::MutexLock lock(&mu_);
    while (true) {
      ++idle_;
      mu_.Await(absl::Condition(
          +[](ThreadIoQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) {
            return q->stopping_ || !q->pending_.empty();
          },
          this));
      --idle_;
      if (pending_.empty()) return;  // stopping
      Request* r = pending_.front();
      pending_.pop_front();
      ++running_;
      mu_.Unlock();
      const IoOp& op = r->op;
      if (op.kind == IoOp::Kind::kRead) {
        r->status = op.file->ReadAt(op.offset, {op.buffer, op.length});
      } else if (!op.gather.empty()) {
        r->status = op.file->WriteGatherAt(op.offset, op.gather);
      } else {
        r->status =
            op.file->WriteAt(op.offset, {static_cast<const std::byte*>(op.buffer), op.length});
      }
      mu_.Lock();
      CKV_DCHECK(running_ > 0);
      --running_;
      ++counters_.transfers;
      if (r->status.ok()) counters_.bytes += op.length;
      completed_.push_back(r);
    }
  }

  // Moves completed Requests to ready_ (with `wait`, first waiting for one or a Wake), releasing
  // their table entries.
  void Collect(bool wait) {
    std::deque<Request*> done;
    {
      absl::MutexLock lock(&mu_);
      if (wait) {
        mu_.Await(absl::Condition(
            +[](ThreadIoQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) {
              return q->woken_ || !q->completed_.empty();
            },
            this));
      }
      woken_ = false;
      CKV_DCHECK(free_.size() + pending_.size() + running_ + completed_.size() == depth_);
      done.swap(completed_);
    }
    for (Request* r : done) {
      ready_.emplace_back(std::move(r->callback), std::move(r->status));
      r->callback = nullptr;
      r->status = absl::OkStatus();
      free_.push_back(r);
    }
  }

  void RunCallbacks() {
    if (running_callbacks_) return;
    running_callbacks_ = true;
    while (!ready_.empty()) {
      auto [callback, status] = std::move(ready_.front());
      ready_.pop_front();
      if (callback) callback(status);
    }
    running_callbacks_ = false;
  }

  const uint32_t depth_;
  std::vector<Request> table_;                           // never resized: pointers stay valid
  std::vector<Request*> free_;                           // the queue's thread only
  std::deque<std::pair<Callback, absl::Status>> ready_;  // the queue's thread only
  bool running_callbacks_ = false;
  std::vector<std::thread> workers_;  // started by the queue's thread, joined at destruction

  mutable absl::Mutex mu_;
  std::deque<Request*> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<Request*> completed_ ABSL_GUARDED_BY(mu_);
  uint32_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Counters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoQueue>> NewThreadIoQueue(uint32_t depth) {
  if (depth == 0 || depth > kMaxIoQueueDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("I/O queue depth ", depth, " is outside 1..", kMaxIoQueueDepth));
  }
  return std::unique_ptr<IoQueue>(new ThreadIoQueue(depth));
}

}  // namespace ckv::io
