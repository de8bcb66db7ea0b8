// SPDX-License-Identifier: Apache-2.0
// io/staging_pool.h: the Put path's staging memory and write queues, made once per store.
//
// A Put copies records into staging buffers and writes them with O_DIRECT. Allocating those
// buffers per Put made every Put copy into freshly faulted pages (a page fault per 4 KiB, zeroed
// by the kernel, then the copy): most of a request-sized Put's time. The pool allocates its
// buffers once, page-aligned and pre-faulted, and hands them out in lanes. A lane is a fixed set
// of buffers plus the I/O queue that writes them; on io_uring the queue is made once, on the
// lane's first use, and the lane's buffers are registered with it (IORING_REGISTER_BUFFERS), so
// writes are WRITE_FIXED and the kernel does not pin the pages per write. Where registration is
// refused (RLIMIT_MEMLOCK) or the backend has none (the thread fallback, in-memory and
// fault-injecting file systems), the same buffers are written as plain buffers.
//
// A Put leases one lane for its whole write (LeaseLane blocks while every lane is leased), so a
// Put never waits for a buffer another Put holds while holding one itself (no deadlock), and the
// staging memory of the store is bounded by the pool whatever the number or size of Puts: a Put
// larger than its lane streams through it, refilling each buffer as its write completes.
//
// Thread-safety: thread-safe. A leased lane (its queue and buffers) belongs to the leasing thread
// until the Lease is destroyed.
#ifndef CKV_IO_STAGING_POOL_H_
#define CKV_IO_STAGING_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "io/file_system.h"

namespace ckv::io {

class StagingPool {
 public:
  // Buffers are `buffer_bytes` (rounded up to 64 KiB, so each starts on a 64 KiB boundary);
  // the pool holds max(2, pool_bytes / buffer_bytes) of them, split into lanes of
  // clamp(buffers / 2, 2, queue_depth) buffers (the remainder joins the last lane). Queues are
  // made by `fs` with `queue_depth` entries. Nothing is allocated until the first lease.
  StagingPool(FileSystem* fs, uint64_t pool_bytes, size_t buffer_bytes, uint32_t queue_depth);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Buffers start on this boundary (a file whose direct-I/O alignment is larger cannot use them).
  static constexpr size_t kBufferAlignment = 64 << 10;

  struct Lane;
  // A leased lane; returns it to the pool when destroyed. The caller drains the queue first
  // (nothing in flight may use a buffer once the lane is free for another Put).
  class Lease {
   public:
    Lease(StagingPool* pool, Lane* lane) : pool_(pool), lane_(lane) {}
    ~Lease();
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    IoQueue* queue() const;
    // The lane's buffers, each buffer_bytes().
    std::span<std::byte* const> buffers() const;
    // Registered index of buffers()[i] (IoOp::buffer_index), or kNoIoSlot when the lane's
    // buffers are not registered with its queue.
    uint32_t buffer_index(size_t i) const;
    // Drops the lane's queue after the queue itself failed (Submit, Reap or Drain returned an
    // error); the next lease of the lane makes a new one.
    void DiscardQueue();

   private:
    StagingPool* pool_;
    Lane* lane_;
  };

  // Blocks until a lane is free and leases it. On first use of the lane, makes its queue and
  // registers its buffers; an error making the queue is returned (the lane stays free).
  absl::StatusOr<Lease> LeaseLane();

  size_t buffer_bytes() const { return buffer_bytes_; }
  // Bytes of staging memory the pool holds (allocated on the first lease).
  uint64_t pool_bytes() const { return uint64_t{buffer_bytes_} * buffer_count_; }
  size_t lanes() const { return lane_count_; }
  // Leases that had to wait for a lane, since the pool was made.
  uint64_t waits() const;

 private:
  // Allocates and pre-faults the memory and makes the lanes; ResourceExhausted, with no lane
  // made, when the memory cannot be had. REQUIRES: mu_ held.
  absl::Status AllocateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(Lane* lane);

  FileSystem* const fs_;
  const size_t buffer_bytes_;
  const size_t buffer_count_;
  const size_t lane_count_;
  const uint32_t queue_depth_;

  mutable absl::Mutex mu_;
  absl::CondVar lane_free_;
  AlignedBuffer memory_ ABSL_GUARDED_BY(mu_);
  // Declared after memory_: destroyed first, so queues (which wait for their ops) go before
  // the memory they may be writing from.
  std::vector<std::unique_ptr<Lane>> lanes_ ABSL_GUARDED_BY(mu_);
  std::vector<Lane*> free_ ABSL_GUARDED_BY(mu_);
  uint64_t waits_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckv::io

#endif  // CKV_IO_STAGING_POOL_H_
