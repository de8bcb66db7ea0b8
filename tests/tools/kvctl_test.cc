// SPDX-License-Identifier: Apache-2.0
// kvctl, driven end to end as an operator would: exit codes and --json output.
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ckv/engine.h"
#include "gmock/gmock.h"
#include "storage/chunk_store.h"
#include "tests/json_test_util.h"
#include "tests/test_util.h"
#include "tools/json_reader.h"
#include "tools/safetensors.h"

#ifndef CKV_KVCTL_PATH
#error "CKV_KVCTL_PATH must name the kvctl binary"
#endif

namespace ckv {
namespace {

using ::ckv::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

using KvctlRun = ::ckv::testing::ProgramRun;

using ::ckv::testing::Kvctl;
using ::ckv::testing::KvctlStdout;

using ::ckv::testing::JsonInt;

// A store is a cache: without --max-disk-bytes, init caps it at 90% of the space free on its file
// system (rather than leaving it unlimited, when a full disk would fail every Put), and says so.
TEST(KvctlTest, InitWithoutACapTakesNinetyPercentOfTheFreeSpace) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  struct statvfs fs;
  ASSERT_EQ(::statvfs(dir.path().c_str(), &fs), 0);
  const double free_bytes = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
  KvctlRun r = Kvctl("init " + store);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("90% of the "), std::string::npos) << r.output;
  r = Kvctl("stats " + store + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto json = tools::ParseJson(r.output);
  ASSERT_TRUE(json.ok()) << json.status() << r.output;
  const double cap = static_cast<double>(JsonInt(*json->Find("stats"), "max_disk_bytes"));
  // 90% of what was free then; the file system's use moves a little meanwhile.
  EXPECT_GT(cap, 0.85 * free_bytes) << r.output;
  EXPECT_LT(cap, 0.95 * free_bytes) << r.output;
  // 0 still means unlimited.
  r = Kvctl("init " + dir.Sub("unlimited") + " --max-disk-bytes 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cap unlimited"), std::string::npos) << r.output;
}

TEST(KvctlTest, InitPutListVerifyAndCatchACorruptRecord) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  KvctlRun r = Kvctl("init " + store + " --max-disk-bytes 64M");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Kvctl("init " + store);
  EXPECT_EQ(r.exit_code, 3) << r.output;  // a store is there already

  r = Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 256 --seed 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"chunks_written\":16"), std::string::npos) << r.output;
  // 192 of its 256 tokens shared with the first: only the last 4 chunks are written.
  r = Kvctl("put " + store +
            " --model qwen2.5-0.5b --tokens 256 --seed 2 --shared-tokens 192 --shared-seed 1 "
            "--json");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  r = Kvctl("ls " + store + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"prefixes\":2"), std::string::npos) << r.output;
  // Under its 64 MiB cap the store keeps the reclaimer's default margin: 1/8 of the data cap.
  auto listed = tools::ParseJson(r.output);
  ASSERT_TRUE(listed.ok()) << r.output;
  const tools::JsonValue& listed_stats = *listed->Find("stats");
  const int64_t margin = *listed_stats.Find("reclaim_margin_bytes")->AsInt();
  EXPECT_GT(margin, 7 << 20) << r.output;
  EXPECT_LE(margin, 8 << 20) << r.output;
  EXPECT_EQ(*listed_stats.Find("inline_evictions")->AsInt(), 0) << r.output;
  r = Kvctl("stats " + store);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("reclaimer      keeps ")) << r.output;

  r = Kvctl("verify " + store + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"ok\":true"), std::string::npos) << r.output;

  // Flip one byte of one record.
  {
    auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
    const auto tokens = synth::Tokens(1, 256);
    const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
    storage::StoreOptions options;
    options.create_if_missing = false;
    auto cs = storage::ChunkStore::Open(options, store);
    ASSERT_TRUE(cs.ok()) << cs.status();
    auto loc = (*cs)->LocateRecord(keys[3], 7);
    ASSERT_TRUE(loc.ok());
    cs->reset();
    std::fstream f(loc->segment_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(loc->offset + 100));
    f.put('\x7f');
  }
  r = Kvctl("verify " + store);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("checksum"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/L7"), std::string::npos) << r.output;
  // --json names the problem's kind, chunk and layer as fields.
  r = KvctlStdout("verify " + store + " --json");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  auto json = tools::ParseJson(r.output);
  ASSERT_TRUE(json.ok()) << r.output;
  const auto* problems = json->Find("problems")->AsArray();
  ASSERT_NE(problems, nullptr) << r.output;
  ASSERT_EQ(problems->size(), 1u) << r.output;
  const tools::JsonValue& p = (*problems)[0];
  EXPECT_EQ(*p.Find("kind")->AsString(), "checksum") << r.output;
  const auto keys =
      ChainChunkKeys((*ModelSpec::Preset("qwen2.5-0.5b")).Fingerprint(), 16, synth::Tokens(1, 256));
  EXPECT_EQ(*p.Find("chunk")->AsString(), keys[3].ToHex()) << r.output;
  EXPECT_EQ(JsonInt(p, "layer"), 7) << r.output;
  EXPECT_THAT(*p.Find("message")->AsString(), HasSubstr("/L7")) << r.output;
}

