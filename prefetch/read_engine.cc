// SPDX-License-Identifier: Apache-2.0
// ReadEngine: the request table, the priority queues, coalescing, cancellation and the counters.
// The backends (uring_read_backend.cc, thread_read_backend.cc) issue the reads.
//
// Requests live in a fixed table of max_outstanding_requests entries, so Submit allocates nothing
// but the request's own name and callback, and the bound is the table. A queued request sits in
// the FIFO of its priority and in two hash maps keyed by (file, start) and (file, end), which is
// how a read taken for the head of a queue grows into its adjacent neighbours. Entries leave the
// FIFOs lazily: a request taken by coalescing or cancelled leaves a stale entry, recognised by its
// generation and skipped (the FIFOs are compacted when stale entries outnumber the table).
#include "prefetch/read_engine.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "prefetch/read_engine_internal.h"
#include "storage/record_checksum.h"

namespace ckv::prefetch {

using internal::Completion;
using internal::IoGroup;
using internal::Request;

namespace {
// The request's name, else "<path>@<offset>" (`f` its file, or nullptr: "file N@<offset>").
std::string RequestName(const ReadRequest& r, const io::File* f) {
  if (!r.name.empty()) return r.name;
  return f != nullptr ? absl::StrCat(f->path(), "@", r.offset)
                      : absl::StrCat("file ", r.file, "@", r.offset);
}
}  // namespace

const char* PriorityName(Priority priority) {
  switch (priority) {
    case Priority::kDemand:
      return "demand";
    case Priority::kIntraPeriod:
      return "intra-period";
    case Priority::kSpeculative:
      return "speculative";
  }
  return "?";
}

// ---- ReadFuture ----

absl::Status ReadFuture::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("read request ", id_, " not complete after ", absl::FormatDuration(timeout)));
  }
  return status_;
}

bool ReadFuture::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

void ReadFuture::Set(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  status_ = status;
  done_ = true;
}

// ---- Impl ----

ReadEngine::Impl::Impl(ReadEngineOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock()) {
  start_ns_ = clock_->MonotonicNanos();
  last_tick_ns_ = start_ns_;
  paused_ = options_.start_paused;
}

ReadEngine::Impl::~Impl() = default;

absl::Status ReadEngine::Impl::Init() {
  const ReadEngineOptions& o = options_;
  if (o.queue_depth == 0 || o.queue_depth > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue_depth ", o.queue_depth, " is outside 1..1024"));
  }
  if (o.io_threads == 0 || o.io_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("io_threads ", o.io_threads, " is outside 1..64"));
  }
  if (o.max_io_bytes == 0 || o.max_io_bytes % io::kDirectIoAlignment != 0 ||
      o.max_io_bytes > (1u << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_io_bytes ", o.max_io_bytes, " is not a multiple of 4096 up to 1 GiB"));
  }
  if (o.max_outstanding_requests == 0 || o.max_files == 0 || o.max_files > (1u << 15)) {
    return absl::InvalidArgumentError(
        "max_outstanding_requests and max_files must be positive "
        "(max_files at most 32768)");
  }
  {
    absl::MutexLock lock(&mu_);
    table_.resize(o.max_outstanding_requests);
    free_.reserve(table_.size());
    for (uint32_t i = static_cast<uint32_t>(table_.size()); i-- > 0;) {
      table_[i].index = i;
      free_.push_back(i);
    }
    files_.assign(o.max_files, nullptr);
    reserved_.assign(o.max_files, false);
  }
  if (o.file_system == nullptr && o.backend == IoBackend::kUring && !io::UringAvailable()) {
    return absl::FailedPreconditionError(
        absl::StrCat("io_uring backend requested but unavailable: ", io::UringUnavailableReason()));
  }
  // The reads go through the I/O layer of the file system the files were opened by; without
  // one, the POSIX file system's for `backend` (kAuto falls back to threads, logged once).
  io::FileSystem* fs = o.file_system != nullptr ? o.file_system : io::PosixFileSystem(o.backend);
  backend_ = internal::NewIoThreads(this, fs);
  absl::Status s = backend_->Start();
  if (!s.ok()) backend_.reset();
  return s;
}

