// SPDX-License-Identifier: Apache-2.0
// bench/reprefill/systems.h: the systems the Re-Prefill benchmark compares (docs/baselines.md):
//   full       AttentionStore: every record of every layer, next-layer preload, LRU tiers;
//   h2o        AttentionStore + H2O: every key, then the selected tokens' values;
//   impress    IMPRESS: probe heads' keys (next layer's read early), Jaccard fallback, its own
//              64-token block file reordered between turns, frequency x share tiers;
//   ckv-paper  ContiguousKV as published, through a ckv session;
//   ckv        ckv's chosen configuration, through a ckv session; or ckv:<...> variants.
// full and the ckv systems take a codec as a suffix (full@int8, ckv@fp8): they then run over a
// store whose records are stored with it (ckv/codec.h), beside the others in the same run.
// Each runs one request at a time per worker over the same store and read engine; one file per
// system (system_*.cc).
#ifndef CKV_BENCH_REPREFILL_SYSTEMS_H_
#define CKV_BENCH_REPREFILL_SYSTEMS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bench/reprefill/gpu_model.h"
#include "bench/reprefill/store.h"
#include "bench/reprefill/workload.h"
#include "ckv/engine.h"
#include "ckv/session.h"
#include "engine/internal.h"

namespace ckv::bench {

enum class Kind { kFull, kH2o, kImpress, kCkv };

// `ckv`: the configuration chosen by measurement (docs/baselines.md, "Choosing ckv").
inline constexpr const char* kBestCkv = "ckv:mean-key:period-major:8";

// The token-level baselines identify from keys kept apart from values (the key file).
inline bool NeedsKeyFile(Kind k) { return k == Kind::kH2o || k == Kind::kImpress; }

struct System;
// The engine sessions that score exactly read their keys from a key file of their own
// (scoring_keys.bin, engine::ScoringKeys), as the token-level baselines read theirs.
bool ScoresFromKeys(const System& s);

struct System {
  std::string name;
  Kind kind = Kind::kCkv;
  RecordLayout layout = RecordLayout::kLayerMajor;
  Selector selector = Selector::kPeriodExact;
  uint32_t period = 8;
  bool period_selection = false;  // quest / mean-key scored at period heads only
  bool prefetch = true;
  // The chunks not loaded stand in as virtual tokens (ReprefillOptions::estimate_rest).
  bool estimate = false;
  // The sweep's budgets are target masses (ReprefillOptions::target_mass, no ceiling): each
  // layer loads what its scores say reaches the target.
  bool target = false;
  // With period_selection: every layer also scored, serving its own selection
  // (ReprefillOptions::rescore_layers).
  bool rescore = false;
  // How the records it reads are stored: `@<codec>` in its name, or --codec.
  KvCodec codec = KvCodec::kNone;
  StoreId store() const { return {layout, codec}; }
  // What the table and the JSON say the system does.
  std::string Config(const Flags& f) const;

