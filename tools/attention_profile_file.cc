// SPDX-License-Identifier: Apache-2.0
#include "tools/attention_profile_file.h"

#include <cmath>
#include <cstring>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckv/status.h"
#include "common/status_macros.h"

namespace ckv::synth {
namespace {

std::string ShapeString(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionProfileFile>> AttentionProfileFile::Open(
    const std::string& path) {
  auto reader = safetensors::Reader::OpenFile(path);
  if (!reader.ok()) {
    return absl::Status(reader.status().code(),
                        absl::StrCat("attention profile ", path, ": ", reader.status().message()));
  }
  std::unique_ptr<AttentionProfileFile> f(new AttentionProfileFile());
  f->path_ = path;
  f->reader_ = *std::move(reader);
  if (absl::Status st = f->Init(); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("attention profile ", path, ": ", st.message()));
  }
  return f;
}

absl::Status AttentionProfileFile::Init() {
  const auto& meta = reader_->metadata();
  auto text = [&](const char* key) -> absl::StatusOr<std::string> {
    auto it = meta.find(key);
    if (it == meta.end()) {
      return absl::InvalidArgumentError(absl::StrCat("__metadata__ has no \"", key, "\""));
    }
    return it->second;
  };
  auto count = [&](const char* key, uint32_t* out) -> absl::Status {
    CKV_ASSIGN_OR_RETURN(std::string s, text(key));
    if (!absl::SimpleAtoi(s, out) || *out == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("__metadata__ \"", key, "\" is \"", s, "\", not a positive integer"));
    }
    return absl::OkStatus();
  };
  CKV_ASSIGN_OR_RETURN(spec_.model_id, text("model_id"));
  spec_.dtype = DType::kFp16;
  CKV_RETURN_IF_ERROR(count("layers", &spec_.layers));
  CKV_RETURN_IF_ERROR(count("q_heads", &spec_.q_heads));
  CKV_RETURN_IF_ERROR(count("kv_heads", &spec_.kv_heads));
  CKV_RETURN_IF_ERROR(count("head_dim", &spec_.head_dim));
  CKV_RETURN_IF_ERROR(count("chunk_tokens", &spec_.chunk_tokens));
  CKV_RETURN_IF_ERROR(count("prefix_tokens", &prefix_tokens_));
  CKV_RETURN_IF_ERROR(count("suffix_tokens", &suffix_tokens_));
  CKV_RETURN_IF_ERROR(count("turns", &turns_));
  CKV_RETURN_IF_ERROR(count("window", &window_));
  // Optional: the network's hidden and MLP sizes, for the benchmark's modelled compute.
  for (auto [key, out] :
       {std::pair{"hidden", &hidden_}, std::pair{"intermediate", &intermediate_}}) {
    if (meta.contains(key)) CKV_RETURN_IF_ERROR(count(key, out));
  }
  {
    CKV_ASSIGN_OR_RETURN(std::string s, text("rope_theta"));
    if (!absl::SimpleAtod(s, &rope_theta_) || !std::isfinite(rope_theta_) || rope_theta_ <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("__metadata__ \"rope_theta\" is \"", s, "\", not a positive number"));
    }
  }
  if (absl::Status st = spec_.Validate(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the metadata's model: ", st.message()));
  }
  if (window_ > suffix_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("window ", window_, " > suffix_tokens ",
                                                   suffix_tokens_,
                                                   " (the window is the suffix's "
                                                   "last tokens)"));
  }

