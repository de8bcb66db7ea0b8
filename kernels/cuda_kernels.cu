// SPDX-License-Identifier: Apache-2.0
// kernels/cuda_kernels.cu: CUDA versions of quest and mean-key scoring, exact attention and
// gather, with the semantics of the CPU code (see cuda_kernels.h and cuda_launch.h), and record
// decoding (ckv/codec.h). Built when nvcc is found.
//
// Each call copies its inputs into device buffers, runs on its own stream and copies the result
// back. The reductions (sums over channels, softmax maxima and sums) are done in float like the
// CPU path, in a different order, so results agree to rounding, not bit for bit. Record
// decoding is the exception: it is bit-exact with common/codec.cc (explicit roundings, no fma).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda_launch.h"

namespace ckv::kernels::cuda_launch {
namespace {

constexpr int kThreads = 256;

std::string CudaError(cudaError_t e, const char* what) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

#define CKV_CUDA(call)                                                      \
  do {                                                                      \
    const cudaError_t ckv_cuda_err = (call);                                \
    if (ckv_cuda_err != cudaSuccess) return CudaError(ckv_cuda_err, #call); \
  } while (0)

#define CKV_TRY(expr)                             \
  do {                                            \
    std::string ckv_try_err = (expr);             \
    if (!ckv_try_err.empty()) return ckv_try_err; \
  } while (0)

// A device buffer freed on scope exit.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  std::string Allocate(size_t n) {
    count = n;
    if (n == 0) return "";
    CKV_CUDA(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T)));
    return "";
  }
  std::string Upload(const T* host, size_t n, cudaStream_t s) {
    CKV_TRY(Allocate(n));
    if (n > 0) CKV_CUDA(cudaMemcpyAsync(ptr, host, n * sizeof(T), cudaMemcpyHostToDevice, s));
    return "";
  }
};

// A stream destroyed on scope exit.
struct Stream {
  cudaStream_t s = nullptr;
  ~Stream() {
    if (s != nullptr) cudaStreamDestroy(s);
  }
};

__device__ float Element(const unsigned char* p, size_t index, int dtype) {
  switch (dtype) {
    case 1: {  // fp16
      __half h;
      memcpy(&h, p + 2 * index, 2);
      return __half2float(h);
    }
    case 2: {  // bf16
      unsigned short b;
      memcpy(&b, p + 2 * index, 2);
      return __uint_as_float(static_cast<unsigned int>(b) << 16);
    }
    default: {
      float f;
      memcpy(&f, p + 4 * index, 4);
      return f;
    }
  }
}

__device__ float HalfAt(const unsigned char* p) {
  __half h;
  memcpy(&h, p, 2);
  return __half2float(h);
}

// Block-wide sum of one value per thread (blockDim.x == kThreads).
__device__ float BlockSum(float v) {
  __shared__ float partial[kThreads];
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float total = partial[0];
  __syncthreads();
  return total;
}

__device__ float BlockMax(float v) {
  __shared__ float partial[kThreads];
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  const float total = partial[0];
  __syncthreads();
  return total;
}

// One block per chunk: logits[g * n + j] = (neg_g . min_{j, h(g)} * scale_min +
// pos_g . max_{j, h(g)} * scale_max) * scale, with rows[g] = [neg_g, pos_g] (2 * head_dim floats).
__global__ void QuestLogitsKernel(const unsigned char* minmax, size_t part_bytes, int layer,
                                  int q_heads, int kv_heads, int head_dim, const float* rows,
                                  float scale, size_t n, float* logits) {
  const size_t j = blockIdx.x;
  const size_t entry = 4 + 2 * static_cast<size_t>(head_dim);
  const int group = q_heads / kv_heads;
  for (int g = 0; g < q_heads; ++g) {
    const unsigned char* e =
        minmax + j * part_bytes + (static_cast<size_t>(layer) * kv_heads + g / group) * entry;
    const float s_min = HalfAt(e), s_max = HalfAt(e + 2);
    const auto* q_min = reinterpret_cast<const signed char*>(e + 4);
    const auto* q_max = q_min + head_dim;
    const float* neg = rows + static_cast<size_t>(g) * 2 * head_dim;
    const float* pos = neg + head_dim;
    float acc = 0;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
      acc += neg[d] * (q_min[d] * s_min) + pos[d] * (q_max[d] * s_max);
    }
    const float total = BlockSum(acc);
    if (threadIdx.x == 0) logits[g * n + j] = total * scale;
  }
}

