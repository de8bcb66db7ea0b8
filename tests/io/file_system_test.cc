// SPDX-License-Identifier: Apache-2.0
// Tests of the data path's OS seam: AlignedBuffer, the POSIX file system, both IoQueue backends
// (io_uring and the synchronous "threads" one) and the fault-injecting wrapper.
#include "io/file_system.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "io/fault_file_system.h"
#include "io/mem_file_system.h"
#include "io/uring_io_queue.h"
#include "tests/test_util.h"

namespace ckv::io {
namespace {

using ::ckv::testing::TempDir;
using OpenMode = FileSystem::OpenMode;

constexpr size_t kBlock = 4096;

// Fills `out` with bytes that depend on `seed` and the position, so misplaced blocks show.
void FillPattern(std::span<std::byte> out, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < out.size(); i += 8) {
    const uint64_t word = rng();
    std::memcpy(out.data() + i, &word, std::min<size_t>(8, out.size() - i));
  }
}

bool AllBytesAre(std::span<const std::byte> bytes, std::byte value) {
  return std::all_of(bytes.begin(), bytes.end(), [&](std::byte b) { return b == value; });
}

std::unique_ptr<File> OpenOrDie(FileSystem* fs, const std::string& path,
                                OpenMode mode = OpenMode::kCreateReadWrite) {
  auto file = fs->Open(path, mode);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::move(*file) : nullptr;
}

// The number N in "<before>N<after>" inside `message`, or -1.
int64_t NumberAfter(absl::string_view message, absl::string_view before) {
  const size_t at = message.find(before);
  if (at == absl::string_view::npos) return -1;
  absl::string_view rest = message.substr(at + before.size());
  rest = rest.substr(0, rest.find_first_not_of("0123456789"));
  int64_t value = -1;
  return absl::SimpleAtoi(rest, &value) ? value : -1;
}

// A File the POSIX queues have never seen.
class FakeFile final : public File {
 public:
  const std::string& path() const override { return path_; }
  size_t alignment() const override { return kBlock; }
  absl::Status ReadAt(uint64_t, std::span<std::byte>) override { return absl::OkStatus(); }
  absl::Status WriteAt(uint64_t, std::span<const std::byte>) override { return absl::OkStatus(); }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status PunchHole(uint64_t, uint64_t) override { return absl::OkStatus(); }
  absl::Status Allocate(uint64_t, uint64_t) override { return absl::OkStatus(); }
  absl::Status Truncate(uint64_t) override { return absl::OkStatus(); }
  absl::StatusOr<uint64_t> Size() override { return 0; }
  absl::StatusOr<uint64_t> AllocatedBytes() override { return 0; }

 private:
  std::string path_ = "/fake/file";
};

// ---------------------------------------------------------------------------------------------
// AlignedBuffer

// A size the machine cannot give is ResourceExhausted, naming the size: never an exception.
TEST(AlignedBufferTest, AllocateRefusesWhatCannotBeHadWithAStatus) {
  absl::StatusOr<AlignedBuffer> rounded_past_the_end = AlignedBuffer::Allocate(SIZE_MAX - 10);
  ASSERT_TRUE(absl::IsResourceExhausted(rounded_past_the_end.status()))
      << rounded_past_the_end.status();
  EXPECT_THAT(rounded_past_the_end.status().message(),
              ::testing::HasSubstr(absl::StrCat(SIZE_MAX - 10, " bytes")));
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // More than any machine has (a sanitizer's allocator reports such a request as its own error
  // instead of failing it).
  absl::StatusOr<AlignedBuffer> petabyte = AlignedBuffer::Allocate(size_t{1} << 50);
  ASSERT_TRUE(absl::IsResourceExhausted(petabyte.status())) << petabyte.status();
  EXPECT_THAT(petabyte.status().message(), ::testing::HasSubstr("1125899906842624 bytes"));
#endif
  absl::StatusOr<AlignedBuffer> empty = AlignedBuffer::Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  absl::StatusOr<AlignedBuffer> block = AlignedBuffer::Allocate(1, 512);
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(block->size(), 512u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block->data()) % kBlock, 0u);
}

TEST(AlignedBufferTest, RoundsSizeUpAndAligns) {
  AlignedBuffer empty;
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);

  AlignedBuffer small(100);
  ASSERT_NE(small.data(), nullptr);
  EXPECT_EQ(small.size(), kBlock);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % kBlock, 0u);

  AlignedBuffer odd(10000, 512);
  EXPECT_EQ(odd.size(), 10240u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(odd.data()) % 512, 0u);
  // The memory starts on a page whatever the alignment asked for: ext4 runs direct writes from
  // buffers aligned below its block size one at a time.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(odd.data()) % kBlock, 0u);
  std::memset(odd.data(), 0x5a, odd.size());  // the whole rounded size is usable

  AlignedBuffer moved(std::move(odd));
  EXPECT_EQ(moved.size(), 10240u);
  EXPECT_EQ(odd.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(odd.size(), 0u);
  small = std::move(moved);
  EXPECT_EQ(small.size(), 10240u);
  EXPECT_EQ(small.span().size(), 10240u);
}

// ---------------------------------------------------------------------------------------------
// PosixFileSystem: files and directories

// The File and FileSystem contract, run against the POSIX file system and the in-memory one
// (io/mem_file_system.h), which must behave alike: same results, same error codes.
class PosixFileTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "mem") {
      mem_ = std::make_unique<MemFileSystem>();
      CKV_ASSERT_OK(mem_->CreateDirs(dir_.path()));
      fs_ = mem_.get();
    }
  }

  std::unique_ptr<MemFileSystem> mem_;
  FileSystem* fs_ = PosixFileSystem(IoBackend::kThreads);
  TempDir dir_;
};

TEST_P(PosixFileTest, WriteReadSizeTruncate) {
  const std::string path = dir_.Sub("data");
  std::unique_ptr<File> file = OpenOrDie(fs_, path);
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->path(), path);
  const size_t alignment = file->alignment();
  EXPECT_GT(alignment, 0u);
  EXPECT_EQ(alignment & (alignment - 1), 0u) << "alignment " << alignment;
  RecordProperty("direct_io_alignment", static_cast<int>(alignment));

  AlignedBuffer out(64 * 1024), in(64 * 1024);
  FillPattern(out.span(), 1);
  CKV_ASSERT_OK(file->WriteAt(8192, out.span()));
  CKV_ASSERT_OK(file->Sync());
  CKV_ASSERT_OK(file->ReadAt(8192, in.span()));
  EXPECT_EQ(std::memcmp(in.data(), out.data(), in.size()), 0);
  EXPECT_EQ(*file->Size(), 8192u + 64 * 1024);

  CKV_ASSERT_OK(file->Truncate(kBlock));
  EXPECT_EQ(*file->Size(), kBlock);
  // Reopening without creating finds the file.
  file.reset();
  file = OpenOrDie(fs_, path, OpenMode::kReadWrite);
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(*file->Size(), kBlock);
}