// Off a terminal, progress is plain lines: one per phase at least, ending with what it did.
TEST(KvctlTest, ProgressIsPlainLinesOffATerminal) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store).exit_code, 0);
  KvctlRun r = Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 64 --seed 1", "lines");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("generate: 768.0 KiB in ")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("write 768.0 KiB: done in ")) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << "no bar redraws: " << r.output;
  r = Kvctl("verify " + store, "lines");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << r.output;
  r = Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 64 --seed 2");
  EXPECT_EQ(r.output.find("generate:"), std::string::npos) << "KVCTL_PROGRESS=off: " << r.output;
}

TEST(KvctlTest, UsageAndStoreErrorsHaveTheirExitCodes) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store).exit_code, 0);
  KvctlRun r = Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 250 --seed 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;  // not a whole number of chunks
  EXPECT_NE(r.output.find("multiple of the chunk size 16"), std::string::npos) << r.output;
  r = Kvctl("put " + store + " --model no-such-model --tokens 32 --seed 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 12abc --seed 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = Kvctl("frobnicate " + store);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = Kvctl("ls " + dir.Sub("missing"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("missing"), std::string::npos) << r.output;
  // None of this touched the store.
  r = Kvctl("ls " + store + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"prefixes\":[]"), std::string::npos) << r.output;
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

using ::ckv::testing::JsonString;

// A KV file as ExportKv writes it, of `tokens` synthetic tokens of `spec`.
void ExportSynthetic(const std::string& path, const ModelSpec& spec, size_t tokens, uint64_t seed) {
  const std::vector<int32_t> ids = synth::Tokens(seed, tokens);
  const synth::SyntheticKv kv(spec, ids);
  CKV_ASSERT_OK(safetensors::ExportKv(path, spec, ids, kv.tensors()));
}

// Import and export end to end for two presets: a small one and the paper's 7b shape.
class KvctlImportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KvctlImportTest, ImportListExportRoundTripIsBitExact) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store).exit_code, 0);
  const std::string preset = GetParam();
  ModelSpec spec = *ModelSpec::Preset(preset, DType::kBf16);
  spec.model_id = "Org/Model-0.5B";
  const std::string file = dir.Sub("in.safetensors");
  ExportSynthetic(file, spec, 48, /*seed=*/5);

  // A bare preset: dtype and model id come from the file.
  KvctlRun r = Kvctl("import " + store + " " + file + " --model " + preset + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"chunks_written\":3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"tail_tokens\":0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"dtype\":\"bf16\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"layout\":\"tokens-first\""), std::string::npos) << r.output;
  const std::string id = JsonString(r.output, "prefix_id");
  ASSERT_EQ(id.size(), 32u) << r.output;

  r = Kvctl("ls " + store);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(id.substr(0, 16) + "  Org/Model-0.5B"), std::string::npos) << r.output;

  // Export by the id ls prints: the same file, byte for byte.
  const std::string out = dir.Sub("out.safetensors");
  r = Kvctl("export " + store + " " + id.substr(0, 16) + " " + out + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"tokens\":48"), std::string::npos) << r.output;
  EXPECT_EQ(ReadFileBytes(out), ReadFileBytes(file));

  // Importing it again stores nothing new.
  r = Kvctl("import " + store + " " + out + " --model " + preset + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"chunks_deduplicated\":3"), std::string::npos) << r.output;
}

