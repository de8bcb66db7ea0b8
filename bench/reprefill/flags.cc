// SPDX-License-Identifier: Apache-2.0
#include "bench/reprefill/flags.h"

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/cli.h"

namespace ckv::bench {
namespace {

constexpr const char* kSystemsHelp =
    "Systems: full, h2o, impress, ckv-paper, ckv, ckv-est (ckv with the chunks not loaded\n"
    "  estimated), or a ckv variant\n"
    "  "
    "ckv:<selector>:<layer-major|period-major>[:<period>][:noprefetch][:estimate][:target][:"
    "rescore]\n"
    "  (selector: period-exact, quest, mean-key, outlier-key, oracle; a period makes quest,\n"
    "  mean-key and outlier-key score each period's head only and share its selection;\n"
    "  :target reads each budget as\n"
    "  a target mass, ReprefillOptions::target_mass; :rescore has each layer of a period\n"
    "  scored and served its own selection beside the head's, ReprefillOptions::rescore_layers).\n"
    "recompute (the modelled prefill of the whole prefix, no cache) is always reported.";

// A comma-separated list, each element checked by `add` (which throws CLI::ValidationError
// naming the element).
CLI::Option* AddList(CLI::App& app, const std::string& name, const std::string& help,
                     std::function<void()> clear, std::function<void(const std::string&)> add) {
  return cli::AddParsed(app, name, help, "A,B,...", "a list", [clear, add](const std::string& v) {
    clear();
    for (absl::string_view s : absl::StrSplit(v, ',')) add(std::string(s));
    return true;
  });
}

// The workload and the systems: what is stored and what runs against it.
void AddWorkloadFlags(CLI::App& app, Flags* f) {
  app.add_option("--store", f->store,
                 "store directory, reused when it matches (default "
                 "ckv-bench-store)")
      ->type_name("DIR");
  app.add_option("--model", f->model, "model preset (default qwen2.5-7b)")->type_name("PRESET");
  cli::AddUint(app, "--prefix-tokens", &f->prefix_tokens,
               "stored prefix per conversation "
               "(default 8192, >= 16)");
  cli::AddUint(app, "--suffix-tokens", &f->suffix_tokens, "new tokens per turn (default 64)");
  cli::AddUint(app, "--conversations", &f->conversations, "conversations (default 8)");
  cli::AddUint(app, "--turns", &f->turns, "turns per conversation (default 4)");
  cli::AddUint(app, "--warmup-turns", &f->warmup_turns, "turns not measured (default 1)");
  cli::AddDouble(app, "--system-prompt-share", &f->system_prompt_share,
                 "share of the prefix all conversations have in common, [0, 1] (default 0)");
  cli::AddUint(app, "--concurrency", &f->concurrency, "requests at once (default 1)");
  AddList(
      app, "--budgets",
      "budgets in percent of the chunks, each in (0, 100] "
      "(default 2,5,10,25,50,75,90: far enough for an output error of 0.1)",
      [f] { f->budgets.clear(); },
      [f](const std::string& s) {
        double b = 0;
        if (!cli::ParseDouble(s, &b) || !(b > 0 && b <= 100)) {
          throw CLI::ValidationError("--budgets: '" + s + "' is not a percentage in (0, 100]");
        }
        f->budgets.push_back(b / 100);
      });
  AddList(
      app, "--systems",
      "systems to run (default full,h2o,impress,ckv-paper,ckv); full and the ckv systems "
      "take a codec as a suffix (full@int8, ckv@fp8) and read a store kept with it",
      [f] { f->systems.clear(); }, [f](const std::string& s) { f->systems.push_back(s); });
  cli::AddUint(app, "--window", &f->window, "suffix queries scored per layer (default 32)");
  cli::AddUint(app, "--seed", &f->seed, "workload seed (default 1)", "S");
  app.add_option("--attention-profile", f->attention_profile,
                 "calibrated (default), planted-chunks, or trained-tiny (a trained network's "
                 "KV and queries from --profile-file; docs/generator.md)")
      ->type_name("P");
  app.add_option("--profile-file", f->profile_file,
                 "the safetensors profile of --attention-profile trained-tiny; it sets the model, "
                 "prefix and suffix tokens, conversations, turns and window")
      ->type_name("PATH");
  cli::AddParsed(app, "--request-shift", "the generator's request shift, [0, 1]", "F",
                 "a number in [0, 1]", [f](const std::string& v) {
                   return cli::ParseDouble(v, &f->request_shift) && f->request_shift >= 0 &&
                          f->request_shift <= 1;
                 });
  cli::AddParsed(app, "--head-agreement",
                 "the generator's agreement of the q heads of a GQA group: the top-5% Jaccard "
                 "it aims at, [0, 1] (default 0.7; docs/generator.md)",
                 "F", "a number in [0, 1]", [f](const std::string& v) {
                   return cli::ParseDouble(v, &f->head_agreement) && f->head_agreement >= 0 &&
                          f->head_agreement <= 1;
                 });
  cli::AddChoice(app, "--codec", &f->codec, {"none", "fp8", "int8", "int4"},
                 "how full and the ckv systems whose name has no @<codec> read their records: "
                 "none (the dtype, default), fp8, int8 or int4 (ckv/codec.h)");
  cli::AddChoice(app, "--impress-probes", &f->impress_probes, {"group", "spread"},
                 "impress's probe heads: group (default) or spread");
  cli::AddChoice(app, "--impress-gate", &f->impress_gate, {"expected-jaccard", "budget"},
                 "impress's gate threshold t = j^0.6: j = r/(2-r), the expected Jaccard of "
                 "random top-k at budget r (default), or j = r");
  cli::AddUint(app, "--impress-reorder-passes", &f->impress_reorder_passes,
               "impress: most passes over the warm-up requests to let reordering converge "
               "(default 8)");
}

// Tiers, the modelled GPU, and what is measured and written.
void AddRunFlags(CLI::App& app, Flags* f) {
  cli::AddBytes(app, "--gpu-tier-bytes", &f->gpu_tier_bytes, "GPU tier of 'default' (64M)");
  cli::AddBytes(app, "--cpu-tier-bytes", &f->cpu_tier_bytes, "CPU tier of 'default' (192M)");
  AddList(
      app, "--tiers", "tier configurations: default, cold, large (default: default)",
      [f] { f->tiers.clear(); },
      [f](const std::string& s) {
        if (s != "cold" && s != "default" && s != "large") {
          throw CLI::ValidationError("--tiers: '" + s + "' is not one of cold, default, large");
        }
        f->tiers.push_back(s);
      });
  cli::AddDouble(app, "--gpu-tflops", &f->gpu_tflops, "modelled GPU throughput (default 156)");
  cli::AddDouble(app, "--hbm-gb-s", &f->hbm_gb_s, "modelled HBM bandwidth (default 1630)");
  cli::AddDouble(app, "--launch-us", &f->launch_us, "kernel launches per layer (default 40)");
  cli::AddDouble(app, "--pcie-gb-s", &f->pcie_gb_s, "host to device bandwidth (default 25)");
  cli::AddUint(app, "--rounds", &f->rounds, "rounds, in shuffled order (default 5)");
  app.add_flag("--fidelity", f->fidelity, "measure attention recall and output error");
  app.add_option("--compare", f->compare,
                 "the system the comparison tables set against the others (default: ckv when "
                 "run, else the first ckv variant)")
      ->type_name("SYSTEM");
  cli::AddUint(app, "--fidelity-requests", &f->fidelity_requests,
               "distinct measured requests whose fidelity is measured, 0 for every one "
               "(default 0)");
  app.add_flag("--no-fio{false}", f->fio, "do not run fio beside each row");
  cli::AddDouble(app, "--fio-seconds", &f->fio_seconds, "seconds per fio run (default 3)");
  cli::AddJson(app, &f->json);
  app.add_option("--plot", f->plot, "draw latency against output error with gnuplot")
      ->type_name("FILE.png");
}

}  // namespace

std::optional<int> ParseFlags(int argc, char** argv, Flags* f) {
  CLI::App app{"The Re-Prefill benchmark: ckv against its baselines (docs/baselines.md).", kProg};
  cli::Configure(app, kSystemsHelp);
  AddWorkloadFlags(app, f);
  AddRunFlags(app, f);
  if (const std::optional<int> exit = cli::Parse(app, argc, argv)) return exit;
  for (const CLI::Option* o : app.get_options()) {
    if (o->count() > 0 && !o->get_lnames().empty()) f->given.insert("--" + o->get_lnames()[0]);
  }
  if (f->prefix_tokens < 16 || f->turns < 1 || f->conversations < 1 || f->concurrency < 1 ||
      f->warmup_turns >= f->turns || f->window < 1 || f->suffix_tokens < 1 || f->rounds < 1 ||
      !(f->system_prompt_share >= 0 && f->system_prompt_share <= 1) || !(f->gpu_tflops > 0) ||
      !(f->hbm_gb_s > 0) || !(f->pcie_gb_s > 0) || !(f->launch_us >= 0)) {
    return cli::UsageError(
        kProg, absl::StrCat(
                   "need prefix-tokens >= 16 (got ", f->prefix_tokens, "), turns >= 1 (", f->turns,
                   "), warmup-turns < turns (", f->warmup_turns, "), rounds >= 1 (", f->rounds,
                   "), conversations >= 1, concurrency >= 1, window >= 1, suffix-tokens >= 1, "
                   "system-prompt-share in [0, 1], gpu-tflops, hbm-gb-s and pcie-gb-s > 0, "
                   "launch-us >= 0"));
  }
  if (f->budgets.empty() || f->systems.empty() || f->tiers.empty()) {
    return cli::UsageError(kProg, "--budgets, --systems and --tiers must not be empty");
  }
  return std::nullopt;
}

std::vector<TierConfig> TierConfigs(const Flags& f, uint64_t store_bytes) {
  std::vector<TierConfig> out;
  for (const std::string& name : f.tiers) {
    if (name == "cold")
      out.push_back({name, 0, 0});
    else if (name == "large")
      out.push_back({name, store_bytes + (64ull << 20), store_bytes + (64ull << 20)});
    else
      out.push_back({name, f.gpu_tier_bytes, f.cpu_tier_bytes});
  }
  return out;
}

}  // namespace ckv::bench
