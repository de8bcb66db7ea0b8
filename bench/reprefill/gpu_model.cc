// SPDX-License-Identifier: Apache-2.0
#include "bench/reprefill/gpu_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/half.h"

namespace ckv::bench {

absl::StatusOr<Arch> ArchOf(const std::string& model) {
  if (model == "qwen2.5-0.5b") return Arch{896, 4864};
  if (model == "qwen2.5-7b") return Arch{3584, 18944};
  if (model == "qwen2.5-14b") return Arch{5120, 13824};
  if (model == "qwen2.5-32b") return Arch{5120, 27648};
  return absl::InvalidArgumentError(absl::StrCat("no architecture figures for model ", model));
}

namespace {
double LayerWeights(const ModelSpec& spec, const Arch& arch) {
  const double qd = double(spec.q_heads) * spec.head_dim;
  const double kvd = double(spec.kv_heads) * spec.head_dim;
  // q and o projections, k and v projections, gate, up and down of the MLP.
  return 2 * arch.hidden * qd + 2 * arch.hidden * kvd + 3.0 * arch.hidden * arch.intermediate;
}
}  // namespace

double LayerFlops(const ModelSpec& spec, const Arch& arch, double s, double context) {
  const double qd = double(spec.q_heads) * spec.head_dim;
  return 2 * s * LayerWeights(spec, arch) + 4 * s * (context + s) * qd;
}

double LayerWeightBytes(const ModelSpec& spec, const Arch& arch) {
  return LayerWeights(spec, arch) * kernels::ElementBytes(spec.dtype);
}

GpuParams GpuParams::Of(const Flags& f) {
  GpuParams p;
  p.flops_per_s = f.gpu_tflops * 1e12;
  p.hbm_bytes_per_s = f.hbm_gb_s * 1e9;
  p.launch_s = f.launch_us * 1e-6;
  p.pcie_bytes_per_s = f.pcie_gb_s * 1e9;
  return p;
}

double LayerSeconds(const ModelSpec& spec, const Arch& arch, const GpuParams& gpu,
                    double suffix_tokens, double context_tokens) {
  const double flops = LayerFlops(spec, arch, suffix_tokens, context_tokens);
  double kv_bytes = (context_tokens + suffix_tokens) * spec.TokenBytesPerLayer() * 2.0;
  if (spec.codec != KvCodec::kNone) {
    // Dequantised before the attention reads it: the stored bytes read, the dtype written.
    kv_bytes += context_tokens *
                (double(spec.RecordBytes()) / spec.chunk_tokens + spec.TokenBytesPerLayer() * 2.0);
  }
  const double hbm = LayerWeightBytes(spec, arch) + kv_bytes;
  return std::max(flops / gpu.flops_per_s, hbm / gpu.hbm_bytes_per_s) + gpu.launch_s;
}

double RecomputeSeconds(const ModelSpec& spec, const Arch& arch, const GpuParams& gpu,
                        double tokens) {
  // Causal attention over the prompt: on average each token attends to half of it.
  const double qd = double(spec.q_heads) * spec.head_dim;
  const double flops = 2 * tokens * LayerWeights(spec, arch) + 4 * tokens * (tokens / 2) * qd;
  const double hbm = LayerWeightBytes(spec, arch) + tokens * spec.TokenBytesPerLayer() * 2.0;
  return spec.layers *
         (std::max(flops / gpu.flops_per_s, hbm / gpu.hbm_bytes_per_s) + gpu.launch_s);
}

absl::Time ModelledGpu::Transfer(uint64_t bytes) {
  if (bytes == 0) return absl::InfinitePast();
  const absl::Duration d = absl::Seconds(double(bytes) / p_.pcie_bytes_per_s);
  absl::MutexLock lock(&mu_);
  copy_until_ = std::max(absl::Now(), copy_until_) + d;
  return copy_until_;
}

void ModelledGpu::Compute(double seconds, absl::Time ready) {
  absl::Time end;
  {
    absl::MutexLock lock(&mu_);
    end = std::max({absl::Now(), compute_until_, ready}) + absl::Seconds(seconds);
    compute_until_ = end;
  }
  const absl::Duration left = end - absl::Now();
  if (left > absl::ZeroDuration()) absl::SleepFor(left);
}

namespace {
thread_local absl::Time clock_begin;
thread_local double clock_cpu_seconds = 0;
}  // namespace

void ScoringClock::Begin() {
  if (hold_) reads_->PauseAndDrain();  // on the clock: what was issued lands in time
  clock_begin = absl::Now();
}

void ScoringClock::End(double flops) {
  clock_cpu_seconds += absl::ToDoubleSeconds(absl::Now() - clock_begin);
  if (hold_) reads_->Resume();
  if (flops > 0) gpu_->Compute(flops / gpu_->params().flops_per_s);
}

double ScoringClock::Take() {
  const double s = clock_cpu_seconds;
  clock_cpu_seconds = 0;
  return s;
}

}  // namespace ckv::bench
