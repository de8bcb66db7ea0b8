// SPDX-License-Identifier: Apache-2.0
// kernels/device_memory.h: the memory a tier keeps records in, behind one small interface.
//
// The GPU tier keeps records in device memory and the CPU tier in host memory; both go through a
// DeviceMemory. Two implementations:
//   - host (kernels/host_device_memory.cc): aligned host memory and memcpy; a copy is done when
//     its call returns. Always built; the default, the CPU tier's, and the GPU tier's in tests and
//     on machines without a device.
//   - CUDA (kernels/cuda_device_memory.cu): cudaMalloc'd slabs that the tier carves into records,
//     copies with cudaMemcpyAsync on one stream of its own, a cudaEvent per copy. Built when nvcc
//     is found; usable only where a device is present.
//
// Copies are asynchronous: a copy call enqueues the copy and returns a CopyEvent that says when it
// is done. Copies issued on one DeviceMemory run in issue order, so memory that a copy reads may be
// the destination of a copy issued after it. For DMA, host memory should be registered
// (RegisterHost: cudaHostRegister on CUDA, nothing on the host); unregistered host memory is
// copied correctly, only slower and not overlapped.
//
// This header is compiled by nvcc as C++17 too (kernels/CMakeLists.txt): nothing newer in it.
//
// Thread-safety: implementations are thread-safe; a CopyEvent may be polled and waited for from
// several threads at once.
#ifndef CKV_KERNELS_DEVICE_MEMORY_H_
#define CKV_KERNELS_DEVICE_MEMORY_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckv::kernels {

// Alignment of every Allocate result, bytes.
inline constexpr size_t kDeviceAlignment = 256;

// The completion of one asynchronous copy.
class CopyEvent {
 public:
  virtual ~CopyEvent() = default;
  // True once the copy has finished, successfully or not (Wait then returns at once). Never blocks.
  virtual bool Ready() = 0;
  // Blocks until the copy has finished; its outcome. The destination's bytes are the source's only
  // when this returns OK.
  virtual absl::Status Wait() = 0;
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // "host", "cuda:0".
  virtual std::string name() const = 0;
  // True when Allocate returns device pointers (not dereferenceable on the host).
  virtual bool device_pointers() const = 0;

  // `bytes` (> 0) of this memory, aligned to kDeviceAlignment. ResourceExhausted when there is
  // not enough.
  virtual absl::StatusOr<std::byte*> Allocate(size_t bytes) = 0;
  // Frees what Allocate returned, once the copies issued on this memory so far have finished (a
  // tier may free a slab right after issuing a copy out of it).
  virtual void Free(std::byte* p) = 0;

  // Enqueues a copy of `bytes` from host memory `src` to this memory's `dst` (from Allocate).
  // REQUIRES: `src` stays valid and unchanged until the event is ready. Errors: the enqueue's.
  virtual absl::StatusOr<std::unique_ptr<CopyEvent>> CopyFromHostAsync(std::byte* dst,
                                                                       const std::byte* src,
                                                                       size_t bytes) = 0;
  // Enqueues a copy of `bytes` from this memory's `src` to host memory `dst`.
  virtual absl::StatusOr<std::unique_ptr<CopyEvent>> CopyToHostAsync(std::byte* dst,
                                                                     const std::byte* src,
                                                                     size_t bytes) = 0;

  // Registers (page-locks) the host range [p, p + bytes) for DMA by this memory's copies; the
  // host implementation does nothing. UnregisterHost(p) undoes it before the range is freed.
  virtual absl::Status RegisterHost(void* p, size_t bytes) = 0;
  virtual absl::Status UnregisterHost(void* p) = 0;
};

// Host memory.
std::unique_ptr<DeviceMemory> NewHostMemory();
// The memory of CUDA device `device`. Unavailable, saying why, when ckv was built without CUDA,
// when no device is present (cudaGetDeviceCount) or `device` is not one of them.
absl::StatusOr<std::unique_ptr<DeviceMemory>> NewCudaMemory(int device = 0);

}  // namespace ckv::kernels

#endif  // CKV_KERNELS_DEVICE_MEMORY_H_
