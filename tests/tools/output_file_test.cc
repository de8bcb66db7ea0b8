// SPDX-License-Identifier: Apache-2.0
// tools/output_file.h: the files kvctl writes for the user (export, --json PATH).
//
// Regression: export opened OUT.tmp with O_CREAT | O_TRUNC, so a symbolic link
// planted at that name overwrote its target; the file was 0644 where the store is 0600.
#include "tools/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <set>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckv::tools {
namespace {

using ::ckv::testing::TempDir;
using ::testing::HasSubstr;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The names in `dir`.
std::set<std::string> Names(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.insert(e.path().filename().string());
  }
  return names;
}

// Temporary names "0000000000000000", "0000000000000001", ...: guessable, as an attacker would
// want them.
OutputFileOptions Guessable() {
  OutputFileOptions options;
  options.temp_suffix = [n = 0]() mutable {
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016x", n++);
    return std::string(buf);
  };
  return options;
}

TEST(OutputFileTest, WritesTheWholeFileMode0600AndReplacesTheOldOne) {
  TempDir dir;
  const std::string out = dir.Sub("out.json");
  Spit(out, "old");
  ASSERT_EQ(::chmod(out.c_str(), 0644), 0);
  CKV_ASSERT_OK(WriteOutputFile(out, "{\"new\": true}\n"));
  EXPECT_EQ(Slurp(out), "{\"new\": true}\n");
  struct stat st;
  ASSERT_EQ(::lstat(out.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(Names(dir.path()), std::set<std::string>{"out.json"});
}

TEST(OutputFileTest, LinksPlantedAtTheOldTmpNameAndAtGuessableNamesAreNotFollowed) {
  TempDir dir;
  const std::string victim = dir.Sub("victim");
  Spit(victim, "precious");
  const std::string out = dir.Sub("out.safetensors");
  // The name the old code wrote through, and the first names the guessable generator gives.
  const std::set<std::string> planted = {"out.safetensors.tmp",
                                         ".out.safetensors.0000000000000000.tmp",
                                         ".out.safetensors.0000000000000001.tmp"};
  for (const std::string& name : planted) {
    ASSERT_EQ(::symlink(victim.c_str(), dir.Sub(name).c_str()), 0) << name;
  }
  CKV_ASSERT_OK(WriteOutputFile(out, "exported", Guessable()));
  EXPECT_EQ(Slurp(victim), "precious");
  EXPECT_EQ(Slurp(out), "exported");
  // The links are still links to the victim: neither written through nor replaced.
  for (const std::string& name : planted) {
    std::error_code ec;
    EXPECT_TRUE(std::filesystem::is_symlink(dir.Sub(name), ec)) << name;
  }
  std::set<std::string> want = planted;
  want.insert("victim");
  want.insert("out.safetensors");
  EXPECT_EQ(Names(dir.path()), want);

  // A link at the output's own name is replaced by the file, its target untouched.
  const std::string linked = dir.Sub("linked.json");
  ASSERT_EQ(::symlink(victim.c_str(), linked.c_str()), 0);
  CKV_ASSERT_OK(WriteOutputFile(linked, "{}\n"));
  EXPECT_EQ(Slurp(victim), "precious");
  std::error_code ec;
  EXPECT_FALSE(std::filesystem::is_symlink(linked, ec));
  EXPECT_EQ(Slurp(linked), "{}\n");
}

TEST(OutputFileTest, EveryTemporaryNameTakenIsAlreadyExistsAndCreatesNothing) {
  TempDir dir;
  OutputFileOptions options;
  options.temp_suffix = [] { return std::string("0000000000000000"); };
  Spit(dir.Sub(".out.0000000000000000.tmp"), "someone else's");
  const absl::Status s = WriteOutputFile(dir.Sub("out"), "x", options);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("16 random names were all taken"));
  EXPECT_EQ(Slurp(dir.Sub(".out.0000000000000000.tmp")), "someone else's");
  EXPECT_EQ(Names(dir.path()), std::set<std::string>{".out.0000000000000000.tmp"});
}

TEST(OutputFileTest, AFailedWriteLeavesTheOldFileAndNoTemporaryFile) {
  TempDir dir;
  const std::string out = dir.Sub("out");
  Spit(out, "old");
  const absl::Status s = WriteOutputFile(out, [](const OutputWriteFn& write) -> absl::Status {
    const std::string part = "half of it";
    CKV_RETURN_IF_ERROR(write(std::as_bytes(std::span(part.data(), part.size()))));
    return absl::DataLossError("read record 3/L0: checksum mismatch");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(Slurp(out), "old");
  EXPECT_EQ(Names(dir.path()), std::set<std::string>{"out"});

  // A directory that does not exist: NotFound naming the temporary file's path.
  const absl::Status missing = WriteOutputFile(dir.Sub("no-such-dir/out"), "x");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_THAT(std::string(missing.message()), HasSubstr(dir.Sub("no-such-dir/.out.")));
}

TEST(OutputFileTest, ACharacterDeviceIsWrittenInPlace) {
  CKV_EXPECT_OK(WriteOutputFile("/dev/null", "{}\n"));
  struct stat st;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

// Runs WriteOutputFile(path, contents) on a thread. A write still blocked after 20 s (on a FIFO
// that no process reads) is released by opening that FIFO for reading, and reported as blocked.
absl::Status WriteWithoutBlocking(const std::string& path, const std::string& contents,
                                  const std::string& fifo, bool* blocked) {
  auto done = std::async(std::launch::async, [&] { return WriteOutputFile(path, contents); });
  *blocked = done.wait_for(std::chrono::seconds(20)) != std::future_status::ready;
  int reader = -1;
  if (*blocked) reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  absl::Status s = done.get();
  if (reader >= 0) ::close(reader);
  return s;
}

TEST(OutputFileTest, RegressionAFifoWithNoReaderIsAnErrorNotAWait) {
  // Regression: the FIFO was opened O_WRONLY without O_NONBLOCK, which
  // waits for a reader: kvctl export or --json hung on a FIFO planted at OUT.
  TempDir dir;
  const std::string fifo = dir.Sub("out.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  bool blocked = false;
  const absl::Status s = WriteWithoutBlocking(fifo, "{}\n", fifo, &blocked);
  EXPECT_FALSE(blocked) << "the write waited for a reader";
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("no process reads"));
  struct stat st;
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST(OutputFileTest, AFifoWithAReaderIsWrittenInPlace) {
  TempDir dir;
  const std::string fifo = dir.Sub("out.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  CKV_EXPECT_OK(WriteOutputFile(fifo, "{\"a\": 1}\n"));  // fits the pipe's buffer
  char buf[64] = {};
  const ssize_t n = ::read(reader, buf, sizeof(buf));
  ::close(reader);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "{\"a\": 1}\n");
  EXPECT_EQ(Names(dir.path()), std::set<std::string>{"out.json"});
}

TEST(OutputFileTest, RegressionALinkToAFifoOrADeviceIsReplacedNotWrittenThrough) {
  // Regression: stat followed a link at OUT, so a link to a FIFO hung the
  // write and a link to a writable character device was written through.
  TempDir dir;
  const std::string fifo = dir.Sub("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string to_fifo = dir.Sub("to-fifo.json");
  ASSERT_EQ(::symlink(fifo.c_str(), to_fifo.c_str()), 0);
  bool blocked = false;
  CKV_EXPECT_OK(WriteWithoutBlocking(to_fifo, "{}\n", fifo, &blocked));
  EXPECT_FALSE(blocked) << "the write went through the link to the FIFO";
  std::error_code ec;
  EXPECT_FALSE(std::filesystem::is_symlink(to_fifo, ec));
  EXPECT_EQ(Slurp(to_fifo), "{}\n");
  struct stat st;
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));

  const std::string to_null = dir.Sub("to-null.json");
  ASSERT_EQ(::symlink("/dev/null", to_null.c_str()), 0);
  CKV_EXPECT_OK(WriteOutputFile(to_null, "exported"));
  EXPECT_FALSE(std::filesystem::is_symlink(to_null, ec));
  EXPECT_EQ(Slurp(to_null), "exported");
  ASSERT_EQ(::lstat(to_null.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST(OutputFileTest, AStreamOfTheProcessIsWrittenThroughItsDescriptor) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  CKV_EXPECT_OK(WriteOutputFile(absl::StrCat("/proc/self/fd/", fds[1]), "streamed"));
  CKV_EXPECT_OK(WriteOutputFile(absl::StrCat("/dev/fd/", fds[1]), "+again"));
  ::close(fds[1]);
  char buf[64] = {};
  const ssize_t n = ::read(fds[0], buf, sizeof(buf));
  ::close(fds[0]);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "streamed+again");
}

}  // namespace
}  // namespace ckv::tools
