// SPDX-License-Identifier: Apache-2.0
// tools/safetensors: the reader and writer, KV import and export, and the specific error for each
// kind of malformed file.
#include "tools/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tools/json_reader.h"
#include "tools/model_spec_json.h"
#include "tools/synthetic_kv.h"

namespace ckv::safetensors {
namespace {

using ::ckv::testing::TempDir;
using ::testing::HasSubstr;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::span<const std::byte> Bytes(const std::string& s) { return std::as_bytes(std::span(s)); }

// A safetensors file with header text `header` (not padded) and data area `data`.
std::string RawFile(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

absl::Status ReadStatus(const std::string& file) {
  return Reader::FromBuffer(Bytes(file)).status();
}

// The KV file contents of a synthetic prefix, as TensorData that tests can alter before writing.
class KvFixture {
 public:
  KvFixture(const ModelSpec& spec, size_t tokens, KvLayout layout = KvLayout::kTokensFirst)
      : spec_(spec), tokens_(synth::Tokens(7, tokens)), kv_(spec, tokens_) {
    const uint64_t t = tokens, h = spec.kv_heads, d = spec.head_dim;
    const size_t row = d * DTypeBytes(spec.dtype);
    tensors_.push_back(
        {std::string(kTokenIdsTensor), Dtype::kI32, {t}, std::as_bytes(std::span(tokens_))});
    for (uint32_t l = 0; l < spec.layers; ++l) {
      for (const bool key : {true, false}) {
        std::span<const std::byte> data = key ? kv_.tensors().k[l] : kv_.tensors().v[l];
        std::vector<uint64_t> shape = {t, h, d};
        if (layout == KvLayout::kHeadsFirst) {
          std::vector<std::byte>& moved = transposed_.emplace_back(data.size());
          for (uint64_t i = 0; i < t; ++i) {
            for (uint64_t j = 0; j < h; ++j) {
              std::memcpy(moved.data() + (j * t + i) * row, data.data() + (i * h + j) * row, row);
            }
          }
          data = moved;
          shape = {h, t, d};
        }
        tensors_.push_back({key ? KeyTensorName(l) : ValueTensorName(l), Dtype::kF16, shape, data});
        if (spec.dtype == DType::kBf16) tensors_.back().dtype = Dtype::kBF16;
        if (spec.dtype == DType::kFp32) tensors_.back().dtype = Dtype::kF32;
      }
    }
  }

  std::vector<TensorData>& tensors() { return tensors_; }
  TensorData& Get(const std::string& name) {
    return *std::find_if(tensors_.begin(), tensors_.end(),
                         [&](const TensorData& t) { return t.name == name; });
  }
  void Remove(const std::string& name) {
    tensors_.erase(std::find_if(tensors_.begin(), tensors_.end(),
                                [&](const TensorData& t) { return t.name == name; }));
  }
  const std::vector<int32_t>& token_ids() const { return tokens_; }
  const KvTensors& kv() const { return kv_.tensors(); }

 private:
  ModelSpec spec_;
  std::vector<int32_t> tokens_;
  synth::SyntheticKv kv_;
  std::vector<std::vector<std::byte>> transposed_;
  std::vector<TensorData> tensors_;
};

void ExpectSameKv(const KvTensors& a, const KvTensors& b) {
  ASSERT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.k.size(), b.k.size());
  ASSERT_EQ(a.v.size(), b.v.size());
  for (size_t l = 0; l < a.k.size(); ++l) {
    EXPECT_TRUE(std::equal(a.k[l].begin(), a.k[l].end(), b.k[l].begin(), b.k[l].end()))
        << "K " << l;
    EXPECT_TRUE(std::equal(a.v[l].begin(), a.v[l].end(), b.v[l].begin(), b.v[l].end()))
        << "V " << l;
  }
}

class SafetensorsTest : public ::testing::Test {
 protected:
  // Writes `tensors` to a fresh file and imports it.
  absl::StatusOr<ImportedKv> WriteAndImport(
      std::vector<TensorData> tensors, const ModelSpec& spec, const ImportOptions& options = {},
      const std::map<std::string, std::string>& metadata = {}) {
    const std::string path = dir_.Sub("kv-" + std::to_string(files_++) + ".safetensors");
    if (absl::Status s = WriteFile(path, std::move(tensors), metadata); !s.ok()) return s;
    auto reader = Reader::OpenFile(path);
    if (!reader.ok()) return reader.status();
    return ImportKv(**reader, spec, options);
  }

