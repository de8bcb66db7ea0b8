#include "bench/reprefill/flags.h"

#include <cstdlib>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ckv::bench {
namespace {

bool ParseBytes(std::string_view s, uint64_t* out) {
  uint64_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K': case 'k': mult = 1ull << 10; break;
      case 'M': case 'm': mult = 1ull << 20; break;
      case 'G': case 'g': mult = 1ull << 30; break;
      default: break;
    }
    if (mult != 1) s.remove_suffix(1);
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(std::string(s), &v) || v > (~0ull) / mult) return false;
  *out = v * mult;
  return true;
}

}  // namespace

void Usage(FILE* out) {
  std::fprintf(
      out,
      "Usage: reprefill_bench [--store DIR] [--model qwen2.5-7b] [--prefix-tokens 8192]\n"
      "                       [--suffix-tokens 64] [--conversations 8] [--turns 4]\n"
      "                       [--warmup-turns 1] [--system-prompt-share 0] [--concurrency 1]\n"
      "                       [--budgets 2,5,10,15,25,50]\n"
      "                       [--systems full,h2o,impress,ckv-paper,ckv]\n"
      "                       [--gpu-tier-bytes 64M] [--cpu-tier-bytes 192M]\n"
      "                       [--tiers default[,cold,large]] [--window 32] [--seed 1]\n"
      "                       [--attention-profile calibrated|planted-chunks]\n"
      "                       [--request-shift F] [--impress-probes group|spread]\n"
      "                       [--gpu-tflops 156] [--hbm-gb-s 1630] [--launch-us 40]\n"
      "                       [--pcie-gb-s 25] [--rounds 5] [--fidelity]\n"
      "                       [--fidelity-requests 4] [--no-fio] [--fio-seconds 3]\n"
      "                       [--json FILE] [--plot FILE.png]\n"
      "Systems: full, h2o, impress, ckv-paper, ckv, or a ckv variant\n"
      "  ckv:<selector>:<layer-major|period-major>[:<period>][:noprefetch]\n"
      "  (selector: period-exact, quest, mean-key, oracle; period > 1 shares a selection\n"
      "  over a period only for period-exact).\n"
      "recompute (the modelled prefill of the whole prefix, no cache) is always reported.\n");
}

absl::Status ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      Usage(stdout);
      std::exit(0);
    }
    if (a == "--fidelity") { f->fidelity = true; continue; }
    if (a == "--no-fio") { f->fio = false; continue; }
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(a, " needs a value"));
    const std::string v = argv[++i];
    bool ok = true;
    if (a == "--store") f->store = v;
    else if (a == "--model") f->model = v;
    else if (a == "--prefix-tokens") ok = absl::SimpleAtoi(v, &f->prefix_tokens);
    else if (a == "--suffix-tokens") ok = absl::SimpleAtoi(v, &f->suffix_tokens);
    else if (a == "--conversations") ok = absl::SimpleAtoi(v, &f->conversations);
    else if (a == "--turns") ok = absl::SimpleAtoi(v, &f->turns);
    else if (a == "--warmup-turns") ok = absl::SimpleAtoi(v, &f->warmup_turns);
    else if (a == "--system-prompt-share") ok = absl::SimpleAtod(v, &f->system_prompt_share);
    else if (a == "--concurrency") ok = absl::SimpleAtoi(v, &f->concurrency);
    else if (a == "--gpu-tier-bytes") ok = ParseBytes(v, &f->gpu_tier_bytes);
    else if (a == "--cpu-tier-bytes") ok = ParseBytes(v, &f->cpu_tier_bytes);
    else if (a == "--window") ok = absl::SimpleAtoi(v, &f->window);
    else if (a == "--gpu-tflops") ok = absl::SimpleAtod(v, &f->gpu_tflops);
    else if (a == "--hbm-gb-s") ok = absl::SimpleAtod(v, &f->hbm_gb_s);
    else if (a == "--launch-us") ok = absl::SimpleAtod(v, &f->launch_us);
    else if (a == "--pcie-gb-s") ok = absl::SimpleAtod(v, &f->pcie_gb_s);
    else if (a == "--seed") ok = absl::SimpleAtoi(v, &f->seed);
    else if (a == "--rounds") ok = absl::SimpleAtoi(v, &f->rounds);
    else if (a == "--attention-profile") f->attention_profile = v;
    else if (a == "--request-shift") ok = absl::SimpleAtod(v, &f->request_shift) && f->request_shift >= 0 && f->request_shift <= 1;
    else if (a == "--impress-probes") {
      f->impress_probes = v;
      ok = v == "group" || v == "spread";
    }
    else if (a == "--fidelity-requests") ok = absl::SimpleAtoi(v, &f->fidelity_requests);
    else if (a == "--fio-seconds") ok = absl::SimpleAtod(v, &f->fio_seconds);
    else if (a == "--json") f->json = v;
    else if (a == "--plot") f->plot = v;
    else if (a == "--budgets") {
      f->budgets.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        double b = 0;
        if (!absl::SimpleAtod(s, &b) || !(b > 0 && b <= 100)) {
          return absl::InvalidArgumentError(
              absl::StrCat("--budgets: '", std::string(s), "' is not a percentage in (0, 100]"));
        }
        f->budgets.push_back(b / 100);
      }
    } else if (a == "--systems") {
      f->systems.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) f->systems.emplace_back(s);
    } else if (a == "--tiers") {
      f->tiers.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        if (s != "cold" && s != "default" && s != "large") {
          return absl::InvalidArgumentError(absl::StrCat(
              "--tiers: '", std::string(s), "' is not one of cold, default, large"));
        }
        f->tiers.emplace_back(s);
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat(a, ": bad value '", v, "'"));
  }
  if (f->prefix_tokens < 16 || f->turns < 1 || f->conversations < 1 || f->concurrency < 1 ||
      f->warmup_turns >= f->turns || f->window < 1 || f->suffix_tokens < 1 || f->rounds < 1 ||
      !(f->system_prompt_share >= 0 && f->system_prompt_share <= 1) || !(f->gpu_tflops > 0) ||
      !(f->hbm_gb_s > 0) || !(f->pcie_gb_s > 0) || !(f->launch_us >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "need prefix-tokens >= 16 (got ", f->prefix_tokens, "), turns >= 1 (", f->turns,
        "), warmup-turns < turns (", f->warmup_turns, "), rounds >= 1 (", f->rounds,
        "), conversations >= 1, concurrency >= 1, window >= 1, suffix-tokens >= 1, "
        "system-prompt-share in [0, 1], gpu-tflops, hbm-gb-s and pcie-gb-s > 0, launch-us >= 0"));
  }
  if (f->budgets.empty() || f->systems.empty() || f->tiers.empty()) {
    return absl::InvalidArgumentError("--budgets, --systems and --tiers must not be empty");
  }
  return absl::OkStatus();
}

std::vector<TierConfig> TierConfigs(const Flags& f, uint64_t store_bytes) {
  std::vector<TierConfig> out;
  for (const std::string& name : f.tiers) {
    if (name == "cold") out.push_back({name, 0, 0});
    else if (name == "large") out.push_back({name, store_bytes + (64ull << 20), store_bytes + (64ull << 20)});
    else out.push_back({name, f.gpu_tier_bytes, f.cpu_tier_bytes});
  }
  return out;
}

}  // namespace ckv::bench
