// kvctl, driven end to end as an operator would: exit codes and --json output.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "ckv/engine.h"
#include "storage/chunk_store.h"
#include "tests/test_util.h"

#ifndef CKV_KVCTL_PATH
#error "CKV_KVCTL_PATH must name the kvctl binary"
#endif

namespace ckv {
namespace {

using ::ckv::testing::TempDir;

struct KvctlRun {
  int exit_code = -1;
  std::string out;  // stdout and stderr
};

KvctlRun Kvctl(const std::string& args) {
  KvctlRun r;
  const std::string cmd = std::string(CKV_KVCTL_PATH) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(KvctlTest, InitPutListVerifyAndCatchACorruptRecord) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  KvctlRun r = Kvctl("init " + store + " --max-disk-bytes 64M");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = Kvctl("init " + store);
  EXPECT_EQ(r.exit_code, 3) << r.out;  // a store is there already

  r = Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 256 --seed 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"chunks_written\":16"), std::string::npos) << r.out;
  // 192 of its 256 tokens shared with the first: only the last 4 chunks are written.
  r = Kvctl("put " + store +
            " --model qwen2.5-0.5b --tokens 256 --seed 2 --shared-tokens 192 --shared-seed 1 "
            "--json");
  ASSERT_EQ(r.exit_code, 0) << r.out;

  r = Kvctl("ls " + store + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"prefixes\":2"), std::string::npos) << r.out;

  r = Kvctl("verify " + store + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"ok\":true"), std::string::npos) << r.out;

  // Flip one byte of one record.
  {
    auto spec = *ModelSpec::Preset("qwen2.5-0.5b");
    const auto tokens = synth::Tokens(1, 256);
    const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
    EngineOptions options;
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
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("checksum"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/L7"), std::string::npos) << r.out;
}

TEST(KvctlTest, UsageAndStoreErrorsHaveTheirExitCodes) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store).exit_code, 0);
  KvctlRun r = Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 250 --seed 1");
  EXPECT_EQ(r.exit_code, 2) << r.out;  // not a whole number of chunks
  EXPECT_NE(r.out.find("multiple of the chunk size 16"), std::string::npos) << r.out;
  r = Kvctl("put " + store + " --model no-such-model --tokens 32 --seed 1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  r = Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 12abc --seed 1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  r = Kvctl("frobnicate " + store);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  r = Kvctl("ls " + dir.Sub("missing"));
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(r.out.find("missing"), std::string::npos) << r.out;
  // None of this touched the store.
  r = Kvctl("ls " + store + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"prefixes\":[]"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace ckv
