// SPDX-License-Identifier: Apache-2.0
// prefetch/read_engine_internal.h: the scheduler and the interface of its I/O threads
// (prefetch/io_threads.cc). Internal to prefetch/.
//
// One mutex (Impl::mu_) guards the queues, the request table, the counters and each backend's
// sleep/wake state. A backend's I/O thread takes it once per loop turn: it returns the requests of
// the reads that landed, then takes new coalesced reads (TakeLocked), then releases it and issues
// them. Verification, copies and callbacks run without it.
#ifndef CKV_PREFETCH_READ_ENGINE_INTERNAL_H_
#define CKV_PREFETCH_READ_ENGINE_INTERNAL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "io/file_system.h"
#include "prefetch/read_engine.h"

namespace ckv::prefetch {
namespace internal {

// A submitted request, in the fixed table.
struct Request {
  enum class State : uint8_t { kFree, kQueued, kIssued };
  uint32_t index = 0;
  uint32_t generation = 1;  // bumped when released; a RequestId is (generation << 32 | index)
  State state = State::kFree;
  ReadRequest r;
  RequestId id() const { return (uint64_t{generation} << 32) | index; }
};

// One device read: one request, or several adjacent ones in offset order.
struct IoGroup {
  FileId file = 0;
  io::File* file_ptr = nullptr;
  uint64_t offset = 0;
  uint32_t length = 0;
  uint64_t issue_seq = 0;
  Priority priority = Priority::kDemand;  // of the request it was taken for
  absl::InlinedVector<Request*, 8> requests;
};

// A finished request waiting for its callback.
struct Completion {
  ReadCallback callback;
  ReadResult result;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual bool fixed_buffers() const { return false; }
  // Starts the threads. Called once, without the lock.
  virtual absl::Status Start() = 0;
  // Registers / unregisters a file at table slot `id`. Called without the lock.
  virtual absl::Status RegisterFile(FileId id, io::File* file) = 0;
  virtual void UnregisterFile(FileId id) = 0;
  // Work was queued or shutdown began: wake a thread that sleeps with room.
  virtual void WakeLocked() = 0;
  // Joins the threads (after Impl set stopping_). Called without the lock.
  virtual void Join() = 0;
};

}  // namespace internal

class ReadEngine::Impl {
 public:
  explicit Impl(ReadEngineOptions options);
  ~Impl();

  absl::Status Init();
  void Shutdown();

  // The public API.
  absl::StatusOr<FileId> RegisterFile(io::File* file);
  absl::Status UnregisterFile(FileId file);
  absl::StatusOr<FileId> FileIdOf(io::File* file);
  absl::StatusOr<std::vector<RequestId>> SubmitBatch(std::span<ReadRequest> requests);
  absl::Status Cancel(RequestId id);
  void SetPaused(bool paused);
  void PauseAndDrain();
  ReadEngineStats stats() const;
  const char* backend_name() const { return backend_->name(); }
  bool fixed_buffers() const { return backend_->fixed_buffers(); }

  // For backends.
  const ReadEngineOptions& options() const { return options_; }
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // True when a read could be taken now (something queued and not paused).
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !paused_ && queued_ > 0; }
  // Fills groups[0..n) with up to groups.size() coalesced device reads, highest priority first,
  // counts them in flight and returns n. The groups belong to the backend.
  size_t TakeLocked(std::span<internal::IoGroup* const> groups) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A read landed (or failed): releases its requests, counts it out of flight.
  void ReleaseLocked(internal::IoGroup& group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An I/O queue failed (`why`, not OK): every queued request fails with it (appended to `out`),
  // and so does every later SubmitBatch. The reads other threads hold still land.
  void BreakLocked(const absl::Status& why, std::vector<internal::Completion>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts device transfers (each SQE / ReadAt, as the I/O queue counts them) and their bytes.
  void CountIoLocked(uint64_t ios, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountIo(uint64_t ios, uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    CountIoLocked(ios, bytes);
  }
  // Without the lock: verifies each request of `group` against the bytes at `buffer` (or gives
  // each `io_status` when it is not OK), copies to dest, and appends the completions (callbacks
  // moved out of the requests). `buffer` must stay unchanged until the callbacks have run.
  void FinishGroup(internal::IoGroup& group, const std::byte* buffer, const absl::Status& io_status,
                   std::vector<internal::Completion>& out);
  // Runs callbacks (no lock held) and clears `completions`.
  static void RunCallbacks(std::vector<internal::Completion>& completions);
  // "read <path> at offset N (<request name>)"-style context for a failed read.
  static std::string Describe(const internal::IoGroup& group);

 private:
  struct QueueEntry {
    internal::Request* request;
    uint32_t generation;
  };
  static uint64_t RangeKey(FileId file, uint64_t offset) { return (uint64_t{file} << 48) | offset; }

  absl::Status ValidateLocked(const ReadRequest& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnindexLocked(internal::Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeLocked(internal::Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Advances the time-weighted counters to now.
  void TickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  internal::Request* PopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes every queued request out of the queues, each with the status `status_of(request,
  // its file)` (completions appended to `out`); returns how many.
  template <typename StatusOf>
  uint64_t DropQueuedLocked(StatusOf status_of, std::vector<internal::Completion>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompactLocked(size_t priority) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ReadEngineOptions options_;
  std::unique_ptr<internal::Backend> backend_;

  std::vector<internal::Request> table_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  std::deque<QueueEntry> queues_[kNumPriorities] ABSL_GUARDED_BY(mu_);
  // Queued requests by (file, start) and (file, end), for coalescing.
  absl::flat_hash_map<uint64_t, internal::Request*> by_start_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, internal::Request*> by_end_ ABSL_GUARDED_BY(mu_);
  std::vector<io::File*> files_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> reserved_ ABSL_GUARDED_BY(mu_);  // slots being (un)registered
  // FileIdOf's registrations; held across RegisterFile so that a file is registered once.
  absl::Mutex ids_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::flat_hash_map<io::File*, FileId> ids_ ABSL_GUARDED_BY(ids_mu_);
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // set by BreakLocked
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // device reads
  uint64_t issue_seq_ ABSL_GUARDED_BY(mu_) = 0;
  ReadEngineStats stats_ ABSL_GUARDED_BY(mu_);
  Clock* const clock_;    // options_.clock, or the real one
  int64_t start_ns_ = 0;  // clock_->MonotonicNanos() at construction
  int64_t last_tick_ns_ ABSL_GUARDED_BY(mu_) = 0;
  double depth_area_ ABSL_GUARDED_BY(mu_) = 0;  // in-flight reads x seconds
  // Counted by FinishGroup, before the callbacks run, without the lock.
  std::atomic<uint64_t> requests_ok_{0}, requests_failed_{0}, checksum_failures_{0};
};

namespace internal {
// The I/O threads (prefetch/io_threads.cc), each driving one queue of `fs`'s I/O layer.
std::unique_ptr<Backend> NewIoThreads(ReadEngine::Impl* engine, io::FileSystem* fs);
}  // namespace internal

}  // namespace ckv::prefetch

#endif  // CKV_PREFETCH_READ_ENGINE_INTERNAL_H_
