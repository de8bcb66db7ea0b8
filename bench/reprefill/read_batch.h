// SPDX-License-Identifier: Apache-2.0
// bench/reprefill/read_batch.h: reads through the engine's read engine, waited for as a batch;
// each read's bytes are verified (a read's own checksum, or a caller's check of what landed) and
// cross the modelled PCIe as it lands.
//
// Thread-safety: one thread adds, submits and waits; callbacks run on the read engine's threads.
#ifndef CKV_BENCH_REPREFILL_READ_BATCH_H_
#define CKV_BENCH_REPREFILL_READ_BATCH_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/reprefill/gpu_model.h"
#include "engine/internal.h"

namespace ckv::bench {

class ReadBatch {
 public:
  // `gpu`: the modelled GPU whose copy engine each read's bytes cross as soon as the read lands,
  // as a GPU system's copy engine starts on data once it is in host memory; null: none cross.
  explicit ReadBatch(prefetch::ReadEngine* engine, ModelledGpu* gpu = nullptr)
      : engine_(engine), gpu_(gpu) {}
  ~ReadBatch() { Wait().IgnoreError(); }  // the buffers must not go while reads land in them

  // Checks the bytes of a read that landed (on the read engine's thread, as the engine verifies
  // its own checksums); an error fails the batch.
  using Verify = std::function<absl::Status(std::span<const std::byte> landed)>;

  // `cross_bytes`: what of the read crosses PCIe once it lands (its payload, without the
  // alignment around it). `verify`, when set, checks r.dest once it holds the read's bytes.
  void Add(prefetch::ReadRequest r, uint64_t cross_bytes, Verify verify = {}) {
    r.callback = [this, cross_bytes, dest = r.dest,
                  verify = std::move(verify)](const prefetch::ReadResult& result) {
      absl::Status st = result.status;
      if (st.ok() && verify) st = verify(dest);
      const absl::Time there = st.ok() && gpu_ != nullptr && cross_bytes > 0
                                   ? gpu_->Transfer(cross_bytes)
                                   : absl::InfinitePast();
      absl::MutexLock lock(&mu_);
      if (!st.ok() && status_.ok()) status_ = std::move(st);
      crossed_ = std::max(crossed_, there);
      --pending_;
    };
    queued_.push_back(std::move(r));
  }
  // Bytes already in host memory (a CPU-tier hit) that cross PCIe now.
  void Charge(uint64_t bytes) {
    if (gpu_ == nullptr || bytes == 0) return;
    const absl::Time there = gpu_->Transfer(bytes);
    absl::MutexLock lock(&mu_);
    crossed_ = std::max(crossed_, there);
  }
  // When every byte charged or landed so far will have crossed. Call after Wait().
  absl::Time crossed() {
    absl::MutexLock lock(&mu_);
    return crossed_;
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
    mu_.Await(absl::Condition(
        +[](size_t* p) { return *p == 0; }, &pending_));
    return status_;
  }

 private:
  prefetch::ReadEngine* engine_;
  ModelledGpu* const gpu_;
  std::vector<prefetch::ReadRequest> queued_;
  absl::Mutex mu_;
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time crossed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Splits [offset, offset + length) into reads of at most `max` bytes into `dest`; the first
// `cross_bytes` of them (all, by default) cross PCIe as they land.
inline void AddRange(ReadBatch& batch, prefetch::FileId file, uint64_t offset, uint64_t length,
                     std::byte* dest, uint32_t max, prefetch::Priority priority,
                     uint64_t cross_bytes = ~uint64_t{0}) {
  while (length > 0) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(length, max));
    prefetch::ReadRequest r;
    r.file = file;
    r.offset = offset;
    r.length = n;
    r.priority = priority;
    r.dest = std::span<std::byte>(dest, n);
    const uint64_t cross = std::min<uint64_t>(n, cross_bytes);
    cross_bytes -= cross;
    batch.Add(std::move(r), cross);
    offset += n;
    dest += n;
    length -= n;
  }
}

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_READ_BATCH_H_
