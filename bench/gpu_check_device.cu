// SPDX-License-Identifier: Apache-2.0
// bench/gpu_check_device.cu: see gpu_check_device.h. Built only when nvcc is found (C++17).
//
// The attention kernel is deliberately plain: one warp per (query, q head), eight queries of one
// q head per block, K and V staged through shared memory in tiles of 64 tokens as fp16, an online
// softmax in float (FlashAttention's recurrence without its tensor-core tiling). It reads the
// records in the layout ckv stores and loads them (K [c, kv_heads, D] then V, one record per
// chunk, back to back), so it attends over exactly the bytes a system moved. Its time is an upper
// bound on what a tuned kernel (FlashAttention, cuDNN) takes on the same device.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <string>

#include "bench/gpu_check_device.h"

namespace ckv::bench::gpu_device {
namespace {

std::string CudaError(cudaError_t e, const std::string& what) {
  return what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

#define CKV_CUDA(call)                                                      \
  do {                                                                      \
    const cudaError_t ckv_cuda_err = (call);                                \
    if (ckv_cuda_err != cudaSuccess) return CudaError(ckv_cuda_err, #call); \
  } while (0)

// Owners that release on scope exit (errors there cannot be reported, and nothing is left to
// undo).
struct Stream {
  cudaStream_t s = nullptr;
  ~Stream() {
    if (s != nullptr) cudaStreamDestroy(s);
  }
};
struct Event {
  cudaEvent_t e = nullptr;
  ~Event() {
    if (e != nullptr) cudaEventDestroy(e);
  }
};
struct Buffer {
  void* p = nullptr;
  ~Buffer() {
    if (p != nullptr) cudaFree(p);
  }
};

std::string Elapsed(cudaEvent_t start, cudaEvent_t stop, double* ms) {
  float f = 0;
  CKV_CUDA(cudaEventSynchronize(stop));
  CKV_CUDA(cudaEventElapsedTime(&f, start, stop));
  *ms = f;
  return "";
}

__global__ void EmptyKernel() {}

// Reads n float4s once; the sum is stored only if it equals a value zeroed memory never sums to,
// which the compiler cannot know, so every load stays.
__global__ void ReadKernel(const float4* p, size_t n, float* sink) {
  float acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const float4 v = p[i];
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 1234.5f) sink[0] = acc;
}

constexpr int kWarps = 8;  // queries per block, one warp each
constexpr int kTile = 64;  // tokens per shared-memory tile (two per lane)

template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionKernel(const unsigned char* records, size_t record_bytes, int chunk_tokens,
                    int kv_heads, int group, size_t tokens, const float* queries, int suffix,
                    int q_heads, float scale, float* out) {
  // Rows of D + 2 halfs put lane t's row one bank after lane t-1's: the score loop, where each
  // lane reads its own token's row, is free of bank conflicts.
  constexpr int kPad = D + 2;
  constexpr int kPerLane = D / 32;
  __shared__ __align__(16) __half k_tile[kTile * kPad];
  __shared__ __align__(16) __half v_tile[kTile * kPad];
  __shared__ float q_s[kWarps * D];
  const int g = blockIdx.x;
  const int h = g / group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int qi = blockIdx.y * kWarps + warp;
  const bool active = qi < suffix;  // the same for a whole warp
  for (int d = lane; d < D; d += 32) {
    q_s[warp * D + d] =
        active ? queries[(static_cast<size_t>(qi) * q_heads + g) * D + d] * scale : 0.0f;
  }
  float m = -INFINITY, l = 0;
  float acc[kPerLane];
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) acc[c] = 0;
  const size_t half_bytes = record_bytes / 2;
  for (size_t base = 0; base < tokens; base += kTile) {
    __syncthreads();  // the previous tile is consumed; on the first pass, q_s is written
    for (int i = threadIdx.x; i < kTile * (D / 2); i += blockDim.x) {
      const int row = i / (D / 2), pair = i % (D / 2);
      const size_t t = base + row;
      __half2 kv = __float2half2_rn(0.0f), vv = kv;
      if (t < tokens) {
        const unsigned char* rec = records + (t / chunk_tokens) * record_bytes;
        const size_t off =
            ((t % chunk_tokens) * kv_heads + h) * static_cast<size_t>(D) * 2 + pair * 4;
        kv = *reinterpret_cast<const __half2*>(rec + off);
        vv = *reinterpret_cast<const __half2*>(rec + half_bytes + off);
      }
      *reinterpret_cast<__half2*>(&k_tile[row * kPad + 2 * pair]) = kv;
      *reinterpret_cast<__half2*>(&v_tile[row * kPad + 2 * pair]) = vv;
    }
    __syncthreads();
    if (!active) continue;
    const int rows =
        tokens - base < static_cast<size_t>(kTile) ? static_cast<int>(tokens - base) : kTile;
    float s[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = lane + 32 * j;
      if (row < rows) {
        const __half2* kr = reinterpret_cast<const __half2*>(&k_tile[row * kPad]);
        const float* q = &q_s[warp * D];
        float dot = 0;
#pragma unroll 8
        for (int p = 0; p < D / 2; ++p) {
          const float2 kf = __half22float2(kr[p]);
          dot += q[2 * p] * kf.x + q[2 * p + 1] * kf.y;
        }
        s[j] = dot;
      } else {
        s[j] = -INFINITY;
      }
    }
    float tile_max = fmaxf(s[0], s[1]);
    for (int o = 16; o > 0; o /= 2) {
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o));
    }
    const float m_new = fmaxf(m, tile_max);  // finite: a tile holds at least one token
    const float corr = expf(m - m_new);      // 0 on the first tile, where m is -inf
    const float p0 = expf(s[0] - m_new), p1 = expf(s[1] - m_new);
    float psum = p0 + p1;
    for (int o = 16; o > 0; o /= 2) psum += __shfl_xor_sync(0xffffffffu, psum, o);
    l = l * corr + psum;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) acc[c] *= corr;
    for (int t = 0; t < rows; ++t) {
      const float p = __shfl_sync(0xffffffffu, t < 32 ? p0 : p1, t & 31);
      const __half* vr = &v_tile[t * kPad + lane * kPerLane];
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) acc[c] += p * __half2float(vr[c]);
    }
    m = m_new;
  }
  if (!active) return;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    out[(static_cast<size_t>(qi) * q_heads + g) * D + lane * kPerLane + c] = acc[c] / l;
  }
}

}  // namespace