// One block per chunk: logits[g * n + j] = qbar_g . mean_{j, h(g)} * scale_mean * scale.
__global__ void MeanLogitsKernel(const unsigned char* mean, size_t part_bytes, int layer,
                                 int q_heads, int kv_heads, int head_dim, const float* qbar,
                                 float scale, size_t n, float* logits) {
  const size_t j = blockIdx.x;
  const size_t entry = 2 + static_cast<size_t>(head_dim);
  const int group = q_heads / kv_heads;
  for (int g = 0; g < q_heads; ++g) {
    const unsigned char* e =
        mean + j * part_bytes + (static_cast<size_t>(layer) * kv_heads + g / group) * entry;
    const auto* q = reinterpret_cast<const signed char*>(e + 2);
    float acc = 0;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) acc += qbar[g * head_dim + d] * q[d];
    const float total = BlockSum(acc);
    if (threadIdx.x == 0) logits[g * n + j] = total * HalfAt(e) * scale;
  }
}

// One block per row: its max and the sum of exp(x - max).
__global__ void RowStatsKernel(const float* x, size_t n, float* row_max, float* row_sum) {
  const float* row = x + blockIdx.x * n;
  float m = -INFINITY;
  for (size_t t = threadIdx.x; t < n; t += blockDim.x) m = fmaxf(m, row[t]);
  m = BlockMax(m);
  float s = 0;
  for (size_t t = threadIdx.x; t < n; t += blockDim.x) s += expf(row[t] - m);
  s = BlockSum(s);
  if (threadIdx.x == 0) {
    row_max[blockIdx.x] = m;
    row_sum[blockIdx.x] = s;
  }
}

// out[t] = norm * sum over rows of exp(x[r][t] - max[r]) / sum[r].
__global__ void ColumnSoftmaxSumKernel(const float* x, size_t n, int rows, const float* row_max,
                                       const float* row_sum, float norm, float* out) {
  const size_t t = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (t >= n) return;
  float acc = 0;
  for (int r = 0; r < rows; ++r) acc += expf(x[r * n + t] - row_max[r]) / row_sum[r];
  out[t] = acc * norm;
}

// scores[r * tokens + t] = q_r . k_{t, h(r)} * scale; row r = (head index hi, query i).
__global__ void TokenScoresKernel(const unsigned char* records, size_t record_bytes, int dtype,
                                  int chunk_tokens, int kv_heads, int head_dim, int group,
                                  const float* queries, int q_heads, const int* heads, int window,
                                  size_t tokens, float scale, float* scores) {
  const size_t t = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const int r = blockIdx.y;
  if (t >= tokens) return;
  const int g = heads[r / window], i = r % window, h = g / group;
  const unsigned char* rec = records + (t / chunk_tokens) * record_bytes;
  const size_t base = ((t % chunk_tokens) * kv_heads + h) * static_cast<size_t>(head_dim);
  const float* q = queries + (static_cast<size_t>(i) * q_heads + g) * head_dim;
  float acc = 0;
  for (int d = 0; d < head_dim; ++d) acc += q[d] * Element(rec, base + d, dtype);
  scores[static_cast<size_t>(r) * tokens + t] = acc * scale;
}