TEST_P(PosixFileTest, OpenMissingIsNotFoundNamingThePath) {
  const std::string path = dir_.Sub("missing");
  auto file = fs_->Open(path, OpenMode::kReadWrite);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound) << file.status();
  EXPECT_TRUE(absl::StrContains(file.status().message(), path)) << file.status();
  EXPECT_FALSE(fs_->Exists(path));
}

TEST_P(PosixFileTest, ShortReadAtEofIsDataLoss) {
  const std::string path = dir_.Sub("short");
  std::unique_ptr<File> file = OpenOrDie(fs_, path);
  ASSERT_NE(file, nullptr);
  AlignedBuffer buffer(2 * kBlock);
  FillPattern(buffer.span(), 2);
  CKV_ASSERT_OK(file->WriteAt(0, buffer.span().first(kBlock)));

  absl::Status status = file->ReadAt(0, buffer.span());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_EQ(status.message(),
            absl::StrCat("short read of ", path, " at offset 0: got 4096 of 8192 bytes"));

  status = file->ReadAt(2 * kBlock, buffer.span().first(kBlock));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_EQ(status.message(),
            absl::StrCat("short read of ", path, " at offset 8192: got 0 of 4096 bytes"));

  // A file whose end is not aligned stops the read there too.
  CKV_ASSERT_OK(file->Truncate(kBlock + 100));
  status = file->ReadAt(0, buffer.span());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "got 4196 of 8192 bytes")) << status;
}

TEST_P(PosixFileTest, PunchHoleFreesBlocksAndReadsZeros) {
  constexpr size_t kFile = 1 << 20, kHoleOffset = 256 << 10, kHole = 512 << 10;
  std::unique_ptr<File> file = OpenOrDie(fs_, dir_.Sub("holes"));
  ASSERT_NE(file, nullptr);
  AlignedBuffer data(kFile);
  FillPattern(data.span(), 3);
  CKV_ASSERT_OK(file->WriteAt(0, data.span()));
  CKV_ASSERT_OK(file->Sync());
  const uint64_t before = *file->AllocatedBytes();
  ASSERT_GE(before, kFile);

  absl::Status punched = file->PunchHole(kHoleOffset, kHole);
  if (punched.code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << "the file system of " << dir_.path() << " cannot punch holes: " << punched;
  }
  CKV_ASSERT_OK(punched);
  CKV_ASSERT_OK(file->PunchHole(0, 0));  // an empty range is a no-op
  const uint64_t after = *file->AllocatedBytes();
  EXPECT_LE(after + kHole, before) << "before " << before << " after " << after;
  EXPECT_EQ(*file->Size(), kFile);

  AlignedBuffer in(kFile);
  CKV_ASSERT_OK(file->ReadAt(0, in.span()));
  EXPECT_TRUE(AllBytesAre(in.span().subspan(kHoleOffset, kHole), std::byte{0}));
  EXPECT_EQ(std::memcmp(in.data(), data.data(), kHoleOffset), 0);
  const size_t tail = kHoleOffset + kHole;
  EXPECT_EQ(std::memcmp(in.data() + tail, data.data() + tail, kFile - tail), 0);
}

TEST_P(PosixFileTest, ErrorsNameThePath) {
  const std::string missing = dir_.Sub("nope");
  absl::Status deleted = fs_->DeleteFile(missing);
  EXPECT_EQ(deleted.code(), absl::StatusCode::kNotFound) << deleted;
  EXPECT_TRUE(absl::StrContains(deleted.message(), missing)) << deleted;

  auto listed = fs_->ListDir(missing);
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kNotFound) << listed.status();
  EXPECT_TRUE(absl::StrContains(listed.status().message(), missing)) << listed.status();

  absl::Status synced = fs_->SyncDir(missing);
  EXPECT_EQ(synced.code(), absl::StatusCode::kNotFound) << synced;
  EXPECT_TRUE(absl::StrContains(synced.message(), missing)) << synced;

  // A misaligned buffer on a direct-I/O file is the caller's error, and says where.
  const std::string path = dir_.Sub("direct");
  std::unique_ptr<File> file = OpenOrDie(fs_, path);
  ASSERT_NE(file, nullptr);
  // A MemFileSystem's files always follow O_DIRECT's rule.
  auto* posix = dynamic_cast<PosixFile*>(file.get());
  ASSERT_TRUE(posix != nullptr || mem_ != nullptr);
  if (posix != nullptr && !posix->direct()) {
    GTEST_SKIP() << dir_.path() << " does not support O_DIRECT";
  }
  AlignedBuffer buffer(2 * kBlock);
  CKV_ASSERT_OK(file->WriteAt(0, buffer.span()));
  absl::Status misaligned = file->ReadAt(kBlock, buffer.span().subspan(1, kBlock));
  EXPECT_EQ(misaligned.code(), absl::StatusCode::kInvalidArgument) << misaligned;
  EXPECT_TRUE(absl::StrContains(misaligned.message(), absl::StrCat(path, " at offset 4096")))
      << misaligned;
}

TEST_P(PosixFileTest, Directories) {
  const std::string sub = dir_.Sub("sub");
  CKV_ASSERT_OK(fs_->CreateDir(sub));
  CKV_ASSERT_OK(fs_->CreateDir(sub));  // exists: fine
  EXPECT_TRUE(fs_->Exists(sub));
  for (const char* name : {"b", "a", "c"}) {
    ASSERT_NE(OpenOrDie(fs_, sub + "/" + name), nullptr);
  }
  CKV_ASSERT_OK(fs_->SyncDir(sub));
  auto names = fs_->ListDir(sub);
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, (std::vector<std::string>{"a", "b", "c"}));

  CKV_ASSERT_OK(fs_->DeleteFile(sub + "/b"));
  EXPECT_FALSE(fs_->Exists(sub + "/b"));
  names = fs_->ListDir(sub);
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, (std::vector<std::string>{"a", "c"}));

  absl::Status over_file = fs_->CreateDir(sub + "/a");
  EXPECT_EQ(over_file.code(), absl::StatusCode::kAlreadyExists) << over_file;
}