  TempDir dir_;
  int files_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Reader and writer

TEST_F(SafetensorsTest, RoundTripsEveryDtypeDeterministically) {
  std::vector<std::string> payloads;
  for (size_t bytes : {12, 6, 32, 16, 16, 4, 0}) {
    std::string p(bytes, '\0');
    for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<char>(i * 37 + bytes);
    payloads.push_back(p);
  }
  std::vector<TensorData> tensors = {
      {"half", Dtype::kF16, {2, 3}, Bytes(payloads[0])},
      {"brain", Dtype::kBF16, {3}, Bytes(payloads[1])},
      {"single", Dtype::kF32, {2, 2, 2}, Bytes(payloads[2])},
      {"ints", Dtype::kI32, {4}, Bytes(payloads[3])},
      {"longs", Dtype::kI64, {1, 2}, Bytes(payloads[4])},
      {"scalar", Dtype::kF32, {}, Bytes(payloads[5])},
      {"empty", Dtype::kF16, {0, 5}, Bytes(payloads[6])},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"note", "\xc3\xa9t\xc3\xa9"}};
  const std::string a = dir_.Sub("a.safetensors"), b = dir_.Sub("b.safetensors");
  CKV_ASSERT_OK(WriteFile(a, tensors, metadata));
  std::reverse(tensors.begin(), tensors.end());
  CKV_ASSERT_OK(WriteFile(b, tensors, metadata));
  const std::string bytes = ReadBytes(a);
  EXPECT_EQ(bytes, ReadBytes(b));  // input order does not matter
  EXPECT_FALSE(std::filesystem::exists(a + ".tmp"));
  uint64_t header_bytes;
  std::memcpy(&header_bytes, bytes.data(), 8);
  EXPECT_EQ(header_bytes % 8, 0u);
  EXPECT_EQ(bytes.substr(8, 17), "{\"__metadata__\":{");
  // Data in name order: "brain" first.
  EXPECT_EQ(bytes.substr(8 + header_bytes, 6), payloads[1]);

  for (const bool from_file : {true, false}) {
    auto reader = from_file ? Reader::OpenFile(a) : Reader::FromBuffer(Bytes(bytes));
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->metadata(), metadata);
    ASSERT_EQ((*reader)->tensors().size(), tensors.size());
    for (const TensorData& t : tensors) {
      const TensorInfo* info = (*reader)->Find(t.name);
      ASSERT_NE(info, nullptr) << t.name;
      EXPECT_EQ(info->dtype, t.dtype) << t.name;
      EXPECT_EQ(info->shape, t.shape) << t.name;
      std::vector<std::byte> data(info->bytes());
      CKV_ASSERT_OK((*reader)->Read(*info, data));
      EXPECT_TRUE(std::equal(data.begin(), data.end(), t.data.begin(), t.data.end())) << t.name;
    }
    EXPECT_EQ((*reader)->Find("nope"), nullptr);
  }
}

TEST_F(SafetensorsTest, WriterRejectsInconsistentTensors) {
  const std::string data(8, 'x');
  const std::string path = dir_.Sub("w.safetensors");
  auto write = [&](std::vector<TensorData> tensors,
                   const std::map<std::string, std::string>& metadata = {}) {
    return WriteFile(path, std::move(tensors), metadata);
  };
  absl::Status s = write({{"t", Dtype::kF32, {3}, Bytes(data)}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 't': 8 bytes of data for shape [3] of F32"));
  s = write({{"t", Dtype::kF32, {2}, Bytes(data)}, {"t", Dtype::kI64, {1}, Bytes(data)}});
  EXPECT_THAT(s.message(), HasSubstr("tensor 't': given twice"));
  s = write({{"", Dtype::kF32, {2}, Bytes(data)}});
  EXPECT_THAT(s.message(), HasSubstr("empty name"));
  s = write({{"__metadata__", Dtype::kF32, {2}, Bytes(data)}});
  EXPECT_THAT(s.message(), HasSubstr("not a valid tensor name"));
  s = write({{"t", Dtype::kF32, {2}, Bytes(data)}}, {{"id", "\xff"}});
  EXPECT_THAT(s.message(), HasSubstr("not UTF-8"));
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_F(SafetensorsTest, TruncatedFilesAreDataLoss) {
  const std::string data(12, 'x');
  const std::string good = dir_.Sub("good.safetensors");
  CKV_ASSERT_OK(WriteFile(good,
                          {{"a", Dtype::kF16, {2}, Bytes(data).subspan(0, 4)},
                           {"b", Dtype::kF32, {2}, Bytes(data).subspan(4, 8)}},
                          {}));
  const std::string bytes = ReadBytes(good);
  const std::string cut = dir_.Sub("cut.safetensors");

  WriteBytes(cut, bytes.substr(0, 5));
  absl::Status s = Reader::OpenFile(cut).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("file of 5 bytes, shorter than the 8-byte header length"));

  WriteBytes(cut, bytes.substr(0, 20));  // inside the header
  s = Reader::OpenFile(cut).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("only 12 bytes follow it: truncated"));

  WriteBytes(cut, bytes.substr(0, bytes.size() - 3));  // inside the data of "b"
  s = Reader::OpenFile(cut).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("the tensors need 12 bytes of data but the file holds 9 "
                                     "(tensor 'b' ends at 12): truncated"));
}

TEST_F(SafetensorsTest, RejectsBadHeaderLengths) {
  std::string file = RawFile("{}", "");
  const uint64_t huge = 200u << 20;
  std::memcpy(file.data(), &huge, 8);
  absl::Status s = ReadStatus(file);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("header length 209715200 is over the limit of 104857600"));

