// kernels/device_memory.cc: the host DeviceMemory, and the CUDA one on top of cuda_launch.h.
#include "kernels/device_memory.h"

#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_kernels.h"
#if defined(CKV_HAVE_CUDA)
#include "kernels/cuda_launch.h"
#endif

namespace ckv::kernels {
namespace {

constexpr std::align_val_t kAlignment{256};

class HostMemory final : public DeviceMemory {
 public:
  std::string name() const override { return "host"; }
  bool device_pointers() const override { return false; }
  absl::StatusOr<std::byte*> Allocate(size_t bytes) override {
    auto* p = static_cast<std::byte*>(::operator new(bytes, kAlignment, std::nothrow));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("host memory: ", bytes, " bytes"));
    }
    return p;
  }
  void Free(std::byte* p) override { ::operator delete(p, kAlignment); }
  absl::Status CopyFromHost(std::byte* dst, const std::byte* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(std::byte* dst, const std::byte* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
};

#if defined(CKV_HAVE_CUDA)
class CudaMemory final : public DeviceMemory {
 public:
  std::string name() const override { return "cuda:0"; }
  bool device_pointers() const override { return true; }
  absl::StatusOr<std::byte*> Allocate(size_t bytes) override {
    void* p = nullptr;
    const std::string error = cuda_launch::DeviceAllocate(&p, bytes);
    if (!error.empty()) {
      return absl::ResourceExhaustedError(absl::StrCat("device memory: ", bytes, " bytes: ", error));
    }
    return static_cast<std::byte*>(p);
  }
  void Free(std::byte* p) override { cuda_launch::DeviceFree(p); }
  absl::Status CopyFromHost(std::byte* dst, const std::byte* src, size_t bytes) override {
    const std::string error = cuda_launch::CopyToDevice(dst, src, bytes);
    if (error.empty()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("CUDA: ", error));
  }
  absl::Status CopyToHost(std::byte* dst, const std::byte* src, size_t bytes) override {
    const std::string error = cuda_launch::CopyToHost(dst, src, bytes);
    if (error.empty()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("CUDA: ", error));
  }
};
#endif

}  // namespace

std::unique_ptr<DeviceMemory> NewHostMemory() { return std::make_unique<HostMemory>(); }

absl::StatusOr<std::unique_ptr<DeviceMemory>> NewCudaMemory() {
  if (auto st = cuda::DeviceAvailable(); !st.ok()) return st;
#if defined(CKV_HAVE_CUDA)
  return std::unique_ptr<DeviceMemory>(std::make_unique<CudaMemory>());
#else
  return absl::UnavailableError("ckv was built without CUDA");
#endif
}

}  // namespace ckv::kernels