// out[i * row + e] = element e of the K (or V) of chunk chunks[i / chunk_elems]...
__global__ void GatherKernel(const unsigned char* records, size_t record_bytes, int dtype,
                             size_t half_elements, const unsigned* chunks, size_t count, float* k,
                             float* v) {
  const size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (e >= count * half_elements) return;
  const size_t i = e / half_elements, within = e % half_elements;
  const unsigned char* rec = records + chunks[i] * record_bytes;
  k[e] = Element(rec, within, dtype);
  v[e] = Element(rec, half_elements + within, dtype);
}

// scores[r * tokens + t] = q_r . k_{t, h(g)} * scale + bias[t * q_heads + g], row r = i * q_heads
// + g.
__global__ void BiasedScoresKernel(const float* k, const float* bias, size_t tokens, int kv_heads,
                                   int head_dim, int group, const float* queries, int q_heads,
                                   float scale, float* scores) {
  const size_t t = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const int r = blockIdx.y;
  if (t >= tokens) return;
  const int g = r % q_heads;
  const float* q = queries + static_cast<size_t>(r) * head_dim;
  const float* kt = k + (t * kv_heads + g / group) * static_cast<size_t>(head_dim);
  float acc = 0;
  for (int d = 0; d < head_dim; ++d) acc += q[d] * kt[d];
  scores[r * tokens + t] = acc * scale + bias[t * q_heads + g];
}

// out[r * head_dim + d] = sum_t exp(scores[r, t] - row_max[r]) v_{t, h(g)}[d] / row_sum[r].
__global__ void WeightedValuesKernel(const float* scores, const float* v, size_t tokens,
                                     int kv_heads, int head_dim, int group, int q_heads,
                                     const float* row_max, const float* row_sum, float* out) {
  const int r = blockIdx.x;
  const int h = (r % q_heads) / group;
  const float* row = scores + r * tokens;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0;
    for (size_t t = 0; t < tokens; ++t) {
      acc += expf(row[t] - row_max[r]) * v[(t * kv_heads + h) * static_cast<size_t>(head_dim) + d];
    }
    out[static_cast<size_t>(r) * head_dim + d] = acc / row_sum[r];
  }
}

// --- Record decoding: device ports of common/half.h and common/codec.cc, bit for bit. ---

// HalfToFloat (common/half.h).
__device__ float HalfBitsToFloat(unsigned h) {
  const unsigned sign = (h & 0x8000u) << 16;
  const unsigned exp = (h >> 10) & 0x1fu;
  unsigned mant = h & 0x3ffu;
  unsigned bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    unsigned e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  return __uint_as_float(bits);
}

// FloatToHalf (common/half.h): round to nearest even; NaN keeps its sign, as 0x7e00.
__device__ unsigned short FloatToHalfBits(float f) {
  const unsigned x = __float_as_uint(f);
  const unsigned sign = (x >> 16) & 0x8000u;
  const unsigned abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {
    return static_cast<unsigned short>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<unsigned short>(sign | 0x7c00u);
  if (abs < 0x38800000u) {
    if (abs < 0x33000000u) return static_cast<unsigned short>(sign);
    const unsigned mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24
    const unsigned half_mant = mant >> shift;
    const unsigned rem = mant & ((1u << shift) - 1);
    const unsigned halfway = 1u << (shift - 1);
    const unsigned round = (rem > halfway || (rem == halfway && (half_mant & 1u))) ? 1u : 0u;
    return static_cast<unsigned short>(sign | (half_mant + round));
  }
  const unsigned rebased = abs - (112u << 23);
  const unsigned rem = rebased & 0x1fffu;
  unsigned h = rebased >> 13;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<unsigned short>(sign | h);
}

// FloatToBf16 (common/half.h).
__device__ unsigned short FloatToBf16Bits(float f) {
  const unsigned x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((x >> 16) | 0x40u);
  return static_cast<unsigned short>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// E4M3ToFloat (common/codec.cc): OCP e4m3 "FN"; 0x7f and 0xff are the NaN nanf("") gives.
__device__ float E4M3Value(unsigned code) {
  const unsigned e = (code >> 3) & 0xfu, m = code & 0x7u;
  if (e == 0xf && m == 0x7) return __uint_as_float(0x7fc00000u);
  const unsigned sign = (code & 0x80u) << 24;
  if (e == 0) {  // m * 2^-9, exact
    return __uint_as_float(sign | __float_as_uint(__fmul_rn(static_cast<float>(m), 0.001953125f)));
  }
  return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));  // (1 + m / 8) * 2^(e - 7)
}