  const uint64_t larger = 1000;
  std::memcpy(file.data(), &larger, 8);
  s = ReadStatus(file);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("header length 1000 but only 2 bytes follow it"));

  EXPECT_TRUE(ReadStatus(RawFile("{}  ", "")).ok());  // no tensors, space padding
}

TEST_F(SafetensorsTest, RejectsHeadersThatAreNotTheRightJson) {
  const std::string entry = R"({"dtype":"F16","shape":[2],"data_offsets":[0,4]})";
  const std::string data(4, 'x');
  struct Case {
    std::string header;
    std::string message;
  };
  const Case cases[] = {
      {"not json", "header: JSON at byte 0: expected a value"},
      {"{\"t\":" + entry, "header: JSON at byte 53: expected ',' or '}' in an object"},
      {"[1,2]", "header is an array, not a JSON object"},
      {"{\"t\":" + entry + ",\"t\":" + entry + "}", "duplicate key \"t\""},
      {R"({"t":[1]})", "tensor 't': entry is an array, not an object"},
      {R"({"t":{"dtype":"F16","shape":[2],"data_offsets":[0,4],"x":1}})",
       "tensor 't': unknown field 'x'"},
      {R"({"t":{"shape":[2],"data_offsets":[0,4]}})", "tensor 't': no dtype"},
      {R"({"t":{"dtype":16,"shape":[2],"data_offsets":[0,4]}})",
       "tensor 't': dtype is an integer, not a string"},
      {R"({"t":{"dtype":"F16","data_offsets":[0,4]}})", "tensor 't': no shape"},
      {R"({"t":{"dtype":"F16","shape":[2]}})", "tensor 't': no data_offsets"},
      {R"({"t":{"dtype":"F16","shape":[2],"data_offsets":[0]}})",
       "tensor 't': data_offsets [0] is not [BEGIN, END] with integers in 0..2^63"},
      {R"({"t":{"dtype":"F16","shape":[2],"data_offsets":[-4,0]}})",
       "data_offsets [-4, 0] is not [BEGIN, END]"},
      {R"({"t":{"dtype":"F16","shape":[2],"data_offsets":[0,4.0]}})",
       "data_offsets [0, 4] is not [BEGIN, END]"},
      // Past int64: the JSON reader holds it as a double; the message still shows it.
      {R"({"t":{"dtype":"F16","shape":[2],"data_offsets":[0,100000000000000000000]}})",
       "data_offsets [0, 1e+20] is not [BEGIN, END]"},
      {R"({"t":{"dtype":"F16","shape":[2],"data_offsets":"0-4"}})",
       "data_offsets is a string, not [BEGIN, END]"},
      {R"({"":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", "a tensor has an empty name"},
      {R"({"__metadata__":[],"t":)" + entry + "}", "__metadata__ is an array, not an object"},
      {R"({"__metadata__":{"n":1},"t":)" + entry + "}",
       "__metadata__ 'n' is an integer, not a string"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ReadStatus(RawFile(c.header, data));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.header;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.header;
  }
}

TEST_F(SafetensorsTest, RejectsUnsupportedDtypesAndAbsurdShapes) {
  struct Case {
    std::string entry;  // of tensor "t"
    std::string message;
  };
  const Case cases[] = {
      {R"({"dtype":"F64","shape":[1],"data_offsets":[0,8]})",
       "tensor 't': dtype 'F64' is not supported (supported: F16, BF16, F32, I32, I64)"},
      {R"({"dtype":"f16","shape":[4],"data_offsets":[0,8]})", "dtype 'f16' is not supported"},
      {R"({"dtype":"F16","shape":[1099511627776,1099511627776,1099511627776],"data_offsets":[0,8]})",
       "tensor 't': shape [1099511627776,1099511627776,1099511627776] of F16 has more than 2^64 "
       "bytes"},
      {R"({"dtype":"F16","shape":[2199023255552],"data_offsets":[0,8]})",
       "tensor 't': shape[0] 2199023255552 is not an integer in 0..2^40"},
      {R"({"dtype":"F16","shape":[-4],"data_offsets":[0,8]})", "shape[0] -4 is not an integer"},
      {R"({"dtype":"F16","shape":[4.0],"data_offsets":[0,8]})", "shape[0] 4 is not an integer"},
      {R"({"dtype":"F16","shape":[[4]],"data_offsets":[0,8]})",
       "shape[0] (an array) is not an integer"},
      {R"({"dtype":"F16","shape":"4","data_offsets":[0,8]})",
       "tensor 't': shape is a string, not an array"},
      {R"({"dtype":"F16","shape":[1,1,1,1,1,1,1,1,4],"data_offsets":[0,8]})",
       "tensor 't': rank 9 is over the limit of 8"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ReadStatus(RawFile("{\"t\":" + c.entry + "}", std::string(8, 'x')));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.entry;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.entry;
  }
}

TEST_F(SafetensorsTest, RejectsHeadersThatLieAboutOffsets) {
  struct Case {
    std::string header;
    size_t data_bytes;
    std::string message;
  };
  const Case cases[] = {
      // Out of range: past the end of the data area.
      {R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},
           "b":{"dtype":"F16","shape":[2],"data_offsets":[100,104]}})",
       8, "tensor 'b': data_offsets [100, 104] start past the end of the data area (8 bytes)"},
      // Overlapping.
      {R"({"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},
           "b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})",
       8, "tensor 'b': data_offsets [4, 8] overlap tensor 'a' at [0, 8]"},
      // The wrong size for the shape.
      {R"({"a":{"dtype":"F16","shape":[2,3],"data_offsets":[0,8]}})", 8,
       "tensor 'a': data_offsets [0, 8] hold 8 bytes but shape [2,3] of F16 needs 12"},
      // Reversed.
      {R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[8,4]}})", 8,
       "tensor 'a': data_offsets [8, 4] end before they begin"},
      // A gap.
      {R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})", 8,
       "tensor 'a': data_offsets [4, 8] leave bytes [0, 4) of the data area unused"},
      // Data past the last tensor.
      {R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 8,
       "4 bytes after the last tensor's data"},
      // Offsets near 2^63 with a size that matches: still outside the file.
      {R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},
           "b":{"dtype":"F16","shape":[2],"data_offsets":[9223372036854775800,9223372036854775804]}})",
       8, "start past the end of the data area"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ReadStatus(RawFile(c.header, std::string(c.data_bytes, 'x')));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.header;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.header;
  }
}

