// The thread-pool backend of ReadEngine: queue_depth threads, each owning one staging buffer of
// max_io_bytes. A thread takes one coalesced read under the engine's lock, reads it with
// File::ReadAt (positioned, retrying EINTR and short transfers; the fault-injecting file system
// wraps exactly this call), verifies and delivers it, then takes the next. The fault hook is
// applied per ReadAt: an injected errno fails the read (EINTR/EAGAIN are retried), a transfer
// limit reads only part and goes round again for the remainder, as the io_uring backend does.
#include <cerrno>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "prefetch/read_engine_internal.h"

namespace ckv::prefetch::internal {
namespace {

constexpr int kMaxRetries = 1000;

class ThreadBackend final : public Backend {
 public:
  explicit ThreadBackend(ReadEngine::Impl* engine) : engine_(engine) {}
  ~ThreadBackend() override { Join(); }

  const char* name() const override { return "threads"; }

  absl::Status Start() override {
    const ReadEngineOptions& o = engine_->options();
    const size_t n = o.queue_depth;
    buffers_.reserve(n);
    for (size_t i = 0; i < n; ++i) buffers_.emplace_back(o.max_io_bytes, storage::kDirectIoAlignment);
    if (o.pin_memory) {
      for (auto& b : buffers_) CKV_RETURN_IF_ERROR(o.pin_memory(b.data(), b.size()));
      pinned_ = true;
    }
    threads_.reserve(n);
    for (size_t i = 0; i < n; ++i) threads_.emplace_back([this, i] { Loop(buffers_[i].data()); });
    return absl::OkStatus();
  }

  absl::Status RegisterFile(FileId, storage::File* file) override {
    if (file->alignment() > storage::kDirectIoAlignment) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RegisterFile ", file->path(), ": alignment ", file->alignment(), " exceeds 4096"));
    }
    return absl::OkStatus();
  }
  void UnregisterFile(FileId) override {}

  // One thread per wake-up; a thread that takes work and leaves more queued wakes the next, so
  // a submission does not wake the whole pool.
  void WakeLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_->mu_) {
    if (engine_->stopping_) {
      cv_.SignalAll();
    } else {
      cv_.Signal();
    }
  }

  void Join() override {
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    if (pinned_ && engine_->options().unpin_memory) {
      for (auto& b : buffers_) engine_->options().unpin_memory(b.data(), b.size());
    }
    pinned_ = false;
  }

 private:
  void Loop(std::byte* buffer) {
    IoGroup group;
    IoGroup* const slot[1] = {&group};
    std::vector<Completion> completions;
    bool have = false;
    while (true) {
      {
        absl::MutexLock lock(&engine_->mu_);
        if (have) engine_->ReleaseLocked(group);
        have = false;
        while (!engine_->stopping_ && !engine_->HasWorkLocked()) cv_.Wait(&engine_->mu_);
        if (engine_->TakeLocked(slot) == 0) {
          if (engine_->stopping_) return;
          continue;
        }
        have = true;
        if (engine_->HasWorkLocked()) cv_.Signal();
      }
      const absl::Status status = Read(group, buffer);
      engine_->FinishGroup(group, buffer, status, completions);
      ReadEngine::Impl::RunCallbacks(completions);
    }
  }

  absl::Status Read(const IoGroup& g, std::byte* buffer) {
    const FaultHook& hook = engine_->options().fault_hook;
    uint32_t done = 0;
    int retries = 0;
    while (done < g.length) {
      uint32_t length = g.length - done;
      if (hook) {
        const IoFault fault = hook(g.file_ptr->path(), g.offset + done, length);
        if (fault.latency_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(fault.latency_us));
        if (fault.error != 0) {
          engine_->CountIo(1, 0);
          if ((fault.error == EINTR || fault.error == EAGAIN) && ++retries < kMaxRetries) continue;
          return ErrnoToStatus(fault.error, absl::StrCat(ReadEngine::Impl::Describe(g), " (injected)"));
        }
        if (fault.transfer_limit >= 0 && fault.transfer_limit < length) {
          length = static_cast<uint32_t>(fault.transfer_limit);
          if (length == 0) {
            engine_->CountIo(1, 0);
            return absl::DataLossError(absl::StrCat("short read: ", ReadEngine::Impl::Describe(g),
                                                    ": got ", done, " of ", g.length,
                                                    " bytes (injected end of file)"));
          }
        }
      }
      absl::Status s = g.file_ptr->ReadAt(g.offset + done, std::span<std::byte>(buffer + done, length));
      engine_->CountIo(1, s.ok() ? length : 0);
      if (!s.ok()) return s;
      done += length;
      retries = 0;
    }
    return absl::OkStatus();
  }

  ReadEngine::Impl* const engine_;
  absl::CondVar cv_;
  std::vector<storage::AlignedBuffer> buffers_;
  std::vector<std::thread> threads_;
  bool pinned_ = false;
};

}  // namespace

std::unique_ptr<Backend> NewThreadBackend(ReadEngine::Impl* engine) {
  return std::make_unique<ThreadBackend>(engine);
}

}  // namespace ckv::prefetch::internal