// The little-endian fp16 at p (any alignment), as float.
__device__ float HalfAtBytes(const unsigned char* p) {
  return HalfBitsToFloat(static_cast<unsigned>(p[0]) | (static_cast<unsigned>(p[1]) << 8));
}

// out: `count` decoded records of 2 * n elements of dtype (1 fp16, 2 bf16, 3 fp32), K then V;
// record i decoded from records[i] as DecodeRecord does (codec 1 fp8 e4m3, 2 int8, 3 int4). K's
// scale entries are per channel (h * D + d), V's per token and head (t * H + h).
__global__ void DecodeRecordsKernel(const unsigned char* const* records, size_t count, int codec,
                                    int dtype, size_t n, size_t channels, int head_dim,
                                    size_t key_bytes, unsigned char* out) {
  const size_t payload = codec == 3 ? (n + 1) / 2 : n;
  const size_t entry_bytes = codec == 3 ? 4 : 2;
  const size_t total = count * 2 * n;
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < total;
       e += step) {
    const size_t i = e / (2 * n), within = e % (2 * n);
    const bool value = within >= n;
    const size_t at = value ? within - n : within;
    const unsigned char* part = records[i] + (value ? key_bytes : 0);
    const size_t group = value ? at / head_dim : at % channels;
    const unsigned char* entry = part + payload + group * entry_bytes;
    const float s = HalfAtBytes(entry);
    float x;
    if (codec == 3) {
      const unsigned b = part[at / 2];
      const unsigned q = at % 2 == 0 ? (b & 0x0fu) : (b >> 4);
      x = __fadd_rn(HalfAtBytes(entry + 2), __fmul_rn(static_cast<float>(q), s));
    } else {
      const unsigned char c = part[at];
      const float v = codec == 2 ? static_cast<float>(static_cast<signed char>(c)) : E4M3Value(c);
      x = __fmul_rn(v, s);
    }
    // The CPU's NaN (an fp8 NaN code times a finite scale) is the code's: 0x7fc00000.
    if (isnan(x)) x = __uint_as_float(0x7fc00000u);
    const size_t o = i * 2 * n + within;
    if (dtype == 1) {
      // As the CPU: a value past fp16's largest is stored as the largest, not infinity.
      if (!isnan(x)) x = fminf(fmaxf(x, -65504.0f), 65504.0f);
      reinterpret_cast<unsigned short*>(out)[o] = FloatToHalfBits(x);
    } else if (dtype == 2) {
      reinterpret_cast<unsigned short*>(out)[o] = FloatToBf16Bits(x);
    } else {
      reinterpret_cast<float*>(out)[o] = x;
    }
  }
}

}  // namespace

std::string DeviceCount(int* count) {
  CKV_CUDA(cudaGetDeviceCount(count));
  return "";
}

std::string HostRegister(void* address, size_t bytes) {
  CKV_CUDA(cudaHostRegister(address, bytes, cudaHostRegisterDefault));
  return "";
}

std::string HostUnregister(void* address) {
  CKV_CUDA(cudaHostUnregister(address));
  return "";
}