void ReadEngine::Impl::Shutdown() {
  if (backend_ == nullptr) return;
  std::vector<Completion> cancelled;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    TickLocked();
    stats_.requests_cancelled += DropQueuedLocked(
        [](const Request& r, const io::File*) {
          return absl::CancelledError(
              absl::StrCat("read ", r.r.name.empty() ? absl::StrCat("request ", r.id()) : r.r.name,
                           " cancelled: the read engine is shutting down"));
        },
        cancelled);
    backend_->WakeLocked();
  }
  RunCallbacks(cancelled);
  backend_->Join();
  backend_.reset();
}

template <typename StatusOf>
uint64_t ReadEngine::Impl::DropQueuedLocked(StatusOf status_of, std::vector<Completion>& out) {
  uint64_t dropped = 0;
  for (Request& r : table_) {
    if (r.state != Request::State::kQueued) continue;
    UnindexLocked(&r);
    CKV_DCHECK(queued_ > 0);
    --queued_;
    ++dropped;
    Completion c;
    c.result.id = r.id();
    c.result.status = status_of(r, files_[r.r.file]);
    c.callback = std::move(r.r.callback);
    out.push_back(std::move(c));
    FreeLocked(&r);
  }
  for (auto& q : queues_) q.clear();
  return dropped;
}

void ReadEngine::Impl::BreakLocked(const absl::Status& why, std::vector<Completion>& out) {
  CKV_CHECK(!why.ok());
  TickLocked();
  if (broken_.ok()) broken_ = why;
  requests_failed_.fetch_add(DropQueuedLocked(
                                 [&](const Request& r, const io::File* f) {
                                   return absl::Status(
                                       why.code(),
                                       absl::StrCat(why.message(), " [", RequestName(r.r, f), "]"));
                                 },
                                 out),
                             std::memory_order_relaxed);
}

absl::StatusOr<FileId> ReadEngine::Impl::RegisterFile(io::File* file) {
  if (file == nullptr) return absl::InvalidArgumentError("RegisterFile: null file");
  FileId id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::FailedPreconditionError("read engine is shutting down");
    while (id < files_.size() && (files_[id] != nullptr || reserved_[id])) ++id;
    if (id == files_.size()) {
      return absl::ResourceExhaustedError(absl::StrCat("RegisterFile ", file->path(), ": all ",
                                                       files_.size(), " file slots in use"));
    }
    reserved_[id] = true;  // requests see the file only once the backend has registered it
  }
  absl::Status s = backend_->RegisterFile(id, file);
  absl::MutexLock lock(&mu_);
  reserved_[id] = false;
  if (!s.ok()) return s;
  files_[id] = file;
  return id;
}

absl::StatusOr<FileId> ReadEngine::Impl::FileIdOf(io::File* file) {
  absl::MutexLock lock(&ids_mu_);
  if (auto it = ids_.find(file); it != ids_.end()) return it->second;
  CKV_ASSIGN_OR_RETURN(FileId id, RegisterFile(file));
  ids_.emplace(file, id);
  return id;
}

absl::Status ReadEngine::Impl::UnregisterFile(FileId id) {
  {
    absl::MutexLock lock(&ids_mu_);
    absl::erase_if(ids_, [id](const auto& entry) { return entry.second == id; });
  }
  {
    absl::MutexLock lock(&mu_);
    if (id >= files_.size() || files_[id] == nullptr) {
      return absl::NotFoundError(absl::StrCat("UnregisterFile: file ", id, " is not registered"));
    }
    files_[id] = nullptr;
    reserved_[id] = true;
  }
  backend_->UnregisterFile(id);
  absl::MutexLock lock(&mu_);
  reserved_[id] = false;
  return absl::OkStatus();
}

