// SPDX-License-Identifier: Apache-2.0
// kernels/host_device_memory.cc: the host DeviceMemory (see device_memory.h), and NewCudaMemory
// of a build without CUDA.
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "kernels/device_memory.h"

namespace ckv::kernels {
namespace {

// A host copy is done by the time its call returns.
class DoneEvent final : public CopyEvent {
 public:
  bool Ready() override { return true; }
  absl::Status Wait() override { return absl::OkStatus(); }
};

class HostMemory final : public DeviceMemory {
 public:
  std::string name() const override { return "host"; }
  bool device_pointers() const override { return false; }
  absl::StatusOr<std::byte*> Allocate(size_t bytes) override {
    void* p = ::operator new (bytes, std::align_val_t{kDeviceAlignment}, std::nothrow);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("host memory: ", bytes, " bytes"));
    }
    return static_cast<std::byte*>(p);
  }
  void Free(std::byte* p) override { ::operator delete (p, std::align_val_t{kDeviceAlignment}); }
  absl::StatusOr<std::unique_ptr<CopyEvent>> CopyFromHostAsync(std::byte* dst, const std::byte* src,
                                                               size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return std::make_unique<DoneEvent>();
  }
  absl::StatusOr<std::unique_ptr<CopyEvent>> CopyToHostAsync(std::byte* dst, const std::byte* src,
                                                             size_t bytes) override {
    return CopyFromHostAsync(dst, src, bytes);
  }
  // Host memory needs no registration to be copied by memcpy.
  absl::Status RegisterHost(void*, size_t) override { return absl::OkStatus(); }
  absl::Status UnregisterHost(void*) override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<DeviceMemory> NewHostMemory() { return std::make_unique<HostMemory>(); }

#if !defined(CKV_HAVE_CUDA)
absl::StatusOr<std::unique_ptr<DeviceMemory>> NewCudaMemory(int device) {
  return absl::UnavailableError(
      absl::StrCat("cuda:", device, ": ckv was built without CUDA (nvcc not found)"));
}
#endif

}  // namespace ckv::kernels
