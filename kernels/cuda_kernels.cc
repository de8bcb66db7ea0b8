// SPDX-License-Identifier: Apache-2.0
// kernels/cuda_kernels.cc: cuda_kernels.h on top of the device launchers (cuda_launch.h), or,
// in a build without CUDA, functions that say so.
#include "kernels/cuda_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

#if defined(CKV_HAVE_CUDA)
#include "kernels/cuda_launch.h"
#include "kernels/summary.h"

#endif

namespace ckv::kernels::cuda {

#if defined(CKV_HAVE_CUDA)
namespace {

absl::Status FromLaunch(const std::string& error) {
  if (error.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA: ", error));
}

// Concatenates the `bytes`-long blocks that `parts` point to, in order.
std::vector<unsigned char> Concatenate(std::span<const std::byte* const> parts, size_t bytes) {
  std::vector<unsigned char> out(parts.size() * bytes);
  for (size_t i = 0; i < parts.size(); ++i) std::memcpy(out.data() + i * bytes, parts[i], bytes);
  return out;
}

absl::Status CheckSummaryInput(const SelectorInput& in, SelectorKind kind) {
  if (auto st = DeviceAvailable(); !st.ok()) return st;
  if (auto st = in.shape.Validate(); !st.ok()) return st;
  const auto& parts = kind == SelectorKind::kQuest ? in.minmax : in.mean;
  const size_t want = size_t{in.window} * in.shape.q_heads * in.shape.head_dim;
  if (in.window == 0 || in.chunks == 0 || parts.size() != in.chunks || in.queries.size() != want ||
      in.layer >= in.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(SelectorName(kind)), " on the device: ", parts.size(),
                     " summaries for ", in.chunks, " chunks, ", in.queries.size(),
                     " query floats (", want, " needed), layer ", in.layer, " of ", in.layers));
  }
  return absl::OkStatus();
}

}  // namespace

bool Built() { return true; }

absl::Status DeviceAvailable() {
  int count = 0;
  const std::string error = cuda_launch::DeviceCount(&count);
  if (!error.empty()) return absl::UnavailableError(absl::StrCat("no CUDA device: ", error));
  if (count == 0) return absl::UnavailableError("no CUDA device: cudaGetDeviceCount is 0");
  return absl::OkStatus();
}

absl::Status PinHostMemory(void* address, size_t bytes) {
  if (auto st = DeviceAvailable(); !st.ok()) return st;
  return FromLaunch(cuda_launch::HostRegister(address, bytes));
}

void UnpinHostMemory(void* address) {
  // Nothing to do about a failure: the range is freed right after, registered or not.
  cuda_launch::HostUnregister(address);
}

// Both take their query rows from selector.h, as the CPU path does, so that only the summary
// side (one block per chunk, then a softmax per q head) runs differently.
absl::StatusOr<std::vector<float>> QuestScores(const SelectorInput& in) {
  if (auto st = CheckSummaryInput(in, SelectorKind::kQuest); !st.ok()) return st;
  const KvShape& s = in.shape;
  const SummaryFormat f{in.layers, s.kv_heads, s.head_dim};
  const auto rows = QuestQueryRows(in);
  const auto parts = Concatenate(in.minmax, f.MinMaxBytes());
  std::vector<float> scores(in.chunks);
  if (auto st = FromLaunch(cuda_launch::QuestScores(
          parts.data(), in.chunks, f.MinMaxBytes(), static_cast<int>(in.layer),
          static_cast<int>(s.q_heads), static_cast<int>(s.kv_heads), static_cast<int>(s.head_dim),
          rows.data(),
          1.0f / (static_cast<float>(in.window) * std::sqrt(static_cast<float>(s.head_dim))),
          scores.data()));
      !st.ok()) {
    return st;
  }
  return scores;
}

