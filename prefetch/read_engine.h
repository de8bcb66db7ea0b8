// SPDX-License-Identifier: Apache-2.0
// prefetch/read_engine.h: asynchronous, prioritised, coalescing, checksum-verifying reads.
//
// ReadEngine turns "these byte ranges (records) of these files" into device reads that keep the
// NVMe busy. A caller registers files, then submits ReadRequests, each with a priority, an
// optional expected XXH3-64 checksum and a callback or a waitable ReadFuture. The engine:
//   - queues requests by priority: kDemand before kIntraPeriod before kSpeculative, FIFO within
//     one priority;
//   - coalesces queued requests for adjacent byte ranges of one file into one device read of at
//     most `max_io_bytes` (each request's checksum is still verified on its own bytes);
//   - issues reads through the I/O layer (io::IoQueue of the options' FileSystem),
//     one queue per I/O thread, `queue_depth` reads in flight each, into staging buffers
//     registered with the queue: io_uring with READ_FIXED and fixed-file indexes, or the thread
//     fallback (File::ReadAt on a pool of workers; any io::File); the fault-injecting file
//     system injects faults there, whichever backend is under it;
//   - verifies each request's checksum as its read lands, before any callback sees the bytes: a
//     mismatch is DataLoss naming the request;
//   - hands each request its bytes: a view of the staging buffer valid during the callback, and
//     a copy into `dest` when the request gives one.
// See docs/io.md for the design (ring life cycle, buffers, coalescing, cancellation, counters).
//
// Errors are per request: an I/O error of a coalesced read is reported to every request it
// carried (each message names its request). EINTR/EAGAIN are retried, short reads requeued for
// the remainder; a read that hits the end of the file is DataLoss ("short read").
//
// Thread-safety: every method is thread-safe and may be called from a callback, except the
// destructor (REQUIRES: not called from a callback). Callbacks run on an I/O thread (or, for
// Cancel and shutdown, on the thread calling Cancel or destroying the engine), never with an
// engine lock held; a callback must not block for long: it holds up the reads of its thread.
#ifndef CKV_PREFETCH_READ_ENGINE_H_
#define CKV_PREFETCH_READ_ENGINE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ckv/io_backend.h"
#include "ckv/log.h"
#include "common/clock.h"
#include "io/file_system.h"

