// SPDX-License-Identifier: Apache-2.0
// bench/reprefill/flags.h: the command line of reprefill_bench.
#ifndef CKV_BENCH_REPREFILL_FLAGS_H_
#define CKV_BENCH_REPREFILL_FLAGS_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tools/cli.h"

namespace ckv::bench {

inline constexpr int kExitUsage = cli::kExitUsage;
inline constexpr const char* kProg = "reprefill_bench";

// A named pair of tier budgets that the whole sweep runs under.
struct TierConfig {
  std::string name;  // "cold", "default", "large"
  uint64_t gpu_bytes = 0;
  uint64_t cpu_bytes = 0;
};

struct Flags {
  std::string store = "ckv-bench-store";
  std::string model = "qwen2.5-7b";
  uint32_t prefix_tokens = 8192;
  uint32_t suffix_tokens = 64;
  uint32_t conversations = 8;
  uint32_t turns = 4;
  uint32_t warmup_turns = 1;
  double system_prompt_share = 0;
  uint32_t concurrency = 1;
  std::vector<double> budgets = {0.02, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90};
  std::vector<std::string> systems = {"full", "h2o", "impress", "ckv-paper", "ckv"};
  // The system the comparison tables measure against the rest; empty: ckv when run, else the
  // first ckv variant.
  std::string compare;
  uint64_t gpu_tier_bytes = 64ull << 20;
  uint64_t cpu_tier_bytes = 192ull << 20;
  // Tier configurations to run: "cold" (both 0), "default" (the two flags above), "large"
  // (each tier larger than the whole store).
  std::vector<std::string> tiers = {"default"};
  uint32_t window = 32;
  uint64_t seed = 1;
  // The synthetic attention (tools/synthetic_attention.h), or kTrainedProfile: a trained
  // network's, read from `profile_file` (tools/attention_profile_file.h).
  std::string attention_profile = "calibrated";
  std::string profile_file;
  double request_shift = -1;  // < 0: the generator's default
  // The generator's head agreement: the top-5% Jaccard of q heads of one GQA group it aims at
  // (CalibratedShape::head_agreement). < 0: the generator's default.
  double head_agreement = -1;
  // The modelled GPU (docs/baselines.md, "Compute model"): an A800 80GB SXM.
  double gpu_tflops = 156;  // bf16 dense: 312 TFLOPS peak at 50%
  double hbm_gb_s = 1630;   // 2039 GB/s peak at 80%
  double launch_us = 40;    // kernel launches per decoder layer
  double pcie_gb_s = 25;    // host to device, PCIe 4.0 x16 (32 GB/s peak)
  // impress's probe heads: "group" (3 q heads of one GQA group: one kv head's keys) or "spread"
  // (one q head in each of 3 groups).
  std::string impress_probes = "group";
  // impress's gate threshold t = j^0.6: "expected-jaccard", j = r / (2 - r), the expected
  // Jaccard of two random top-k sets of share r (0.111 at 5%); or "budget", j = r (0.166 at 5%).
  std::string impress_gate = "expected-jaccard";
  // How full and the ckv systems without `@<codec>` in their name read their records
  // (ckv/codec.h): none (the dtype), fp8, int8 or int4.
  std::string codec = "none";
  // impress: passes over the warm-up requests until reordering rewrites nothing (at most this
  // many), so that the measured requests meet a converged layout.
  uint32_t impress_reorder_passes = 8;
  uint32_t rounds = 5;
  bool fidelity = false;
  uint32_t fidelity_requests = 0;  // 0: every distinct measured request
  bool fio = true;
  double fio_seconds = 3;
  cli::JsonOutput json;  // --json [PATH]: the rows as JSON (tools/cli.h)
  std::string plot;
  // The flags given on the command line (by long name, e.g. "--turns"), so that a profile file
  // can tell the values it sets from flags that contradict it.
  std::set<std::string> given;
};

// The attention profile whose KV and queries come from --profile-file.
inline constexpr const char* kTrainedProfile = "trained-tiny";

// Parses argv into *f (tools/cli.h). Returns the exit code when the program should stop: 0
// after --help or --version, kExitUsage after printing a usage error.
std::optional<int> ParseFlags(int argc, char** argv, Flags* f);
// The tier configurations named by f.tiers; `store_bytes` sizes "large".
std::vector<TierConfig> TierConfigs(const Flags& f, uint64_t store_bytes);

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_FLAGS_H_
