// SPDX-License-Identifier: Apache-2.0
// kvctl against what an attacker or a careless operator hands it: planted links at
// its output files, requests larger than memory, files that are no trace, escape sequences in
// model ids and labels, and timestamps and speeds that would sleep for ages. Each is refused or
// neutralised with a clear message and the documented exit code, quickly and in little memory.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ckv/model_spec.h"
#include "gmock/gmock.h"
#include "tests/test_util.h"
#include "tools/json_reader.h"
#include "tools/safetensors.h"
#include "tools/synthetic_kv.h"

#ifndef CKV_KVCTL_PATH
#error "CKV_KVCTL_PATH must name the kvctl binary"
#endif

namespace ckv {
namespace {

using ::ckv::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

struct ShellRun {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string out;      // stdout and stderr
  long max_rss_kb = 0;  // of the command's process (kvctl: `sh -c` execs it)
  double seconds = 0;
};

// Runs `command` with /bin/sh, progress off, and measures its peak RSS with wait4 (so that other
// children of this test process do not count). `timeout 60` bounds a command that would hang
// without the fix being tested.
ShellRun Shell(const std::string& command, const std::string& dir) {
  ShellRun r;
  const std::string out_path = dir + "/.run-output";
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) ::_exit(126);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::setenv("KVCTL_PROGRESS", "off", 1);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  if (pid > 0 && ::wait4(pid, &status, 0, &usage) == pid) {
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    r.max_rss_kb = usage.ru_maxrss;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ifstream in(out_path, std::ios::binary);
  r.out.assign(std::istreambuf_iterator<char>(in), {});
  std::filesystem::remove(out_path);
  return r;
}

ShellRun KvctlTimed(const std::string& args, const std::string& dir) {
  return Shell("exec timeout 60 " + std::string(CKV_KVCTL_PATH) + " " + args, dir);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

using ::ckv::testing::JsonString;

// A store holding one prefix of 64 tokens of qwen2.5-0.5b; returns its id.
std::string StoreWithOnePrefix(const TempDir& dir, const std::string& store) {
  EXPECT_EQ(KvctlTimed("init " + store + " --max-disk-bytes 64M", dir.path()).exit_code, 0);
  const ShellRun r =
      KvctlTimed("put " + store + " --model qwen2.5-0.5b --tokens 64 --seed 1 --json", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return JsonString(r.out, "prefix_id");
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 ? st.st_mode : 0;
}

// Regression: export opened OUT.tmp with O_CREAT | O_TRUNC, so a link planted
// there overwrote its target; OUT was 0644; --json PATH was fopen(PATH, "w"), which follows a
// link at PATH.
TEST(KvctlUntrustedInputTest, OutputFilesDoNotFollowPlantedLinksAndAreMode0600) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  const std::string id = StoreWithOnePrefix(dir, store);
  ASSERT_FALSE(id.empty());
  const std::string victim = dir.Sub("victim");
  std::ofstream(victim) << "precious";
  const std::string out = dir.Sub("out.safetensors");
  ASSERT_EQ(::symlink(victim.c_str(), (out + ".tmp").c_str()), 0);
  const std::string json = dir.Sub("export.json");
  ASSERT_EQ(::symlink(victim.c_str(), (json + ".tmp").c_str()), 0);

  ShellRun r = KvctlTimed("export " + store + " " + id + " " + out + " --json " + json, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(Slurp(victim), "precious");
  EXPECT_TRUE(S_ISREG(ModeOf(out)));
  EXPECT_EQ(ModeOf(out) & 07777, 0600u);
  EXPECT_EQ(ModeOf(json) & 07777, 0600u);
  EXPECT_THAT(Slurp(json), HasSubstr("\"prefix_id\":\"" + id + "\""));

  // A link at --json PATH itself is replaced by the file, not written through.
  const std::string linked = dir.Sub("ls.json");
  ASSERT_EQ(::symlink(victim.c_str(), linked.c_str()), 0);
  r = KvctlTimed("ls " + store + " --json " + linked, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(Slurp(victim), "precious");
  EXPECT_TRUE(S_ISREG(ModeOf(linked)));
  EXPECT_EQ(ModeOf(linked) & 07777, 0600u);

  // Nothing else is left in the directory: no temporary file.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("store", "victim", "out.safetensors",
                                                     "out.safetensors.tmp", "export.json",
                                                     "export.json.tmp", "ls.json"));
}

// Regression: one 100-byte Mooncake line with --block-tokens 65536 made a
// 768 MiB request, and replay built it (975 MB RSS) before any check but its 8 GiB bound.
TEST(KvctlUntrustedInputTest, RequestsOverTheMemoryLimitAreRefusedBeforeAllocating) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(KvctlTimed("init " + store + " --max-disk-bytes 64M", dir.path()).exit_code, 0);
  const std::string trace = dir.Sub("m.jsonl");
  std::ofstream(trace)
      << "{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [7]}\n";
  ShellRun r =
      KvctlTimed("replay " + store + " " + trace +
                     " --model qwen2.5-0.5b --block-tokens 65536 --max-request-kv-bytes 256M",
                 dir.path());
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_THAT(r.out, HasSubstr("RESOURCE_EXHAUSTED: " + trace +
                               ":1: turn 1 of \"r0\": 65536 tokens, 768.0 MiB of KV"));
  EXPECT_THAT(r.out, HasSubstr("over the limit of 256.0 MiB per request (--max-request-kv-bytes)"));
  if (!::ckv::testing::kSanitizerBuild) {
    EXPECT_LT(r.max_rss_kb, 128 * 1024) << r.out;
  }
  // Under the default limit, the request is still more than this 64 MiB store could hold: it is
  // refused before its KV is generated, as the store would refuse its Put after.
  r = KvctlTimed("replay " + store + " " + trace + " --model qwen2.5-0.5b --block-tokens 65536",
                 dir.path());
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_THAT(r.out, HasSubstr("RESOURCE_EXHAUSTED: Put of 4096 new chunks: 768.0 MiB of KV, more "
                               "than the store's cap of 64.0 MiB (max_disk_bytes); not generated"));
  if (!::ckv::testing::kSanitizerBuild) {
    EXPECT_LT(r.max_rss_kb, 128 * 1024) << r.out;
  }

  // put and import state the same limit.
  r = KvctlTimed("put " + store +
                     " --model qwen2.5-0.5b --tokens 65536 --seed 1 "
                     "--max-request-kv-bytes 256M",
                 dir.path());
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_THAT(r.out, HasSubstr("RESOURCE_EXHAUSTED: the prefix: 65536 tokens, 768.0 MiB of KV"));
  if (!::ckv::testing::kSanitizerBuild) {
    EXPECT_LT(r.max_rss_kb, 128 * 1024) << r.out;
  }

  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const std::vector<int32_t> ids = synth::Tokens(3, 64);
  const synth::SyntheticKv kv(spec, ids);
  const std::string file = dir.Sub("kv.safetensors");
  CKV_ASSERT_OK(safetensors::ExportKv(file, spec, ids, kv.tensors()));
  r = KvctlTimed(
      "import " + store + " " + file + " --model qwen2.5-0.5b --max-request-kv-bytes 64K",
      dir.path());
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_THAT(r.out, HasSubstr("over the import limit of 65536 bytes (--max-request-kv-bytes"));
  // ... and the limit is a byte count, at most 1T.
  r = KvctlTimed("put " + store +
                     " --model qwen2.5-0.5b --tokens 16 --seed 1 "
                     "--max-request-kv-bytes 2T",
                 dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--max-request-kv-bytes: '2T' is not a byte count up to 1T"));
}

// Regression: under a 3 GiB address-space limit a 7.9 GiB request ended in an
// uncaught std::bad_alloc (SIGABRT), not exit 3.
TEST(KvctlUntrustedInputTest, ARequestLargerThanTheAddressSpaceExitsThreeNotAbort) {
  if (::ckv::testing::kSanitizerBuild) {
    GTEST_SKIP() << "sanitizers reserve terabytes of address space: ulimit -v cannot apply";
  }
  TempDir dir;
  const std::string store = dir.Sub("store");
  // A cap the request fits (nothing is written: the cap only lets the replay get that far).
  ASSERT_EQ(KvctlTimed("init " + store + " --max-disk-bytes 16G", dir.path()).exit_code, 0);
  // 262144 tokens of qwen2.5-0.5b are 3 GiB of KV, under the 8 GiB limit given, over the 2 GiB of
  // address space the shell allows.
  const std::string limit = "ulimit -v 2097152 && exec " + std::string(CKV_KVCTL_PATH);
  ShellRun r = Shell(limit + " put " + store +
                         " --model qwen2.5-0.5b --tokens 262144 --seed 1 --max-request-kv-bytes 8G",
                     dir.path());
  EXPECT_EQ(r.signal, 0) << r.out;
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_THAT(r.out, HasSubstr("RESOURCE_EXHAUSTED: out of memory allocating 3.0 GiB"));

  const std::string trace = dir.Sub("t.jsonl");
  std::ofstream(trace) << "{\"conversation\": \"a\", \"turn\": 1, \"generate\": {\"seed\": 1, "
                          "\"tokens\": 262144}}\n";
  r = Shell(
      limit + " replay " + store + " " + trace + " --model qwen2.5-0.5b --max-request-kv-bytes 8G",
      dir.path());
  EXPECT_EQ(r.signal, 0) << r.out;
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_THAT(r.out, HasSubstr("RESOURCE_EXHAUSTED: out of memory"));
  // The store is as it was: nothing of either was stored.
  r = KvctlTimed("verify " + store + " --json", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\"chunks_checked\":0"));
}

// Regression: /dev/zero as a trace read 256 MiB (the file limit) before it was
// refused.
TEST(KvctlUntrustedInputTest, AFileThatIsNoTraceIsRefusedAtOnce) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(KvctlTimed("init " + store + " --max-disk-bytes 64M", dir.path()).exit_code, 0);
  ShellRun r = KvctlTimed("replay " + store + " /dev/zero --model qwen2.5-0.5b", dir.path());
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_THAT(r.out, HasSubstr("/dev/zero:1: a NUL byte at byte 0 of the file: binary data, not a "
                               "JSON Lines trace"));
  if (!::ckv::testing::kSanitizerBuild) {
    EXPECT_LT(r.max_rss_kb, 64 * 1024) << r.out;
  }
  // Text that is no trace: refused at its first character, not at the end of the file.
  const std::string text = dir.Sub("notes.txt");
  std::ofstream(text) << "\n  hello\n" << std::string(1 << 20, 'x') << "\n";
  r = KvctlTimed("replay " + store + " " + text + " --model qwen2.5-0.5b", dir.path());
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_THAT(r.out, HasSubstr(text + ":2: the line starts with 'h', not '{'"));
  // A line that never ends is refused once it passes the line limit (16 MiB), not the file's.
  r = Shell("head -c 40000000 /dev/zero | tr '\\0' '{' | exec timeout 60 " +
                std::string(CKV_KVCTL_PATH) + " replay " + store +
                " /dev/stdin --model qwen2.5-0.5b",
            dir.path());
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_THAT(r.out, HasSubstr("/dev/stdin:1: line of more than 16777216 bytes"));
}

// Regression: a model id from an imported file ("\x1b]0;pwned\x07" retitles
// an xterm) and a trace's labels reached the terminal raw through import, ls, show and errors.
TEST(KvctlUntrustedInputTest, EscapeSequencesFromFilesAndStoresAreShownNotObeyed) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(KvctlTimed("init " + store + " --max-disk-bytes 64M", dir.path()).exit_code, 0);
  ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  spec.model_id = "evil\x1b]0;pwned\x07";
  const std::vector<int32_t> ids = synth::Tokens(3, 32);
  const synth::SyntheticKv kv(spec, ids);
  const std::string file = dir.Sub("evil.safetensors");
  CKV_ASSERT_OK(safetensors::ExportKv(file, spec, ids, kv.tensors()));