std::string QuestScores(const unsigned char* parts, size_t chunks, size_t part_bytes, int layer,
                        int q_heads, int kv_heads, int head_dim, const float* rows, float scale,
                        float* scores) {
  Stream stream;
  CKV_CUDA(cudaStreamCreate(&stream.s));
  DeviceBuffer<unsigned char> d_parts;
  DeviceBuffer<float> d_rows, d_logits, d_max, d_sum, d_scores;
  CKV_TRY(d_parts.Upload(parts, chunks * part_bytes, stream.s));
  CKV_TRY(d_rows.Upload(rows, static_cast<size_t>(q_heads) * 2 * head_dim, stream.s));
  CKV_TRY(d_logits.Allocate(static_cast<size_t>(q_heads) * chunks));
  CKV_TRY(d_max.Allocate(q_heads));
  CKV_TRY(d_sum.Allocate(q_heads));
  CKV_TRY(d_scores.Allocate(chunks));
  QuestLogitsKernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream.s>>>(
      d_parts.ptr, part_bytes, layer, q_heads, kv_heads, head_dim, d_rows.ptr, scale, chunks,
      d_logits.ptr);
  RowStatsKernel<<<q_heads, kThreads, 0, stream.s>>>(d_logits.ptr, chunks, d_max.ptr, d_sum.ptr);
  ColumnSoftmaxSumKernel<<<static_cast<unsigned>((chunks + kThreads - 1) / kThreads), kThreads, 0,
                           stream.s>>>(d_logits.ptr, chunks, q_heads, d_max.ptr, d_sum.ptr,
                                       1.0f / static_cast<float>(q_heads), d_scores.ptr);
  CKV_CUDA(cudaGetLastError());
  CKV_CUDA(cudaMemcpyAsync(scores, d_scores.ptr, chunks * sizeof(float), cudaMemcpyDeviceToHost,
                           stream.s));
  CKV_CUDA(cudaStreamSynchronize(stream.s));
  return "";
}

std::string MeanKeyScores(const unsigned char* parts, size_t chunks, size_t part_bytes, int layer,
                          int q_heads, int kv_heads, int head_dim, const float* qbar, float scale,
                          float* scores) {
  Stream stream;
  CKV_CUDA(cudaStreamCreate(&stream.s));
  DeviceBuffer<unsigned char> d_parts;
  DeviceBuffer<float> d_qbar, d_logits, d_max, d_sum, d_scores;
  CKV_TRY(d_parts.Upload(parts, chunks * part_bytes, stream.s));
  CKV_TRY(d_qbar.Upload(qbar, static_cast<size_t>(q_heads) * head_dim, stream.s));
  CKV_TRY(d_logits.Allocate(static_cast<size_t>(q_heads) * chunks));
  CKV_TRY(d_max.Allocate(q_heads));
  CKV_TRY(d_sum.Allocate(q_heads));
  CKV_TRY(d_scores.Allocate(chunks));
  MeanLogitsKernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream.s>>>(
      d_parts.ptr, part_bytes, layer, q_heads, kv_heads, head_dim, d_qbar.ptr, scale, chunks,
      d_logits.ptr);
  RowStatsKernel<<<q_heads, kThreads, 0, stream.s>>>(d_logits.ptr, chunks, d_max.ptr, d_sum.ptr);
  ColumnSoftmaxSumKernel<<<static_cast<unsigned>((chunks + kThreads - 1) / kThreads), kThreads, 0,
                           stream.s>>>(d_logits.ptr, chunks, q_heads, d_max.ptr, d_sum.ptr,
                                       1.0f / static_cast<float>(q_heads), d_scores.ptr);
  CKV_CUDA(cudaGetLastError());
  CKV_CUDA(cudaMemcpyAsync(scores, d_scores.ptr, chunks * sizeof(float), cudaMemcpyDeviceToHost,
                           stream.s));
  CKV_CUDA(cudaStreamSynchronize(stream.s));
  return "";
}