TEST_P(PosixFileTest, QueueDepthIsChecked) {
  for (uint32_t depth : {0u, kMaxIoQueueDepth + 1}) {
    auto queue = fs_->NewIoQueue(depth);
    EXPECT_EQ(queue.status().code(), absl::StatusCode::kInvalidArgument) << depth;
  }
}

INSTANTIATE_TEST_SUITE_P(FileSystems, PosixFileTest, ::testing::Values("posix", "mem"),
                         [](const auto& info) { return info.param; });

TEST(PosixFileSystemTest, BackendsAreWhatTheyClaim) {
  auto threads = PosixFileSystem(IoBackend::kThreads)->NewIoQueue(4);
  ASSERT_TRUE(threads.ok()) << threads.status();
  EXPECT_STREQ((*threads)->backend(), "threads");

  auto uring = PosixFileSystem(IoBackend::kUring)->NewIoQueue(4);
  auto automatic = PosixFileSystem(IoBackend::kAuto)->NewIoQueue(4);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  if (UringAvailable()) {
    ASSERT_TRUE(uring.ok()) << uring.status();
    EXPECT_STREQ((*uring)->backend(), "io_uring");
    EXPECT_STREQ((*automatic)->backend(), "io_uring");
  } else {
    EXPECT_EQ(uring.status().code(), absl::StatusCode::kUnavailable) << uring.status();
    EXPECT_STREQ((*automatic)->backend(), "threads");
  }
}

// ---------------------------------------------------------------------------------------------
// Both queue backends

class IoQueueTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    if (GetParam() == IoBackend::kUring && !UringAvailable()) {
      GTEST_SKIP() << "io_uring is unavailable here: " << UringUnavailableReason();
    }
    fs_ = PosixFileSystem(GetParam());
  }

  std::unique_ptr<IoQueue> NewQueue(uint32_t depth) {
    auto queue = fs_->NewIoQueue(depth);
    EXPECT_TRUE(queue.ok()) << queue.status();
    return queue.ok() ? std::move(*queue) : nullptr;
  }

  bool is_uring() const { return GetParam() == IoBackend::kUring; }

  FileSystem* fs_ = nullptr;
  TempDir dir_;
};

// Writes non-overlapping extents at random aligned offsets with many ops in flight, then reads
// random aligned ranges, overlapping the extents any way, and checks every byte.
TEST_P(IoQueueTest, RoundTripManyOpsInFlight) {
  constexpr size_t kFileBlocks = 2048;  // 8 MiB
  constexpr uint32_t kDepth = 32;
  std::unique_ptr<File> file = OpenOrDie(fs_, dir_.Sub("round_trip"));
  ASSERT_NE(file, nullptr);
  std::unique_ptr<IoQueue> queue = NewQueue(kDepth);
  ASSERT_NE(queue, nullptr);
  EXPECT_STREQ(queue->backend(), is_uring() ? "io_uring" : "threads");

  std::mt19937_64 rng(42);
  // Cut the file into extents of 1-16 blocks and write them in a random order.
  struct Extent {
    uint64_t offset;
    size_t length;
  };
  std::vector<Extent> extents;
  for (size_t block = 0; block < kFileBlocks;) {
    const size_t blocks = std::min<size_t>(1 + rng() % 16, kFileBlocks - block);
    extents.push_back({block * kBlock, blocks * kBlock});
    block += blocks;
  }
  std::shuffle(extents.begin(), extents.end(), rng);
  AlignedBuffer model(kFileBlocks * kBlock);
  FillPattern(model.span(), 7);

  std::vector<AlignedBuffer> buffers;
  std::vector<int> write_calls(extents.size(), 0);
  std::vector<absl::Status> write_status(extents.size());
  for (size_t i = 0; i < extents.size(); ++i) {
    buffers.emplace_back(extents[i].length);
    std::memcpy(buffers[i].data(), model.data() + extents[i].offset, extents[i].length);
    IoOp op{IoOp::Kind::kWrite, file.get(), extents[i].offset, buffers[i].data(),
            extents[i].length};
    CKV_ASSERT_OK(queue->Submit(op, [&, i](const absl::Status& s) {
      ++write_calls[i];
      write_status[i] = s;
    }));
  }
  CKV_ASSERT_OK(queue->Drain());
  for (size_t i = 0; i < extents.size(); ++i) {
    ASSERT_EQ(write_calls[i], 1) << "write " << i;
    CKV_ASSERT_OK(write_status[i]);
  }
  CKV_ASSERT_OK(file->Sync());
  EXPECT_EQ(*file->Size(), kFileBlocks * kBlock);

  // Random reads, overlapping each other and the extents.
  constexpr int kReads = 400;
  std::vector<Extent> reads;
  std::vector<AlignedBuffer> read_buffers;
  std::vector<int> read_calls(kReads, 0);
  std::vector<absl::Status> read_status(kReads);
  for (int i = 0; i < kReads; ++i) {
    const size_t blocks = 1 + rng() % 32;
    const size_t first = rng() % (kFileBlocks - blocks + 1);
    reads.push_back({first * kBlock, blocks * kBlock});
    read_buffers.emplace_back(blocks * kBlock);
    std::memset(read_buffers.back().data(), 0xEE, read_buffers.back().size());
  }
  for (int i = 0; i < kReads; ++i) {
    IoOp op{IoOp::Kind::kRead, file.get(), reads[i].offset, read_buffers[i].data(),
            reads[i].length};
    CKV_ASSERT_OK(queue->Submit(op, [&, i](const absl::Status& s) {
      ++read_calls[i];
      read_status[i] = s;
    }));
  }
  CKV_ASSERT_OK(queue->Drain());
  for (int i = 0; i < kReads; ++i) {
    ASSERT_EQ(read_calls[i], 1) << "read " << i;
    CKV_ASSERT_OK(read_status[i]);
    ASSERT_EQ(std::memcmp(read_buffers[i].data(), model.data() + reads[i].offset, reads[i].length),
              0)
        << "read " << i << " at offset " << reads[i].offset << " length " << reads[i].length;
  }
  // Drain with nothing outstanding is a no-op.
  CKV_ASSERT_OK(queue->Drain());
}

