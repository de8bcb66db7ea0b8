// SPDX-License-Identifier: Apache-2.0
// Tests of ckv/status.h (ErrnoToStatus, the macros) and ckv/log.h.
#include <cerrno>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ckv/log.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/status.h"
#include "storage/catalog.h"

namespace ckv {
namespace {

using ::testing::HasSubstr;

TEST(ErrnoToStatusTest, Codes) {
  struct Case {
    int err;
    const char* context;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {ENOSPC, "write x", absl::StatusCode::kResourceExhausted},
      {EDQUOT, "write x", absl::StatusCode::kResourceExhausted},
      {EFBIG, "write x", absl::StatusCode::kResourceExhausted},
      {ENOMEM, "alloc x", absl::StatusCode::kResourceExhausted},
      {ENOENT, "open x", absl::StatusCode::kNotFound},
      {EEXIST, "create x", absl::StatusCode::kAlreadyExists},
      {EACCES, "open x", absl::StatusCode::kPermissionDenied},
      {EPERM, "io_uring_setup", absl::StatusCode::kPermissionDenied},
      {EROFS, "open x", absl::StatusCode::kPermissionDenied},
      {EIO, "read segment seg-000003.ckv at offset 4096", absl::StatusCode::kDataLoss},
      {EIO, "Read record", absl::StatusCode::kDataLoss},
      {EIO, "write segment seg-000003.ckv at offset 4096", absl::StatusCode::kInternal},
      {EIO, "fdatasync seg-000003.ckv", absl::StatusCode::kInternal},
      {EINTR, "read x", absl::StatusCode::kUnavailable},
      {EAGAIN, "read x", absl::StatusCode::kUnavailable},
      {EBUSY, "open x", absl::StatusCode::kUnavailable},
      {EOPNOTSUPP, "punch hole", absl::StatusCode::kUnimplemented},
      {ENOSYS, "io_uring_setup", absl::StatusCode::kUnimplemented},
      {EINVAL, "read x", absl::StatusCode::kInternal},
      {EBADF, "read x", absl::StatusCode::kInternal},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ErrnoToStatus(c.err, c.context).code(), c.code) << c.err << " " << c.context;
  }
}

TEST(ErrnoToStatusTest, Message) {
  const absl::Status s = ErrnoToStatus(ENOSPC, "write segment seg-000003.ckv at offset 4096");
  EXPECT_EQ(s.message(),
            "write segment seg-000003.ckv at offset 4096: No space left on device (errno 28)");
  EXPECT_THAT(ErrnoToStatus(99999, "x").message(), HasSubstr("(errno 99999)"));
}

// A full file system is told by a mark, not by words: ENOSPC and EDQUOT from the one errno
// mapping and RocksDB's NoSpace carry it, keep it when a message is reworded, and a cap error
// that quotes a punch's ENOSPC text does not have it (the Put would evict for nothing).
TEST(ErrnoToStatusTest, IsNoSpaceGoesByTheMarkNotTheMessage) {
  EXPECT_TRUE(IsNoSpace(ErrnoToStatus(ENOSPC, "write segment seg-000003.ckv")));
  EXPECT_TRUE(IsNoSpace(ErrnoToStatus(EDQUOT, "write segment seg-000003.ckv")));
  EXPECT_FALSE(IsNoSpace(ErrnoToStatus(ENOMEM, "allocate")));  // ResourceExhausted, not a disk
  EXPECT_FALSE(IsNoSpace(ErrnoToStatus(EIO, "write segment seg-000003.ckv")));
  const absl::Status rocks = storage::FromRocks(
      rocksdb::Status::NoSpace("While appending to file: 000012.log"), "commit catalog batch");
  EXPECT_EQ(rocks.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsNoSpace(rocks)) << rocks;
  const absl::Status punch = ErrnoToStatus(ENOSPC, "punch hole in seg-000001.ckv");
  const absl::Status cap = absl::ResourceExhaustedError(
      absl::StrCat("cannot make room for 65536 bytes under max_disk_bytes 1048576: evicted 2 "
                   "chunks but could not give back the blocks of 2 slots (",
                   punch.message(), ")"));
  EXPECT_FALSE(IsNoSpace(cap)) << cap;
  const absl::Status reworded = WithMessage(punch, "Put of m: the file system was full");
  EXPECT_TRUE(IsNoSpace(reworded));
  EXPECT_EQ(reworded.message(), "Put of m: the file system was full");
  EXPECT_TRUE(IsNoSpace(NoSpaceError("catalog full")));
}

absl::Status Fails() { return absl::DataLossError("bad"); }
absl::StatusOr<int> Seven() { return 7; }
absl::StatusOr<int> NoInt() { return absl::NotFoundError("none"); }

absl::Status UseMacros(bool fail_status, bool fail_value, int* out) {
  if (fail_status) CKV_RETURN_IF_ERROR(Fails());
  CKV_ASSIGN_OR_RETURN(int v, fail_value ? NoInt() : Seven());
  CKV_ASSIGN_OR_RETURN(int w, Seven());  // twice in one scope
  *out = v + w;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnAndAssign) {
  int out = 0;
  EXPECT_TRUE(UseMacros(false, false, &out).ok());
  EXPECT_EQ(out, 14);
  EXPECT_EQ(UseMacros(true, false, &out).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(UseMacros(false, true, &out).code(), absl::StatusCode::kNotFound);
}

TEST(LoggerTest, StderrLinesArePrefixedAndWhole) {
  ::testing::internal::CaptureStderr();
  StderrLogger()->Log(LogLevel::kInfo, "opened store");
  StderrLogger()->Log(LogLevel::kWarning, "io_uring unavailable");
  StderrLogger()->Log(LogLevel::kError, "record 3/L7: checksum");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        StderrLogger()->Log(LogLevel::kInfo, std::string(100, static_cast<char>('a' + t)));
      }
    });
  }
  for (auto& th : threads) th.join();
  const std::string out = ::testing::internal::GetCapturedStderr();
  std::vector<std::string> lines = absl::StrSplit(out, '\n');
  ASSERT_EQ(lines.size(), 3u + 800u + 1u);
  EXPECT_EQ(lines[0], "ckv: info: opened store");
  EXPECT_EQ(lines[1], "ckv: warning: io_uring unavailable");
  EXPECT_EQ(lines[2], "ckv: error: record 3/L7: checksum");
  for (size_t i = 3; i < 803; ++i) {
    ASSERT_EQ(lines[i].size(), 11u + 100u) << lines[i];
    EXPECT_EQ(lines[i].find_first_not_of(lines[i][11], 11), std::string::npos) << lines[i];
  }
  EXPECT_EQ(lines.back(), "");
  EXPECT_EQ(StderrLogger(), StderrLogger());
}

TEST(LoggerTest, NullDropsEverything) {
  ::testing::internal::CaptureStderr();
  NullLogger()->Log(LogLevel::kError, "nothing");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(NullLogger(), NullLogger());
}

}  // namespace
}  // namespace ckv