// ---------------------------------------------------------------------------------------------
// KV import and export

TEST_F(SafetensorsTest, ImportsTwoPresetsInBothLayouts) {
  for (const char* preset : {"qwen2.5-0.5b", "qwen2.5-7b"}) {
    const ModelSpec spec = *ModelSpec::Preset(preset);
    for (const KvLayout layout : {KvLayout::kTokensFirst, KvLayout::kHeadsFirst}) {
      SCOPED_TRACE(std::string(preset) + (layout == KvLayout::kHeadsFirst ? " heads" : " tokens"));
      KvFixture f(spec, 21, layout);
      absl::StatusOr<ImportedKv> imported = WriteAndImport(f.tensors(), spec);
      ASSERT_TRUE(imported.ok()) << imported.status();
      EXPECT_EQ(imported->spec, spec);
      EXPECT_EQ(imported->token_ids, f.token_ids());
      EXPECT_EQ(imported->file_layout, layout);
      EXPECT_FALSE(imported->layout_ambiguous);
      ExpectSameKv(imported->kv, f.kv());
    }
  }
}

TEST_F(SafetensorsTest, TokensEqualToKvHeadsReadTokensFirstAndSaySo) {
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");  // 2 kv heads
  KvFixture f(spec, 2);
  absl::StatusOr<ImportedKv> imported = WriteAndImport(f.tensors(), spec);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->file_layout, KvLayout::kTokensFirst);
  EXPECT_TRUE(imported->layout_ambiguous);
  ExpectSameKv(imported->kv, f.kv());
}