// A queue of depth 1 must reap before every Submit after the first; ops of several MiB go through
// as one op each.
TEST_P(IoQueueTest, DepthOneAndLargeOps) {
  constexpr size_t kOpBytes = 3 << 20;
  constexpr int kOps = 6;
  std::unique_ptr<File> file = OpenOrDie(fs_, dir_.Sub("large"));
  ASSERT_NE(file, nullptr);
  std::unique_ptr<IoQueue> queue = NewQueue(1);
  ASSERT_NE(queue, nullptr);
  std::vector<AlignedBuffer> out, in;
  int completed = 0;
  for (int i = 0; i < kOps; ++i) {
    out.emplace_back(kOpBytes);
    FillPattern(out.back().span(), 50 + i);
    CKV_ASSERT_OK(
        queue->Submit({IoOp::Kind::kWrite, file.get(), i * kOpBytes, out.back().data(), kOpBytes},
                      [&](const absl::Status& s) {
                        CKV_EXPECT_OK(s);
                        ++completed;
                      }));
  }
  CKV_ASSERT_OK(queue->Drain());
  for (int i = kOps - 1; i >= 0; --i) {
    in.emplace_back(kOpBytes);
    CKV_ASSERT_OK(
        queue->Submit({IoOp::Kind::kRead, file.get(), i * kOpBytes, in.back().data(), kOpBytes},
                      [&](const absl::Status& s) {
                        CKV_EXPECT_OK(s);
                        ++completed;
                      }));
  }
  CKV_ASSERT_OK(queue->Drain());
  EXPECT_EQ(completed, 2 * kOps);
  for (int i = 0; i < kOps; ++i) {
    EXPECT_EQ(std::memcmp(in[kOps - 1 - i].data(), out[i].data(), kOpBytes), 0) << "op " << i;
  }
}

TEST_P(IoQueueTest, ShortReadAtEofIsDataLoss) {
  const std::string path = dir_.Sub("eof");
  std::unique_ptr<File> file = OpenOrDie(fs_, path);
  ASSERT_NE(file, nullptr);
  AlignedBuffer block(kBlock), two(2 * kBlock), past(kBlock);
  FillPattern(block.span(), 9);
  CKV_ASSERT_OK(file->WriteAt(0, block.span()));
  std::unique_ptr<IoQueue> queue = NewQueue(4);
  ASSERT_NE(queue, nullptr);

  absl::Status partly, nothing;
  int calls = 0;
  CKV_ASSERT_OK(queue->Submit({IoOp::Kind::kRead, file.get(), 0, two.data(), two.size()},
                              [&](const absl::Status& s) {
                                ++calls;
                                partly = s;
                              }));
  CKV_ASSERT_OK(queue->Submit({IoOp::Kind::kRead, file.get(), 2 * kBlock, past.data(), kBlock},
                              [&](const absl::Status& s) {
                                ++calls;
                                nothing = s;
                              }));
  CKV_ASSERT_OK(queue->Drain());
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(partly.code(), absl::StatusCode::kDataLoss) << partly;
  EXPECT_EQ(partly.message(),
            absl::StrCat("short read of ", path, " at offset 0: got 4096 of 8192 bytes"));
  EXPECT_EQ(std::memcmp(two.data(), block.data(), kBlock), 0);  // what was there was delivered
  EXPECT_EQ(nothing.code(), absl::StatusCode::kDataLoss) << nothing;
  EXPECT_EQ(nothing.message(),
            absl::StrCat("short read of ", path, " at offset 8192: got 0 of 4096 bytes"));
}

TEST_P(IoQueueTest, ErrorsNameThePathAndOffset) {
  const std::string path = dir_.Sub("misaligned");
  std::unique_ptr<File> file = OpenOrDie(fs_, path);
  ASSERT_NE(file, nullptr);
  if (!dynamic_cast<PosixFile*>(file.get())->direct()) {
    GTEST_SKIP() << dir_.path() << " does not support O_DIRECT";
  }
  AlignedBuffer buffer(3 * kBlock);
  CKV_ASSERT_OK(file->WriteAt(0, buffer.span()));
  std::unique_ptr<IoQueue> queue = NewQueue(2);
  ASSERT_NE(queue, nullptr);
  absl::Status status;
  CKV_ASSERT_OK(queue->Submit({IoOp::Kind::kRead, file.get(), kBlock, buffer.data() + 1, kBlock},
                              [&](const absl::Status& s) { status = s; }));
  CKV_ASSERT_OK(queue->Drain());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), absl::StrCat(path, " at offset 4096"))) << status;
}

// Every callback runs exactly once; callbacks never run inside another callback (so a callback
// that submits is not re-entered), and io_uring runs none until it must reap.
TEST_P(IoQueueTest, CallbacksRunOnceAndNeverNested) {
  constexpr uint32_t kDepth = 8;
  constexpr int kOps = 200;
  constexpr int kFollowUps = 40;  // the first kFollowUps callbacks each submit one more read
  std::unique_ptr<File> file = OpenOrDie(fs_, dir_.Sub("callbacks"));
  ASSERT_NE(file, nullptr);
  AlignedBuffer data(64 * kBlock);
  FillPattern(data.span(), 11);
  CKV_ASSERT_OK(file->WriteAt(0, data.span()));
  std::unique_ptr<IoQueue> queue = NewQueue(kDepth);
  ASSERT_NE(queue, nullptr);

  std::vector<AlignedBuffer> buffers;
  for (int i = 0; i < kOps + kFollowUps; ++i) buffers.emplace_back(kBlock);
  std::vector<int> calls(kOps + kFollowUps, 0);
  bool in_callback = false;
  int nested = 0;
  int follow_ups = 0;
  std::function<void(int, const absl::Status&)> on_done = [&](int i, const absl::Status& s) {
    if (in_callback) ++nested;
    in_callback = true;
    EXPECT_TRUE(s.ok()) << "op " << i << ": " << s;
    ++calls[i];
    if (follow_ups < kFollowUps) {
      const int j = kOps + follow_ups++;
      const uint64_t offset = (j % 64) * kBlock;
      EXPECT_TRUE(queue
                      ->Submit({IoOp::Kind::kRead, file.get(), offset, buffers[j].data(), kBlock},
                               [&, j](const absl::Status& s2) { on_done(j, s2); })
                      .ok());
    }
    in_callback = false;
  };

  int total_calls_before_full = -1;
  for (int i = 0; i < kOps; ++i) {
    const uint64_t offset = (i % 64) * kBlock;
    CKV_ASSERT_OK(queue->Submit({IoOp::Kind::kRead, file.get(), offset, buffers[i].data(), kBlock},
                                [&, i](const absl::Status& s) { on_done(i, s); }));
    if (i + 1 == static_cast<int>(kDepth)) {
      total_calls_before_full = 0;  // of the first kDepth ops, not counting follow-ups
      for (uint32_t k = 0; k < kDepth; ++k) total_calls_before_full += calls[k];
    }
  }
  CKV_ASSERT_OK(queue->Drain());
  EXPECT_EQ(nested, 0);
  EXPECT_EQ(follow_ups, kFollowUps);
  for (int i = 0; i < kOps + kFollowUps; ++i) {
    ASSERT_EQ(calls[i], 1) << "op " << i;
    const uint64_t offset = (i % 64) * kBlock;
    ASSERT_EQ(std::memcmp(buffers[i].data(), data.data() + offset, kBlock), 0) << "op " << i;
  }
  // Until the queue is full, Submit only submits (io_uring and the thread fallback alike: both
  // run callbacks only when they reap).
  EXPECT_EQ(total_calls_before_full, 0);
}

