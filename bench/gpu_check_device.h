// SPDX-License-Identifier: Apache-2.0
// bench/gpu_check_device.h: the device side of bench/gpu_check (docs/kernels.md, "The device
// check"): copies, launches, a weight-streaming read and an exact attention kernel, each timed
// with cudaEvents on a stream of its own.
//
// Like kernels/cuda_launch.h this is compiled by nvcc as C++17 (CMake 3.25 cannot ask nvcc for
// C++20): raw host pointers in and out, and every function returns "" or the CUDA error it met,
// naming the call. Built only when nvcc is found; gpu_check.cc wraps it in absl::Status.
//
// Thread-safety: the functions are thread-safe (each uses its own stream and buffers); gpu_check
// calls them from one thread.
#ifndef CKV_BENCH_GPU_CHECK_DEVICE_H_
#define CKV_BENCH_GPU_CHECK_DEVICE_H_

#include <cstddef>
#include <string>

namespace ckv::bench::gpu_device {

// What device 0 is.
struct DeviceInfo {
  std::string name;
  int major = 0;
  int minor = 0;
  int multiprocessors = 0;
  double memory_gib = 0;
  int driver_version = 0;   // cudaDriverGetVersion: 12040 is 12.4
  int runtime_version = 0;  // cudaRuntimeGetVersion
};
std::string Describe(DeviceInfo* info);

// `reps` host-to-device cudaMemcpyAsync copies of `bytes` from `host` (page-locked by the caller)
// into one device buffer, each between two cudaEvents; ms[i] is copy i's elapsed time.
std::string TimeHostToDevice(const void* host, size_t bytes, int reps, double* ms);

// `reps` rounds of `kernels` empty kernels launched back to back on one stream, then a
// cudaStreamSynchronize: wall_ms[i] is round i's host wall time from the first launch to the end
// of the synchronize, event_ms[i] its GPU time between events around the launches.
std::string TimeLaunches(int kernels, int reps, double* wall_ms, double* event_ms);

// `reps` passes of a kernel that reads `bytes` of device memory once (16-byte loads, summed so
// that nothing is optimised away): ms[i] is pass i's event time. The buffer is allocated and
// zeroed once, before the first pass.
std::string TimeDeviceRead(size_t bytes, int reps, double* ms);

// Exact attention over records as ckv stores them, fp16 only.
struct AttentionShape {
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;  // 64 or 128
  int chunk_tokens = 0;
  size_t record_bytes = 0;  // K [chunk_tokens, kv_heads, head_dim] then V, fp16
};
// out [suffix, q_heads, head_dim] = softmax(q K^T * scale) V with GQA, for queries
// [suffix, q_heads, head_dim] (float) over the `chunks` records at `records` (host memory, back to
// back, page-locked by the caller), no mask (the prefix precedes every suffix token), in float.
// The records and queries are copied to the device once; the kernel runs once for `out` and then
// `reps` more times, each between two cudaEvents (ms[i]): the kernel alone, no copies.
// REQUIRES: chunks >= 1, suffix >= 1, q_heads % kv_heads == 0, head_dim 64 or 128.
std::string Attention(const AttentionShape& shape, const unsigned char* records, size_t chunks,
                      const float* queries, int suffix, float scale, int reps, float* out,
                      double* ms);

}  // namespace ckv::bench::gpu_device

#endif  // CKV_BENCH_GPU_CHECK_DEVICE_H_
