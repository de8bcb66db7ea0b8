// SPDX-License-Identifier: Apache-2.0
// kernels/cuda_device_memory.cu: the CUDA DeviceMemory (see device_memory.h). Built only when nvcc
// is found (C++17, see kernels/CMakeLists.txt).
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/device_memory.h"

namespace ckv::kernels {
namespace {

// "cuda:0: cudaMalloc(2097152 bytes): cudaErrorMemoryAllocation: out of memory".
absl::Status CudaError(int device, const std::string& call, cudaError_t error) {
  const std::string message = absl::StrCat(
      "cuda:", device, ": ", call, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

class CudaEvent final : public CopyEvent {
 public:
  CudaEvent(int device, cudaEvent_t event, std::string what)
      : device_(device), event_(event), what_(std::move(what)) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  // cudaEventQuery reports a failed copy's error as "done" too; Wait then returns it.
  bool Ready() override { return cudaEventQuery(event_) != cudaErrorNotReady; }
  absl::Status Wait() override {
    const cudaError_t error = cudaEventSynchronize(event_);
    if (error == cudaSuccess) return absl::OkStatus();
    return CudaError(device_, absl::StrCat("cudaEventSynchronize after ", what_), error);
  }

 private:
  const int device_;
  const cudaEvent_t event_;
  const std::string what_;
};

class CudaMemory final : public DeviceMemory {
 public:
  CudaMemory(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaMemory() override {
    // Nothing can be reported from here. cudaStreamDestroy lets copies still queued finish.
    cudaSetDevice(device_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return absl::StrCat("cuda:", device_); }
  bool device_pointers() const override { return true; }

  absl::StatusOr<std::byte*> Allocate(size_t bytes) override {
    if (absl::Status s = Select(); !s.ok()) return s;
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
      return CudaError(device_, absl::StrCat("cudaMalloc(", bytes, " bytes)"), e);
    }
    return static_cast<std::byte*>(p);
  }
  void Free(std::byte* p) override {
    // Failures leave nothing to undo: the pointer is not used again either way.
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);  // the interface's promise; cudaFree's own sync is implicit
    cudaFree(p);
  }

  absl::StatusOr<std::unique_ptr<CopyEvent>> CopyFromHostAsync(std::byte* dst, const std::byte* src,
                                                               size_t bytes) override {
    return Copy(dst, src, bytes, cudaMemcpyHostToDevice, "host to device");
  }
  absl::StatusOr<std::unique_ptr<CopyEvent>> CopyToHostAsync(std::byte* dst, const std::byte* src,
                                                             size_t bytes) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToHost, "device to host");
  }

  absl::Status RegisterHost(void* p, size_t bytes) override {
    if (absl::Status s = Select(); !s.ok()) return s;
    if (cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault); e != cudaSuccess) {
      return CudaError(device_, absl::StrCat("cudaHostRegister(", bytes, " bytes)"), e);
    }
    return absl::OkStatus();
  }
  absl::Status UnregisterHost(void* p) override {
    if (absl::Status s = Select(); !s.ok()) return s;
    if (cudaError_t e = cudaHostUnregister(p); e != cudaSuccess) {
      return CudaError(device_, "cudaHostUnregister", e);
    }
    return absl::OkStatus();
  }

 private:
  // The runtime API acts on the calling thread's current device: every call selects ours first.
  absl::Status Select() {
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaError(device_, "cudaSetDevice", e);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<CopyEvent>> Copy(std::byte* dst, const std::byte* src,
                                                  size_t bytes, cudaMemcpyKind kind,
                                                  const char* direction) {
    if (absl::Status s = Select(); !s.ok()) return s;
    const std::string what = absl::StrCat("cudaMemcpyAsync(", bytes, " bytes, ", direction, ")");
    // The event exists before the copy is enqueued, so that a failure leaves no copy running
    // unobserved.
    cudaEvent_t event;
    if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        e != cudaSuccess) {
      return CudaError(device_, "cudaEventCreateWithFlags", e);
    }
    auto done = std::make_unique<CudaEvent>(device_, event, what);
    if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, stream_); e != cudaSuccess) {
      return CudaError(device_, what, e);
    }
    if (cudaError_t e = cudaEventRecord(event, stream_); e != cudaSuccess) {
      cudaStreamSynchronize(stream_);  // the copy is enqueued: let it finish before reporting
      return CudaError(device_, "cudaEventRecord", e);
    }
    return std::unique_ptr<CopyEvent>(std::move(done));
  }

  const int device_;
  // One stream: copies run in issue order (the interface's promise).
  const cudaStream_t stream_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceMemory>> NewCudaMemory(int device) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cuda:", device, ": cudaGetDeviceCount: ",
                                               cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
  }
  if (device < 0 || device >= count) {
    return absl::UnavailableError(
        absl::StrCat("cuda:", device, ": no such device (", count, " present)"));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaError(device, "cudaSetDevice", e);
  }
  cudaStream_t stream;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return CudaError(device, "cudaStreamCreateWithFlags", e);
  }
  return std::unique_ptr<DeviceMemory>(std::make_unique<CudaMemory>(device, stream));
}

}  // namespace ckv::kernels