  ShellRun r = KvctlTimed("import " + store + " " + file + " --model qwen2.5-0.5b", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x07'), std::string::npos) << r.out;
  EXPECT_THAT(r.out, HasSubstr("evil\\x1b]0;pwned\\x07 (24 layers"));
  r = KvctlTimed("ls " + store, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_THAT(r.out, HasSubstr("evil\\x1b]0;pwned\\x07"));
  r = KvctlTimed("ls " + store + " --json", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_THAT(r.out, HasSubstr("evil\\u001b]0;pwned\\u0007"));
  const std::string id = JsonString(r.out, "id");
  r = KvctlTimed("show " + store + " " + id, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;

  // A trace's label, in the replay table and in an error message.
  const std::string trace = dir.Sub("t.jsonl");
  std::ofstream(trace) << "{\"conversation\": \"\\u001b[2J\", \"turn\": 1, \"tokens\": [1, 2]}\n";
  r = KvctlTimed("replay " + store + " " + trace + " --model qwen2.5-0.5b", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\\x1b[2J"));
  std::ofstream(trace, std::ios::app)
      << "{\"conversation\": \"\\u001b[2J\", \"turn\": 3, \"tokens\": [1, 2]}\n";
  r = KvctlTimed("replay " + store + " " + trace + " --model qwen2.5-0.5b", dir.path());
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_THAT(r.out, HasSubstr("turn 3 of conversation \"\\x1b[2J\" follows turn 1"));
}

// Regression: --speed 1e-20, or a timestamp of 1e15 ms at --speed 1, slept for
// ages. Both are refused before the replay starts.
TEST(KvctlUntrustedInputTest, ReplaySpeedsAndTimestampGapsThatWouldSleepForAgesAreRefused) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(KvctlTimed("init " + store + " --max-disk-bytes 64M", dir.path()).exit_code, 0);
  const std::string trace = dir.Sub("m.jsonl");
  std::ofstream(trace)
      << "{\"timestamp\": 0, \"input_length\": 32, \"output_length\": 1, \"hash_ids\": [1]}\n"
         "{\"timestamp\": 9, \"input_length\": 32, \"output_length\": 1, \"hash_ids\": [1]}\n";
  ShellRun r = KvctlTimed("replay " + store + " " + trace + " --model qwen2.5-0.5b --speed 1e-20",
                          dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--speed: 1e-20 is not 0 or a number in [0.001, 1e+06]"));
  r = KvctlTimed("replay " + store + " " + trace + " --model qwen2.5-0.5b --speed 2e6", dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out;

  std::ofstream(trace, std::ios::app)
      << "{\"timestamp\": 1e15, \"input_length\": 32, \"output_length\": 1, \"hash_ids\": [1]}\n";
  r = KvctlTimed("replay " + store + " " + trace + " --model qwen2.5-0.5b --speed 1", dir.path());
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_THAT(r.out,
              HasSubstr(trace + ":3: request \"r2\" arrives 1e+12 s after the one before "
                                "it; at --speed 1 replay would wait 1e+12 s, and it waits at most "
                                "3600 s between requests"));
  EXPECT_LT(r.seconds, 30) << r.out;
  // Slowed down within the bounds, the first two requests replay (9 ms apart, at half speed).
  r = KvctlTimed(
      "replay " + store + " " + trace + " --model qwen2.5-0.5b --speed 0.5 --max-requests 2 --json",
      dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

}  // namespace
}  // namespace ckv