// The read engine's way of driving a queue: registered file slots and buffers, a batch handed
// over at once, Reap(wait) until every op has landed, counters of the transfers.
TEST_P(IoQueueTest, RegisteredFilesAndBuffersWriteAndReadInOneBatch) {
  constexpr uint32_t kOps = 16;
  std::unique_ptr<File> file = OpenOrDie(fs_, dir_.Sub("registered"));
  ASSERT_NE(file, nullptr);
  std::unique_ptr<IoQueue> queue = NewQueue(kOps);
  ASSERT_NE(queue, nullptr);
  CKV_ASSERT_OK(queue->ReserveFileSlots(4));
  CKV_ASSERT_OK(queue->RegisterFile(3, file.get()));
  AlignedBuffer arena(2 * kOps * kBlock);
  std::vector<std::span<std::byte>> buffers;
  for (uint32_t i = 0; i < 2 * kOps; ++i) buffers.push_back({arena.data() + i * kBlock, kBlock});
  const absl::Status registered = queue->RegisterBuffers(buffers);
  if (is_uring()) {
    // Registration may fail only for want of locked memory; the ops then use plain buffers.
    EXPECT_TRUE(registered.ok() || absl::IsResourceExhausted(registered)) << registered;
  } else {
    EXPECT_TRUE(absl::IsUnimplemented(registered)) << registered;
  }
  for (uint32_t i = 0; i < kOps; ++i) {
    std::memset(buffers[i].data(), static_cast<int>(i + 1), kBlock);
  }
  auto run = [&](IoOp::Kind kind, uint32_t first_buffer) {
    std::vector<IoOp> ops;
    std::vector<IoQueue::Callback> done;
    int landed = 0;
    for (uint32_t i = 0; i < kOps; ++i) {
      ops.push_back({.kind = kind,
                     .file = file.get(),
                     .offset = i * kBlock,
                     .buffer = buffers[first_buffer + i].data(),
                     .length = kBlock,
                     .priority = static_cast<uint8_t>(i % 3),
                     .file_slot = 3,
                     .buffer_index = first_buffer + i});
      done.push_back([&](const absl::Status& s) {
        EXPECT_TRUE(s.ok()) << s;
        ++landed;
      });
    }
    CKV_ASSERT_OK(queue->SubmitBatch(ops, done));
    for (int turns = 0; landed < static_cast<int>(kOps) && turns < 10000; ++turns) {
      CKV_ASSERT_OK(queue->Reap(/*wait=*/true));
    }
    EXPECT_EQ(landed, static_cast<int>(kOps));
  };
  run(IoOp::Kind::kWrite, 0);
  run(IoOp::Kind::kRead, kOps);
  for (uint32_t i = 0; i < kOps; ++i) {
    ASSERT_EQ(std::memcmp(buffers[i].data(), buffers[kOps + i].data(), kBlock), 0) << i;
  }
  EXPECT_GE(queue->counters().transfers, 2u * kOps);
  EXPECT_EQ(queue->counters().bytes, 2u * kOps * kBlock);
  EXPECT_FALSE(queue->HasCompletions());
  queue->UnregisterFile(3);
}

// Another thread's Wake ends a Reap that waits with nothing in flight (how the read engine's
// I/O thread learns of new work), and a Wake that comes first is not lost.
TEST_P(IoQueueTest, WakeEndsAWaitingReap) {
  std::unique_ptr<IoQueue> queue = NewQueue(4);
  ASSERT_NE(queue, nullptr);
  queue->Wake();
  CKV_ASSERT_OK(queue->Reap(/*wait=*/true));  // returns at once: woken before it waited
  std::atomic<bool> woke{false};
  std::thread waker([&] {
    absl::SleepFor(absl::Milliseconds(50));
    woke = true;
    queue->Wake();
  });
  CKV_ASSERT_OK(queue->Reap(/*wait=*/true));
  EXPECT_TRUE(woke.load());
  waker.join();
}

TEST_P(IoQueueTest, RejectsBadOps) {
  std::unique_ptr<IoQueue> queue = NewQueue(2);
  ASSERT_NE(queue, nullptr);
  AlignedBuffer buffer(kBlock);
  bool ran = false;
  absl::Status no_file = queue->Submit({IoOp::Kind::kRead, nullptr, 0, buffer.data(), kBlock},
                                       [&](const absl::Status&) { ran = true; });
  EXPECT_EQ(no_file.code(), absl::StatusCode::kInvalidArgument) << no_file;
  if (is_uring()) {
    // io_uring needs a descriptor: only PosixFiles will do.
    FakeFile fake;
    absl::Status foreign = queue->Submit({IoOp::Kind::kRead, &fake, 0, buffer.data(), kBlock},
                                         [&](const absl::Status&) { ran = true; });
    EXPECT_EQ(foreign.code(), absl::StatusCode::kInvalidArgument) << foreign;
    EXPECT_TRUE(absl::StrContains(foreign.message(), fake.path())) << foreign;
  }
  CKV_ASSERT_OK(queue->Drain());
  EXPECT_FALSE(ran);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoQueueTest,
                         ::testing::Values(IoBackend::kThreads, IoBackend::kUring),
                         [](const ::testing::TestParamInfo<IoBackend>& info) {
                           return info.param == IoBackend::kUring ? "Uring" : "Threads";
                         });

// ---------------------------------------------------------------------------------------------
// FaultInjectingFileSystem