absl::Status ReadEngine::Impl::ValidateLocked(const ReadRequest& r) const {
  if (r.file >= files_.size() || files_[r.file] == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("read request: file ", r.file, " is not registered"));
  }
  io::File* f = files_[r.file];
  const size_t align = f->alignment();
  if (r.length == 0 || r.length > options_.max_io_bytes || r.length % align != 0 ||
      r.offset % align != 0 || r.offset >= (uint64_t{1} << 48)) {
    return absl::InvalidArgumentError(
        absl::StrCat("read request ", r.name, " on ", f->path(), ": offset ", r.offset, " length ",
                     r.length, " must be multiples of ", align, " with 0 < length <= max_io_bytes ",
                     options_.max_io_bytes));
  }
  if (r.checksum_bytes > r.length || r.dest.size() > r.length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "read request ", r.name, " on ", f->path(), ": checksum_bytes ", r.checksum_bytes,
        " or dest size ", r.dest.size(), " exceeds length ", r.length));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RequestId>> ReadEngine::Impl::SubmitBatch(
    std::span<ReadRequest> requests) {
  std::vector<RequestId> ids;
  ids.reserve(requests.size());
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::FailedPreconditionError("read engine is shutting down");
  if (!broken_.ok()) return broken_;
  for (const ReadRequest& r : requests) CKV_RETURN_IF_ERROR(ValidateLocked(r));
  if (requests.size() > free_.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("read queue full: ", table_.size() - free_.size(), " of ", table_.size(),
                     " requests outstanding, ", requests.size(), " more submitted"));
  }
  TickLocked();
  for (ReadRequest& rr : requests) {
    Request* r = &table_[free_.back()];
    free_.pop_back();
    r->state = Request::State::kQueued;
    r->r = std::move(rr);
    by_start_.try_emplace(RangeKey(r->r.file, r->r.offset), r);
    by_end_.try_emplace(RangeKey(r->r.file, r->r.offset + r->r.length), r);
    const size_t p = static_cast<size_t>(r->r.priority) % kNumPriorities;
    queues_[p].push_back({r, r->generation});
    if (queues_[p].size() > 2 * table_.size()) CompactLocked(p);
    ids.push_back(r->id());
  }
  queued_ += requests.size();
  // Queued requests hold table entries: the table bounds the queues.
  CKV_DCHECK(queued_ <= table_.size() - free_.size());
  stats_.requests_submitted += requests.size();
  backend_->WakeLocked();
  return ids;
}

void ReadEngine::Impl::CompactLocked(size_t p) {
  std::deque<QueueEntry> kept;
  for (const QueueEntry& e : queues_[p]) {
    if (e.request->generation == e.generation && e.request->state == Request::State::kQueued) {
      kept.push_back(e);
    }
  }
  queues_[p].swap(kept);
}

absl::Status ReadEngine::Impl::Cancel(RequestId id) {
  Completion c;
  {
    absl::MutexLock lock(&mu_);
    const uint32_t index = static_cast<uint32_t>(id);
    const uint32_t generation = static_cast<uint32_t>(id >> 32);
    if (index >= table_.size() || table_[index].generation != generation ||
        table_[index].state == Request::State::kFree) {
      return absl::NotFoundError(absl::StrCat("cancel: read request ", id, " is not outstanding"));
    }
    Request* r = &table_[index];
    if (r->state == Request::State::kIssued) {
      return absl::FailedPreconditionError(
          absl::StrCat("cancel: read request ", id, " is already being read"));
    }
    TickLocked();
    CKV_DCHECK(r->state == Request::State::kQueued && queued_ > 0);
    UnindexLocked(r);
    --queued_;
    ++stats_.requests_cancelled;
    c.result.id = id;
    c.result.status = absl::CancelledError(absl::StrCat(
        "read ", r->r.name.empty() ? absl::StrCat("request ", id) : r->r.name, " cancelled"));
    c.callback = std::move(r->r.callback);
    FreeLocked(r);
  }
  if (c.callback) c.callback(c.result);
  return absl::OkStatus();
}

