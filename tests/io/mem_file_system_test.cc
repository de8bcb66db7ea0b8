// SPDX-License-Identifier: Apache-2.0
// The in-memory FileSystem (io/mem_file_system.h). The contract it shares with the POSIX
// file system runs against both in file_system_test.cc (PosixFileTest, parametrised); here is
// what only memory shows: blocks and holes counted exactly, a deleted file still open, the
// directory tree, the queue, and a whole store whose segments never touch the disk.
#include "io/mem_file_system.h"

#include <cstring>
#include <filesystem>

#include "ckv/engine.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

using ::ckv::io::AlignedBuffer;
using ::ckv::io::File;
using ::ckv::io::IoOp;
using ::ckv::io::MemFileSystem;
using OpenMode = ::ckv::io::FileSystem::OpenMode;
using ::ckv::testing::CountBadRecords;
using ::ckv::testing::PutSynthetic;
using ::ckv::testing::TempDir;

constexpr uint64_t kBlock = 4096;

std::unique_ptr<File> MustOpen(MemFileSystem& fs, const std::string& path) {
  auto file = fs.Open(path, OpenMode::kCreateReadWrite);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::move(*file) : nullptr;
}

TEST(MemFileSystemTest, BlocksAreCountedLikeExt4) {
  MemFileSystem fs;
  std::unique_ptr<File> file = MustOpen(fs, "/f");
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->alignment(), kBlock);
  EXPECT_EQ(*file->AllocatedBytes(), 0u);

  // Allocate grows the size over the range and holds its blocks; the range reads as zeros.
  CKV_ASSERT_OK(file->Allocate(0, 4 * kBlock));
  EXPECT_EQ(*file->Size(), 4 * kBlock);
  EXPECT_EQ(*file->AllocatedBytes(), 4 * kBlock);

  // A write past the end leaves a hole between, which holds nothing.
  AlignedBuffer data(kBlock);
  std::memset(data.data(), 0x5a, kBlock);
  CKV_ASSERT_OK(file->WriteAt(8 * kBlock, data.span()));
  EXPECT_EQ(*file->Size(), 9 * kBlock);
  EXPECT_EQ(*file->AllocatedBytes(), 5 * kBlock);

  // Only whole blocks are freed by a hole; partial ones are zeroed and kept.
  CKV_ASSERT_OK(file->PunchHole(kBlock / 2, 2 * kBlock));
  EXPECT_EQ(*file->AllocatedBytes(), 4 * kBlock);
  EXPECT_EQ(*file->Size(), 9 * kBlock);  // KEEP_SIZE

  // Truncate gives back the blocks past the new end.
  CKV_ASSERT_OK(file->Truncate(2 * kBlock + 1));
  EXPECT_EQ(*file->AllocatedBytes(), 2 * kBlock);  // block 1 was punched, 0 and 2 remain
  CKV_ASSERT_OK(file->Truncate(0));
  EXPECT_EQ(*file->AllocatedBytes(), 0u);
}

TEST(MemFileSystemTest, MisalignedIoIsInvalidArgument) {
  MemFileSystem fs;
  std::unique_ptr<File> file = MustOpen(fs, "/f");
  ASSERT_NE(file, nullptr);
  AlignedBuffer buffer(2 * kBlock);
  for (const absl::Status& s :
       {file->WriteAt(1, buffer.span().first(kBlock)), file->WriteAt(0, buffer.span().first(100)),
        file->WriteAt(0, buffer.span().subspan(1, kBlock)),
        file->ReadAt(0, buffer.span().subspan(8, kBlock))}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("/f at offset"), std::string::npos) << s;
  }
  EXPECT_EQ(*file->Size(), 0u);  // nothing was written
}

TEST(MemFileSystemTest, DeletedFileStaysReadableWhileOpen) {
  MemFileSystem fs;
  CKV_ASSERT_OK(fs.CreateDirs("/a/b"));
  std::unique_ptr<File> file = MustOpen(fs, "/a/b/f");
  ASSERT_NE(file, nullptr);
  AlignedBuffer out(kBlock), in(kBlock);
  std::memset(out.data(), 7, kBlock);
  CKV_ASSERT_OK(file->WriteAt(0, out.span()));
  CKV_ASSERT_OK(fs.DeleteFile("/a/b/f"));
  EXPECT_FALSE(fs.Exists("/a/b/f"));
  CKV_ASSERT_OK(file->ReadAt(0, in.span()));
  EXPECT_EQ(std::memcmp(in.data(), out.data(), kBlock), 0);
  // A new file under the old name starts empty.
  std::unique_ptr<File> fresh = MustOpen(fs, "/a/b/f");
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(*fresh->Size(), 0u);
}

