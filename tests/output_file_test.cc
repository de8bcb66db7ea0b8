// SPDX-License-Identifier: Apache-2.0
// tools/output_file.h: the files kvctl writes for the user (export, --json PATH).
//
// Regression (issue 32, item 3): export opened OUT.tmp with O_CREAT | O_TRUNC, so a symbolic link
// planted at that name overwrote its target; the file was 0644 where the store is 0600.
#include "tools/output_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <span>
#include <string>

#include "ckv/status.h"
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

}  // namespace
}  // namespace ckv::tools