TEST_F(SafetensorsTest, ExportOfImportIsByteIdentical) {
  ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b", DType::kBf16, /*chunk_tokens=*/8);
  spec.model_id = "Org/Model-0.5B@rev";
  const std::vector<int32_t> tokens = synth::Tokens(3, 48);
  const synth::SyntheticKv kv(spec, tokens);
  const std::string a = dir_.Sub("a.safetensors"), b = dir_.Sub("b.safetensors");
  CKV_ASSERT_OK(ExportKv(a, spec, tokens, kv.tensors()));

  // Import with a bare preset: dtype, model id and chunk size come from the file.
  auto reader = Reader::OpenFile(a);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->metadata().at("model_id"), spec.model_id);
  EXPECT_EQ((*reader)->metadata().at("dtype"), "bf16");
  EXPECT_EQ((*reader)->metadata().at("chunk_tokens"), "8");
  ImportOptions options;
  options.dtype_from_file = options.model_id_from_file = options.chunk_tokens_from_file = true;
  absl::StatusOr<ImportedKv> imported =
      ImportKv(**reader, *ModelSpec::Preset("qwen2.5-0.5b"), options);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->spec, spec);
  EXPECT_EQ(imported->token_ids, tokens);
  ExpectSameKv(imported->kv, kv.tensors());

  CKV_ASSERT_OK(ExportKv(b, imported->spec, imported->token_ids, imported->kv));
  EXPECT_EQ(ReadBytes(a), ReadBytes(b));

  // Without the from-file options, the spec is the caller's and its dtype must match.
  absl::StatusOr<ImportedKv> strict = ImportKv(**reader, *ModelSpec::Preset("qwen2.5-0.5b"));
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(strict.status().message(),
              HasSubstr("the file's K/V dtype is bf16 (BF16) but the spec's is fp16"));
}

TEST_F(SafetensorsTest, ImportNamesWhatIsMissingExtraOrMisshapen) {
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");  // 24 layers, 2 kv heads, dim 64
  auto expect_error = [&](KvFixture& f, absl::StatusCode code, const std::string& message,
                          const ImportOptions& options = {}) {
    absl::StatusOr<ImportedKv> imported = WriteAndImport(f.tensors(), spec, options);
    EXPECT_EQ(imported.status().code(), code) << imported.status();
    EXPECT_THAT(imported.status().message(), HasSubstr(message));
  };
  {
    KvFixture f(spec, 20);
    f.Remove("layers.23.key");
    f.Remove("layers.23.value");
    expect_error(f, absl::StatusCode::kInvalidArgument,
                 "missing 2 K/V tensors, the first 'layers.23.key' (the spec has 24 layers)");
  }
  {
    KvFixture f(spec, 20);
    f.tensors().push_back(f.Get("layers.0.key"));
    f.tensors().back().name = "layers.24.key";
    expect_error(f, absl::StatusCode::kInvalidArgument,
                 "tensor 'layers.24.key': layer 24 is past the spec's 24 layers");
  }
  {
    KvFixture f(spec, 20);
    f.Get("layers.3.value").name = "layers.03.value";
    expect_error(f, absl::StatusCode::kInvalidArgument, "tensor 'layers.03.value': unexpected");
  }
  {
    KvFixture f(spec, 20);  // token_ids one short of the K/V length
    TensorData& ids = f.Get("token_ids");
    ids.shape = {19};
    ids.data = ids.data.first(19 * 4);
    expect_error(f, absl::StatusCode::kInvalidArgument,
                 "tensor 'layers.0.key': shape [20,2,64] fits neither [tokens, kv_heads, head_dim]"
                 " = [19,2,64] nor [kv_heads, tokens, head_dim] = [2,19,64] (19 token ids; "
                 "kv_heads 2 and head_dim 64 from the spec)");
  }
  {
    KvFixture f(spec, 20);  // the shape of another model
    TensorData& k = f.Get("layers.5.key");
    k.shape = {20, 1, 128};
    expect_error(f, absl::StatusCode::kInvalidArgument,
                 "tensor 'layers.5.key': shape [20,1,128] fits neither");
  }
  {
    KvFixture f(spec, 20);
    f.Get("layers.7.value").dtype = Dtype::kBF16;
    expect_error(f, absl::StatusCode::kInvalidArgument,
                 "tensor 'layers.7.value': dtype BF16 differs from 'layers.0.key''s F16");
  }
  {
    KvFixture f(spec, 20);
    TensorData& k = f.Get("layers.0.key");
    k.dtype = Dtype::kI32;
    k.shape = {20, 2, 32};
    expect_error(f, absl::StatusCode::kInvalidArgument,
                 "tensor 'layers.0.key': dtype I32 is not a K/V dtype (F16, BF16 or F32)");
  }
  {
    KvFixture tokens_first(spec, 20);
    KvFixture heads_first(spec, 20, KvLayout::kHeadsFirst);
    tokens_first.Get("layers.9.key") = heads_first.Get("layers.9.key");
    expect_error(tokens_first, absl::StatusCode::kInvalidArgument,
                 "tensor 'layers.9.key': shape [2,20,64] is [kv_heads, tokens, head_dim] but "
                 "'layers.0.key' is [tokens, kv_heads, head_dim]");
  }
  {
    KvFixture f(spec, 20);
    f.Remove("token_ids");
    expect_error(f, absl::StatusCode::kInvalidArgument, "no token_ids tensor in the file");
  }
  {
    KvFixture f(spec, 20);
    f.Get("token_ids").dtype = Dtype::kF32;
    expect_error(f, absl::StatusCode::kInvalidArgument,
                 "tensor 'token_ids': dtype F32, not I32 or I64");
  }
  {
    KvFixture f(spec, 20);
    f.Get("token_ids").shape = {1, 20};
    expect_error(f, absl::StatusCode::kInvalidArgument,
                 "tensor 'token_ids': shape [1,20] is not [tokens] (rank 1)");
  }
}