absl::StatusOr<std::vector<float>> MeanKeyScores(const SelectorInput& in) {
  if (auto st = CheckSummaryInput(in, SelectorKind::kMeanKey); !st.ok()) return st;
  const KvShape& s = in.shape;
  const SummaryFormat f{in.layers, s.kv_heads, s.head_dim};
  const auto qbar = MeanQueryRows(in);
  const auto parts = Concatenate(in.mean, f.MeanBytes());
  std::vector<float> scores(in.chunks);
  if (auto st = FromLaunch(cuda_launch::MeanKeyScores(
          parts.data(), in.chunks, f.MeanBytes(), static_cast<int>(in.layer),
          static_cast<int>(s.q_heads), static_cast<int>(s.kv_heads), static_cast<int>(s.head_dim),
          qbar.data(), 1.0f / std::sqrt(static_cast<float>(s.head_dim)), scores.data()));
      !st.ok()) {
    return st;
  }
  return scores;
}

absl::StatusOr<std::vector<float>> TokenAttention(const KvShape& s, std::span<const float> queries,
                                                  uint32_t window, ChunkRecords records,
                                                  std::span<const uint32_t> heads) {
  if (auto st = DeviceAvailable(); !st.ok()) return st;
  if (auto st = s.Validate(); !st.ok()) return st;
  const size_t want = size_t{window} * s.q_heads * s.head_dim;
  if (window == 0 || queries.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("queries of ", queries.size(), " floats; ", want, " needed"));
  }
  std::vector<int> head_list;
  for (uint32_t g : heads) {
    if (g >= s.q_heads) {
      return absl::InvalidArgumentError(absl::StrCat("q head ", g, " of ", s.q_heads));
    }
    head_list.push_back(static_cast<int>(g));
  }
  if (head_list.empty()) {
    for (uint32_t g = 0; g < s.q_heads; ++g) head_list.push_back(static_cast<int>(g));
  }
  std::vector<float> mass(records.size() * s.chunk_tokens, 0.0f);
  if (mass.empty()) return mass;
  const auto all = Concatenate(records, s.record_bytes());
  if (auto st = FromLaunch(cuda_launch::TokenAttention(
          all.data(), records.size(), s.record_bytes(), static_cast<int>(s.dtype),
          static_cast<int>(s.chunk_tokens), static_cast<int>(s.kv_heads),
          static_cast<int>(s.head_dim), queries.data(), static_cast<int>(s.q_heads),
          head_list.data(), static_cast<int>(head_list.size()), static_cast<int>(window),
          1.0f / std::sqrt(static_cast<float>(s.head_dim)), mass.data()));
      !st.ok()) {
    return st;
  }
  return mass;
}

absl::StatusOr<GatheredKv> Gather(const KvShape& s, ChunkRecords records,
                                  std::span<const uint32_t> chunks) {
  if (auto st = DeviceAvailable(); !st.ok()) return st;
  if (auto st = s.Validate(); !st.ok()) return st;
  for (uint32_t j : chunks) {
    if (j >= records.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gather of chunk ", j, " of a prefix of ", records.size()));
    }
  }
  const size_t half = s.half_record_bytes() / ElementBytes(s.dtype);
  GatheredKv out;
  out.tokens = static_cast<uint32_t>(chunks.size() * s.chunk_tokens);
  out.k.resize(chunks.size() * half);
  out.v.resize(chunks.size() * half);
  for (uint32_t j : chunks) {
    for (uint32_t t = 0; t < s.chunk_tokens; ++t) out.positions.push_back(j * s.chunk_tokens + t);
  }
  if (chunks.empty()) return out;
  const auto all = Concatenate(records, s.record_bytes());
  const std::vector<unsigned> list(chunks.begin(), chunks.end());
  if (auto st = FromLaunch(cuda_launch::Gather(all.data(), records.size(), s.record_bytes(),
                                               static_cast<int>(s.dtype), half, list.data(),
                                               list.size(), out.k.data(), out.v.data()));
      !st.ok()) {
    return st;
  }
  return out;
}

