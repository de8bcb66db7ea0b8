// SPDX-License-Identifier: Apache-2.0
#include "bench/reprefill/systems.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ckv/status.h"

namespace ckv::bench {

bool ScoresFromKeys(const System& s) {
  return s.kind == Kind::kCkv &&
         (s.selector == Selector::kPeriodExact || s.selector == Selector::kOracle);
}

absl::StatusOr<System> ParseSystem(const std::string& name) {
  System s;
  s.name = name;
  if (name == "full") { s.kind = Kind::kFull; return s; }
  if (name == "h2o") { s.kind = Kind::kH2o; return s; }
  if (name == "impress") { s.kind = Kind::kImpress; return s; }
  if (name == "ckv-paper") {
    // ContiguousKV as published: c = 16, p = 8, period-exact, intra- and inter-period prefetch.
    s.selector = Selector::kPeriodExact;
    s.layout = RecordLayout::kLayerMajor;
    return s;
  }
  // ckv, our best configuration (docs/baselines.md, "Choosing ckv"); ckv-est, the same with the
  // chunks not loaded estimated.
  std::string spec = name == "ckv"       ? std::string(kBestCkv)
                     : name == "ckv-est" ? absl::StrCat(kBestCkv, ":estimate")
                                         : name;
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  if (parts.size() < 3 || parts[0] != "ckv") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown system '", name,
        "' (full, h2o, impress, ckv-paper, ckv, ckv-est, "
        "ckv:<selector>:<layout>[:<period>][:noprefetch][:estimate][:target][:rescore])"));
  }
  CKV_ASSIGN_OR_RETURN(s.selector, ParseSelector(parts[1]));
  if (parts[2] == "layer-major") s.layout = RecordLayout::kLayerMajor;
  else if (parts[2] == "period-major") s.layout = RecordLayout::kPeriodMajor;
  else return absl::InvalidArgumentError(absl::StrCat("system ", name, ": unknown layout ", parts[2]));
  for (size_t i = 3; i < parts.size(); ++i) {
    if (parts[i] == "noprefetch") s.prefetch = false;
    else if (parts[i] == "estimate") s.estimate = true;
    else if (parts[i] == "target") s.target = true;
    else if (parts[i] == "rescore") s.rescore = true;
    else if (!absl::SimpleAtoi(parts[i], &s.period) || s.period < 1) {
      return absl::InvalidArgumentError(absl::StrCat("system ", name, ": bad part ", parts[i]));
    } else {
      s.period_selection = s.selector == Selector::kQuest || s.selector == Selector::kMeanKey;
    }
  }
  if (s.rescore && !s.period_selection) {
    return absl::InvalidArgumentError(absl::StrCat(
        "system ", name, ": rescore needs quest or mean-key with a period (ckv:mean-key:"
        "period-major:8:rescore)"));
  }
  return s;
}

std::string System::Config(const Flags& f) const {
  switch (kind) {
    case Kind::kFull:
      return "all chunks, layer-major records, next-layer preload, LRU tiers";
    case Kind::kH2o:
      return "all keys + selected tokens' values, next-layer key preload, LRU tiers";
    case Kind::kImpress:
      return absl::StrCat("3 probe heads (", f.impress_probes,
                          ") gate, every q head of their keys scores, Jaccard fallback (",
                          f.impress_gate, "), 64-token blocks, reordering to convergence, "
                          "next-layer probe key preload, freq x share tiers");
    case Kind::kCkv: break;
  }
  return absl::StrCat(std::string(SelectorName(selector)), ", ",
                      layout == RecordLayout::kLayerMajor ? "layer-major" : "period-major",
                      selector == Selector::kPeriodExact || period_selection
                          ? absl::StrCat(", one selection per ", period, " layers",
                                         rescore ? " prefetched, each layer's own served beside it" : "")
                          : ", every layer scored",
                      prefetch ? ", prefetch" : ", no prefetch",
                      estimate ? ", the rest estimated" : "",
                      target ? ", budgets read as target masses" : "", ", S=IxF tiers");
}

double RunContext::LayerSeconds(size_t context_tokens) const {
  return bench::LayerSeconds(w->spec(), arch, gpu->params(), w->flags().suffix_tokens,
                             double(context_tokens));
}

}  // namespace ckv::bench