TEST_P(KvctlImportTest, ImportsHeadsFirstKvWithATailAndSidecarTokens) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store).exit_code, 0);
  const std::string preset = GetParam();
  const ModelSpec spec = *ModelSpec::Preset(preset);
  const std::vector<int32_t> ids = synth::Tokens(9, 35);  // 2 chunks and a 3-token tail
  const synth::SyntheticKv kv(spec, ids);
  const size_t row = spec.head_dim * 2;
  std::vector<std::vector<std::byte>> moved;
  std::vector<safetensors::TensorData> tensors;
  for (uint32_t l = 0; l < spec.layers; ++l) {
    for (const bool key : {true, false}) {
      const std::span<const std::byte> data = key ? kv.tensors().k[l] : kv.tensors().v[l];
      std::vector<std::byte>& t = moved.emplace_back(data.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        for (size_t h = 0; h < spec.kv_heads; ++h) {
          std::memcpy(t.data() + (h * ids.size() + i) * row,
                      data.data() + (i * spec.kv_heads + h) * row, row);
        }
      }
      tensors.push_back({key ? safetensors::KeyTensorName(l) : safetensors::ValueTensorName(l),
                         safetensors::Dtype::kF16,
                         {spec.kv_heads, ids.size(), spec.head_dim},
                         t});
    }
  }
  const std::string file = dir.Sub("heads.safetensors");
  CKV_ASSERT_OK(safetensors::WriteFile(file, tensors, {}));
  std::string json = "[";
  for (size_t i = 0; i < ids.size(); ++i) json += (i ? "," : "") + std::to_string(ids[i]);
  WriteFileBytes(dir.Sub("ids.json"), json + "]");

  KvctlRun r = Kvctl("import " + store + " " + file + " --model " + preset + " --tokens-file " +
                     dir.Sub("ids.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("chunks written       2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tail tokens          3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[kv_heads, tokens, head_dim], transposed"), std::string::npos)
      << r.output;

  // The stored chunks are the synthetic KV of the first 32 tokens.
  r = Kvctl("ls " + store + " --json");
  const std::string id = JsonString(r.output, "id");
  const std::string out = dir.Sub("out.safetensors");
  ASSERT_EQ(Kvctl("export " + store + " " + id + " " + out).exit_code, 0);
  const std::string expected = dir.Sub("expected.safetensors");
  ExportSynthetic(expected, spec, 32, /*seed=*/9);
  EXPECT_EQ(ReadFileBytes(out), ReadFileBytes(expected));
}

INSTANTIATE_TEST_SUITE_P(Presets, KvctlImportTest, ::testing::Values("qwen2.5-0.5b", "qwen2.5-7b"),
                         [](const auto& info) {
                           return info.param == "qwen2.5-0.5b" ? std::string("small")
                                                               : std::string("seven_b");
                         });

TEST(KvctlTest, MalformedImportsExitThreeAndLeaveTheStoreUnchanged) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store).exit_code, 0);
  ASSERT_EQ(Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 32 --seed 1").exit_code, 0);
  const std::string before = Kvctl("ls " + store + " --json").output;

  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const std::string good = dir.Sub("good.safetensors");
  ExportSynthetic(good, spec, 32, /*seed=*/2);
  const std::string bytes = ReadFileBytes(good);
  uint64_t header_bytes;
  std::memcpy(&header_bytes, bytes.data(), 8);
  std::string header = bytes.substr(8, header_bytes);
  auto with_header = [&](std::string h) {  // same length, so offsets stay valid
    h.resize(header_bytes, ' ');
    return bytes.substr(0, 8) + h + bytes.substr(8 + header_bytes);
  };
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string h = header;
    const size_t at = h.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return with_header(h.replace(at, from.size(), to));
  };
  std::string lying_length = bytes;
  const uint64_t too_long = bytes.size();
  std::memcpy(lying_length.data(), &too_long, 8);

  struct Case {
    std::string name;
    std::string contents;
    std::string extra_args;
    std::string message;
  };
  const Case cases[] = {
      {"truncated", bytes.substr(0, bytes.size() - 100), "", "DATA_LOSS"},
      {"length-past-end", lying_length, "", "bytes follow it: truncated"},
      {"not-json", with_header("this is not JSON"), "", "header: JSON at byte 0"},
      {"f64", replace("\"dtype\":\"F16\"", "\"dtype\":\"F64\""), "",
       "dtype 'F64' is not supported"},
      {"missing-layer", replace("layers.23.value", "layers.99.value"), "",
       "tensor 'layers.99.value': layer 99 is past the spec's 24 layers"},
      {"token-ids-size-lie", replace("\"shape\":[32]", "\"shape\":[31]"), "",
       "tensor 'token_ids': data_offsets [393216, 393344] hold 128 bytes but shape [31] of I32 "
       "needs 124"},
      {"dtype-mismatch", bytes, "--spec " + dir.Sub("bf16.json"), "FAILED_PRECONDITION"},
      {"bad-spec", bytes, "--spec " + dir.Sub("bad.json"), "spec field \"rope\" is unknown"},
      {"bad-tokens-file", bytes, "--tokens-file " + dir.Sub("bad-ids.json"), "is not a token id"},
      {"less-than-a-chunk", bytes.substr(0, 0), "", ""},
  };
  WriteFileBytes(dir.Sub("bf16.json"), R"({"model_id":"m","layers":24,"q_heads":14,"kv_heads":2,
                                           "head_dim":64,"dtype":"bf16"})");
  WriteFileBytes(dir.Sub("bad.json"), R"({"model_id":"m","layers":24,"rope":1})");
  WriteFileBytes(dir.Sub("bad-ids.json"), "[1, -1]");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string file = dir.Sub(c.name + ".safetensors");
    if (c.name == "less-than-a-chunk") {
      ExportSynthetic(file, spec, 15, /*seed=*/3);
    } else {
      WriteFileBytes(file, c.contents);
    }
    const std::string model = c.extra_args.rfind("--spec", 0) == 0 ? "" : " --model qwen2.5-0.5b";
    const KvctlRun r = Kvctl("import " + store + " " + file + model + " " + c.extra_args);
    EXPECT_EQ(r.exit_code, 3) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_EQ(r.output.rfind("kvctl: import", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    EXPECT_EQ(Kvctl("ls " + store + " --json").output, before);
  }

  // Usage errors are exit 2, a prefix that is not stored exit 3.
  EXPECT_EQ(Kvctl("import " + store + " " + good).exit_code, 2);
  EXPECT_EQ(
      Kvctl("import " + store + " " + good + " --model qwen2.5-0.5b --spec " + dir.Sub("bf16.json"))
          .exit_code,
      2);
  EXPECT_EQ(Kvctl("export " + store + " xyz " + dir.Sub("o.safetensors")).exit_code, 2);
  EXPECT_EQ(Kvctl("export " + store + " " + std::string(32, '0') + " " + dir.Sub("o.safetensors"))
                .exit_code,
            3);
  EXPECT_EQ(Kvctl("ls " + store + " --json").output, before);
}

