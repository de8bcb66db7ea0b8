// SPDX-License-Identifier: Apache-2.0
// The security checklist of docs/reliability.md: store files are 0600 and directories 0700
// (RocksDB's too, including files it creates after open), and kvctl writes nothing outside the
// paths it is given.
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ckv/engine.h"
#include "storage/catalog.h"
#include "tests/test_util.h"
#include "tools/synthetic_kv.h"

#ifndef CKV_KVCTL_PATH
#error "CKV_KVCTL_PATH must name the kvctl binary"
#endif

namespace ckv {
namespace {

using ::ckv::testing::PutSynthetic;
using ::ckv::testing::TempDir;

// Sets the umask for the test's lifetime and puts the old one back: the checks must hold under
// the common 022, whatever the runner's umask is.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(old_); }

 private:
  mode_t old_;
};

// Every path under `root` (root included) whose mode is not 0600 (files) or 0700 (directories),
// with its mode; and how many files were checked.
std::vector<std::string> WrongModes(const std::string& root, int* files_checked) {
  std::vector<std::string> wrong;
  auto check = [&](const std::filesystem::path& p) {
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0) {
      wrong.push_back(p.string() + ": cannot stat");
      return;
    }
    const mode_t mode = st.st_mode & 07777;
    if (S_ISDIR(st.st_mode)) {
      if (mode != 0700) wrong.push_back(p.string() + ": directory mode " + std::to_string(mode));
    } else if (S_ISREG(st.st_mode)) {
      ++*files_checked;
      if (mode != 0600) wrong.push_back(p.string() + ": file mode " + std::to_string(mode));
    } else {
      wrong.push_back(p.string() + ": neither a file nor a directory");
    }
  };
  check(root);
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) check(e.path());
  return wrong;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += s + "\n";
  return out;
}

ModelSpec SmallSpec() {
  ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b", DType::kFp16);
  spec.layers = 4;
  return spec;
}

TEST(SecurityTest, StoreFilesAre0600AndDirectories0700AfterPutsFlushCompactionAndReopen) {
  ScopedUmask umask(022);
  TempDir dir;
  const std::string store = dir.Sub("store");
  const ModelSpec spec = SmallSpec();
  int files = 0;
  {
    auto engine = Engine::Open(EngineOptions{}, store);
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      ASSERT_TRUE(PutSynthetic(**engine, spec, synth::Tokens(seed, 64)).ok());
    }
    EXPECT_EQ(Join(WrongModes(store, &files)), "") << "after open and puts";
  }
  // Reopen: RocksDB replays its WAL, writes a new one, a new MANIFEST and OPTIONS, rotates LOG.
  {
    auto engine = Engine::Open(EngineOptions{}, store);
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE(PutSynthetic(**engine, spec, synth::Tokens(4, 64)).ok());
  }
  // Flush and compaction: new SST files, then the old ones deleted.
  {
    storage::Catalog::Contents contents;
    auto catalog = storage::Catalog::Open(store + "/catalog", false, false, &contents);
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    CKV_ASSERT_OK((*catalog)->FlushAndCompact());
  }
  bool saw_sst = false, saw_log = false;
  for (const auto& e : std::filesystem::directory_iterator(store + "/catalog")) {
    saw_sst |= e.path().extension() == ".sst";
    saw_log |= e.path().filename().string().rfind("LOG", 0) == 0;
  }
  EXPECT_TRUE(saw_sst) << "the flush made no SST file to check";
  EXPECT_TRUE(saw_log) << "RocksDB wrote no LOG file to check";
  files = 0;
  EXPECT_EQ(Join(WrongModes(store, &files)), "") << "after flush and compaction";
  EXPECT_GE(files, 8) << "segment, SST, WAL, MANIFEST, CURRENT, IDENTITY, OPTIONS, LOCK, LOG";

  // A store whose catalog an older ckv left with the umask's modes is tightened on open.
  ASSERT_EQ(::chmod((store + "/catalog").c_str(), 0755), 0);
  ASSERT_EQ(::chmod((store + "/catalog/CURRENT").c_str(), 0644), 0);
  {
    auto engine = Engine::Open(EngineOptions{}, store);
    ASSERT_TRUE(engine.ok()) << engine.status();
  }
  files = 0;
  EXPECT_EQ(Join(WrongModes(store, &files)), "") << "after reopening a store with wide modes";
}

// Runs kvctl with `args` in directory `cwd`, with TMPDIR and HOME pointed at `tmp`.
int KvctlIn(const std::string& cwd, const std::string& tmp, const std::string& args,
            std::string* out) {
  const std::string cmd = "cd '" + cwd + "' && TMPDIR='" + tmp + "' HOME='" + tmp +
                          "' KVCTL_PROGRESS=off " + std::string(CKV_KVCTL_PATH) + " " + args +
                          " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    names.insert(std::filesystem::relative(e.path(), dir).string());
  }
  return names;
}

