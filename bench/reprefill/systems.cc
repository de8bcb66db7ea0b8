// SPDX-License-Identifier: Apache-2.0
#include "bench/reprefill/systems.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ckv/status.h"
#include "common/status_macros.h"

namespace ckv::bench {

bool ScoresFromKeys(const System& s) {
  // A codec's exact scoring decodes the records' K parts: a key file in the dtype would score
  // keys the store does not hold.
  return s.kind == Kind::kCkv && s.codec == KvCodec::kNone &&
         (s.selector == Selector::kPeriodExact || s.selector == Selector::kOracle);
}

namespace {

absl::StatusOr<System> ParseBase(const std::string& name) {
  System s;
  s.name = name;
  if (name == "full") {
    s.kind = Kind::kFull;
    return s;
  }
  if (name == "h2o") {
    s.kind = Kind::kH2o;
    return s;
  }
  if (name == "impress") {
    s.kind = Kind::kImpress;
    return s;
  }
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
  if (parts[2] == "layer-major")
    s.layout = RecordLayout::kLayerMajor;
  else if (parts[2] == "period-major")
    s.layout = RecordLayout::kPeriodMajor;
  else
    return absl::InvalidArgumentError(absl::StrCat("system ", name, ": unknown layout ", parts[2]));
  for (size_t i = 3; i < parts.size(); ++i) {
    if (parts[i] == "noprefetch")
      s.prefetch = false;
    else if (parts[i] == "estimate")
      s.estimate = true;
    else if (parts[i] == "target")
      s.target = true;
    else if (parts[i] == "rescore")
      s.rescore = true;
    else if (!absl::SimpleAtoi(parts[i], &s.period) || s.period < 1) {
      return absl::InvalidArgumentError(absl::StrCat("system ", name, ": bad part ", parts[i]));
    } else {
      s.period_selection = s.selector == Selector::kQuest || s.selector == Selector::kMeanKey ||
                           s.selector == Selector::kOutlierKey;
    }
  }
  if (s.rescore && !s.period_selection) {
    return absl::InvalidArgumentError(
        absl::StrCat("system ", name,
                     ": rescore needs quest, mean-key or outlier-key with a period "
                     "(ckv:mean-key:period-major:8:rescore)"));
  }
  return s;
}

}  // namespace

absl::StatusOr<System> ParseSystem(const std::string& name, KvCodec default_codec) {
  const size_t at = name.find('@');
  CKV_ASSIGN_OR_RETURN(System s, ParseBase(name.substr(0, at)));
  s.name = name;
  const bool own_files = s.kind == Kind::kH2o || s.kind == Kind::kImpress;
  if (at == std::string::npos) {
    if (!own_files) s.codec = default_codec;
    if (own_files && default_codec != KvCodec::kNone) {
      const std::string codec(KvCodecName(default_codec));
      return absl::InvalidArgumentError(
          absl::StrCat("system ", name,
                       " keeps its own files in the dtype, as its authors store them: it "
                       "takes no codec (--codec ",
                       codec,
                       " applies to full and the ckv systems; name a "
                       "codec per system instead, as full@",
                       codec, ")"));
    }
    return s;
  }
  absl::StatusOr<KvCodec> codec = ParseKvCodec(name.substr(at + 1));
  if (!codec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("system ", name, ": ", codec.status().message()));
  }
  if (own_files) {
    return absl::InvalidArgumentError(absl::StrCat("system ", name, ": ", name.substr(0, at),
                                                   " keeps its own files in the dtype, as its "
                                                   "authors store them; it takes no codec"));
  }
  s.codec = *codec;
  return s;
}

std::string System::Config(const Flags& f) const {
  switch (kind) {
    case Kind::kFull:
      return absl::StrCat("all chunks, layer-major records", CodecPart(),
                          ", next-layer preload, "
                          "LRU tiers");
    case Kind::kH2o:
      return "all keys + selected tokens' values, next-layer key preload, LRU tiers";
    case Kind::kImpress:
      return absl::StrCat("3 probe heads (", f.impress_probes,
                          ") gate, every q head of their keys scores, Jaccard fallback (",
                          f.impress_gate,
                          "), 64-token blocks, reordering to convergence, "
                          "next-layer probe key preload, freq x share tiers");
    case Kind::kCkv:
      break;
  }
  return absl::StrCat(
      std::string(SelectorName(selector)), ", ",
      layout == RecordLayout::kLayerMajor ? "layer-major" : "period-major",
      selector == Selector::kPeriodExact || period_selection
          ? absl::StrCat(", one selection per ", period, " layers",
                         rescore ? " prefetched, each layer's own served beside it" : "")
          : ", every layer scored",
      CodecPart(), prefetch ? ", prefetch" : ", no prefetch",
      estimate ? ", the rest estimated" : "", target ? ", budgets read as target masses" : "",
      ", S=IxF tiers");
}

std::string System::CodecPart() const {
  return codec == KvCodec::kNone ? std::string()
                                 : absl::StrCat(", stored ", std::string(KvCodecName(codec)));
}

double RunContext::LayerSeconds(size_t context_tokens) const {
  return bench::LayerSeconds(spec, arch, gpu->params(), w->flags().suffix_tokens,
                             double(context_tokens));
}

}  // namespace ckv::bench