absl::StatusOr<std::vector<float>> AttentionWithVirtualTokens(const KvShape& s,
                                                              std::span<const float> queries,
                                                              uint32_t window,
                                                              const GatheredKv& loaded,
                                                              const VirtualTokens& vt) {
  if (auto st = DeviceAvailable(); !st.ok()) return st;
  if (auto st = CheckVirtualTokenInput(s, queries, window, loaded, vt); !st.ok()) return st;
  if (size_t{window} * s.q_heads > 65535) {  // one grid row per (query, q head)
    return absl::InvalidArgumentError(
        absl::StrCat("AttentionWithVirtualTokens on the device: ", window, " queries x ", s.q_heads,
                     " q heads; at most 65535 rows a call"));
  }
  const size_t tokens = size_t{loaded.tokens} + vt.count;
  std::vector<float> out(queries.size(), 0.0f);
  if (tokens == 0) return out;  // over no tokens the output is zeros, as on the CPU
  // One key set: the loaded tokens, then the virtual ones, with their bias beside a 0 for each
  // loaded token.
  std::vector<float> k(loaded.k), v(loaded.v), bias(size_t{loaded.tokens} * s.q_heads, 0.0f);
  k.insert(k.end(), vt.keys.begin(), vt.keys.end());
  v.insert(v.end(), vt.values.begin(), vt.values.end());
  bias.insert(bias.end(), vt.bias.begin(), vt.bias.end());
  if (auto st = FromLaunch(cuda_launch::BiasedAttention(
          k.data(), v.data(), bias.data(), tokens, static_cast<int>(s.kv_heads),
          static_cast<int>(s.head_dim), queries.data(), static_cast<int>(s.q_heads),
          static_cast<int>(window), 1.0f / std::sqrt(static_cast<float>(s.head_dim)), out.data()));
      !st.ok()) {
    return st;
  }
  return out;
}

absl::Status DecodeRecords(const ModelSpec& spec, std::span<const std::byte* const> records,
                           std::span<std::byte> out) {
  if (auto st = DeviceAvailable(); !st.ok()) return st;
  if (auto st = spec.Validate(); !st.ok()) return st;
  const size_t decoded = spec.DecodedRecordBytes();
  const size_t element = DTypeBytes(spec.dtype);
  if (out.size() != records.size() * decoded) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeRecords: output of ", out.size(), " bytes; ", records.size(),
                     " records of ", spec.DebugString(), " need ", records.size() * decoded));
  }
  if (reinterpret_cast<uintptr_t>(out.data()) % element != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeRecords: output not aligned to ", element, " bytes"));
  }
  for (size_t i = 0; i < records.size(); ++i) {
    if (records[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("DecodeRecords: record ", i, " is null"));
    }
  }
  if (records.empty()) return absl::OkStatus();
  std::vector<const unsigned char*> list(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    list[i] = reinterpret_cast<const unsigned char*>(records[i]);
  }
  return FromLaunch(cuda_launch::DecodeRecords(
      list.data(), list.size(), static_cast<int>(spec.codec), static_cast<int>(spec.dtype),
      static_cast<int>(spec.chunk_tokens), static_cast<int>(spec.kv_heads),
      static_cast<int>(spec.head_dim), spec.RecordBytes(), spec.RecordKeyBytes(),
      reinterpret_cast<unsigned char*>(out.data())));
}

#else  // !CKV_HAVE_CUDA

namespace {
absl::Status NotBuilt() {
  return absl::UnavailableError(
      "ckv was built without CUDA (nvcc was not found at configure time)");
}
}  // namespace

bool Built() { return false; }
absl::Status DeviceAvailable() { return NotBuilt(); }
absl::Status PinHostMemory(void*, size_t) { return NotBuilt(); }
void UnpinHostMemory(void*) {}
absl::StatusOr<std::vector<float>> QuestScores(const SelectorInput&) { return NotBuilt(); }
absl::StatusOr<std::vector<float>> MeanKeyScores(const SelectorInput&) { return NotBuilt(); }
absl::StatusOr<std::vector<float>> TokenAttention(const KvShape&, std::span<const float>, uint32_t,
                                                  ChunkRecords, std::span<const uint32_t>) {
  return NotBuilt();
}
absl::StatusOr<GatheredKv> Gather(const KvShape&, ChunkRecords, std::span<const uint32_t>) {
  return NotBuilt();
}
absl::StatusOr<std::vector<float>> AttentionWithVirtualTokens(const KvShape&,
                                                              std::span<const float>, uint32_t,
                                                              const GatheredKv&,
                                                              const VirtualTokens&) {
  return NotBuilt();
}
absl::Status DecodeRecords(const ModelSpec&, std::span<const std::byte* const>,
                           std::span<std::byte>) {
  return NotBuilt();
}

#endif  // CKV_HAVE_CUDA

}  // namespace ckv::kernels::cuda
