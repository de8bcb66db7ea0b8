// SPDX-License-Identifier: Apache-2.0
// bench/reprefill/read_batch.h: reads through the engine's read engine, waited for as a batch.
//
// Thread-safety: one thread adds, submits and waits; callbacks run on the read engine's threads.
#ifndef CKV_BENCH_REPREFILL_READ_BATCH_H_
#define CKV_BENCH_REPREFILL_READ_BATCH_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/internal.h"

namespace ckv::bench {

class ReadBatch {
 public:
  explicit ReadBatch(prefetch::ReadEngine* engine) : engine_(engine) {}
  ~ReadBatch() { Wait().IgnoreError(); }  // the buffers must not go while reads land in them

  void Add(prefetch::ReadRequest r) {
    r.callback = [this](const prefetch::ReadResult& result) {
      absl::MutexLock lock(&mu_);
      if (!result.status.ok() && status_.ok()) status_ = result.status;
      --pending_;
    };
    queued_.push_back(std::move(r));
  }
  absl::Status Submit() {
    if (queued_.empty()) return absl::OkStatus();
    {
      absl::MutexLock lock(&mu_);
      pending_ += queued_.size();
    }
    auto ids = engine_->SubmitBatch(queued_);
    if (!ids.ok()) {
      absl::MutexLock lock(&mu_);
      pending_ -= queued_.size();
      queued_.clear();
      return ids.status();
    }
    queued_.clear();
    return absl::OkStatus();
  }
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](size_t* p) { return *p == 0; }, &pending_));
    return status_;
  }

 private:
  prefetch::ReadEngine* engine_;
  std::vector<prefetch::ReadRequest> queued_;
  absl::Mutex mu_;
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Splits [offset, offset + length) into reads of at most `max` bytes into `dest`.
inline void AddRange(ReadBatch& batch, prefetch::FileId file, uint64_t offset, uint64_t length,
                     std::byte* dest, uint32_t max, prefetch::Priority priority) {
  while (length > 0) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(length, max));
    prefetch::ReadRequest r;
    r.file = file;
    r.offset = offset;
    r.length = n;
    r.priority = priority;
    r.dest = std::span<std::byte>(dest, n);
    batch.Add(std::move(r));
    offset += n;
    dest += n;
    length -= n;
  }
}

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_READ_BATCH_H_
