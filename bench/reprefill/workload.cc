// SPDX-License-Identifier: Apache-2.0
#include "bench/reprefill/workload.h"

#include <cmath>
#include <filesystem>

#include "ckv/status.h"
#include "common/status_macros.h"
#include "tools/json_writer.h"

namespace ckv::bench {

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Workload::Workload(const Flags& f, ModelSpec spec, const synth::AttentionProfileFile* file)
    : f_(f), spec_(std::move(spec)), file_(file) {
  stored_tokens_ = f.prefix_tokens + size_t{f.turns - 1} * f.suffix_tokens;
  for (uint32_t turn = 0; turn < f.turns; ++turn) {
    for (uint32_t c = 0; c < f.conversations; ++c) {
      requests_.push_back({c, turn, turn < f.warmup_turns});
    }
  }
  base_.seed = f.seed;
  base_.window = f.window;
  if (f.request_shift >= 0) base_.request_shift = f.request_shift;
  if (f.head_agreement >= 0) base_.calibrated.head_agreement = f.head_agreement;
  if (file_ != nullptr) {
    tokens_.resize(f.conversations);
    for (uint32_t c = 0; c < f.conversations; ++c) {
      const std::span<const int32_t> t = file_->Tokens(c);
      tokens_[c].assign(t.begin(), t.end());
    }
    return;
  }
  const size_t shared = static_cast<size_t>(std::llround(f.system_prompt_share * f.prefix_tokens));
  tokens_.resize(f.conversations);
  for (uint32_t c = 0; c < f.conversations; ++c) {
    auto& t = tokens_[c];
    t.resize(stored_tokens_ + f.suffix_tokens);
    for (size_t i = 0; i < t.size(); ++i) {
      const uint64_t h =
          i < shared ? Mix(f.seed * 1000003 + i) : Mix(Mix(f.seed + 7919 * (c + 1)) + i);
      t[i] = static_cast<int32_t>(h % 151643);  // qwen2.5's vocabulary
    }
  }
  base_.profile = *synth::ParseAttentionProfile(f.attention_profile);
}

uint64_t Workload::store_bytes() const {
  return uint64_t(stored_tokens_ / spec_.chunk_tokens) * spec_.RecordBytes() * spec_.layers *
         f_.conversations;
}

synth::AttentionParams Workload::Params(uint32_t conversation) const {
  synth::AttentionParams p = base_;
  // Distinct KV per conversation. The planted-chunks profile keeps its one shared KV, as the
  // stores measured before the calibrated profile had it.
  if (p.profile != synth::AttentionProfile::kPlantedChunks) {
    p.seed = Mix(f_.seed * 7717 + conversation + 1);
  }
  return p;
}

synth::AttentionParams Workload::Params(const Request& r) const {
  synth::AttentionParams p = Params(r.conversation);
  p.request = r.turn;
  p.query_seed = Mix(f_.seed * 31 + r.conversation * 1009 + r.turn + 1);
  return p;
}

std::vector<std::vector<float>> Workload::Queries(const Request& r) const {
  if (file_ != nullptr) return file_->Queries(r.conversation, r.turn);
  synth::SyntheticAttention gen(spec_, stored_tokens_, Params(r));
  std::vector<std::vector<float>> q(spec_.layers);
  for (uint32_t l = 0; l < spec_.layers; ++l) q[l] = gen.Queries(l);
  return q;
}

absl::Status Workload::WithStoredKv(uint32_t c,
                                    const std::function<absl::Status(const KvTensors&)>& fn) const {
  if (file_ != nullptr) {
    CKV_ASSIGN_OR_RETURN(synth::ProfileKv kv, file_->ReadKv(c, stored_tokens_));
    return fn(kv.tensors);
  }
  synth::SyntheticAttention gen(spec_, stored_tokens_, Params(c));
  synth::PlantedKv kv(gen);
  return fn(kv.tensors());
}

absl::StatusOr<std::vector<std::byte>> Workload::Records(uint32_t c, uint32_t layer) const {
  if (file_ != nullptr) return file_->Records(c, layer, stored_tokens_);
  synth::SyntheticAttention gen(spec_, stored_tokens_, Params(c));
  return gen.Records(gen.Generate(layer));
}

std::string Workload::Manifest() const {
  tools::JsonWriter w;
  w.BeginObject().Key("model").String(f_.model).Key("prefix_tokens").Uint(f_.prefix_tokens);
  w.Key("suffix_tokens").Uint(f_.suffix_tokens).Key("conversations").Uint(f_.conversations);
  w.Key("turns").Uint(f_.turns).Key("system_prompt_share").Double(f_.system_prompt_share);
  w.Key("seed").Uint(f_.seed).Key("window").Uint(f_.window).Key("generator").Uint(3);
  // The KV depends on the profile, not on the requests' shift (queries are not stored).
  w.Key("attention_profile").String(f_.attention_profile);
  if (file_ != nullptr) {
    // The file by name, size and modification time: a rewritten profile makes a new store.
    std::error_code size_ec, mtime_ec;
    const auto size = std::filesystem::file_size(file_->path(), size_ec);
    const auto mtime = std::filesystem::last_write_time(file_->path(), mtime_ec);
    w.Key("profile_file").String(file_->path());
    w.Key("profile_file_bytes").Uint(size_ec ? 0 : static_cast<uint64_t>(size));
    w.Key("profile_file_mtime")
        .Int(mtime_ec ? 0 : static_cast<int64_t>(mtime.time_since_epoch().count()));
  }
  w.EndObject();
  return w.str();
}

}  // namespace ckv::bench