namespace ckv::prefetch {

// Demand reads outrank intra-period prefetches, which outrank inter-period speculation.
// Do not renumber: the values index the queues and the counters.
enum class Priority : uint8_t { kDemand = 0, kIntraPeriod = 1, kSpeculative = 2 };
inline constexpr size_t kNumPriorities = 3;
const char* PriorityName(Priority priority);

// Registers / unregisters the staging arena as pinned host memory (cudaHostRegister /
// cudaHostUnregister where the CUDA backend is built) so that a GPU tier can DMA from it. The
// engine calls pin once per arena after allocating it and unpin before freeing it; a pin error
// fails Create. Not set: the arena is ordinary memory (the CPU-only build).
using PinMemoryHook = std::function<absl::Status(void* address, size_t bytes)>;
using UnpinMemoryHook = std::function<void(void* address, size_t bytes)>;

struct ReadEngineOptions {
  // The file system whose I/O layer (io::IoQueue) issues the reads; registered files must
  // be opened by it. A FaultInjectingFileSystem injects faults into the reads here, over either
  // backend. Not owned; must outlive the engine. Default: none, io::PosixFileSystem(backend).
  io::FileSystem* file_system = nullptr;
  // Without file_system: the POSIX file system's backend. Default: kAuto (io_uring when
  // available, else threads with one log line); kUring fails Create when io_uring is unavailable.
  IoBackend backend = IoBackend::kAuto;
  // I/O threads, one I/O queue (one ring) each. Default: 1.
  uint32_t io_threads = 1;
  // Device reads in flight per I/O thread (each thread has 2 x queue_depth staging buffers, so
  // that the device is refilled while landed reads are verified; the threads backend runs up to
  // queue_depth worker threads per queue). 1..1024. Default: 64.
  uint32_t queue_depth = 64;
  // Largest device read, and the size of each staging buffer; coalescing stops here; a request
  // may not be longer. Multiple of 4096. Default: 256 KiB.
  uint32_t max_io_bytes = 256 * 1024;
  // Merge queued requests for adjacent byte ranges of one file. Default: true.
  bool coalesce = true;
  // Requests submitted and not yet released (queued, in flight, or landed and being called back:
  // a request's entry is freed just after its callback); Submit beyond it is ResourceExhausted.
  // Default: 8192.
  uint32_t max_outstanding_requests = 8192;
  // Most files registered at once. Default: 1024.
  uint32_t max_files = 1024;
  // Where the registration-fallback lines go. Default: StderrLogger().
  Logger* logger = nullptr;
  // Pinned-memory seam (see PinMemoryHook). Default: none.
  PinMemoryHook pin_memory;
  UnpinMemoryHook unpin_memory;
  // io_uring: with reads in flight and nothing completed, an I/O thread polls its completion queue
  // up to this long before sleeping in the kernel, when completions have been arriving at least
  // twice that often (small reads). Trades CPU for throughput: a sleep/wake per completion leaves
  // the device slot idle for the wake-up latency. 0 never polls. Default: 50.
  uint32_t poll_before_sleep_us = 50;
  // Register the staging buffers and files with the I/O queues (io_uring: READ_FIXED, fixed-file
  // indexes). False uses plain reads and descriptors. Default: true.
  bool register_with_ring = true;
  // Start with issuing held until Resume() (tests queue a backlog first). Default: false.
  bool start_paused = false;
  // What the time-weighted stats (busy, idle with pending, elapsed seconds, mean queue depth)
  // are measured on. Not owned; must outlive the engine. Default (nullptr): ckv::RealClock().
  Clock* clock = nullptr;
};

// Identifies a submitted request; 0 is never an id.
using RequestId = uint64_t;
// Index of a registered file.
using FileId = uint32_t;

struct ReadResult {
  RequestId id = 0;
  // OK, DataLoss (checksum mismatch, EIO, short read), Cancelled, or another mapped errno.
  absl::Status status;
  // The request's `length` bytes, checksum-verified; valid only during the callback. Empty
  // unless status is OK.
  std::span<const std::byte> data;
  // 1-based order in which the device read carrying this request was issued; 0 when it never
  // was (cancelled). Requests coalesced into one read share it.
  uint64_t issue_seq = 0;
  // Requests carried by that device read (1 when not coalesced).
  uint32_t coalesced = 0;
};
using ReadCallback = std::function<void(const ReadResult&)>;

struct ReadRequest {
  FileId file = 0;
  // Byte range; offset and length aligned to the file's alignment; 0 < length <= max_io_bytes.
  uint64_t offset = 0;
  uint32_t length = 0;
  Priority priority = Priority::kDemand;
  // When set, XXH3-64 of the first `checksum_bytes` bytes (0 means `length`) must equal
  // `expected_checksum`, else the request fails with DataLoss.
  bool verify_checksum = false;
  uint64_t expected_checksum = 0;
  uint32_t checksum_bytes = 0;
  // Names the request in error messages, e.g. "record 9f3c…/L7". Default: "<path>@<offset>".
  std::string name;
  // When not empty, the first dest.size() (<= length) bytes are copied here before completion.
  // Must stay valid until the request completes.
  std::span<std::byte> dest;
  // Runs once with the outcome. May be empty (fire and forget, or when using a future).
  ReadCallback callback;
};

// The waitable form of a request's completion.
class ReadFuture {
 public:
  // Blocks until the request completes or `timeout` passes. Returns the request's status, or
  // DeadlineExceeded when it has not completed in time (it may complete later).
  absl::Status Wait(absl::Duration timeout);
  bool done() const;
  RequestId id() const { return id_; }