 private:
  std::string CodecPart() const;  // ", stored int8", or nothing without a codec
};

// `default_codec` (--codec) is the codec of full and the ckv systems whose name has no
// `@<codec>`; h2o and impress keep their own files in the dtype and take none.
absl::StatusOr<System> ParseSystem(const std::string& name, KvCodec default_codec = KvCodec::kNone);

// One request's figures.
struct RequestResult {
  double latency_s = 0;  // on the modelled GPU: wall time less the CPU work taken out
  double wall_s = 0;     // as measured here
  double scoring_s = 0;  // selection (and the baselines' host gathers) on this CPU
  double blocked_s = 0;  // the compute stream waiting for data (bubbles)
  uint64_t bytes_needed = 0;
  uint64_t bytes_read = 0;
  uint64_t h2d_bytes = 0;  // bytes that crossed PCIe (from the CPU tier or NVMe)
  uint64_t gpu_hits = 0, cpu_hits = 0, nvme_records = 0;
  uint64_t wasted_prefetch_bytes = 0;
  uint32_t fallback_layers = 0;  // impress: layers whose probe heads disagreed (Jaccard gate)
  // Per layer: the chunks whose records the system loaded and
  std::vector<std::vector<uint32_t>> loaded;
  // the tokens its attention used, sorted; empty for a layer when it attends to every token of
  // its loaded chunks (chunk-level systems). Recall and output error count these only.
  std::vector<std::vector<uint32_t>> attended;
  // Per layer, with an estimate: the chunks its attention also took as virtual tokens (the
  // fidelity rebuilds them from the records, as kernels::VirtualTokensOf makes them), and, for a
  // runner's first measured request of a run the fidelity measures (RunContext::check_served),
  // the virtual tokens themselves, which the fidelity checks against its rebuild. Holding every
  // request's tokens until the run ends would put a harness's page faults (50 MB per request at
  // 10%) on the requests' clocks; one request in the first round still carries them.
  std::vector<std::vector<uint32_t>> estimated;
  std::vector<VirtualTokens> virtual_tokens;
};

// The baselines' tiers and history across the requests of one run: a TierManager with the
// original's policy, and the original's own counters.
struct BaselineState {
  std::unique_ptr<engine::TierManager> tiers;
  std::atomic<uint64_t> tick{1};
  absl::Mutex mu;
  std::map<ChunkKey, uint64_t> freq;  // impress: requests that loaded the chunk's block
  // impress: per conversation, its layout (mapping list) and accumulated importance.
  std::map<uint32_t, std::shared_ptr<void>> impress;
  std::shared_ptr<void> impress_counters;  // impress: its reorders' cost
  uint64_t reordered_bytes = 0;  // impress: bytes its reorders rewrote, over the run (under mu)
};

// What every system run sees.
struct RunContext {
  const Workload* w = nullptr;
  const System* sys = nullptr;
  ModelSpec spec;  // the store's, as `sys` reads it: WithCodec(w->spec(), sys->codec)
  double budget = 0;
  // The fidelity measures this run (its first round, with --fidelity): a runner keeps the
  // virtual tokens its first measured request was served, for the fidelity to check.
  bool check_served = false;
  Engine* engine = nullptr;
  prefetch::ReadEngine* reads = nullptr;
  prefetch::FileId key_file = 0;
  prefetch::FileId impress_file = 0;  // impress.bin, registered with `reads`
  io::File* impress_io = nullptr;     // the same file, for the between-turns rewrites
  prefetch::FileId value_file = 0;    // values.bin (h2o), registered with `reads`
  // The checksums of keys.bin, of impress.bin in token order and of values.bin (store.h),
  // verified on every read.
  const std::vector<uint64_t>* key_sums = nullptr;
  const std::vector<uint64_t>* impress_sums = nullptr;
  const std::vector<uint64_t>* value_sums = nullptr;
  ModelledGpu* gpu = nullptr;
  ScoringClock* clock = nullptr;
  BaselineState* state = nullptr;
  Arch arch;
  // The modelled compute of one layer over `context_tokens` loaded tokens.
  double LayerSeconds(size_t context_tokens) const;
};

// A system's request runner: one per worker thread, owning its reusable buffers (allocated
// before timing starts).
class SystemRunner {
 public:
  virtual ~SystemRunner() = default;
  virtual absl::StatusOr<RequestResult> Run(const Request& r,
                                            const std::vector<std::vector<float>>& queries) = 0;
  // Called after each request, outside its latency (between turns).
  virtual absl::Status AfterRequest(const Request&, const RequestResult&) {
    return absl::OkStatus();
  }
  // Called once the run's requests are done, before the runner goes.
  virtual absl::Status Finish() { return absl::OkStatus(); }
};

std::unique_ptr<SystemRunner> MakeCkvRunner(const RunContext& ctx);
// The key source of scoring_keys.bin (registered with `reads` as `file`; `sums` its checksums,
// not owned) for the chunks of every conversation of `w`.
std::unique_ptr<engine::ScoringKeys> MakeScoringKeys(const Workload& w, prefetch::FileId file,
                                                     const std::vector<uint64_t>* sums);
std::unique_ptr<SystemRunner> MakeFullRunner(const RunContext& ctx);
std::unique_ptr<SystemRunner> MakeH2oRunner(const RunContext& ctx);
std::unique_ptr<SystemRunner> MakeImpressRunner(const RunContext& ctx);
inline std::unique_ptr<SystemRunner> MakeRunner(const RunContext& ctx) {
  switch (ctx.sys->kind) {
    case Kind::kFull:
      return MakeFullRunner(ctx);
    case Kind::kH2o:
      return MakeH2oRunner(ctx);
    case Kind::kImpress:
      return MakeImpressRunner(ctx);
    case Kind::kCkv:
      break;
  }
  return MakeCkvRunner(ctx);
}

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_SYSTEMS_H_