TEST_F(SafetensorsTest, ImportChecksTokenIdValues) {
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  KvFixture f(spec, 4);
  const int32_t negative[] = {1, 2, 3, -1};
  f.Get("token_ids").data = std::as_bytes(std::span(negative));
  absl::StatusOr<ImportedKv> imported = WriteAndImport(f.tensors(), spec);
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(imported.status().message(),
              HasSubstr("tensor 'token_ids': token_ids[3] = -1 is not a token id in [0, 2^31)"));

  // I64 ids are read too, and must fit in int32.
  int64_t wide[] = {5, 6, 7, 8};
  TensorData& ids = f.Get("token_ids");
  ids.dtype = Dtype::kI64;
  ids.data = std::as_bytes(std::span(wide));
  imported = WriteAndImport(f.tensors(), spec);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->token_ids, (std::vector<int32_t>{5, 6, 7, 8}));
  wide[1] = int64_t{1} << 31;
  imported = WriteAndImport(f.tensors(), spec);
  EXPECT_THAT(imported.status().message(),
              HasSubstr("token_ids[1] = 2147483648 is not a token id"));

  const int32_t none[] = {0};
  ids.shape = {0};
  ids.data = std::as_bytes(std::span(none)).first(0);
  imported = WriteAndImport(f.tensors(), spec);
  EXPECT_THAT(imported.status().message(), HasSubstr("no tokens: token_ids is empty"));
}

TEST_F(SafetensorsTest, ImportTakesTokenIdsFromASidecarFile) {
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  KvFixture f(spec, 5);
  const std::string sidecar = dir_.Sub("ids.json");
  std::string json = "[";
  for (size_t i = 0; i < f.token_ids().size(); ++i) {
    json += (i > 0 ? ", " : "") + std::to_string(f.token_ids()[i]);
  }
  WriteBytes(sidecar, json + "]\n");
  ImportOptions options;
  absl::StatusOr<std::vector<int32_t>> ids = ReadTokenIdsFile(sidecar);
  ASSERT_TRUE(ids.ok()) << ids.status();
  options.token_ids = *ids;

  // Both the sidecar and a token_ids tensor: ambiguous.
  absl::StatusOr<ImportedKv> imported = WriteAndImport(f.tensors(), spec, options);
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(imported.status().message(), HasSubstr("holds a token_ids tensor too"));

  f.Remove("token_ids");
  imported = WriteAndImport(f.tensors(), spec, options);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->token_ids, f.token_ids());
  ExpectSameKv(imported->kv, f.kv());

  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"{}", "an object, not a JSON array of token ids"},
           {"[1, -2]", "entry 1 is not a token id"},
           {"[1, 2.5]", "entry 1 is not a token id"},
           {"[2147483648]", "entry 0 is not a token id"},
           {"[[1]]", "nesting deeper than 1"},
           {"[1, 2", "JSON at byte 5"},
       }) {
    WriteBytes(sidecar, text);
    const absl::Status s = ReadTokenIdsFile(sidecar).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(s.message(), HasSubstr(sidecar + ": ")) << text;
    EXPECT_THAT(s.message(), HasSubstr(message)) << text;
  }
}

TEST_F(SafetensorsTest, ImportChecksTheMetadataItUses) {
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  KvFixture f(spec, 16);
  ImportOptions options;
  options.chunk_tokens_from_file = true;
  for (const char* bad : {"0", "4097", "16x", "-1", ""}) {
    absl::StatusOr<ImportedKv> imported =
        WriteAndImport(f.tensors(), spec, options, {{"chunk_tokens", bad}});
    EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(imported.status().message(), HasSubstr("__metadata__ chunk_tokens")) << bad;
  }
  // Metadata the caller did not ask for is not used.
  absl::StatusOr<ImportedKv> imported =
      WriteAndImport(f.tensors(), spec, {}, {{"chunk_tokens", "32"}, {"model_id", "other"}});
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->spec, spec);
}

