// kernels/device_memory.h: the memory a tier keeps records in, behind one small interface.
//
// The GPU tier holds records in device memory; the CPU tier in host memory. Both go through a
// DeviceMemory: the host implementation (the default, used by the tests, and the CPU tier's) and
// a CUDA implementation (device memory from cudaMalloc, copies with cudaMemcpy), built when nvcc
// is found and usable where a device is present.
//
// Thread-safety: implementations are thread-safe.
#ifndef CKV_KERNELS_DEVICE_MEMORY_H_
#define CKV_KERNELS_DEVICE_MEMORY_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckv::kernels {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // "host" or "cuda:0".
  virtual std::string name() const = 0;
  // True when pointers it returns are device pointers (not dereferenceable on the host).
  virtual bool device_pointers() const = 0;
  // `bytes` of memory, aligned to 256 bytes. ResourceExhausted when there is none.
  virtual absl::StatusOr<std::byte*> Allocate(size_t bytes) = 0;
  virtual void Free(std::byte* p) = 0;
  // Copies between host memory and this memory; done when the call returns.
  virtual absl::Status CopyFromHost(std::byte* dst, const std::byte* src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(std::byte* dst, const std::byte* src, size_t bytes) = 0;
};

// Host memory (new / memcpy).
std::unique_ptr<DeviceMemory> NewHostMemory();
// Device 0's memory. Unavailable, saying why, without CUDA or without a device.
absl::StatusOr<std::unique_ptr<DeviceMemory>> NewCudaMemory();

}  // namespace ckv::kernels

#endif  // CKV_KERNELS_DEVICE_MEMORY_H_