  const std::set<std::string> want = {"k", "v", "q", "tokens"};
  for (const safetensors::TensorInfo& t : reader_->tensors()) {
    if (!want.contains(t.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unexpected tensor ", t.name, " (a profile holds exactly k, v, q and tokens)"));
    }
  }
  auto find = [&](const char* name, safetensors::Dtype dtype,
                  size_t rank) -> absl::StatusOr<const safetensors::TensorInfo*> {
    const safetensors::TensorInfo* t = reader_->Find(name);
    if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("no tensor ", name));
    if (t->dtype != dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", name, " is ", std::string(safetensors::DtypeName(t->dtype)),
                       ", not ", std::string(safetensors::DtypeName(dtype))));
    }
    if (t->shape.size() != rank || t->shape[0] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has shape ",
                                                     ShapeString(t->shape), ", not rank ", rank,
                                                     " with conversations >= 1 first"));
    }
    return t;
  };
  CKV_ASSIGN_OR_RETURN(k_, find("k", safetensors::Dtype::kF16, 5));
  CKV_ASSIGN_OR_RETURN(v_, find("v", safetensors::Dtype::kF16, 5));
  CKV_ASSIGN_OR_RETURN(const safetensors::TensorInfo* q, find("q", safetensors::Dtype::kF32, 6));
  CKV_ASSIGN_OR_RETURN(const safetensors::TensorInfo* tok,
                       find("tokens", safetensors::Dtype::kI32, 2));
  if (k_->shape[0] > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor k has ", k_->shape[0], " conversations"));
  }
  conversations_ = static_cast<uint32_t>(k_->shape[0]);
  const uint64_t c = conversations_;
  const uint64_t total = total_tokens();
  const std::vector<uint64_t> kv_shape = {c, spec_.layers, total, spec_.kv_heads, spec_.head_dim};
  const std::vector<uint64_t> q_shape = {c,       turns_,        spec_.layers,
                                         window_, spec_.q_heads, spec_.head_dim};
  const std::vector<uint64_t> tok_shape = {c, total};
  const std::string why = absl::StrCat(
      " (from the metadata: conversations = k's first dimension ", c, ", layers ", spec_.layers,
      ", total_tokens = prefix_tokens ", prefix_tokens_, " + turns ", turns_, " * suffix_tokens ",
      suffix_tokens_, " = ", total, ", kv_heads ", spec_.kv_heads, ", q_heads ", spec_.q_heads,
      ", window ", window_, ", head_dim ", spec_.head_dim, ")");
  for (const auto& [t, shape] : {std::pair{k_, kv_shape}, std::pair{v_, kv_shape},
                                 std::pair{q, q_shape}, std::pair{tok, tok_shape}}) {
    if (t->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t->name, " has shape ",
                                                     ShapeString(t->shape), ", want ",
                                                     ShapeString(shape), why));
    }
  }
  if (q->bytes() > kMaxProfileQueryBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor q holds ", q->bytes(),
                                                   " bytes, more than the ", kMaxProfileQueryBytes,
                                                   " read into memory"));
  }
  tokens_.resize(c * total);
  CKV_RETURN_IF_ERROR(reader_->Read(*tok, std::as_writable_bytes(std::span(tokens_))));
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tokens[", i / total, ", ", i % total, "] is ",
                                                     tokens_[i], ", a negative id"));
    }
  }
  q_.resize(q->bytes() / sizeof(float));
  CKV_RETURN_IF_ERROR(reader_->Read(*q, std::as_writable_bytes(std::span(q_))));
  return absl::OkStatus();
}

std::span<const int32_t> AttentionProfileFile::Tokens(uint32_t c) const {
  return std::span(tokens_).subspan(size_t{c} * total_tokens(), total_tokens());
}

std::vector<std::vector<float>> AttentionProfileFile::Queries(uint32_t c, uint32_t t) const {
  const size_t per_layer = size_t{window_} * spec_.q_heads * spec_.head_dim;
  std::vector<std::vector<float>> out(spec_.layers);
  const float* base = q_.data() + (size_t{c} * turns_ + t) * spec_.layers * per_layer;
  for (uint32_t l = 0; l < spec_.layers; ++l) {
    out[l].assign(base + l * per_layer, base + (l + 1) * per_layer);
  }
  return out;
}

absl::Status AttentionProfileFile::ReadSlab(const safetensors::TensorInfo& t, uint32_t c,
                                            uint32_t layer, size_t tokens,
                                            std::vector<std::byte>* out) const {
  if (c >= conversations_ || layer >= spec_.layers || tokens > total_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention profile ", path_, ": conversation ", c, " layer ", layer, " of ", tokens,
        " tokens is outside ", conversations_, " x ", spec_.layers, " x ", total_tokens()));
  }
  const size_t row = spec_.TokenBytesPerLayer();
  out->resize(tokens * row);
  const uint64_t offset = (uint64_t{c} * spec_.layers + layer) * total_tokens() * row;
  return reader_->ReadRange(t, offset, *out);
}

absl::StatusOr<ProfileKv> AttentionProfileFile::ReadKv(uint32_t c, size_t tokens) const {
  ProfileKv kv;
  kv.k.resize(spec_.layers);
  kv.v.resize(spec_.layers);
  kv.tensors.tokens = tokens;
  for (uint32_t l = 0; l < spec_.layers; ++l) {
    CKV_RETURN_IF_ERROR(ReadSlab(*k_, c, l, tokens, &kv.k[l]));
    CKV_RETURN_IF_ERROR(ReadSlab(*v_, c, l, tokens, &kv.v[l]));
    kv.tensors.k.emplace_back(kv.k[l]);
    kv.tensors.v.emplace_back(kv.v[l]);
  }
  return kv;
}

absl::StatusOr<std::vector<std::byte>> AttentionProfileFile::Records(uint32_t c, uint32_t layer,
                                                                     size_t tokens) const {
  std::vector<std::byte> k, v;
  CKV_RETURN_IF_ERROR(ReadSlab(*k_, c, layer, tokens, &k));
  CKV_RETURN_IF_ERROR(ReadSlab(*v_, c, layer, tokens, &v));
  const size_t half = size_t{spec_.chunk_tokens} * spec_.TokenBytesPerLayer();
  const size_t chunks = tokens / spec_.chunk_tokens;
  std::vector<std::byte> out(chunks * 2 * half);
  for (size_t j = 0; j < chunks; ++j) {
    std::memcpy(out.data() + j * 2 * half, k.data() + j * half, half);
    std::memcpy(out.data() + j * 2 * half + half, v.data() + j * half, half);
  }
  return out;
}

}  // namespace ckv::synth
