// SPDX-License-Identifier: Apache-2.0
// The device check (bench/gpu_check) in its dry run, as the suite runs it on machines without a
// GPU: its JSON has the documented schema, nothing is reported as measured or passed without a
// device, and every modelled figure is the one bench/reprefill/gpu_model.h computes.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "bench/reprefill/flags.h"
#include "bench/reprefill/gpu_model.h"
#include "gtest/gtest.h"
#include "kernels/cuda_kernels.h"
#include "kernels/selector.h"
#include "tests/json_test_util.h"
#include "tests/test_util.h"
#include "tools/json_reader.h"

namespace ckv {
namespace {

#ifdef CKV_GPU_CHECK_PATH

using ::ckv::testing::TempDir;
using tools::JsonValue;

::ckv::testing::ProgramRun RunCheck(const std::string& args) {
  return ::ckv::testing::RunProgram(CKV_GPU_CHECK_PATH, args);
}

using ::ckv::testing::JsonNumber;

bool IsNull(const JsonValue& v, const std::string& key) {
  const JsonValue* x = v.Find(key);
  return x != nullptr && x->IsNull();
}

void ExpectSame(double got, double want, const std::string& what) {
  EXPECT_NEAR(got, want, 1e-9 * std::fabs(want)) << what;
}

// Runs the dry run with `flags` and checks every row against the model with `gpu` on a layer of
// `prefix` and `suffix` tokens.
void CheckDryRun(const std::string& flags, const bench::GpuParams& gpu, double prefix,
                 double suffix) {
  TempDir dir;
  const std::string path = dir.path() + "/gpu_check.json";
  const auto r = RunCheck("--dry-run --json " + path + " " + flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("attention.ctx_100pct"), std::string::npos) << "the table: " << r.output;
  std::ifstream in_file(path);
  const std::string text((std::istreambuf_iterator<char>(in_file)),
                         std::istreambuf_iterator<char>());
  auto json = tools::ParseJson(text);
  ASSERT_TRUE(json.ok()) << json.status() << text;
  EXPECT_EQ(*json->Find("program")->AsString(), "gpu_check");
  EXPECT_EQ(*json->Find("mode")->AsString(), "dry-run");
  EXPECT_TRUE(IsNull(*json, "device"));
  EXPECT_EQ(JsonNumber(*json, "failed"), 0);

  const JsonValue& params = *json->Find("params");
  const std::string model = *params.Find("model")->AsString();
  const ModelSpec spec = *ModelSpec::Preset(model);
  const bench::Arch arch = *bench::ArchOf(model);
  EXPECT_EQ(JsonNumber(params, "prefix_tokens"), prefix);
  EXPECT_EQ(JsonNumber(params, "suffix_tokens"), suffix);
  const double s = JsonNumber(params, "suffix_tokens");
  const size_t chunks =
      static_cast<size_t>(JsonNumber(params, "prefix_tokens")) / spec.chunk_tokens;
  const double qd = double(spec.q_heads) * spec.head_dim;
  EXPECT_EQ(JsonNumber(params, "pcie_gb_s"), gpu.pcie_bytes_per_s / 1e9);
  EXPECT_EQ(JsonNumber(params, "launch_us"), gpu.launch_s * 1e6);

  kernels::SelectorInput in;
  in.shape = kernels::KvShape::Of(spec);
  in.window = static_cast<uint32_t>(JsonNumber(params, "window"));
  in.chunks = chunks;

  const std::set<std::string> checks = {"n/a", "skipped: no device", "skipped: dry run"};
  std::set<std::string> names;
  const JsonValue::Array& rows = *json->Find("rows")->AsArray();
  for (const JsonValue& row : rows) {
    const std::string name = *row.Find("name")->AsString();
    SCOPED_TRACE(name);
    names.insert(name);
    // The schema: the same keys on every row.
    for (const char* key : {"unit", "check", "compared", "detail"}) {
      ASSERT_NE(row.Find(key), nullptr) << key;
      EXPECT_NE(row.Find(key)->AsString(), nullptr) << key;
    }
    for (const char* key : {"modelled", "max_abs_error", "tolerance"}) {
      ASSERT_NE(row.Find(key), nullptr) << key;
      if (!IsNull(row, key)) JsonNumber(row, key);
    }
    ASSERT_NE(row.Find("extra"), nullptr);
    ASSERT_NE(row.Find("extra")->AsObject(), nullptr);
    // Nothing is measured, passed or timed without a device.
    EXPECT_TRUE(IsNull(row, "measured"));
    EXPECT_TRUE(IsNull(row, "ratio"));
    EXPECT_EQ(JsonNumber(row, "reps"), 0);
    EXPECT_TRUE(checks.contains(*row.Find("check")->AsString())) << *row.Find("check")->AsString();
    const double bytes = JsonNumber(row, "bytes");
    const double modelled = IsNull(row, "modelled") ? NAN : JsonNumber(row, "modelled");
    const JsonValue& extra = *row.Find("extra");

    if (name.starts_with("kernels.")) {
      EXPECT_EQ(*row.Find("compared")->AsString(), "cpu scalar vs cpu dispatched");
    }
    if (name == "kernels.quest") {
      ExpectSame(
          modelled,
          kernels::ScoringFlops(kernels::SelectorKind::kQuest, in, {}) / gpu.flops_per_s * 1e3,
          name);
    } else if (name == "kernels.mean_key") {
      ExpectSame(
          modelled,
          kernels::ScoringFlops(kernels::SelectorKind::kMeanKey, in, {}) / gpu.flops_per_s * 1e3,
          name);
    } else if (name == "kernels.token_attention") {
      ExpectSame(modelled,
                 kernels::ScoringFlops(kernels::SelectorKind::kPeriodExact, in, {}) /
                     gpu.flops_per_s * 1e3,
                 name);
    } else if (name == "tier.admit") {
      ExpectSame(modelled, spec.RecordBytes() / gpu.pcie_bytes_per_s * 1e3, name);
    } else if (name.starts_with("pcie.")) {
      ExpectSame(modelled, gpu.pcie_bytes_per_s / 1e9, name);
      ExpectSame(JsonNumber(extra, "modelled_ms"), bytes / gpu.pcie_bytes_per_s * 1e3, name);
      EXPECT_TRUE(IsNull(extra, "measured_ms"));
    } else if (name == "launch.layer") {
      ExpectSame(modelled, gpu.launch_s * 1e3, name);
    } else if (name == "hbm.layer_weights") {
      ExpectSame(bytes, std::floor(bench::LayerWeightBytes(spec, arch)), name);
      ExpectSame(modelled, bench::LayerWeightBytes(spec, arch) / gpu.hbm_bytes_per_s * 1e3, name);
    } else if (name == "model.layer_weight_flops") {
      // 2 FLOPs per weight per token (docs/baselines.md, "Compute model").
      const double weights =
          bench::LayerWeightBytes(spec, arch) / kernels::ElementBytes(spec.dtype);
      ExpectSame(modelled, 2 * s * weights / gpu.flops_per_s * 1e3, name);
    } else if (name.starts_with("attention.")) {
      const double share = std::stod(name.substr(name.find('_') + 1, 3)) / 100;
      kernels::SelectOptions so;
      so.budget_fraction = share;
      const double context =
          static_cast<double>(kernels::BudgetChunks(chunks, so) * spec.chunk_tokens);
      ExpectSame(JsonNumber(extra, "tokens"), context, name);
      ExpectSame(bytes, context / spec.chunk_tokens * spec.RecordBytes(), name);
      // QK^T and AV: 4 FLOPs per q head dimension per (query, key) pair; K and V from HBM.
      const double flops = 4 * s * (context + s) * qd;
      const double kv = (context + s) * spec.TokenBytesPerLayer() * 2;
      ExpectSame(JsonNumber(extra, "modelled_attention_flops_ms"), flops / gpu.flops_per_s * 1e3,
                 name);
      ExpectSame(JsonNumber(extra, "modelled_attention_hbm_ms"), kv / gpu.hbm_bytes_per_s * 1e3,
                 name);
      ExpectSame(modelled, std::max(flops / gpu.flops_per_s, kv / gpu.hbm_bytes_per_s) * 1e3, name);
      const double layer = bench::LayerSeconds(spec, arch, gpu, s, context);
      ExpectSame(JsonNumber(extra, "modelled_layer_ms"), layer * 1e3, name);
      ExpectSame(JsonNumber(extra, "modelled_marginal_ms"),
                 (layer - bench::LayerSeconds(spec, arch, gpu, s, 0)) * 1e3, name);
      ExpectSame(JsonNumber(extra, "modelled_launch_ms"), gpu.launch_s * 1e3, name);
      ExpectSame(JsonNumber(extra, "modelled_pcie_ms"), bytes / gpu.pcie_bytes_per_s * 1e3, name);
    }
  }
  const std::set<std::string> want = {"kernels.quest",
                                      "kernels.mean_key",
                                      "kernels.token_attention",
                                      "kernels.gather",
                                      "tier.admit",
                                      "tier.lookup",
                                      "tier.roundtrip",
                                      "pcie.h2d.record",
                                      "pcie.h2d.layer_005pct",
                                      "pcie.h2d.layer_025pct",
                                      "pcie.h2d.layer_100pct",
                                      "launch.layer",
                                      "hbm.layer_weights",
                                      "model.layer_weight_flops",
                                      "attention.ctx_005pct",
                                      "attention.ctx_010pct",
                                      "attention.ctx_025pct",
                                      "attention.ctx_050pct",
                                      "attention.ctx_100pct"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(names.size(), rows.size()) << "a row name repeats";
}

TEST(GpuCheckTest, DryRunReportsTheModelsFiguresAndMeasuresNothing) {
  const bench::Flags f;
  CheckDryRun("", bench::GpuParams::Of(f), f.prefix_tokens, f.suffix_tokens);
}

TEST(GpuCheckTest, DryRunFollowsTheModelsFlagsAndShape) {
  bench::Flags f;
  f.gpu_tflops = 400;
  f.hbm_gb_s = 3000;
  f.launch_us = 12;
  f.pcie_gb_s = 50;
  // A smaller layer too, so that the figures are seen to follow the shape as well.
  CheckDryRun(
      "--gpu-tflops 400 --hbm-gb-s 3000 --launch-us 12 --pcie-gb-s 50 "
      "--prefix-tokens 2048 --suffix-tokens 32",
      bench::GpuParams::Of(f), 2048, 32);
}

TEST(GpuCheckTest, WithoutADeviceItExitsTwoNamingTheReason) {
  const absl::Status device = kernels::cuda::DeviceAvailable();
  if (device.ok()) GTEST_SKIP() << "a CUDA device is present";
  const auto r = RunCheck("--budget-s 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(std::string(device.message())), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("DeviceAvailable"), std::string::npos) << r.output;
}

#endif  // CKV_GPU_CHECK_PATH

}  // namespace
}  // namespace ckv