std::string TokenAttention(const unsigned char* records, size_t chunks, size_t record_bytes,
                           int dtype, int chunk_tokens, int kv_heads, int head_dim,
                           const float* queries, int q_heads, const int* heads, int head_count,
                           int window, float scale, float* mass) {
  const size_t tokens = chunks * chunk_tokens;
  const int rows = head_count * window;
  Stream stream;
  CKV_CUDA(cudaStreamCreate(&stream.s));
  DeviceBuffer<unsigned char> d_records;
  DeviceBuffer<float> d_queries, d_scores, d_max, d_sum, d_mass;
  DeviceBuffer<int> d_heads;
  CKV_TRY(d_records.Upload(records, chunks * record_bytes, stream.s));
  CKV_TRY(d_queries.Upload(queries, static_cast<size_t>(window) * q_heads * head_dim, stream.s));
  CKV_TRY(d_heads.Upload(heads, head_count, stream.s));
  CKV_TRY(d_scores.Allocate(static_cast<size_t>(rows) * tokens));
  CKV_TRY(d_max.Allocate(rows));
  CKV_TRY(d_sum.Allocate(rows));
  CKV_TRY(d_mass.Allocate(tokens));
  const dim3 grid(static_cast<unsigned>((tokens + kThreads - 1) / kThreads),
                  static_cast<unsigned>(rows));
  TokenScoresKernel<<<grid, kThreads, 0, stream.s>>>(
      d_records.ptr, record_bytes, dtype, chunk_tokens, kv_heads, head_dim, q_heads / kv_heads,
      d_queries.ptr, q_heads, d_heads.ptr, window, tokens, scale, d_scores.ptr);
  RowStatsKernel<<<rows, kThreads, 0, stream.s>>>(d_scores.ptr, tokens, d_max.ptr, d_sum.ptr);
  ColumnSoftmaxSumKernel<<<static_cast<unsigned>((tokens + kThreads - 1) / kThreads), kThreads, 0,
                           stream.s>>>(d_scores.ptr, tokens, rows, d_max.ptr, d_sum.ptr,
                                       1.0f / static_cast<float>(rows), d_mass.ptr);
  CKV_CUDA(cudaGetLastError());
  CKV_CUDA(
      cudaMemcpyAsync(mass, d_mass.ptr, tokens * sizeof(float), cudaMemcpyDeviceToHost, stream.s));
  CKV_CUDA(cudaStreamSynchronize(stream.s));
  return "";
}

std::string Gather(const unsigned char* records, size_t chunks, size_t record_bytes, int dtype,
                   size_t half_elements, const unsigned* list, size_t count, float* k, float* v) {
  Stream stream;
  CKV_CUDA(cudaStreamCreate(&stream.s));
  DeviceBuffer<unsigned char> d_records;
  DeviceBuffer<unsigned> d_list;
  DeviceBuffer<float> d_k, d_v;
  CKV_TRY(d_records.Upload(records, chunks * record_bytes, stream.s));
  CKV_TRY(d_list.Upload(list, count, stream.s));
  CKV_TRY(d_k.Allocate(count * half_elements));
  CKV_TRY(d_v.Allocate(count * half_elements));
  GatherKernel<<<static_cast<unsigned>((count * half_elements + kThreads - 1) / kThreads), kThreads,
                 0, stream.s>>>(d_records.ptr, record_bytes, dtype, half_elements, d_list.ptr,
                                count, d_k.ptr, d_v.ptr);
  CKV_CUDA(cudaGetLastError());
  CKV_CUDA(cudaMemcpyAsync(k, d_k.ptr, count * half_elements * sizeof(float),
                           cudaMemcpyDeviceToHost, stream.s));
  CKV_CUDA(cudaMemcpyAsync(v, d_v.ptr, count * half_elements * sizeof(float),
                           cudaMemcpyDeviceToHost, stream.s));
  CKV_CUDA(cudaStreamSynchronize(stream.s));
  return "";
}