class FaultFileSystemTest : public ::testing::Test {
 protected:
  // A file of `blocks` blocks of pattern `seed`, written through the target.
  std::unique_ptr<File> MakeFile(const std::string& name, size_t blocks, uint64_t seed) {
    std::unique_ptr<File> file = OpenOrDie(&fault_fs_, dir_.Sub(name));
    if (file == nullptr) return nullptr;
    AlignedBuffer data(blocks * kBlock);
    FillPattern(data.span(), seed);
    std::unique_ptr<File> inner = OpenOrDie(target_, dir_.Sub(name));
    EXPECT_TRUE(inner->WriteAt(0, data.span()).ok());
    return file;
  }

  // The bytes of the file `name`, read through the target.
  std::vector<std::byte> Contents(const std::string& name) {
    std::unique_ptr<File> inner = OpenOrDie(target_, dir_.Sub(name), OpenMode::kReadWrite);
    AlignedBuffer data(*inner->Size());
    EXPECT_TRUE(inner->ReadAt(0, data.span()).ok());
    return {data.data(), data.data() + data.size()};
  }

  // Injected latency sleeps on it, so it passes without the test sleeping.
  FakeClock clock_;
  FileSystem* target_ = PosixFileSystem(IoBackend::kThreads);
  FaultInjectingFileSystem fault_fs_{target_, /*seed=*/1234, &clock_};
  TempDir dir_;
};

TEST_F(FaultFileSystemTest, ForwardsUnchangedWithoutRules) {
  std::unique_ptr<File> file = MakeFile("plain", 4, 1);
  ASSERT_NE(file, nullptr);
  AlignedBuffer out(4 * kBlock), in(4 * kBlock);
  FillPattern(out.span(), 2);
  CKV_ASSERT_OK(file->WriteAt(0, out.span()));
  CKV_ASSERT_OK(file->Sync());
  CKV_ASSERT_OK(file->ReadAt(0, in.span()));
  EXPECT_EQ(std::memcmp(in.data(), out.data(), in.size()), 0);
  CKV_ASSERT_OK(file->PunchHole(0, kBlock));
  EXPECT_EQ(*file->Size(), 4 * kBlock);
  EXPECT_EQ(fault_fs_.total_injected(), 0u);
  EXPECT_EQ(file->path(), dir_.Sub("plain"));
  EXPECT_TRUE(fault_fs_.Exists(dir_.Sub("plain")));
  auto names = fault_fs_.ListDir(dir_.path());
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, std::vector<std::string>{"plain"});
}

TEST_F(FaultFileSystemTest, ReadEioIsDataLoss) {
  std::unique_ptr<File> file = MakeFile("f", 4, 1);
  ASSERT_NE(file, nullptr);
  fault_fs_.AddRule({.read_eio = 1});
  AlignedBuffer in(4 * kBlock);
  absl::Status status = file->ReadAt(0, in.span());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), dir_.Sub("f"))) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "(injected)")) << status;
  EXPECT_EQ(fault_fs_.injected(FaultKind::kReadEio), 1u);
  EXPECT_EQ(fault_fs_.total_injected(), 1u);
}

TEST_F(FaultFileSystemTest, ShortReadDeliversAPrefixThenDataLoss) {
  constexpr size_t kBlocks = 16;
  std::unique_ptr<File> file = MakeFile("f", kBlocks, 5);
  ASSERT_NE(file, nullptr);
  const std::vector<std::byte> contents = Contents("f");
  fault_fs_.AddRule({.short_read = 1});
  for (int attempt = 0; attempt < 20; ++attempt) {
    AlignedBuffer in(kBlocks * kBlock);
    std::memset(in.data(), 0xEE, in.size());
    absl::Status status = file->ReadAt(0, in.span());
    ASSERT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    ASSERT_TRUE(absl::StrContains(status.message(), "short read of " + dir_.Sub("f"))) << status;
    const int64_t got = NumberAfter(status.message(), ": got ");
    ASSERT_GE(got, 0) << status;
    ASSERT_LT(static_cast<size_t>(got), in.size());
    EXPECT_EQ(got % kBlock, 0u);
    EXPECT_EQ(std::memcmp(in.data(), contents.data(), got), 0);
    EXPECT_TRUE(AllBytesAre(in.span().subspan(got), std::byte{0xEE}));
  }
  EXPECT_EQ(fault_fs_.injected(FaultKind::kShortRead), 20u);
}

TEST_F(FaultFileSystemTest, WriteEioAndEnospcWriteNothing) {
  std::unique_ptr<File> file = MakeFile("f", 2, 1);
  ASSERT_NE(file, nullptr);
  const std::vector<std::byte> before = Contents("f");
  AlignedBuffer out(2 * kBlock);
  FillPattern(out.span(), 2);

  fault_fs_.AddRule({.write_eio = 1});
  absl::Status eio = file->WriteAt(0, out.span());
  EXPECT_EQ(eio.code(), absl::StatusCode::kInternal) << eio;
  EXPECT_TRUE(absl::StrContains(eio.message(), dir_.Sub("f"))) << eio;

  fault_fs_.ClearRules();
  fault_fs_.AddRule({.write_enospc = 1});
  absl::Status enospc = file->WriteAt(0, out.span());
  EXPECT_EQ(enospc.code(), absl::StatusCode::kResourceExhausted) << enospc;

  EXPECT_EQ(Contents("f"), before);
  EXPECT_EQ(fault_fs_.injected(FaultKind::kWriteEio), 1u);
  EXPECT_EQ(fault_fs_.injected(FaultKind::kWriteEnospc), 1u);
}

TEST_F(FaultFileSystemTest, TornWriteWritesAnAlignedPrefix) {
  constexpr size_t kBlocks = 16;
  std::unique_ptr<File> file = MakeFile("f", kBlocks, 1);
  ASSERT_NE(file, nullptr);
  const std::vector<std::byte> before = Contents("f");
  AlignedBuffer out(kBlocks * kBlock);
  FillPattern(out.span(), 2);

  fault_fs_.AddRule({.torn_write = 1});
  absl::Status torn = file->WriteAt(0, out.span());
  EXPECT_EQ(torn.code(), absl::StatusCode::kInternal) << torn;
  const int64_t written = NumberAfter(torn.message(), "torn after ");
  ASSERT_GE(written, 0) << torn;
  ASSERT_LT(static_cast<size_t>(written), out.size());
  EXPECT_EQ(written % kBlock, 0u);
  const std::vector<std::byte> after = Contents("f");
  EXPECT_EQ(std::memcmp(after.data(), out.data(), written), 0);
  EXPECT_EQ(std::memcmp(after.data() + written, before.data() + written, after.size() - written),
            0);

  // A device that lies: the write reports success, and only a prefix (possibly none) landed.
  fault_fs_.ClearRules();
  fault_fs_.AddRule({.torn_write = 1, .torn_write_reports_ok = true});
  AlignedBuffer other(kBlocks * kBlock);
  FillPattern(other.span(), 3);
  CKV_EXPECT_OK(file->WriteAt(0, other.span()));
  EXPECT_NE(std::memcmp(Contents("f").data(), other.data(), other.size()), 0);
  EXPECT_EQ(fault_fs_.injected(FaultKind::kTornWrite), 2u);
}

