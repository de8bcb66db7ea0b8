// SPDX-License-Identifier: Apache-2.0
// Tests of ckv/model_spec.h: presets, validation, fingerprint, sizes.
#include "ckv/model_spec.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckv {
namespace {

using ::testing::HasSubstr;

ModelSpec Spec(const char* preset, DType dtype = DType::kFp16, uint32_t c = 16) {
  absl::StatusOr<ModelSpec> spec = ModelSpec::Preset(preset, dtype, c);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : ModelSpec{};
}

TEST(DTypeTest, BytesNamesAndParsing) {
  EXPECT_EQ(DTypeBytes(DType::kFp16), 2u);
  EXPECT_EQ(DTypeBytes(DType::kBf16), 2u);
  EXPECT_EQ(DTypeBytes(DType::kFp32), 4u);
  for (DType d : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(*ParseDType("float16"), DType::kFp16);
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBf16);
  EXPECT_EQ(*ParseDType("float32"), DType::kFp32);
  absl::StatusOr<DType> bad = ParseDType("int8");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("int8"));
  EXPECT_EQ(ParseDType("").status().code(), absl::StatusCode::kInvalidArgument);
}

// The shapes and sizes of DESIGN.md ("Model shapes").
TEST(ModelSpecTest, PresetsMatchDesign) {
  struct Row {
    const char* name;
    uint32_t layers, q_heads, kv_heads, head_dim;
    size_t kv_bytes_per_token, record_bytes;
  };
  const Row rows[] = {
      {"qwen2.5-0.5b", 24, 14, 2, 64, 12 << 10, 8 << 10},
      {"qwen2.5-7b", 28, 28, 4, 128, 56 << 10, 32 << 10},
      {"qwen2.5-14b", 48, 40, 8, 128, 192 << 10, 64 << 10},
      {"qwen2.5-32b", 64, 40, 8, 128, 256 << 10, 64 << 10},
  };
  std::vector<std::string> names;
  for (const Row& r : rows) {
    names.push_back(r.name);
    SCOPED_TRACE(r.name);
    const ModelSpec spec = Spec(r.name);
    EXPECT_EQ(spec.model_id, r.name);
    EXPECT_EQ(spec.layers, r.layers);
    EXPECT_EQ(spec.q_heads, r.q_heads);
    EXPECT_EQ(spec.kv_heads, r.kv_heads);
    EXPECT_EQ(spec.head_dim, r.head_dim);
    EXPECT_EQ(spec.dtype, DType::kFp16);
    EXPECT_EQ(spec.chunk_tokens, 16u);
    EXPECT_EQ(spec.TokenBytesPerLayer(), size_t{r.kv_heads} * r.head_dim * 2);
    EXPECT_EQ(spec.KvBytesPerToken(), r.kv_bytes_per_token);
    EXPECT_EQ(spec.RecordBytes(), r.record_bytes);
    EXPECT_TRUE(spec.Validate().ok());
  }
  EXPECT_EQ(ModelSpec::PresetNames(), names);
}

TEST(ModelSpecTest, PresetTakesDtypeAndChunkSize) {
  const ModelSpec spec = Spec("qwen2.5-7b", DType::kFp32, 64);
  EXPECT_EQ(spec.dtype, DType::kFp32);
  EXPECT_EQ(spec.chunk_tokens, 64u);
  EXPECT_EQ(spec.RecordBytes(), size_t{2} * 64 * 4 * 128 * 4);
  EXPECT_EQ(Spec("qwen2.5-0.5b", DType::kBf16).RecordBytes(), size_t{8} << 10);
}

TEST(ModelSpecTest, PresetRejectsUnknownNameAndBadChunkSize) {
  absl::StatusOr<ModelSpec> unknown = ModelSpec::Preset("llama-7b");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("llama-7b"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("qwen2.5-7b"));  // lists the known ones

  absl::StatusOr<ModelSpec> zero_c = ModelSpec::Preset("qwen2.5-7b", DType::kFp16, 0);
  EXPECT_EQ(zero_c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero_c.status().message(), HasSubstr("chunk_tokens = 0"));
}

TEST(ModelSpecTest, DebugString) {
  EXPECT_EQ(Spec("qwen2.5-7b").DebugString(),
            "qwen2.5-7b (28 layers, 28 q heads, 4 kv heads, head dim 128, fp16, c=16)");
  EXPECT_EQ(Spec("qwen2.5-0.5b", DType::kBf16, 32).DebugString(),
            "qwen2.5-0.5b (24 layers, 14 q heads, 2 kv heads, head dim 64, bf16, c=32)");
}