TEST_F(SafetensorsTest, ReadRangeReadsASliceOfOneTensorAndNoMore) {
  std::string a(12, '\0'), b(8, '\0');
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>(i + 1);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(100 + i);
  const std::string path = dir_.Sub("r.safetensors");
  CKV_ASSERT_OK(
      WriteFile(path, {{"a", Dtype::kF16, {6}, Bytes(a)}, {"b", Dtype::kI32, {2}, Bytes(b)}}, {}));
  auto reader = Reader::OpenFile(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::string out(4, '\0');
  CKV_ASSERT_OK((*reader)->ReadRange(*(*reader)->Find("a"), 6,
                                     std::as_writable_bytes(std::span(out.data(), out.size()))));
  EXPECT_EQ(out, a.substr(6, 4));
  CKV_ASSERT_OK((*reader)->ReadRange(*(*reader)->Find("b"), 4,
                                     std::as_writable_bytes(std::span(out.data(), out.size()))));
  EXPECT_EQ(out, b.substr(4, 4));
  // Past the end of a: not into b.
  const absl::Status past = (*reader)->ReadRange(
      *(*reader)->Find("a"), 10, std::as_writable_bytes(std::span(out.data(), out.size())));
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument) << past;
  EXPECT_THAT(std::string(past.message()), HasSubstr("not within tensor a of 12 bytes"));
}

TEST_F(SafetensorsTest, ImportsFromMemoryToo) {
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-7b");
  KvFixture f(spec, 3, KvLayout::kHeadsFirst);
  const std::string path = dir_.Sub("m.safetensors");
  CKV_ASSERT_OK(WriteFile(path, f.tensors(), {}));
  const std::string bytes = ReadBytes(path);
  auto reader = Reader::FromBuffer(Bytes(bytes));
  ASSERT_TRUE(reader.ok()) << reader.status();
  uint64_t last_done = 0, last_total = 0;
  ImportOptions options;
  options.progress = [&](uint64_t done, uint64_t total) {
    EXPECT_GT(done, last_done);
    last_done = done;
    last_total = total;
  };
  absl::StatusOr<ImportedKv> imported = ImportKv(**reader, spec, options);
  ASSERT_TRUE(imported.ok()) << imported.status();
  ExpectSameKv(imported->kv, f.kv());
  EXPECT_EQ(last_done, last_total);
  EXPECT_EQ(last_total, 3 * spec.KvBytesPerToken());
}

// ---------------------------------------------------------------------------------------------
// Spec files

TEST(SafetensorsSpecJsonTest, ReadsAModelSpecAndNamesBadFields) {
  auto parse = [](const std::string& text) {
    absl::StatusOr<tools::JsonValue> json = tools::ParseJson(text);
    EXPECT_TRUE(json.ok()) << json.status();
    return tools::ModelSpecFromJson(*json);
  };
  absl::StatusOr<tools::ModelSpecJson> spec =
      parse(R"({"model_id":"m","layers":28,"q_heads":28,"kv_heads":4,"head_dim":128})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ModelSpec want = *ModelSpec::Preset("qwen2.5-7b");
  want.model_id = "m";
  EXPECT_EQ(spec->spec, want);
  EXPECT_FALSE(spec->has_dtype);
  EXPECT_FALSE(spec->has_chunk_tokens);

  spec = parse(R"({"model_id":"m","layers":2,"q_heads":4,"kv_heads":2,"head_dim":8,
                   "dtype":"bf16","chunk_tokens":32})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->spec.dtype, DType::kBf16);
  EXPECT_EQ(spec->spec.chunk_tokens, 32u);
  EXPECT_TRUE(spec->has_dtype && spec->has_chunk_tokens);

  const std::pair<std::string, std::string> bad[] = {
      {R"({"model_id":"m","layers":2,"q_heads":4,"kv_heads":2})", "spec field head_dim is missing"},
      {R"({"model_id":"m","layers":2,"q_heads":4,"kv_heads":2,"head_dim":8,"rope":1})",
       "spec field \"rope\" is unknown"},
      {R"({"model_id":"m","layers":"2","q_heads":4,"kv_heads":2,"head_dim":8})",
       "spec field layers is a string, not an integer"},
      {R"({"model_id":"m","layers":-2,"q_heads":4,"kv_heads":2,"head_dim":8})",
       "spec field layers = -2: out of range"},
      {R"({"model_id":"m","layers":2,"q_heads":3,"kv_heads":2,"head_dim":8})",
       "ModelSpec.q_heads = 3: must be a multiple of kv_heads = 2"},
      {R"({"model_id":"m","layers":2,"q_heads":4,"kv_heads":2,"head_dim":8,"dtype":"fp8"})",
       "dtype \"fp8\": must be fp16, bf16 or fp32"},
      {R"([1])", "spec is an array, not a JSON object"},
  };
  for (const auto& [text, message] : bad) {
    spec = parse(text);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(spec.status().message(), HasSubstr(message)) << text;
  }

  TempDir dir;
  WriteBytes(dir.Sub("spec.json"), R"({"model_id":"m","layers":2})");
  EXPECT_THAT(tools::ReadModelSpecFile(dir.Sub("spec.json")).status().message(),
              HasSubstr(dir.Sub("spec.json") + ": spec field q_heads is missing"));
}

}  // namespace
}  // namespace ckv::safetensors

