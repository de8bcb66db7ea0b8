// SPDX-License-Identifier: Apache-2.0
// bench/reprefill/gpu_model.h: the modelled GPU of the Re-Prefill benchmark (docs/baselines.md,
// "Compute model"). Compute is modelled, I/O is real (DESIGN.md, decision 9).
//
// One decoder layer for s suffix tokens over a context of n loaded tokens takes
//   max(FLOPs / effective peak, bytes from HBM / HBM bandwidth) + launch overhead,
// where FLOPs are the projections and the MLP (2 per weight per token) plus attention (4 per q
// head dimension per pair), and the HBM bytes are the layer's weights plus the context's K and
// V. At 64 suffix tokens a 7B layer is bound by its weights (466 MB at bf16), not by FLOPs.
// Every byte that reaches the GPU from the CPU tier or from NVMe first crosses PCIe on one copy
// engine at --pcie-gb-s; a layer's compute starts when its data has crossed.
//
// Thread-safety: ModelledGpu is thread-safe; ScoringClock is per worker thread.
#ifndef CKV_BENCH_REPREFILL_GPU_MODEL_H_
#define CKV_BENCH_REPREFILL_GPU_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/reprefill/flags.h"
#include "ckv/model_spec.h"
#include "engine/internal.h"

namespace ckv::bench {

struct Arch {
  uint32_t hidden = 0;
  uint32_t intermediate = 0;
};

// Hidden and MLP sizes of the presets, from the models' config.json.
absl::StatusOr<Arch> ArchOf(const std::string& model);

// FLOPs of one decoder layer for `s` new tokens attending over `context` earlier tokens plus
// themselves (causal within the new tokens is not discounted: an upper bound).
double LayerFlops(const ModelSpec& spec, const Arch& arch, double s, double context);
// Weight bytes of one decoder layer in the spec's dtype.
double LayerWeightBytes(const ModelSpec& spec, const Arch& arch);

struct GpuParams {
  double flops_per_s = 156e12;
  double hbm_bytes_per_s = 1630e9;
  double launch_s = 40e-6;
  double pcie_bytes_per_s = 25e9;
  static GpuParams Of(const Flags& f);
};

// The modelled time of one layer's compute (no PCIe).
double LayerSeconds(const ModelSpec& spec, const Arch& arch, const GpuParams& gpu,
                    double suffix_tokens, double context_tokens);
// The modelled time to prefill a whole prompt of `tokens` tokens with no cache (`recompute`):
// every layer over all tokens, compute-bound at this size.
double RecomputeSeconds(const ModelSpec& spec, const Arch& arch, const GpuParams& gpu,
                        double tokens);

// One modelled GPU shared by every request: one compute stream and one host-to-device copy
// engine, each running its work one piece after another in submission order. Time is spent as
// timed waits, so real reads overlap modelled compute as on a GPU.
class ModelledGpu {
 public:
  ModelledGpu(const GpuParams& params) : p_(params) {}
  // Queues `bytes` on the copy engine now; returns when they will have crossed.
  absl::Time Transfer(uint64_t bytes);
  // Runs `seconds` of compute once `ready` has passed (data on the GPU) and the stream is free,
  // and returns when it is done.
  void Compute(double seconds, absl::Time ready = absl::InfinitePast());
  const GpuParams& params() const { return p_; }

 private:
  const GpuParams p_;
  absl::Mutex mu_;
  absl::Time compute_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time copy_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The selectors run on this CPU, where scoring a layer takes milliseconds that a GPU spends
// microseconds on. While one runs, the time is taken out of the request's latency and the
// scoring's FLOPs are spent on the modelled GPU instead. Time that is taken out must not move
// the disk either: before the clock stops, the reads already issued land (on the clock; a GPU's
// microseconds of scoring could not have overtaken them) and the read engine is held until it
// restarts, so no read lands for free while the host scores. Host work that a GPU system would
// do in a kernel (the baselines' gathers of keys into scoring layout) is charged the same way,
// through Begin/End. Per worker thread (one request at a time each); exact at concurrency 1.
class ScoringClock final : public engine::SelectorClock {
 public:
  ScoringClock(prefetch::ReadEngine* reads, ModelledGpu* gpu, bool hold_reads)
      : reads_(reads), gpu_(gpu), hold_(hold_reads) {}
  void Begin() override;
  void End(double flops) override;
  // CPU seconds taken out on this thread since the last call.
  static double Take();

 private:
  prefetch::ReadEngine* reads_;
  ModelledGpu* gpu_;
  const bool hold_;
};

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_GPU_MODEL_H_
