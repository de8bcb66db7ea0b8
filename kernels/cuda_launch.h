// SPDX-License-Identifier: Apache-2.0
// kernels/cuda_launch.h: the device side of kernels/cuda_kernels.h, in the C++17 that nvcc
// compiles here (CMake 3.25 cannot ask nvcc for C++20, which ckv's headers need): raw host
// pointers in, raw host pointers out. Each function copies its inputs to the device, runs on a
// stream of its own, copies the result back, and returns "" or the CUDA error it met.
// Internal to kernels/; only built with CUDA.
#ifndef CKV_KERNELS_CUDA_LAUNCH_H_
#define CKV_KERNELS_CUDA_LAUNCH_H_

#include <cstddef>
#include <string>

namespace ckv::kernels::cuda_launch {

std::string DeviceCount(int* count);

// cudaHostRegister / cudaHostUnregister of a host range (page-locks it for DMA).
std::string HostRegister(void* address, size_t bytes);
std::string HostUnregister(void* address);

// scores[j] = sum_g softmax_j(rows_g . [min, max]_{j,h(g)} * scale) / q_heads, over `chunks`
// min/max parts of `part_bytes` each, back to back in `parts`; rows [q_heads, 2 * head_dim] as
// QuestQueryRows (selector.h) makes them.
std::string QuestScores(const unsigned char* parts, size_t chunks, size_t part_bytes, int layer,
                        int q_heads, int kv_heads, int head_dim, const float* rows, float scale,
                        float* scores);

// scores[j] = sum_g softmax_j(qbar_g . mean_{j,h(g)} * scale) / q_heads.
std::string MeanKeyScores(const unsigned char* parts, size_t chunks, size_t part_bytes, int layer,
                          int q_heads, int kv_heads, int head_dim, const float* qbar, float scale,
                          float* scores);

// mass[t] = mean over (head in heads, query) of softmax_t(q . k_t * scale), over the records of
// `chunks` chunks back to back (K first, dtype 1 fp16, 2 bf16, 3 fp32).
std::string TokenAttention(const unsigned char* records, size_t chunks, size_t record_bytes,
                           int dtype, int chunk_tokens, int kv_heads, int head_dim,
                           const float* queries, int q_heads, const int* heads, int head_count,
                           int window, float scale, float* mass);

// k, v [count * half_elements]: the K and V of records list[i], as float.
std::string Gather(const unsigned char* records, size_t chunks, size_t record_bytes, int dtype,
                   size_t half_elements, const unsigned* list, size_t count, float* k, float* v);

// out [window * q_heads * head_dim], row r = i * q_heads + g for query i and q head g:
// softmax_t(q . k_{t,h(g)} * scale + bias[t * q_heads + g]) . v_{t,h(g)} over `tokens` keys and
// values [tokens, kv_heads, head_dim] (float), h(g) = g / (q_heads / kv_heads). tokens > 0.
std::string BiasedAttention(const float* k, const float* v, const float* bias, size_t tokens,
                            int kv_heads, int head_dim, const float* queries, int q_heads,
                            int window, float scale, float* out);

// Decodes `count` records at the device pointers records[i] (a host array), `record_bytes` each
// with their K part's `key_bytes` first, into device memory `out` (codec 0 none, 1 fp8 e4m3,
// 2 int8, 3 int4; dtype as TokenAttention's), as ckv::DecodeRecord does, bit for bit.
std::string DecodeRecords(const unsigned char* const* records, size_t count, int codec, int dtype,
                          int chunk_tokens, int kv_heads, int head_dim, size_t record_bytes,
                          size_t key_bytes, unsigned char* out);

}  // namespace ckv::kernels::cuda_launch

#endif  // CKV_KERNELS_CUDA_LAUNCH_H_