namespace ckv::safetensors {
namespace {

// A KV file of `tokens` tokens for `spec` whose data area is a hole: the file claims
// 8 + header + data bytes but occupies almost nothing, as an attacker's sparse file would.
std::string SparseKvFile(const std::string& path, const ModelSpec& spec, uint64_t tokens) {
  std::string header = "{";
  uint64_t offset = 0;
  auto add = [&](const std::string& name, const char* dtype, const std::string& shape,
                 uint64_t bytes) {
    if (header.size() > 1) header += ",";
    header += "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
              ",\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
  };
  add("token_ids", "I32", "[" + std::to_string(tokens) + "]", 4 * tokens);
  const std::string kv_shape = "[" + std::to_string(tokens) + "," + std::to_string(spec.kv_heads) +
                               "," + std::to_string(spec.head_dim) + "]";
  const uint64_t kv_bytes = tokens * spec.kv_heads * spec.head_dim * 2;
  for (uint32_t l = 0; l < spec.layers; ++l) {
    add(KeyTensorName(l), "F16", kv_shape, kv_bytes);
    add(ValueTensorName(l), "F16", kv_shape, kv_bytes);
  }
  header += "}";
  WriteBytes(path, RawFile(header, ""));
  std::filesystem::resize_file(path, 8 + header.size() + offset);
  return path;
}

ModelSpec SparseSpec(uint32_t layers, uint32_t kv_heads, uint32_t head_dim) {
  ModelSpec spec;
  spec.model_id = "sparse";
  spec.layers = layers;
  spec.q_heads = kv_heads;
  spec.kv_heads = kv_heads;
  spec.head_dim = head_dim;
  spec.dtype = DType::kFp16;
  spec.chunk_tokens = 16;
  return spec;
}

// Regression (security audit): the token_ids tensor was read whole, sized by its shape, which the
// file's size bounds; a sparse file's size costs nothing, so a 64 MiB hole made a 64 MiB
// allocation, and a terabyte one a failed one. Token ids are now bounded like a JSON ids file.
TEST(SafetensorsBoundsTest, TooManyTokenIdsAreRefusedBeforeReading) {
  TempDir dir;
  const ModelSpec spec = SparseSpec(1, 1, 1);
  const std::string path = SparseKvFile(dir.Sub("ids.safetensors"), spec, kMaxImportTokens + 1);
  auto reader = Reader::OpenFile(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto imported = ImportKv(**reader, spec);
  ASSERT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument) << imported.status();
  EXPECT_THAT(std::string(imported.status().message()),
              HasSubstr("16777217 token ids, over the limit of 16777216"));
}

// Regression (security audit): ImportKv allocated 2 x layers tensors of tokens x kv_heads x
// head_dim, bounded only by the file's claimed size: a 16 GiB hole asked for 16 GiB of memory.
TEST(SafetensorsBoundsTest, KvLargerThanTheImportLimitIsRefusedBeforeAllocating) {
  TempDir dir;
  const ModelSpec spec = SparseSpec(8, 4, 128);  // 1 KiB per token per layer, K or V
  const std::string path = SparseKvFile(dir.Sub("kv.safetensors"), spec, uint64_t{1} << 20);
  auto reader = Reader::OpenFile(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto imported = ImportKv(**reader, spec);
  ASSERT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument) << imported.status();
  EXPECT_THAT(std::string(imported.status().message()),
              HasSubstr("are 17179869184 bytes, over the import limit of 8589934592 bytes"));
  // The limit is an option: a small one refuses a small file too.
  ImportOptions options;
  options.max_kv_bytes = 1 << 20;
  const std::string small = SparseKvFile(dir.Sub("small.safetensors"), spec, 1024);
  auto small_reader = Reader::OpenFile(small);
  ASSERT_TRUE(small_reader.ok()) << small_reader.status();
  EXPECT_EQ(ImportKv(**small_reader, spec, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.max_kv_bytes = 16 << 20;
  EXPECT_TRUE(ImportKv(**small_reader, spec, options).ok());
}

}  // namespace
}  // namespace ckv::safetensors