// Regression: export to a missing directory or onto a directory read the whole prefix first
// and then failed with "INTERNAL: rename OUT.tmp to OUT: Is a directory".
TEST(KvctlTest, ExportFailuresNameTheFileAndLeaveItAsItWas) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store).exit_code, 0);
  KvctlRun r = Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 64 --seed 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string id = JsonString(r.output, "prefix_id");
  ASSERT_FALSE(id.empty()) << r.output;

  r = Kvctl("export " + store + " " + id + " " + dir.Sub("no-such-dir/out.safetensors"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("directory " + dir.Sub("no-such-dir") + " does not exist"));
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;

  ASSERT_EQ(::mkdir(dir.Sub("a-dir").c_str(), 0755), 0);
  r = Kvctl("export " + store + " " + id + " " + dir.Sub("a-dir"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr(dir.Sub("a-dir") + " is a directory"));

  r = Kvctl("import " + store + " " + dir.Sub("a-dir") + " --model qwen2.5-0.5b");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr(dir.Sub("a-dir") + " is not a regular file"));

  // A write that fails part way (as on a full disk; here a file size limit, EFBIG) leaves the
  // old OUT as it was and no OUT.tmp behind.
  const std::string out = dir.Sub("out.safetensors");
  WriteFileBytes(out, "the old file");
  const std::string cmd = "sh -c \"trap '' XFSZ; ulimit -f 64; exec " +
                          std::string(CKV_KVCTL_PATH) + " export " + store + " " + id + " " + out +
                          "\" 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) text.append(buf, n);
  const int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 3) << text;
  EXPECT_THAT(text, HasSubstr("RESOURCE_EXHAUSTED: write " + dir.Sub(".out.safetensors.")));
  EXPECT_THAT(text, HasSubstr(".tmp: File too large"));
  EXPECT_EQ(ReadFileBytes(out), "the old file");
  // No temporary file is left (tools/output_file.h names them .OUT.RANDOM.tmp).
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_THAT(e.path().filename().string(), Not(HasSubstr(".tmp"))) << e.path();
  }
}

