// SPDX-License-Identifier: Apache-2.0
// kvctl against what an attacker or a careless operator hands it (issue 32): planted links at
// its output files, escape sequences in model ids and labels. Each is refused or neutralised with
// a clear message and the documented exit code, quickly and in little memory.
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
  std::string out;     // stdout and stderr
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

ShellRun Kvctl(const std::string& args, const std::string& dir) {
  return Shell("exec timeout 60 " + std::string(CKV_KVCTL_PATH) + " " + args, dir);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The value of the first "key":"..." string member in `json`.
std::string JsonString(const std::string& json, const std::string& key) {
  const std::string open = "\"" + key + "\":\"";
  const size_t at = json.find(open);
  if (at == std::string::npos) return "";
  const size_t begin = at + open.size();
  return json.substr(begin, json.find('"', begin) - begin);
}

// A store holding one prefix of 64 tokens of qwen2.5-0.5b; returns its id.
std::string StoreWithOnePrefix(const TempDir& dir, const std::string& store) {
  EXPECT_EQ(Kvctl("init " + store + " --max-disk-bytes 64M", dir.path()).exit_code, 0);
  const ShellRun r =
      Kvctl("put " + store + " --model qwen2.5-0.5b --tokens 64 --seed 1 --json", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return JsonString(r.out, "prefix_id");
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 ? st.st_mode : 0;
}

// Regression (issue 32, item 3): export opened OUT.tmp with O_CREAT | O_TRUNC, so a link planted
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

  ShellRun r = Kvctl("export " + store + " " + id + " " + out + " --json " + json, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(Slurp(victim), "precious");
  EXPECT_TRUE(S_ISREG(ModeOf(out)));
  EXPECT_EQ(ModeOf(out) & 07777, 0600u);
  EXPECT_EQ(ModeOf(json) & 07777, 0600u);
  EXPECT_THAT(Slurp(json), HasSubstr("\"prefix_id\":\"" + id + "\""));

  // A link at --json PATH itself is replaced by the file, not written through.
  const std::string linked = dir.Sub("ls.json");
  ASSERT_EQ(::symlink(victim.c_str(), linked.c_str()), 0);
  r = Kvctl("ls " + store + " --json " + linked, dir.path());
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

// Regression (issue 32, item 6): a model id from an imported file ("\x1b]0;pwned\x07" retitles
// an xterm) and a trace's labels reached the terminal raw through import, ls, show and errors.
TEST(KvctlUntrustedInputTest, EscapeSequencesFromFilesAndStoresAreShownNotObeyed) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  ASSERT_EQ(Kvctl("init " + store + " --max-disk-bytes 64M", dir.path()).exit_code, 0);
  ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  spec.model_id = "evil\x1b]0;pwned\x07";
  const std::vector<int32_t> ids = synth::Tokens(3, 32);
  const synth::SyntheticKv kv(spec, ids);
  const std::string file = dir.Sub("evil.safetensors");
  CKV_ASSERT_OK(safetensors::ExportKv(file, spec, ids, kv.tensors()));

  ShellRun r = Kvctl("import " + store + " " + file + " --model qwen2.5-0.5b", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x07'), std::string::npos) << r.out;
  EXPECT_THAT(r.out, HasSubstr("evil\\x1b]0;pwned\\x07 (24 layers"));
  r = Kvctl("ls " + store, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_THAT(r.out, HasSubstr("evil\\x1b]0;pwned\\x07"));
  r = Kvctl("ls " + store + " --json", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_THAT(r.out, HasSubstr("evil\\u001b]0;pwned\\u0007"));
  const std::string id = JsonString(r.out, "id");
  r = Kvctl("show " + store + " " + id, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;

  // A trace's label, in the replay table and in an error message.
  const std::string trace = dir.Sub("t.jsonl");
  std::ofstream(trace) << "{\"conversation\": \"\\u001b[2J\", \"turn\": 1, \"tokens\": [1, 2]}\n";
  r = Kvctl("replay " + store + " " + trace + " --model qwen2.5-0.5b", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\\x1b[2J"));
  std::ofstream(trace, std::ios::app)
      << "{\"conversation\": \"\\u001b[2J\", \"turn\": 3, \"tokens\": [1, 2]}\n";
  r = Kvctl("replay " + store + " " + trace + " --model qwen2.5-0.5b", dir.path());
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_THAT(r.out, HasSubstr("turn 3 of conversation \"\\x1b[2J\" follows turn 1"));
}

}  // namespace
}  // namespace ckv