void ReadEngine::Impl::SetPaused(bool paused) {
  absl::MutexLock lock(&mu_);
  TickLocked();
  paused_ = paused;
  if (!paused) backend_->WakeLocked();
}

void ReadEngine::Impl::PauseAndDrain() {
  absl::MutexLock lock(&mu_);
  TickLocked();
  paused_ = true;
  auto drained = [this]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0 || stopping_; };
  mu_.Await(absl::Condition(&drained));
}

void ReadEngine::Impl::UnindexLocked(Request* r) {
  auto s = by_start_.find(RangeKey(r->r.file, r->r.offset));
  if (s != by_start_.end() && s->second == r) by_start_.erase(s);
  auto e = by_end_.find(RangeKey(r->r.file, r->r.offset + r->r.length));
  if (e != by_end_.end() && e->second == r) by_end_.erase(e);
}

void ReadEngine::Impl::FreeLocked(Request* r) {
  // A request is freed once (completed, cancelled or shut down), so its callback runs once.
  CKV_DCHECK(r->state != Request::State::kFree && free_.size() < table_.size());
  r->state = Request::State::kFree;
  r->r = ReadRequest{};
  ++r->generation;
  if (r->generation == 0) r->generation = 1;
  free_.push_back(r->index);
}

Request* ReadEngine::Impl::PopLocked() {
  for (auto& q : queues_) {
    while (!q.empty()) {
      QueueEntry e = q.front();
      q.pop_front();
      if (e.request->generation == e.generation && e.request->state == Request::State::kQueued) {
        return e.request;
      }
    }
  }
  return nullptr;
}

void ReadEngine::Impl::TickLocked() {
  const int64_t now = clock_->MonotonicNanos();
  const double dt = static_cast<double>(now - last_tick_ns_) * 1e-9;
  depth_area_ += static_cast<double>(in_flight_) * dt;
  if (in_flight_ == 0 && queued_ > 0) stats_.idle_with_pending_seconds += dt;
  if (in_flight_ > 0) stats_.busy_seconds += dt;
  last_tick_ns_ = now;
}

size_t ReadEngine::Impl::TakeLocked(std::span<IoGroup* const> groups) {
  if (paused_ || queued_ == 0 || groups.empty()) return 0;
  TickLocked();
  size_t n = 0;
  const uint32_t max_bytes = options_.max_io_bytes;
  while (n < groups.size()) {
    Request* head = PopLocked();
    if (head == nullptr) break;
    IoGroup& g = *groups[n++];
    g.requests.clear();
    g.file = head->r.file;
    g.file_ptr = files_[head->r.file];
    g.offset = head->r.offset;
    g.length = head->r.length;
    g.priority = head->r.priority;
    g.requests.push_back(head);
    head->state = Request::State::kIssued;
    UnindexLocked(head);
    if (options_.coalesce) {
      while (true) {  // forward
        auto it = by_start_.find(RangeKey(g.file, g.offset + g.length));
        if (it == by_start_.end() || g.length + it->second->r.length > max_bytes) break;
        Request* r = it->second;
        CKV_DCHECK(r->state == Request::State::kQueued);  // the indexes hold queued requests only
        UnindexLocked(r);
        r->state = Request::State::kIssued;
        g.requests.push_back(r);
        g.length += r->r.length;
      }
      while (true) {  // backward
        auto it = by_end_.find(RangeKey(g.file, g.offset));
        if (it == by_end_.end() || g.length + it->second->r.length > max_bytes) break;
        Request* r = it->second;
        CKV_DCHECK(r->state == Request::State::kQueued);
        UnindexLocked(r);
        r->state = Request::State::kIssued;
        g.requests.insert(g.requests.begin(), r);
        g.offset = r->r.offset;
        g.length += r->r.length;
      }
    }
    CKV_DCHECK(queued_ >= g.requests.size() && g.length <= max_bytes);
    queued_ -= g.requests.size();
    g.issue_seq = ++issue_seq_;
    ++in_flight_;
    // A device read holds one of its I/O thread's 2 x queue_depth staging slots until released.
    CKV_DCHECK(in_flight_ <= uint64_t{options_.io_threads} * 2 * options_.queue_depth);
    stats_.requests_coalesced += g.requests.size() - 1;
    stats_.bytes_requested += g.length;
    const size_t bucket = std::min<size_t>(std::bit_width(in_flight_), kQueueDepthBuckets - 1);
    ++stats_.queue_depth_histogram[bucket];
    size_t size_bucket = 0;
    while (size_bucket + 1 < kIoSizeBuckets && g.length > (uint64_t{4096} << size_bucket)) {
      ++size_bucket;
    }
    ++stats_.io_size_histogram[size_bucket];
  }
  return n;
}