// Member `key` of `object` as an integer (-1 when absent or not an integer).
TEST(KvctlTest, ReplayRunsTurnsMatchingWhatEarlierTurnsStored) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store).exit_code, 0);
  const std::string trace = dir.Sub("trace.jsonl");
  // Two conversations share a 512-token system prompt (generated from seed 1): 32 chunks.
  std::ofstream(trace)
      << "{\"conversation\": \"a\", \"turn\": 1, \"generate\": {\"seed\": 1, \"tokens\": 512}}\n"
         "{\"conversation\": \"b\", \"turn\": 1, \"generate\": {\"seed\": 1, \"tokens\": 512}}\n"
         "{\"conversation\": \"a\", \"turn\": 2, \"generate\": {\"seed\": 2, \"tokens\": 100}}\n"
         "{\"conversation\": \"b\", \"turn\": 2, \"generate\": {\"seed\": 3, \"tokens\": 60}}\n"
         "{\"conversation\": \"a\", \"turn\": 3, \"tokens\": [5, 6, 7]}\n";
  KvctlRun r = Kvctl("replay " + store + " " + trace +
                     " --model qwen2.5-0.5b --selector mean-key --gpu-tier-bytes 8M --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto json = tools::ParseJson(r.output);
  ASSERT_TRUE(json.ok()) << json.status() << r.output;
  const tools::JsonValue::Array* turns = json->Find("turns")->AsArray();
  ASSERT_NE(turns, nullptr);
  ASSERT_EQ(turns->size(), 5u);
  // {prompt chunks, matched chunks, chunks written} per turn: a's first turn finds nothing and
  // stores the prompt; b's finds it all; later turns match the context and add their new chunks.
  const int64_t want[5][3] = {{32, 0, 32}, {32, 32, 0}, {38, 32, 6}, {35, 32, 3}, {38, 38, 0}};
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  for (size_t i = 0; i < 5; ++i) {
    const tools::JsonValue& t = (*turns)[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(JsonInt(t, "prompt_chunks"), want[i][0]);
    EXPECT_EQ(JsonInt(t, "matched_chunks"), want[i][1]);
    EXPECT_EQ(JsonInt(t, "chunks_written"), want[i][2]);
    // 10% of the matched chunks (at least the sink and the last) at each of the 24 layers.
    const int64_t per_layer = want[i][1] == 0 ? 0 : std::max<int64_t>(2, (want[i][1] + 5) / 10);
    EXPECT_EQ(JsonInt(t, "records_served"), per_layer * spec.layers);
    EXPECT_EQ(JsonInt(t, "bytes_needed"), JsonInt(t, "records_served") * spec.RecordBytes());
  }
  EXPECT_GT(JsonInt((*turns)[4], "gpu_hits"), 0) << "a's third turn finds its records in the tier";
  EXPECT_EQ(JsonInt(*json->Find("engine"), "chunks"), 32 + 6 + 3);

  // Again without storing: every turn's context is stored now.
  r = Kvctl("replay " + store + " " + trace + " --model qwen2.5-0.5b --no-put --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json = tools::ParseJson(r.output);
  ASSERT_TRUE(json.ok()) << json.status() << r.output;
  EXPECT_EQ(JsonInt(*json, "matched_chunks"), JsonInt(*json, "prompt_chunks"));
  EXPECT_EQ(JsonInt(*json, "chunks_written"), 0);

  // Another model's keys match nothing.
  r = Kvctl("replay " + store + " " + trace + " --model qwen2.5-7b --no-put --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json = tools::ParseJson(r.output);
  ASSERT_TRUE(json.ok()) << json.status() << r.output;
  EXPECT_EQ(JsonInt(*json, "matched_chunks"), 0);
}

TEST(KvctlTest, ReplayReadsMooncakeAndBailianTracesOfHashBlocks) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store).exit_code, 0);
  const std::string trace = dir.Sub("mooncake.jsonl");
  // At 32 tokens per hash id: 4, 4 (and a tail of 5) and 4 chunks; blocks 1 and 2 are shared.
  std::ofstream(trace)
      << "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 5, \"hash_ids\": [1, 2]}\n"
         "{\"timestamp\": 9, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [1, 2, "
         "3]}\n"
         "{\"timestamp\": 20, \"input_length\": 1024, \"output_length\": 5, \"hash_ids\": [1, "
         "9]}\n";
  KvctlRun r = Kvctl("replay " + store + " " + trace +
                     " --model qwen2.5-0.5b --block-tokens 32 --speed 1000 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto json = tools::ParseJson(r.output);
  ASSERT_TRUE(json.ok()) << json.status() << r.output;
  EXPECT_EQ(*json->Find("format")->AsString(), "mooncake");
  const tools::JsonValue::Array* turns = json->Find("turns")->AsArray();
  ASSERT_EQ(turns->size(), 3u);
  const int64_t want[3][4] = {{64, 4, 0, 4}, {69, 4, 4, 0}, {64, 4, 2, 2}};
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(JsonInt((*turns)[i], "prompt_tokens"), want[i][0]);
    EXPECT_EQ(JsonInt((*turns)[i], "prompt_chunks"), want[i][1]);
    EXPECT_EQ(JsonInt((*turns)[i], "matched_chunks"), want[i][2]);
    EXPECT_EQ(JsonInt((*turns)[i], "chunks_written"), want[i][3]);
  }
  EXPECT_EQ(*(*turns)[2].Find("conversation")->AsString(), "r2");

  // Bailian, named explicitly, at its own 16 tokens per id; only the first request.
  const std::string bailian = dir.Sub("bailian.jsonl");
  std::ofstream(bailian)
      << "{\"chat_id\": 7, \"parent_chat_id\": -1, \"timestamp\": 1.5, \"input_length\": 40,"
         " \"output_length\": 3, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [5, 6, 7]}\n"
         "{\"chat_id\": 8, \"parent_chat_id\": 7, \"timestamp\": 2.5, \"input_length\": 48,"
         " \"output_length\": 3, \"type\": \"text\", \"turn\": 2, \"hash_ids\": [5, 6, 8]}\n";
  r = Kvctl("replay " + store + " " + bailian +
            " --model qwen2.5-0.5b --format bailian --max-requests 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json = tools::ParseJson(r.output);
  ASSERT_TRUE(json.ok()) << json.status() << r.output;
  turns = json->Find("turns")->AsArray();
  ASSERT_EQ(turns->size(), 1u);
  EXPECT_EQ(*(*turns)[0].Find("conversation")->AsString(), "7");
  EXPECT_EQ(JsonInt((*turns)[0], "prompt_chunks"), 2);

  // Errors: a bad request names file:line and the value; options that need hash blocks.
  std::ofstream(trace, std::ios::app)
      << "{\"timestamp\": 30, \"input_length\": 5000, \"output_length\": 5, \"hash_ids\": [1]}\n";
  r = Kvctl("replay " + store + " " + trace + " --model qwen2.5-0.5b");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr(trace + ":4: \"input_length\" 5000 does not fit 1 blocks of 512 "
                                          "tokens (1..512)"));
  r = Kvctl("replay " + store + " " + bailian + " --model qwen2.5-0.5b --format ckv");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr(bailian + ":1: unknown member"));
  r = Kvctl("replay " + store + " " + trace + " --model qwen2.5-0.5b --format sharegpt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const std::string ckv = dir.Sub("ckv.jsonl");
  std::ofstream(ckv) << "{\"conversation\": \"a\", \"turn\": 1, \"tokens\": [1, 2]}\n";
  r = Kvctl("replay " + store + " " + ckv + " --model qwen2.5-0.5b --block-tokens 32");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--block-tokens and --speed need a trace of hash blocks"));
}