TEST_F(FaultFileSystemTest, SyncAndPunchHoleFail) {
  std::unique_ptr<File> file = MakeFile("f", 4, 1);
  ASSERT_NE(file, nullptr);
  CKV_ASSERT_OK(file->Sync());
  const uint64_t allocated = *file->AllocatedBytes();
  fault_fs_.AddRule({.sync_fail = 1, .punch_hole_fail = 1, .punch_hole_errno = EOPNOTSUPP});
  absl::Status sync = file->Sync();
  EXPECT_EQ(sync.code(), absl::StatusCode::kInternal) << sync;
  EXPECT_TRUE(absl::StrContains(sync.message(), dir_.Sub("f"))) << sync;
  absl::Status punch = file->PunchHole(0, 2 * kBlock);
  EXPECT_EQ(punch.code(), absl::StatusCode::kUnimplemented) << punch;
  EXPECT_EQ(*file->AllocatedBytes(), allocated);
  EXPECT_EQ(fault_fs_.injected(FaultKind::kSyncFail), 1u);
  EXPECT_EQ(fault_fs_.injected(FaultKind::kPunchHoleFail), 1u);
}

TEST_F(FaultFileSystemTest, LatencySleepsOnTheClock) {
  std::unique_ptr<File> file = MakeFile("f", 1, 1);
  ASSERT_NE(file, nullptr);
  fault_fs_.AddRule({.latency_us = 250});
  AlignedBuffer in(kBlock);
  CKV_ASSERT_OK(file->ReadAt(0, in.span()));
  CKV_ASSERT_OK(file->WriteAt(0, in.span()));
  CKV_ASSERT_OK(file->Sync());
  EXPECT_EQ(clock_.MonotonicNanos(), 750'000);  // 3 x 250 us, and nothing else
  EXPECT_EQ(fault_fs_.injected(FaultKind::kLatency), 3u);
  EXPECT_EQ(fault_fs_.total_injected(), 3u);
  fault_fs_.ResetCounters();
  EXPECT_EQ(fault_fs_.total_injected(), 0u);
}

TEST_F(FaultFileSystemTest, RulesSelectFilesByPathAndTheFirstMatchWins) {
  std::unique_ptr<File> victim = MakeFile("victim.seg", 1, 1);
  std::unique_ptr<File> bystander = MakeFile("bystander.seg", 1, 2);
  std::unique_ptr<File> special = MakeFile("victim.special", 1, 3);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(bystander, nullptr);
  ASSERT_NE(special, nullptr);
  fault_fs_.AddRule({.path_substring = "victim.special", .write_enospc = 1});
  fault_fs_.AddRule({.path_substring = "victim", .read_eio = 1, .write_eio = 1});
  AlignedBuffer buffer(kBlock);
  EXPECT_EQ(victim->ReadAt(0, buffer.span()).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(victim->WriteAt(0, buffer.span()).code(), absl::StatusCode::kInternal);
  CKV_EXPECT_OK(bystander->ReadAt(0, buffer.span()));
  CKV_EXPECT_OK(bystander->WriteAt(0, buffer.span()));
  CKV_EXPECT_OK(special->ReadAt(0, buffer.span()));  // its rule has no read faults
  EXPECT_EQ(special->WriteAt(0, buffer.span()).code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(FaultFileSystemTest, SameSeedSameFaults) {
  auto run = [&](uint64_t seed) {
    FaultInjectingFileSystem fs(target_, seed);
    fs.AddRule({.read_eio = 0.25, .short_read = 0.25});
    std::unique_ptr<File> file = OpenOrDie(&fs, dir_.Sub("seeded"));
    AlignedBuffer buffer(4 * kBlock);
    std::string outcomes;
    for (int i = 0; i < 200; ++i) {
      absl::Status s = file->ReadAt(0, buffer.span());
      outcomes += s.ok() ? '.' : absl::StrContains(s.message(), "short read") ? 's' : 'e';
    }
    return outcomes;
  };
  MakeFile("seeded", 4, 1);
  const std::string first = run(99);
  EXPECT_EQ(run(99), first);
  EXPECT_NE(run(100), first);
  const auto errors = std::count(first.begin(), first.end(), 'e');
  const auto shorts = std::count(first.begin(), first.end(), 's');
  EXPECT_GT(errors, 20);  // about 50
  EXPECT_LT(errors, 80);
  EXPECT_GT(shorts, 15);  // about 37
  EXPECT_LT(shorts, 70);
}

// Faults through the wrapper's queue, over both target backends.
class FaultIoQueueTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    if (GetParam() == IoBackend::kUring && !UringAvailable()) {
      GTEST_SKIP() << "io_uring is unavailable here: " << UringUnavailableReason();
    }
    target_ = PosixFileSystem(GetParam());
    fault_fs_ = std::make_unique<FaultInjectingFileSystem>(target_, /*seed=*/7, &clock_);
  }

  FakeClock clock_;  // injected latency sleeps on it
  FileSystem* target_ = nullptr;
  std::unique_ptr<FaultInjectingFileSystem> fault_fs_;
  TempDir dir_;
};

TEST_P(FaultIoQueueTest, EachFaultGivesItsStatus) {
  constexpr size_t kLength = 8 * kBlock;
  std::unique_ptr<File> file = OpenOrDie(fault_fs_.get(), dir_.Sub("q"));
  ASSERT_NE(file, nullptr);
  AlignedBuffer base(kLength);
  FillPattern(base.span(), 1);
  CKV_ASSERT_OK(file->WriteAt(0, base.span()));
  auto queue_or = fault_fs_->NewIoQueue(4);
  ASSERT_TRUE(queue_or.ok()) << queue_or.status();
  std::unique_ptr<IoQueue> queue = std::move(*queue_or);
  EXPECT_STREQ(queue->backend(), GetParam() == IoBackend::kUring ? "io_uring" : "threads");

  struct Case {
    FaultRule rule;
    IoOp::Kind kind;
    absl::StatusCode code;
    FaultKind fault;
  };
  const Case cases[] = {
      {{.read_eio = 1}, IoOp::Kind::kRead, absl::StatusCode::kDataLoss, FaultKind::kReadEio},
      {{.short_read = 1}, IoOp::Kind::kRead, absl::StatusCode::kDataLoss, FaultKind::kShortRead},
      {{.write_eio = 1}, IoOp::Kind::kWrite, absl::StatusCode::kInternal, FaultKind::kWriteEio},
      {{.write_enospc = 1},
       IoOp::Kind::kWrite,
       absl::StatusCode::kResourceExhausted,
       FaultKind::kWriteEnospc},
      {{.torn_write = 1}, IoOp::Kind::kWrite, absl::StatusCode::kInternal, FaultKind::kTornWrite},
      {{.torn_write = 1, .torn_write_reports_ok = true},
       IoOp::Kind::kWrite,
       absl::StatusCode::kOk,
       FaultKind::kTornWrite},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(FaultKindName(c.fault));
    fault_fs_->ClearRules();
    fault_fs_->ResetCounters();
    fault_fs_->AddRule(c.rule);
    // Several ops per case, so that partial transfers of every length are exercised.
    constexpr int kOps = 6;
    std::vector<AlignedBuffer> buffers;
    std::vector<absl::Status> statuses(kOps);
    std::vector<int> calls(kOps, 0);
    for (int i = 0; i < kOps; ++i) {
      buffers.emplace_back(kLength);
      FillPattern(buffers[i].span(), 100 + i);
      CKV_ASSERT_OK(queue->Submit({c.kind, file.get(), 0, buffers[i].data(), kLength},
                                  [&, i](const absl::Status& s) {
                                    ++calls[i];
                                    statuses[i] = s;
                                  }));
    }
    CKV_ASSERT_OK(queue->Drain());
    for (int i = 0; i < kOps; ++i) {
      EXPECT_EQ(calls[i], 1) << "op " << i;
      EXPECT_EQ(statuses[i].code(), c.code) << "op " << i << ": " << statuses[i];
      if (c.code != absl::StatusCode::kOk) {
        EXPECT_TRUE(absl::StrContains(statuses[i].message(), dir_.Sub("q"))) << statuses[i];
      }
    }
    EXPECT_EQ(fault_fs_->injected(c.fault), static_cast<uint64_t>(kOps));
  }

  // Latency is applied per queued op, sleeping on the file system's clock.
  fault_fs_->ClearRules();
  fault_fs_->AddRule({.latency_us = 10});
  AlignedBuffer in(kLength);
  absl::Status status;
  CKV_ASSERT_OK(queue->Submit({IoOp::Kind::kRead, file.get(), 0, in.data(), kLength},
                              [&](const absl::Status& s) { status = s; }));
  CKV_ASSERT_OK(queue->Drain());
  CKV_EXPECT_OK(status);
  EXPECT_EQ(clock_.MonotonicNanos(), 10'000);
}

// Many ops with random faults: every callback runs once, none nested, and the failures are
// exactly the injected faults.
TEST_P(FaultIoQueueTest, RandomFaultsEveryCallbackOnce) {
  constexpr size_t kBlocks = 64;
  constexpr int kOps = 300;
  std::unique_ptr<File> file = OpenOrDie(fault_fs_.get(), dir_.Sub("random"));
  ASSERT_NE(file, nullptr);
  AlignedBuffer base(kBlocks * kBlock);
  FillPattern(base.span(), 1);
  CKV_ASSERT_OK(file->WriteAt(0, base.span()));
  auto queue_or = fault_fs_->NewIoQueue(8);
  ASSERT_TRUE(queue_or.ok()) << queue_or.status();
  std::unique_ptr<IoQueue> queue = std::move(*queue_or);
  fault_fs_->AddRule({.read_eio = 0.1,
                      .short_read = 0.1,
                      .write_eio = 0.1,
                      .write_enospc = 0.1,
                      .torn_write = 0.1});

  std::mt19937_64 rng(5);
  std::vector<AlignedBuffer> buffers;
  std::vector<int> calls(kOps, 0);
  int failures = 0;
  bool in_callback = false;
  int nested = 0;
  for (int i = 0; i < kOps; ++i) {
    const size_t blocks = 1 + rng() % 8;
    const uint64_t offset = (rng() % (kBlocks - blocks + 1)) * kBlock;
    const IoOp::Kind kind = rng() % 2 == 0 ? IoOp::Kind::kRead : IoOp::Kind::kWrite;
    buffers.emplace_back(blocks * kBlock);
    FillPattern(buffers.back().span(), i);
    CKV_ASSERT_OK(queue->Submit({kind, file.get(), offset, buffers.back().data(), blocks * kBlock},
                                [&, i](const absl::Status& s) {
                                  if (in_callback) ++nested;
                                  in_callback = true;
                                  ++calls[i];
                                  if (!s.ok()) ++failures;
                                  in_callback = false;
                                }));
  }
  CKV_ASSERT_OK(queue->Drain());
  EXPECT_EQ(nested, 0);
  for (int i = 0; i < kOps; ++i) ASSERT_EQ(calls[i], 1) << "op " << i;
  EXPECT_EQ(static_cast<uint64_t>(failures), fault_fs_->total_injected());
  EXPECT_GT(failures, 30);  // about 100 of 300
}

TEST_P(FaultIoQueueTest, RejectsFilesItDidNotOpen) {
  std::unique_ptr<File> inner = OpenOrDie(target_, dir_.Sub("inner"));
  ASSERT_NE(inner, nullptr);
  auto queue = fault_fs_->NewIoQueue(2);
  ASSERT_TRUE(queue.ok()) << queue.status();
  AlignedBuffer buffer(kBlock);
  bool ran = false;
  absl::Status status = (*queue)->Submit({IoOp::Kind::kRead, inner.get(), 0, buffer.data(), kBlock},
                                         [&](const absl::Status&) { ran = true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  CKV_ASSERT_OK((*queue)->Drain());
  EXPECT_FALSE(ran);
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultIoQueueTest,
                         ::testing::Values(IoBackend::kThreads, IoBackend::kUring),
                         [](const ::testing::TestParamInfo<IoBackend>& info) {
                           return info.param == IoBackend::kUring ? "Uring" : "Threads";
                         });

}  // namespace
}  // namespace ckv::io
