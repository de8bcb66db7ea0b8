// SPDX-License-Identifier: Apache-2.0
// tests/served_bytes.h: the bytes of a record that a Re-Prefill session served, on the host.
//
// A record served from the GPU tier is a device pointer where the engine's GPU tier is on a CUDA
// device (LayerView::Record::data); the tests that check served bytes copy it back first, so that
// they check the same bytes on a GPU machine as on one without.
#ifndef CKV_TESTS_SERVED_BYTES_H_
#define CKV_TESTS_SERVED_BYTES_H_

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "ckv/session.h"
#include "kernels/device_memory.h"

namespace ckv::testing {

// The `bytes` bytes at `r.data`, read back from the device for a GPU-tier record when a CUDA
// device holds the GPU tier. Empty when that copy fails (which no served record should cause).
inline std::vector<std::byte> ServedBytes(const LayerView::Record& r, size_t bytes) {
  std::vector<std::byte> out(bytes);
  if (r.tier == LayerView::Tier::kGpu) {
    // The engine puts its GPU tier on device 0 whenever NewCudaMemory succeeds.
    static kernels::DeviceMemory* const device = [] {
      auto cuda = kernels::NewCudaMemory();
      return cuda.ok() ? cuda->release() : nullptr;
    }();
    if (device != nullptr) {
      auto copy = device->CopyToHostAsync(out.data(), r.data, bytes);
      if (!copy.ok() || !(*copy)->Wait().ok()) return {};
      return out;
    }
  }
  std::memcpy(out.data(), r.data, bytes);
  return out;
}

// True when the served record `r` holds exactly the `bytes` bytes at `want`.
inline bool ServedEquals(const LayerView::Record& r, const void* want, size_t bytes) {
  const std::vector<std::byte> got = ServedBytes(r, bytes);
  return got.size() == bytes && std::memcmp(got.data(), want, bytes) == 0;
}

}  // namespace ckv::testing

#endif  // CKV_TESTS_SERVED_BYTES_H_