void ReadEngine::Impl::CountIoLocked(uint64_t ios, uint64_t bytes) {
  stats_.ios_issued += ios;
  stats_.bytes_read += bytes;
}

std::string ReadEngine::Impl::Describe(const IoGroup& g) {
  return absl::StrCat("read ", g.file_ptr->path(), " at offset ", g.offset, " (", g.length,
                      " bytes, ", g.requests.size(), " request", g.requests.size() == 1 ? "" : "s",
                      ")");
}

void ReadEngine::Impl::FinishGroup(IoGroup& g, const std::byte* buffer,
                                   const absl::Status& io_status, std::vector<Completion>& out) {
  for (Request* r : g.requests) {
    Completion c;
    c.result.id = r->id();
    c.result.issue_seq = g.issue_seq;
    c.result.coalesced = static_cast<uint32_t>(g.requests.size());
    const ReadRequest& rr = r->r;
    if (!io_status.ok()) {
      c.result.status =
          absl::Status(io_status.code(),
                       absl::StrCat(io_status.message(), " [", RequestName(rr, g.file_ptr), "]"));
    } else {
      const std::byte* data = buffer + (rr.offset - g.offset);
      if (rr.verify_checksum) {
        const size_t n = rr.checksum_bytes == 0 ? rr.length : rr.checksum_bytes;
        c.result.status = storage::VerifyRecordChecksum(data, n, rr.expected_checksum, [&] {
          return absl::StrFormat("%s (offset %u of %s)", RequestName(rr, g.file_ptr), rr.offset,
                                 g.file_ptr->path());
        });
        if (!c.result.status.ok()) checksum_failures_.fetch_add(1, std::memory_order_relaxed);
      }
      if (c.result.status.ok()) {
        if (!rr.dest.empty()) std::memcpy(rr.dest.data(), data, rr.dest.size());
        c.result.data = std::span<const std::byte>(data, rr.length);
      }
    }
    if (c.result.status.ok()) {
      requests_ok_.fetch_add(1, std::memory_order_relaxed);
    } else {
      requests_failed_.fetch_add(1, std::memory_order_relaxed);
    }
    c.callback = std::move(r->r.callback);
    out.push_back(std::move(c));
  }
}

void ReadEngine::Impl::RunCallbacks(std::vector<Completion>& completions) {
  for (Completion& c : completions) {
    if (c.callback) c.callback(c.result);
  }
  completions.clear();
}

void ReadEngine::Impl::ReleaseLocked(IoGroup& g) {
  TickLocked();
  CKV_DCHECK(in_flight_ > 0);  // every device read released was taken
  --in_flight_;
  for (Request* r : g.requests) {
    CKV_DCHECK(r->state == Request::State::kIssued);  // released once, after it was issued
    FreeLocked(r);
  }
  g.requests.clear();
}