TEST(KvctlTest, ReplayRejectsBadTracesAndOptionsWithClearMessages) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store).exit_code, 0);
  const std::string trace = dir.Sub("trace.jsonl");
  std::ofstream(trace) << "{\"conversation\": \"a\", \"turn\": 1, \"tokens\": [1, 2]}\n"
                          "{\"conversation\": \"a\", \"turn\": 3, \"tokens\": [3]}\n";
  KvctlRun r = Kvctl("replay " + store + " " + trace + " --model qwen2.5-0.5b");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr(trace + ":2: turn 3 of conversation \"a\" follows turn 1"));
  EXPECT_EQ(Kvctl("replay " + store + " " + trace).exit_code, 2);  // no --model
  r = Kvctl("replay " + store + " " + trace + " --model qwen2.5-0.5b --selector h2o");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--selector: 'h2o'"));
  r = Kvctl("replay " + dir.Sub("nothing") + " " + trace + " --model qwen2.5-0.5b");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  // A request too large to hold in memory is refused before anything runs.
  std::ofstream(trace) << "{\"conversation\": \"a\", \"turn\": 1, \"generate\": {\"seed\": 1, "
                          "\"tokens\": 600000}}\n";
  r = Kvctl("replay " + store + " " + trace + " --model qwen2.5-7b");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("RESOURCE_EXHAUSTED: " + trace +
                                  ":1: turn 1 of \"a\": 600000 tokens, 32.0 GiB of KV"));
  EXPECT_THAT(r.output, HasSubstr("per request (--max-request-kv-bytes)"));
}

// Member `key` of `object` as a number (JsonWriter writes whole doubles as integers; NaN when
// absent).
double NumberOf(const tools::JsonValue& object, std::string_view key) {
  const tools::JsonValue* v = object.Find(key);
  if (v == nullptr) return std::nan("");
  if (v->AsInt() != nullptr) return static_cast<double>(*v->AsInt());
  return v->AsDouble() != nullptr ? *v->AsDouble() : std::nan("");
}

// The id of the prefix `ls --json` lists with `chunks` chunks ("" when none or several).
std::string PrefixWithChunks(const std::string& store, int64_t chunks) {
  const KvctlRun r = Kvctl("ls " + store + " --json");
  auto json = tools::ParseJson(r.output);
  if (!json.ok()) return "";
  std::string id;
  for (const tools::JsonValue& p : *json->Find("prefixes")->AsArray()) {
    if (JsonInt(p, "chunks") != chunks) continue;
    if (!id.empty()) return "";
    id = *p.Find("id")->AsString();
  }
  return id;
}

void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  const char c = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x5a));
}