 private:
  friend class ReadEngine;
  void Set(const absl::Status& status);
  RequestId id_ = 0;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Buckets of the queue-depth histogram: [0] depth 0, [i] depths in [2^(i-1), 2^i), last open.
inline constexpr size_t kQueueDepthBuckets = 12;
// Buckets of the read-size histogram: [i] reads of at most 4 KiB << i bytes (after coalescing),
// the last open: 4 KiB, 8 KiB, ..., 4 MiB and larger.
inline constexpr size_t kIoSizeBuckets = 11;

struct ReadEngineStats {
  uint64_t requests_submitted = 0;
  uint64_t requests_ok = 0;
  uint64_t requests_failed = 0;     // I/O errors, checksum mismatches
  uint64_t requests_cancelled = 0;  // by Cancel or shutdown
  uint64_t checksum_failures = 0;
  uint64_t requests_coalesced = 0;  // requests that rode in another request's read
  uint64_t bytes_requested = 0;     // lengths of the requests issued to the device
  uint64_t bytes_read = 0;          // bytes the device transferred (retries included)
  uint64_t ios_issued = 0;          // the I/O queue's transfers (SQEs or ReadAt calls), requeued
                                    // remainders and retries included
  // Device reads in flight, sampled at each issue (see kQueueDepthBuckets).
  std::array<uint64_t, kQueueDepthBuckets> queue_depth_histogram{};
  // Device reads by size (see kIoSizeBuckets): what a fio job must replay to be comparable.
  std::array<uint64_t, kIoSizeBuckets> io_size_histogram{};
  // Time-weighted mean of device reads in flight since the engine started.
  double mean_queue_depth = 0;
  // Seconds during which no device read was in flight while requests were queued (including
  // while paused).
  double idle_with_pending_seconds = 0;
  // Seconds during which at least one device read was in flight: bytes_read / busy_seconds is
  // the rate the device delivered while it was in use.
  double busy_seconds = 0;
  double elapsed_seconds = 0;
  // bytes_read / bytes_requested (1 when nothing was requested).
  double read_amplification() const {
    return bytes_requested == 0
               ? 1.0
               : static_cast<double>(bytes_read) / static_cast<double>(bytes_requested);
  }
};

class ReadEngine {
 public:
  // Starts the I/O threads. InvalidArgument for bad options; for kUring, the ring's set-up
  // error (kAuto falls back instead).
  static absl::StatusOr<std::unique_ptr<ReadEngine>> Create(ReadEngineOptions options);

  // Cancels what is queued (callbacks run with Cancelled on this thread), waits for the reads in
  // flight to land and their callbacks to run, then frees the rings and the arena.
  ~ReadEngine();
  ReadEngine(const ReadEngine&) = delete;
  ReadEngine& operator=(const ReadEngine&) = delete;

  // "io_uring" or "threads": the backend in use.
  const char* backend() const;
  // True when the io_uring backend reads into registered buffers (READ_FIXED) with registered
  // files; false when registration failed and it uses plain reads (logged once).
  bool uses_fixed_buffers() const;

  // Makes `file` readable by requests. `file` must be opened by the options' file system (for
  // io_uring, io::PosixFileSystem, or a wrapper over it); it is not owned and must outlive
  // its registration.
  absl::StatusOr<FileId> RegisterFile(io::File* file);
  // REQUIRES: no request for `file` is outstanding.
  absl::Status UnregisterFile(FileId file);
  // The id of `file`, registering it on first use; the same id on later calls until it is
  // unregistered. Thread-safe.
  absl::StatusOr<FileId> FileIdOf(io::File* file);
  // A request for `read` (io::FileRead, e.g. a pinned chunk's record: PinnedChunks::ReadOf):
  // its file by id (FileIdOf), offset and padded length, and its checksum verified when it has
  // one. The caller adds name, dest and callback.
  absl::StatusOr<ReadRequest> RequestFor(const io::FileRead& read, Priority priority);

  // Queues a request. InvalidArgument for a bad request, ResourceExhausted when
  // max_outstanding_requests are outstanding, FailedPrecondition after shutdown began.
  absl::StatusOr<RequestId> Submit(ReadRequest request);
  // Queues all of `requests` or none (one lock and one wake-up for the batch).
  absl::StatusOr<std::vector<RequestId>> SubmitBatch(std::span<ReadRequest> requests);
  // Queues `request` (whose callback must be empty) and returns its waitable completion.
  absl::StatusOr<std::shared_ptr<ReadFuture>> SubmitWithFuture(ReadRequest request);

  // Cancels a queued request: its callback runs with Cancelled before this returns. A request
  // already handed to the device cannot be cancelled (FailedPrecondition; it completes
  // normally, and may still answer so for a moment after its callback ran); NotFound when `id`
  // is unknown or has completed. Cancelling never releases a
  // staging buffer: those are released only when the device read that uses them has landed.
  absl::Status Cancel(RequestId id);

  // Holds / resumes issuing new device reads (reads in flight continue).
  void Pause();
  void Resume();
  // Holds issuing, as Pause does, and returns once no device read is in flight: every read
  // issued before the call has landed and its callback has run. What is queued stays queued
  // until Resume. For a benchmark's clock that stops time: nothing lands while it is stopped.
  void PauseAndDrain();

  ReadEngineStats stats() const;

  class Impl;

 private:
  explicit ReadEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckv::prefetch

#endif  // CKV_PREFETCH_READ_ENGINE_H_