std::string Describe(DeviceInfo* info) {
  cudaDeviceProp p;
  CKV_CUDA(cudaGetDeviceProperties(&p, 0));
  info->name = p.name;
  info->major = p.major;
  info->minor = p.minor;
  info->multiprocessors = p.multiProcessorCount;
  info->memory_gib = static_cast<double>(p.totalGlobalMem) / (1ull << 30);
  CKV_CUDA(cudaDriverGetVersion(&info->driver_version));
  CKV_CUDA(cudaRuntimeGetVersion(&info->runtime_version));
  return "";
}

std::string TimeHostToDevice(const void* host, size_t bytes, int reps, double* ms) {
  Stream stream;
  Event start, stop;
  Buffer dst;
  CKV_CUDA(cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
  CKV_CUDA(cudaEventCreate(&start.e));
  CKV_CUDA(cudaEventCreate(&stop.e));
  CKV_CUDA(cudaMalloc(&dst.p, bytes));
  for (int i = 0; i < reps; ++i) {
    CKV_CUDA(cudaEventRecord(start.e, stream.s));
    CKV_CUDA(cudaMemcpyAsync(dst.p, host, bytes, cudaMemcpyHostToDevice, stream.s));
    CKV_CUDA(cudaEventRecord(stop.e, stream.s));
    if (std::string e = Elapsed(start.e, stop.e, &ms[i]); !e.empty()) return e;
  }
  return "";
}

std::string TimeLaunches(int kernels, int reps, double* wall_ms, double* event_ms) {
  Stream stream;
  Event start, stop;
  CKV_CUDA(cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
  CKV_CUDA(cudaEventCreate(&start.e));
  CKV_CUDA(cudaEventCreate(&stop.e));
  // The first launch of a kernel loads its module: kept out of the timings.
  EmptyKernel<<<1, 1, 0, stream.s>>>();
  CKV_CUDA(cudaGetLastError());
  CKV_CUDA(cudaStreamSynchronize(stream.s));
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    CKV_CUDA(cudaEventRecord(start.e, stream.s));
    for (int k = 0; k < kernels; ++k) EmptyKernel<<<1, 1, 0, stream.s>>>();
    CKV_CUDA(cudaGetLastError());
    CKV_CUDA(cudaEventRecord(stop.e, stream.s));
    CKV_CUDA(cudaStreamSynchronize(stream.s));
    wall_ms[i] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (std::string e = Elapsed(start.e, stop.e, &event_ms[i]); !e.empty()) return e;
  }
  return "";
}

std::string TimeDeviceRead(size_t bytes, int reps, double* ms) {
  Stream stream;
  Event start, stop;
  Buffer data, sink;
  CKV_CUDA(cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
  CKV_CUDA(cudaEventCreate(&start.e));
  CKV_CUDA(cudaEventCreate(&stop.e));
  const size_t n = bytes / sizeof(float4);
  CKV_CUDA(cudaMalloc(&data.p, n * sizeof(float4)));
  CKV_CUDA(cudaMalloc(&sink.p, sizeof(float)));
  CKV_CUDA(cudaMemsetAsync(data.p, 0, n * sizeof(float4), stream.s));
  int sms = 0;
  CKV_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = sms * 8;
  for (int i = 0; i < reps; ++i) {
    CKV_CUDA(cudaEventRecord(start.e, stream.s));
    ReadKernel<<<blocks, 256, 0, stream.s>>>(static_cast<const float4*>(data.p), n,
                                             static_cast<float*>(sink.p));
    CKV_CUDA(cudaGetLastError());
    CKV_CUDA(cudaEventRecord(stop.e, stream.s));
    if (std::string e = Elapsed(start.e, stop.e, &ms[i]); !e.empty()) return e;
  }
  return "";
}

std::string Attention(const AttentionShape& s, const unsigned char* records, size_t chunks,
                      const float* queries, int suffix, float scale, int reps, float* out,
                      double* ms) {
  if (s.head_dim != 64 && s.head_dim != 128) {
    return "attention kernel: head_dim " + std::to_string(s.head_dim) + " (built for 64 and 128)";
  }
  if (chunks == 0 || suffix <= 0 || s.kv_heads <= 0 || s.q_heads % s.kv_heads != 0) {
    return "attention kernel: " + std::to_string(chunks) + " chunks, " + std::to_string(suffix) +
           " queries, " + std::to_string(s.q_heads) + " q heads over " +
           std::to_string(s.kv_heads) + " kv heads";
  }
  Stream stream;
  Event start, stop;
  Buffer d_records, d_queries, d_out;
  CKV_CUDA(cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
  CKV_CUDA(cudaEventCreate(&start.e));
  CKV_CUDA(cudaEventCreate(&stop.e));
  const size_t record_total = chunks * s.record_bytes;
  const size_t query_floats = static_cast<size_t>(suffix) * s.q_heads * s.head_dim;
  CKV_CUDA(cudaMalloc(&d_records.p, record_total));
  CKV_CUDA(cudaMalloc(&d_queries.p, query_floats * sizeof(float)));
  CKV_CUDA(cudaMalloc(&d_out.p, query_floats * sizeof(float)));
  CKV_CUDA(cudaMemcpyAsync(d_records.p, records, record_total, cudaMemcpyHostToDevice, stream.s));
  CKV_CUDA(cudaMemcpyAsync(d_queries.p, queries, query_floats * sizeof(float),
                           cudaMemcpyHostToDevice, stream.s));
  const size_t tokens = chunks * static_cast<size_t>(s.chunk_tokens);
  const dim3 grid(static_cast<unsigned>(s.q_heads),
                  static_cast<unsigned>((suffix + kWarps - 1) / kWarps));
  const auto* rec = static_cast<const unsigned char*>(d_records.p);
  const auto* q = static_cast<const float*>(d_queries.p);
  auto* o = static_cast<float*>(d_out.p);
  const int group = s.q_heads / s.kv_heads;
  const auto launch = [&] {
    if (s.head_dim == 128) {
      AttentionKernel<128><<<grid, kWarps * 32, 0, stream.s>>>(rec, s.record_bytes, s.chunk_tokens,
                                                               s.kv_heads, group, tokens, q, suffix,
                                                               s.q_heads, scale, o);
    } else {
      AttentionKernel<64><<<grid, kWarps * 32, 0, stream.s>>>(rec, s.record_bytes, s.chunk_tokens,
                                                              s.kv_heads, group, tokens, q, suffix,
                                                              s.q_heads, scale, o);
    }
  };
  launch();
  CKV_CUDA(cudaGetLastError());
  CKV_CUDA(cudaMemcpyAsync(out, d_out.p, query_floats * sizeof(float), cudaMemcpyDeviceToHost,
                           stream.s));
  CKV_CUDA(cudaStreamSynchronize(stream.s));
  for (int i = 0; i < reps; ++i) {
    CKV_CUDA(cudaEventRecord(start.e, stream.s));
    launch();
    CKV_CUDA(cudaGetLastError());
    CKV_CUDA(cudaEventRecord(stop.e, stream.s));
    if (std::string e = Elapsed(start.e, stop.e, &ms[i]); !e.empty()) return e;
  }
  return "";
}

}  // namespace ckv::bench::gpu_device