TEST(MemFileSystemTest, DirectoryTree) {
  MemFileSystem fs;
  // mkdir's rules: the parent must exist.
  EXPECT_EQ(fs.CreateDir("/x/y").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fs.Open("/x/f", OpenMode::kCreateReadWrite).status().code(),
            absl::StatusCode::kNotFound);
  CKV_ASSERT_OK(fs.CreateDirs("/x/y/z/"));
  EXPECT_TRUE(fs.Exists("/x/y"));
  ASSERT_NE(MustOpen(fs, "/x/f"), nullptr);
  auto names = fs.ListDir("/x");
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, (std::vector<std::string>{"f", "y"}));         // files and directories, sorted
  EXPECT_FALSE(fs.ListDir("/x/f").ok());                           // ENOTDIR, as opendir of a file
  EXPECT_NE(fs.DeleteFile("/x/y").code(), absl::StatusCode::kOk);  // a directory
  EXPECT_NE(fs.Open("/x/y", OpenMode::kReadWrite).status().code(), absl::StatusCode::kOk);
  CKV_ASSERT_OK(fs.SyncDir("/x/y"));
  EXPECT_EQ(fs.CreateDirs("relative").code(), absl::StatusCode::kInvalidArgument);
}

TEST(MemFileSystemTest, QueueRoundTrip) {
  MemFileSystem fs;
  std::unique_ptr<File> file = MustOpen(fs, "/q");
  ASSERT_NE(file, nullptr);
  auto queue = fs.NewIoQueue(8);
  ASSERT_TRUE(queue.ok()) << queue.status();
  AlignedBuffer out(4 * kBlock), in(4 * kBlock);
  for (size_t i = 0; i < out.size(); ++i) out.data()[i] = static_cast<std::byte>(i * 31);
  int done = 0;
  auto count = [&](const absl::Status& s) {
    EXPECT_TRUE(s.ok()) << s;
    ++done;
  };
  CKV_ASSERT_OK((*queue)->Submit(
      IoOp{IoOp::Kind::kWrite, file.get(), kBlock, out.data(), out.size()}, count));
  CKV_ASSERT_OK((*queue)->Drain());
  CKV_ASSERT_OK(
      (*queue)->Submit(IoOp{IoOp::Kind::kRead, file.get(), kBlock, in.data(), in.size()}, count));
  CKV_ASSERT_OK((*queue)->Drain());
  EXPECT_EQ(done, 2);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), in.size()), 0);
  // Past the end: the read's status is DataLoss, as on disk.
  absl::Status past;
  CKV_ASSERT_OK((*queue)->Submit(IoOp{IoOp::Kind::kRead, file.get(), 8 * kBlock, in.data(), kBlock},
                                 [&](const absl::Status& s) { past = s; }));
  CKV_ASSERT_OK((*queue)->Drain());
  EXPECT_EQ(past.code(), absl::StatusCode::kDataLoss) << past;
}

// A whole store on a MemFileSystem: its segments live in memory (the catalog, which RocksDB
// keeps, stays in the real directory), and a reopened store reads back every record intact.
TEST(MemFileSystemTest, StoreKeepsItsSegmentsInMemory) {
  TempDir dir;
  MemFileSystem fs;
  CKV_ASSERT_OK(fs.CreateDirs(dir.path()));
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const auto tokens = synth::Tokens(3, 4 * spec.chunk_tokens);
  const engine::Seams seams{.file_system = &fs};
  {
    auto engine = engine::OpenWithSeams(EngineOptions{}, dir.path(), seams);
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE(PutSynthetic(**engine, spec, tokens).ok());
  }
  auto engine = engine::OpenWithSeams(EngineOptions{}, dir.path(), seams);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ(*(*engine)->Lookup(spec, tokens), 4u);
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  std::vector<std::byte> record(spec.RecordBytes());
  CKV_EXPECT_OK((*engine)->ReadRecord(spec, keys[0], 0, record));
  EXPECT_EQ(CountBadRecords(**engine, spec, tokens, 4), 0);
  auto segments = fs.ListDir(dir.path() + "/segments");
  ASSERT_TRUE(segments.ok()) << segments.status();
  EXPECT_FALSE(segments->empty());
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/segments"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/catalog"));
}

}  // namespace
}  // namespace ckv