// Every field at each end of its range, and one step past it.
TEST(ModelSpecTest, ValidateRanges) {
  struct Case {
    const char* field;
    uint32_t ModelSpec::*member;
    uint32_t max;
  };
  const Case cases[] = {
      {"layers", &ModelSpec::layers, 1024},
      {"kv_heads", &ModelSpec::kv_heads, 1024},
      {"head_dim", &ModelSpec::head_dim, 4096},
      {"chunk_tokens", &ModelSpec::chunk_tokens, 4096},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    ModelSpec spec = Spec("qwen2.5-7b");
    spec.q_heads = 1024;  // keeps q_heads a multiple of any power-of-two kv_heads below
    spec.*c.member = 1;
    EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();
    spec.*c.member = c.max;
    if (c.member == &ModelSpec::kv_heads) spec.q_heads = c.max;
    EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();

    spec.*c.member = 0;
    absl::Status zero = spec.Validate();
    EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(zero.message(), HasSubstr(std::string("ModelSpec.") + c.field + " = 0"));
    EXPECT_THAT(zero.message(), HasSubstr("1.." + std::to_string(c.max)));

    spec.*c.member = c.max + 1;
    absl::Status over = spec.Validate();
    EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(over.message(),
                HasSubstr(std::string("ModelSpec.") + c.field + " = " + std::to_string(c.max + 1)));
  }
}

TEST(ModelSpecTest, ValidateMessageFormat) {
  ModelSpec spec = Spec("qwen2.5-7b");
  spec.kv_heads = 0;
  EXPECT_EQ(spec.Validate(),
            absl::InvalidArgumentError("ModelSpec.kv_heads = 0: must be in 1..1024"));
}

TEST(ModelSpecTest, ValidateQHeads) {
  ModelSpec spec = Spec("qwen2.5-7b");
  spec.q_heads = 0;
  EXPECT_EQ(spec.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.Validate().message(), HasSubstr("ModelSpec.q_heads = 0"));
  spec.q_heads = 1025;
  EXPECT_THAT(spec.Validate().message(), HasSubstr("ModelSpec.q_heads = 1025"));
  spec.q_heads = 30;  // kv_heads = 4
  EXPECT_EQ(spec.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.Validate().message(), HasSubstr("ModelSpec.q_heads = 30"));
  EXPECT_THAT(spec.Validate().message(), HasSubstr("kv_heads = 4"));
  spec.q_heads = 4;  // MHA-style 1:1 is fine
  EXPECT_TRUE(spec.Validate().ok());
}

TEST(ModelSpecTest, ValidateModelIdAndDtype) {
  ModelSpec spec = Spec("qwen2.5-7b");
  spec.model_id = "";
  EXPECT_EQ(spec.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.Validate().message(), HasSubstr("ModelSpec.model_id"));
  spec.model_id = std::string(256, 'x');
  EXPECT_TRUE(spec.Validate().ok());
  spec.model_id = std::string(257, 'x');
  EXPECT_EQ(spec.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.Validate().message(), HasSubstr("ModelSpec.model_id"));
  EXPECT_THAT(spec.Validate().message(), HasSubstr("257 bytes"));

  spec = Spec("qwen2.5-7b");
  spec.dtype = static_cast<DType>(7);  // e.g. read from a damaged or newer catalog
  EXPECT_EQ(spec.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.Validate().message(), HasSubstr("ModelSpec.dtype = 7"));
}

TEST(ModelSpecTest, FingerprintChangesWithEveryField) {
  const ModelSpec base = Spec("qwen2.5-7b");
  EXPECT_EQ(base.Fingerprint(), Spec("qwen2.5-7b").Fingerprint());
  std::vector<ModelSpec> variants;
  auto add = [&](auto mutate) {
    ModelSpec s = base;
    mutate(s);
    variants.push_back(s);
  };
  add([](ModelSpec& s) { s.model_id = "Qwen/Qwen2.5-7B-Instruct@main"; });
  add([](ModelSpec& s) { s.model_id = "qwen2.5-7B"; });  // one letter's case
  add([](ModelSpec& s) { s.layers += 1; });
  add([](ModelSpec& s) { s.q_heads = 32; });
  add([](ModelSpec& s) { s.kv_heads = 2; });
  add([](ModelSpec& s) { s.head_dim = 64; });
  add([](ModelSpec& s) { s.dtype = DType::kBf16; });
  add([](ModelSpec& s) { s.dtype = DType::kFp32; });
  add([](ModelSpec& s) { s.chunk_tokens = 32; });
  variants.push_back(base);
  for (size_t i = 0; i < variants.size(); ++i) {
    for (size_t j = i + 1; j < variants.size(); ++j) {
      EXPECT_NE(variants[i].Fingerprint(), variants[j].Fingerprint())
          << variants[i].DebugString() << " vs " << variants[j].DebugString();
    }
  }
}

// The fingerprint is hashed into every stored chunk key: a silent change to its encoding would
// orphan every existing store. If this fails on purpose, bump the format tag ("ckv-spec-v2").
TEST(ModelSpecTest, FingerprintGoldenValues) {
  EXPECT_EQ(Spec("qwen2.5-7b").Fingerprint().ToHex(), "ca530f437de0d38f792edea6d47d0f3d");
  EXPECT_EQ(Spec("qwen2.5-0.5b").Fingerprint().ToHex(), "3ec6c8c87a977c8f620fe520576334f8");
}

}  // namespace
}  // namespace ckv