TEST(KvctlTest, ShowVerifyRepairRmGcAndStatsOfAStore) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store).exit_code, 0);
  // A: 16 chunks; B: 16 chunks of which the first 12 are A's.
  ASSERT_EQ(Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 256 --seed 1").exit_code, 0);
  ASSERT_EQ(Kvctl("put " + store +
                  " --model qwen2.5-0.5b --tokens 256 --seed 2 --shared-tokens 192 "
                  "--shared-seed 1")
                .exit_code,
            0);
  KvctlRun r = Kvctl("ls " + store + " --json");
  auto ls = tools::ParseJson(r.output);
  ASSERT_TRUE(ls.ok()) << r.output;
  const tools::JsonValue::Array& listed = *ls->Find("prefixes")->AsArray();
  ASSERT_EQ(listed.size(), 2u);
  const auto tokens_a = synth::Tokens(1, 256);
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const std::string id_a =
      ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens_a).back().ToHex();
  std::string id_b;
  for (const tools::JsonValue& p : listed) {
    if (*p.Find("id")->AsString() != id_a) id_b = *p.Find("id")->AsString();
  }
  ASSERT_EQ(id_b.size(), 32u) << r.output;

  // show: 16 chunks, each at its own place; the text names segment and heat strip.
  r = Kvctl("show " + store + " " + id_a.substr(0, 16) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto shown = tools::ParseJson(r.output);
  ASSERT_TRUE(shown.ok()) << shown.status() << r.output;
  const tools::JsonValue::Array& chunks = *shown->Find("chunks")->AsArray();
  ASSERT_EQ(chunks.size(), 16u);
  std::set<std::pair<int64_t, int64_t>> places;
  for (const tools::JsonValue& c : chunks) {
    places.insert({JsonInt(c, "segment"), JsonInt(c, "offset")});
    EXPECT_EQ(*c.Find("tier")->AsString(), "nvme");
  }
  EXPECT_EQ(places.size(), 16u) << r.output;
  const std::string segment_file = store + "/" + *chunks[14].Find("segment_file")->AsString();
  const int64_t offset14 = JsonInt(chunks[14], "offset");
  const std::string key14 = *chunks[14].Find("key")->AsString();
  r = Kvctl("show " + store + " " + id_a.substr(0, 16));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("256 tokens (16 chunks)"));
  EXPECT_THAT(r.output, HasSubstr("segments/seg-"));
  EXPECT_THAT(r.output, HasSubstr("     0 |                |"));  // no session: I = 0 everywhere

  r = Kvctl("verify " + store);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("clean"));

  // A flipped byte in A's chunk 14 (not shared with B): verify names it, repair removes it and
  // chunk 15 after it, and the store is clean again.
  FlipByte(segment_file, static_cast<uint64_t>(offset14) + 100);
  r = Kvctl("verify " + store);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr(key14.substr(0, 16) + "/L0"));
  r = Kvctl("verify " + store + " --repair");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("repair removed 2 chunks"));
  EXPECT_THAT(r.output, HasSubstr("chunk " + key14 + " (depth 14): failed a check"));
  EXPECT_THAT(r.output, HasSubstr("nothing left to repair"));
  r = Kvctl("verify " + store + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"ok\":true"));
  const std::string id_a14 = PrefixWithChunks(store, 14);  // A now ends at its chunk 13
  ASSERT_EQ(id_a14.size(), 32u);

  // rm B: its 4 own chunks go, the 12 it shares with A stay.
  r = Kvctl("show " + store + " " + id_b + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  shown = tools::ParseJson(r.output);
  ASSERT_TRUE(shown.ok()) << r.output;
  const int64_t offset_b15 = JsonInt((*shown->Find("chunks")->AsArray())[15], "offset");
  r = Kvctl("rm " + store + " " + id_b.substr(0, 16) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"chunks_freed\":4"));
  r = Kvctl("ls " + store);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr(id_b.substr(0, 16))));
  EXPECT_THAT(r.output, HasSubstr(id_a14.substr(0, 16)));

  // rm punched B's slots already: gc finds nothing. Blocks left in a free slot (as a crash or a
  // failed punch leaves them) are reclaimed, and a segment with no chunk is deleted.
  r = Kvctl("gc " + store + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"bytes_reclaimed\":0"));
  {
    std::fstream f(segment_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset_b15));
    const std::string junk(64 * 1024, 'x');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  r = Kvctl("gc " + store + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Open logs what it reclaimed to stderr, before the JSON on stdout.
  EXPECT_THAT(r.output,
              HasSubstr("reclaimed 65536 bytes of segment space no committed chunk names"));
  auto gc = tools::ParseJson(r.output.substr(r.output.find('{')));
  ASSERT_TRUE(gc.ok()) << r.output;
  EXPECT_EQ(JsonInt(*gc, "bytes_reclaimed"), 64 * 1024) << r.output;
  EXPECT_EQ(Kvctl("verify " + store).exit_code, 0);

  // stats: the figures of ls and show, and the ranking once a session has scored the chunks.
  r = Kvctl("stats " + store + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto stats = tools::ParseJson(r.output);
  ASSERT_TRUE(stats.ok()) << stats.status() << r.output;
  EXPECT_EQ(JsonInt(*stats->Find("stats"), "chunks"), 14);
  EXPECT_EQ(JsonInt(*stats->Find("stats"), "prefixes"), 1);
  EXPECT_EQ(JsonInt(*stats->Find("stats"), "segments"), 1);
  EXPECT_EQ(JsonInt(*stats->Find("stats"), "chunks_deleted"), 6);  // 2 repaired, 4 removed
  EXPECT_EQ(JsonInt(*stats->Find("score"), "chunks"), 14);
  EXPECT_EQ(JsonInt(*stats->Find("score"), "zero"), 14);
  EXPECT_EQ(stats->Find("tiers")->AsObject()->size(), 0u);  // no budgets given
  ls = tools::ParseJson(Kvctl("ls " + store + " --json").output);
  ASSERT_TRUE(ls.ok());
  EXPECT_EQ(JsonInt(*ls->Find("stats"), "disk_bytes_used"),
            JsonInt(*stats->Find("stats"), "disk_bytes_used"));

  const std::string trace = dir.Sub("trace.jsonl");
  std::ofstream(trace)
      << "{\"conversation\": \"a\", \"turn\": 1, \"generate\": {\"seed\": 1, \"tokens\": 224}}\n";
  ASSERT_EQ(Kvctl("replay " + store + " " + trace + " --model qwen2.5-0.5b --no-put").exit_code, 0);
  // A GPU tier of 5 chunks' records (24 layers of 8 KiB each), and a CPU tier whose record
  // share (3/4) holds everything else.
  const uint64_t record = spec.RecordBytes();
  r = Kvctl("stats " + store + " --json --gpu-tier-bytes " + std::to_string(5 * 24 * record) +
            " --cpu-tier-bytes 4M");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  stats = tools::ParseJson(r.output);
  ASSERT_TRUE(stats.ok()) << r.output;
  const tools::JsonValue& score = *stats->Find("score");
  EXPECT_LT(JsonInt(score, "zero"), 14);
  EXPECT_GT(NumberOf(score, "max"), 0);
  EXPECT_LE(NumberOf(score, "q1"), NumberOf(score, "median"));
  EXPECT_LE(NumberOf(score, "median"), NumberOf(score, "q3"));
  const tools::JsonValue& gpu = *stats->Find("tiers")->Find("gpu");
  const tools::JsonValue& cpu = *stats->Find("tiers")->Find("cpu");
  EXPECT_EQ(JsonInt(gpu, "records"), 5 * 24);
  EXPECT_EQ(JsonInt(gpu, "chunks"), 5);
  EXPECT_EQ(JsonInt(cpu, "records"), 9 * 24);
  const double gpu_share = NumberOf(gpu, "score_share");
  const double cpu_share = NumberOf(cpu, "score_share");
  EXPECT_GT(gpu_share, 5.0 / 14);  // the top 5 of 14 chunks by S
  EXPECT_NEAR(gpu_share + cpu_share, 1.0, 1e-9);
  r = Kvctl("stats " + store + " --gpu-tier-bytes 1M");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("gpu tier 1.0 MiB"));
  EXPECT_THAT(r.output, HasSubstr("serving process"));

  // The last prefix goes; gc deletes the segment file that holds nothing now.
  ASSERT_EQ(Kvctl("rm " + store + " " + id_a14).exit_code, 0);
  r = Kvctl("gc " + store);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("1 segment file removed, 0 left"));
  EXPECT_FALSE(std::filesystem::exists(segment_file));
}