std::string BiasedAttention(const float* k, const float* v, const float* bias, size_t tokens,
                            int kv_heads, int head_dim, const float* queries, int q_heads,
                            int window, float scale, float* out) {
  const int rows = window * q_heads;
  const size_t kv_floats = tokens * kv_heads * static_cast<size_t>(head_dim);
  Stream stream;
  CKV_CUDA(cudaStreamCreate(&stream.s));
  DeviceBuffer<float> d_k, d_v, d_bias, d_queries, d_scores, d_max, d_sum, d_out;
  CKV_TRY(d_k.Upload(k, kv_floats, stream.s));
  CKV_TRY(d_v.Upload(v, kv_floats, stream.s));
  CKV_TRY(d_bias.Upload(bias, tokens * q_heads, stream.s));
  CKV_TRY(d_queries.Upload(queries, static_cast<size_t>(rows) * head_dim, stream.s));
  CKV_TRY(d_scores.Allocate(static_cast<size_t>(rows) * tokens));
  CKV_TRY(d_max.Allocate(rows));
  CKV_TRY(d_sum.Allocate(rows));
  CKV_TRY(d_out.Allocate(static_cast<size_t>(rows) * head_dim));
  const int group = q_heads / kv_heads;
  const dim3 grid(static_cast<unsigned>((tokens + kThreads - 1) / kThreads),
                  static_cast<unsigned>(rows));
  BiasedScoresKernel<<<grid, kThreads, 0, stream.s>>>(d_k.ptr, d_bias.ptr, tokens, kv_heads,
                                                      head_dim, group, d_queries.ptr, q_heads,
                                                      scale, d_scores.ptr);
  RowStatsKernel<<<rows, kThreads, 0, stream.s>>>(d_scores.ptr, tokens, d_max.ptr, d_sum.ptr);
  WeightedValuesKernel<<<rows, kThreads, 0, stream.s>>>(d_scores.ptr, d_v.ptr, tokens, kv_heads,
                                                        head_dim, group, q_heads, d_max.ptr,
                                                        d_sum.ptr, d_out.ptr);
  CKV_CUDA(cudaGetLastError());
  CKV_CUDA(cudaMemcpyAsync(out, d_out.ptr, static_cast<size_t>(rows) * head_dim * sizeof(float),
                           cudaMemcpyDeviceToHost, stream.s));
  CKV_CUDA(cudaStreamSynchronize(stream.s));
  return "";
}

std::string DecodeRecords(const unsigned char* const* records, size_t count, int codec, int dtype,
                          int chunk_tokens, int kv_heads, int head_dim, size_t record_bytes,
                          size_t key_bytes, unsigned char* out) {
  if (count == 0) return "";
  Stream stream;
  CKV_CUDA(cudaStreamCreate(&stream.s));
  if (codec == 0) {  // stored as decoded: copy
    for (size_t i = 0; i < count; ++i) {
      CKV_CUDA(cudaMemcpyAsync(out + i * record_bytes, records[i], record_bytes,
                               cudaMemcpyDeviceToDevice, stream.s));
    }
    CKV_CUDA(cudaStreamSynchronize(stream.s));
    return "";
  }
  const size_t channels = static_cast<size_t>(kv_heads) * head_dim;
  const size_t n = static_cast<size_t>(chunk_tokens) * channels;
  DeviceBuffer<const unsigned char*> d_records;
  CKV_TRY(d_records.Upload(records, count, stream.s));
  const size_t total = count * 2 * n;
  const size_t blocks = std::min<size_t>((total + kThreads - 1) / kThreads, size_t{1} << 20);
  DecodeRecordsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream.s>>>(
      d_records.ptr, count, codec, dtype, n, channels, head_dim, key_bytes, out);
  CKV_CUDA(cudaGetLastError());
  CKV_CUDA(cudaStreamSynchronize(stream.s));
  return "";
}

}  // namespace ckv::kernels::cuda_launch