ReadEngineStats ReadEngine::Impl::stats() const {
  absl::MutexLock lock(const_cast<absl::Mutex*>(&mu_));
  ReadEngineStats s = stats_;
  s.requests_ok = requests_ok_.load(std::memory_order_relaxed);
  s.requests_failed = requests_failed_.load(std::memory_order_relaxed);
  s.checksum_failures = checksum_failures_.load(std::memory_order_relaxed);
  const int64_t now = clock_->MonotonicNanos();
  const double dt = static_cast<double>(now - last_tick_ns_) * 1e-9;
  if (in_flight_ == 0 && queued_ > 0) s.idle_with_pending_seconds += dt;
  if (in_flight_ > 0) s.busy_seconds += dt;
  s.elapsed_seconds = static_cast<double>(now - start_ns_) * 1e-9;
  const double area = depth_area_ + static_cast<double>(in_flight_) * dt;
  s.mean_queue_depth = s.elapsed_seconds > 0 ? area / s.elapsed_seconds : 0;
  return s;
}

// ---- ReadEngine ----

ReadEngine::ReadEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ReadEngine::~ReadEngine() { impl_->Shutdown(); }

absl::StatusOr<std::unique_ptr<ReadEngine>> ReadEngine::Create(ReadEngineOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  CKV_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<ReadEngine>(new ReadEngine(std::move(impl)));
}

const char* ReadEngine::backend() const { return impl_->backend_name(); }
bool ReadEngine::uses_fixed_buffers() const { return impl_->fixed_buffers(); }

absl::StatusOr<FileId> ReadEngine::RegisterFile(io::File* file) {
  return impl_->RegisterFile(file);
}
absl::Status ReadEngine::UnregisterFile(FileId file) { return impl_->UnregisterFile(file); }
absl::StatusOr<FileId> ReadEngine::FileIdOf(io::File* file) { return impl_->FileIdOf(file); }

absl::StatusOr<ReadRequest> ReadEngine::RequestFor(const io::FileRead& read, Priority priority) {
  CKV_ASSIGN_OR_RETURN(FileId file, impl_->FileIdOf(read.file));
  ReadRequest r;
  r.file = file;
  r.offset = read.offset;
  r.length = read.length;
  r.priority = priority;
  r.verify_checksum = read.checksum_bytes > 0;
  r.expected_checksum = read.checksum;
  r.checksum_bytes = read.checksum_bytes;
  return r;
}

absl::StatusOr<RequestId> ReadEngine::Submit(ReadRequest request) {
  CKV_ASSIGN_OR_RETURN(std::vector<RequestId> ids,
                       impl_->SubmitBatch(std::span<ReadRequest>(&request, 1)));
  return ids[0];
}

absl::StatusOr<std::vector<RequestId>> ReadEngine::SubmitBatch(std::span<ReadRequest> requests) {
  return impl_->SubmitBatch(requests);
}

absl::StatusOr<std::shared_ptr<ReadFuture>> ReadEngine::SubmitWithFuture(ReadRequest request) {
  if (request.callback) {
    return absl::InvalidArgumentError("SubmitWithFuture: the request already has a callback");
  }
  auto future = std::make_shared<ReadFuture>();
  request.callback = [future](const ReadResult& result) { future->Set(result.status); };
  CKV_ASSIGN_OR_RETURN(RequestId id, Submit(std::move(request)));
  future->id_ = id;  // written before anyone can Wait on it; Set does not read it
  return future;
}

absl::Status ReadEngine::Cancel(RequestId id) { return impl_->Cancel(id); }
void ReadEngine::Pause() { impl_->SetPaused(true); }
void ReadEngine::Resume() { impl_->SetPaused(false); }
void ReadEngine::PauseAndDrain() { impl_->PauseAndDrain(); }
ReadEngineStats ReadEngine::stats() const { return impl_->stats(); }

}  // namespace ckv::prefetch
