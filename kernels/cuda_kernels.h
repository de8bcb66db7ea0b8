// SPDX-License-Identifier: Apache-2.0
// kernels/cuda_kernels.h: the CUDA implementations of the selectors' scoring, exact attention and
// gather, with the semantics of their CPU counterparts (selector.h, attention.h).
//
// Each function copies its inputs to the device, runs, and copies the result back: the form the
// tests use to compare with the CPU path (DecodeRecords, which works on device memory in place,
// is the exception). When ckv is built without CUDA (nvcc not found), or no device is present,
// every function returns Unavailable with the reason.
//
// Thread-safety: thread-safe (each call uses its own stream and buffers).
#ifndef CKV_KERNELS_CUDA_KERNELS_H_
#define CKV_KERNELS_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/model_spec.h"
#include "kernels/attention.h"
#include "kernels/estimate.h"
#include "kernels/selector.h"

namespace ckv::kernels::cuda {

// True when this build of ckv has the CUDA kernels.
bool Built();
// OK when a CUDA device can be used; Unavailable naming the reason otherwise.
absl::Status DeviceAvailable();

// Page-locks a host range so that the device can copy from it by DMA (cudaHostRegister), and
// releases it. The read engine's staging arena is pinned this way where a device is present.
absl::Status PinHostMemory(void* address, size_t bytes);
void UnpinHostMemory(void* address);

// ScoreChunks(kQuest / kMeanKey, ...) on the device.
absl::StatusOr<std::vector<float>> QuestScores(const SelectorInput& input);
absl::StatusOr<std::vector<float>> MeanKeyScores(const SelectorInput& input);
// TokenAttention on the device.
absl::StatusOr<std::vector<float>> TokenAttention(const KvShape& shape,
                                                  std::span<const float> queries, uint32_t window,
                                                  ChunkRecords records,
                                                  std::span<const uint32_t> heads = {});
// Gather on the device (K and V converted to float32).
absl::StatusOr<GatheredKv> Gather(const KvShape& shape, ChunkRecords records,
                                  std::span<const uint32_t> chunks);

// AttentionWithVirtualTokens (estimate.h) on the device: the loaded tokens and the virtual ones
// as one set of keys and values with an additive logit bias (0 for the loaded tokens), the way an
// attention kernel that takes a float mask serves them. Same errors as the CPU function.
absl::StatusOr<std::vector<float>> AttentionWithVirtualTokens(const KvShape& shape,
                                                              std::span<const float> queries,
                                                              uint32_t window,
                                                              const GatheredKv& loaded,
                                                              const VirtualTokens& virtual_tokens);

// Dequantises stored records of `spec` that are in device memory (records[i]: a device pointer
// to spec.RecordBytes() bytes, any alignment, e.g. from a CUDA DeviceMemory) into `out`, device
// memory of records.size() * spec.DecodedRecordBytes() bytes aligned to the dtype's size: record
// i at i * DecodedRecordBytes(), K then V, the bytes ckv::DecodeRecord (ckv/codec.h) writes, bit
// for bit, for every record whose scales are finite (every record EncodeRecord writes; an fp8
// NaN code decodes to the same NaN as well). Without a codec it copies. Runs on a stream of its
// own on the current device and returns when done. REQUIRES: copies into the records have
// finished. InvalidArgument for an invalid spec, a wrong `out` size or alignment, or a null
// record.
absl::Status DecodeRecords(const ModelSpec& spec, std::span<const std::byte* const> records,
                           std::span<std::byte> out);

}  // namespace ckv::kernels::cuda

#endif  // CKV_KERNELS_CUDA_KERNELS_H_
