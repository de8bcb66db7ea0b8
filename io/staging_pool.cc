// SPDX-License-Identifier: Apache-2.0
// StagingPool (see io/staging_pool.h).
#include "io/staging_pool.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/assert.h"
#include "common/status_macros.h"

namespace ckv::io {

struct StagingPool::Lane {
  std::vector<std::byte*> buffers;
  std::unique_ptr<IoQueue> queue;  // made on the lane's first lease
  bool registered = false;         // buffers registered with queue (index i = buffers[i])
};

namespace {

size_t RoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

size_t BufferCount(uint64_t pool_bytes, size_t buffer_bytes) {
  return static_cast<size_t>(std::max<uint64_t>(2, pool_bytes / buffer_bytes));
}

size_t LaneBuffers(size_t buffers, uint32_t queue_depth) {
  return std::clamp<size_t>(buffers / 2, 2, std::max<uint32_t>(2, queue_depth));
}

}  // namespace

StagingPool::StagingPool(FileSystem* fs, uint64_t pool_bytes, size_t buffer_bytes,
                         uint32_t queue_depth)
    : fs_(fs),
      buffer_bytes_(RoundUp(std::max<size_t>(buffer_bytes, 1), kBufferAlignment)),
      buffer_count_(BufferCount(pool_bytes, buffer_bytes_)),
      lane_count_(std::max<size_t>(1, buffer_count_ / LaneBuffers(buffer_count_, queue_depth))),
      queue_depth_(queue_depth) {}

StagingPool::~StagingPool() {
  absl::MutexLock lock(&mu_);
  // Every lease has ended (the store outlives its Puts); the queues go before the memory.
  CKV_DCHECK(free_.size() == lanes_.size());
  lanes_.clear();
}

absl::Status StagingPool::AllocateLocked() {
  CKV_ASSIGN_OR_RETURN(memory_,
                       AlignedBuffer::Allocate(buffer_bytes_ * buffer_count_, kBufferAlignment));
  // Pre-fault: every page is touched once here, not by the first copies of every Put.
  std::memset(memory_.data(), 0, memory_.size());
  const size_t per_lane = buffer_count_ / lane_count_;
  for (size_t l = 0; l < lane_count_; ++l) {
    auto lane = std::make_unique<Lane>();
    const size_t first = l * per_lane;
    const size_t last = l + 1 == lane_count_ ? buffer_count_ : first + per_lane;
    for (size_t b = first; b < last; ++b)
      lane->buffers.push_back(memory_.data() + b * buffer_bytes_);
    free_.push_back(lane.get());
    lanes_.push_back(std::move(lane));
  }
  return absl::OkStatus();
}

absl::StatusOr<StagingPool::Lease> StagingPool::LeaseLane() {
  Lane* lane = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (lanes_.empty()) CKV_RETURN_IF_ERROR(AllocateLocked());
    if (free_.empty()) ++waits_;
    while (free_.empty()) lane_free_.Wait(&mu_);
    lane = free_.back();
    free_.pop_back();
  }
  Lease lease(this, lane);
  if (lane->queue == nullptr) {
    // The lane is this thread's now: make its queue outside the lock.
    absl::StatusOr<std::unique_ptr<IoQueue>> queue = fs_->NewIoQueue(queue_depth_);
    if (!queue.ok()) return queue.status();  // the lease returns the lane
    lane->queue = std::move(*queue);
    std::vector<std::span<std::byte>> spans;
    for (std::byte* b : lane->buffers) spans.emplace_back(b, buffer_bytes_);
    // Refused where the backend has no registered buffers or RLIMIT_MEMLOCK is too low: the
    // buffers are then written as plain buffers, which only costs a pin per write.
    lane->registered = lane->queue->RegisterBuffers(spans).ok();
  }
  return lease;
}

void StagingPool::Release(Lane* lane) {
  absl::MutexLock lock(&mu_);
  free_.push_back(lane);
  lane_free_.Signal();
}

uint64_t StagingPool::waits() const {
  absl::MutexLock lock(&mu_);
  return waits_;
}

StagingPool::Lease::~Lease() {
  if (lane_ == nullptr) return;
  // The holder drains before it lets go; this only makes sure that no op outlives the lease.
  if (lane_->queue != nullptr && !lane_->queue->Drain().ok()) {
    lane_->queue.reset();  // a queue that failed is made afresh by the next lease
  }
  pool_->Release(lane_);
}

void StagingPool::Lease::DiscardQueue() {
  if (lane_->queue != nullptr) lane_->queue->Drain().IgnoreError();  // failed already; see below
  lane_->queue.reset();
  lane_->registered = false;
}

StagingPool::Lease::Lease(Lease&& other) noexcept
    : pool_(other.pool_), lane_(std::exchange(other.lane_, nullptr)) {}

IoQueue* StagingPool::Lease::queue() const { return lane_->queue.get(); }

std::span<std::byte* const> StagingPool::Lease::buffers() const { return lane_->buffers; }

uint32_t StagingPool::Lease::buffer_index(size_t i) const {
  return lane_->registered ? static_cast<uint32_t>(i) : kNoIoSlot;
}

}  // namespace ckv::io