TEST(KvctlTest, ShowRmAndGcRejectBadInputWithOneLine) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store).exit_code, 0);
  // 17 prefixes: two of them share a first hex digit.
  std::map<char, int> first_digits;
  for (int seed = 1; seed <= 17; ++seed) {
    const KvctlRun r = Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 16 --seed " +
                             std::to_string(seed) + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    first_digits[JsonString(r.output, "prefix_id")[0]]++;
  }
  char shared = 0;
  for (const auto& [digit, n] : first_digits) {
    if (n > 1) shared = digit;
  }
  ASSERT_NE(shared, 0);
  const std::string before = Kvctl("ls " + store + " --json").output;
  for (const std::string cmd : {"show", "rm"}) {
    SCOPED_TRACE(cmd);
    KvctlRun r = Kvctl(cmd + " " + store + " " + std::string(1, shared));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr("is ambiguous"));
    r = Kvctl(cmd + " " + store + " " + std::string(32, '0'));
    EXPECT_EQ(r.exit_code, 3) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_THAT(r.output, HasSubstr("no stored prefix id starts with " + std::string(32, '0')));
    r = Kvctl(cmd + " " + store + " not-hex");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    r = Kvctl(cmd + " " + dir.Sub("missing") + " 00");
    EXPECT_EQ(r.exit_code, 3) << r.output;
    EXPECT_THAT(r.output, HasSubstr("missing"));
    EXPECT_EQ(Kvctl(cmd + " " + store).exit_code, 2);  // no PREFIX
  }
  for (const std::string cmd : {"gc", "stats", "verify --repair"}) {
    SCOPED_TRACE(cmd);
    const KvctlRun r = Kvctl(cmd + " " + dir.Sub("missing"));
    EXPECT_EQ(r.exit_code, 3) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
  EXPECT_EQ(Kvctl("stats " + store + " --gpu-tier-bytes lots").exit_code, 2);
  EXPECT_EQ(Kvctl("verify " + store + " --repair --synthetic").exit_code, 2);
  for (const std::string cmd : {"show", "stats", "rm", "gc"}) {
    SCOPED_TRACE(cmd);
    EXPECT_EQ(Kvctl(cmd + " --help").exit_code, 0);
    EXPECT_THAT(Kvctl("help").output, HasSubstr("  " + cmd + " "));
  }
  EXPECT_EQ(Kvctl("ls " + store + " --json").output, before);
}

}  // namespace
}  // namespace ckv