TEST(SecurityTest, KvctlWritesNothingOutsideTheStoreAndTheOutputPathsItIsGiven) {
  ScopedUmask umask(022);
  TempDir dir;
  const std::string cwd = dir.Sub("cwd"), tmp = dir.Sub("tmp"), outputs = dir.Sub("out");
  for (const std::string& d : {cwd, tmp, outputs}) std::filesystem::create_directory(d);
  const std::string store = dir.Sub("store");
  const std::string trace = outputs + "/trace.jsonl";
  std::ofstream(trace)
      << "{\"conversation\": \"a\", \"turn\": 1, \"generate\": {\"seed\": 1, \"tokens\": 64}}\n"
         "{\"conversation\": \"a\", \"turn\": 2, \"generate\": {\"seed\": 2, \"tokens\": 40}}\n";
  const std::string exported = outputs + "/prefix.safetensors";

  std::string out;
  auto run = [&](const std::string& args, int want_exit) {
    EXPECT_EQ(KvctlIn(cwd, tmp, args, &out), want_exit) << "kvctl " << args << "\n" << out;
  };
  run("init " + store + " --max-disk-bytes 64M", 0);
  run("put " + store + " --model qwen2.5-0.5b --tokens 64 --seed 1", 0);
  run("put " + store +
          " --model qwen2.5-0.5b --tokens 96 --seed 2 --shared-tokens 64 "
          "--shared-seed 1",
      0);
  ASSERT_EQ(KvctlIn(cwd, tmp, "ls " + store + " --json", &out), 0) << out;
  const size_t at = out.find("\"id\":\"");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string id = out.substr(at + 6, 32);
  run("show " + store + " " + id, 0);
  run("stats " + store, 0);
  run("export " + store + " " + id + " " + exported, 0);
  run("import " + store + " " + exported + " --model qwen2.5-0.5b", 0);
  run("verify " + store + " --synthetic", 0);
  run("verify " + store + " --repair", 0);
  run("replay " + store + " " + trace + " --model qwen2.5-0.5b", 0);
  run("rm " + store + " " + id, 0);
  run("gc " + store, 0);
  // Errors write nothing either.
  run("export " + store + " " + id + " " + outputs + "/gone.safetensors", 3);
  run("init " + store, 3);

  EXPECT_EQ(Entries(cwd), std::set<std::string>{}) << "kvctl wrote into its working directory";
  EXPECT_EQ(Entries(tmp), std::set<std::string>{}) << "kvctl wrote into $TMPDIR or $HOME";
  EXPECT_EQ(Entries(outputs), (std::set<std::string>{"prefix.safetensors", "trace.jsonl"}));
  std::set<std::string> top;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    top.insert(e.path().filename().string());
  }
  EXPECT_EQ(top, (std::set<std::string>{"cwd", "tmp", "out", "store"}));
  int files = 0;
  EXPECT_EQ(Join(WrongModes(store, &files)), "") << "a store kvctl made";
}

}  // namespace
}  // namespace ckv

namespace ckv {
namespace {

// Regression (security audit): ModelSpec::Validate allows records of up to 2^40 bytes, but a
// segment's geometry keeps the record size in a u32: a spec with 4 GiB records became a segment
// of 0-byte records. Put now refuses records over storage::kMaxRecordBytes before anything is
// allocated or written.
TEST(SecurityTest, APutWhoseRecordsExceedTheLimitIsRefusedNotTruncated) {
  TempDir dir;
  auto engine = Engine::Open(EngineOptions{}, dir.Sub("store"));
  ASSERT_TRUE(engine.ok()) << engine.status();
  ModelSpec spec;
  spec.model_id = "huge";
  spec.layers = 1;
  spec.q_heads = 128;
  spec.kv_heads = 128;
  spec.head_dim = 1024;
  spec.dtype = DType::kFp32;
  spec.chunk_tokens = 4096;  // 2 x 4096 x 128 x 1024 x 4 = 4 GiB a record
  ASSERT_TRUE(spec.Validate().ok());
  const std::vector<int32_t> tokens(4096, 7);
  KvTensors kv;
  kv.tokens = tokens.size();  // no tensors: the limit is checked first
  auto put = (*engine)->Put(spec, tokens, kv);
  ASSERT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument) << put.status();
  EXPECT_NE(put.status().message().find("is 4294967296 bytes, over the limit of 1073741824"),
            absl::string_view::npos)
      << put.status();
  EXPECT_EQ((*engine)->Stats().chunks, 0u);
}

// A segment geometry that decodes: one layer of 4 KiB records, one slot.
storage::SegmentRecord SmallGeometry() {
  storage::SegmentRecord g;
  g.layers = 1;
  g.band_layers = 1;
  g.record_bytes = 4096;
  g.record_slot_bytes = 4096;
  g.capacity_slots = 1;
  return g;
}

// Expects `g` to decode, as written, to DataLoss naming it.
void ExpectInconsistentGeometry(const storage::SegmentRecord& g) {
  auto decoded = storage::DecodeSegmentRecord(storage::EncodeSegmentRecord(g), "segments/1");
  ASSERT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss) << decoded.status();
  EXPECT_NE(decoded.status().message().find("segments/1: inconsistent geometry"),
            absl::string_view::npos)
      << decoded.status();
}

// Regression (security audit): a segment record's record and slot sizes were bounded only by
// their u32; a damaged catalog could make every read of the segment allocate up to 4 GiB.
TEST(SecurityTest, ASegmentRecordWithRecordsOverTheLimitIsDataLoss) {
  storage::SegmentRecord g = SmallGeometry();
  ASSERT_TRUE(storage::DecodeSegmentRecord(storage::EncodeSegmentRecord(g), "segments/1").ok());
  g.record_bytes = uint32_t{1} << 31;
  g.record_slot_bytes = uint32_t{1} << 31;
  ExpectInconsistentGeometry(g);
}

TEST(SecurityTest, ASegmentClaimingMoreSlotsThanASegmentHoldsIsDataLoss) {
  // The slots a load marks and the checksums it holds are sized by capacity_slots: a damaged one
  // (any u32) must not size them.
  storage::SegmentRecord g = SmallGeometry();
  g.capacity_slots = storage::kMaxSegmentSlots;
  ASSERT_TRUE(storage::DecodeSegmentRecord(storage::EncodeSegmentRecord(g), "segments/1").ok());
  g.capacity_slots = storage::kMaxSegmentSlots + 1;
  ExpectInconsistentGeometry(g);
}

}  // namespace
}  // namespace ckv
