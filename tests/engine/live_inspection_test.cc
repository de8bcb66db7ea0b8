// SPDX-License-Identifier: Apache-2.0
// Live inspection: a read-only engine (Engine::OpenReadOnly) and kvctl's read-only commands on a
// store that another engine, in this process or another, holds for writing. Readers never get a
// chunk's bytes wrong: a slot the writer reused after an eviction or a Delete is caught by its
// checksum and reported as not found; they write nothing; and they catch up on demand.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckv/engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/chunk_store.h"
#include "tests/reliability/crash_spec.h"
#include "tests/test_util.h"
#include "tools/synthetic_kv.h"

#ifndef CKV_CRASH_CHILD_PATH
#error "CKV_CRASH_CHILD_PATH must name the ckv_crash_child binary"
#endif

namespace ckv {
namespace {

using ::ckv::testing::ChunkDiskBytes;
using ::ckv::testing::PutSynthetic;
using ::ckv::testing::TempDir;
using ::testing::HasSubstr;

ModelSpec Spec() { return *ModelSpec::Preset("qwen2.5-0.5b"); }

// Every file under `dir` with its size and modification time: what a reader must not change.
std::map<std::string, std::pair<uintmax_t, std::filesystem::file_time_type>> Files(
    const std::string& dir) {
  std::map<std::string, std::pair<uintmax_t, std::filesystem::file_time_type>> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    files[e.path().string()] = {e.file_size(), e.last_write_time()};
  }
  return files;
}

// A read-only view can neither publish nor store what it would fetch: remote seeds are refused
// rather than silently ignored, and the same options without them open the view.
TEST(LiveInspectionTest, AReadOnlyEngineRefusesARemoteTier) {
  TempDir dir;
  {
    auto writer = Engine::Open(EngineOptions{}, dir.path());
    ASSERT_TRUE(writer.ok()) << writer.status();
  }
  EngineOptions options;
  options.remote.seeds = {"127.0.0.1:7000", "127.0.0.1:7001"};
  auto refused = Engine::OpenReadOnly(options, dir.path());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("127.0.0.1:7000"));
  EXPECT_THAT(refused.status().message(), HasSubstr("read-only"));
  EXPECT_THAT(refused.status().message(), HasSubstr(dir.path()));
  options.remote.seeds.clear();
  auto opened = Engine::OpenReadOnly(options, dir.path());
  EXPECT_TRUE(opened.ok()) << opened.status();
}

TEST(LiveInspectionTest, AReadOnlyEngineReadsBesideAWriterWritesNothingAndRefusesWrites) {
  TempDir dir;
  const ModelSpec spec = Spec();
  auto writer = Engine::Open(EngineOptions{}, dir.path());
  ASSERT_TRUE(writer.ok()) << writer.status();
  const auto a = synth::Tokens(1, 8 * spec.chunk_tokens);
  ASSERT_TRUE(PutSynthetic(**writer, spec, a).ok());

  const auto before = Files(dir.path());
  auto reader = Engine::OpenReadOnly(EngineOptions{}, dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(*(*reader)->Lookup(spec, a), 8u);
  // Probe, here and on the writer (neither has a remote tier): the local chunks alone.
  for (Engine* e : {reader->get(), writer->get()}) {
    auto extent = e->Probe(spec, a);
    ASSERT_TRUE(extent.ok()) << extent.status();
    EXPECT_EQ(extent->local_chunks, 8u);
    EXPECT_EQ(extent->remote_chunks, 0u);
  }
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, a);
  std::vector<std::byte> got(spec.RecordBytes()), want(spec.RecordBytes());
  ASSERT_TRUE((*reader)->ReadRecord(spec, keys[3], 5, got).ok());
  synth::FillRecord(spec, keys[3], 5, want);
  EXPECT_EQ(got, want);
  auto report = (*reader)->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok());
  EXPECT_EQ(report->chunks_checked, 8u);
  EXPECT_EQ((*reader)->ListPrefixes().size(), 1u);
  EXPECT_EQ((*reader)->Stats().chunks, 8u);

  // Every write is refused, and names the read-only open.
  const auto b = synth::Tokens(2, 4 * spec.chunk_tokens);
  synth::SyntheticKv kv(spec, b);
  auto put = (*reader)->Put(spec, b, kv.tensors());
  EXPECT_EQ(put.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(put.status().message()), HasSubstr("read-only"));
  EXPECT_EQ((*reader)->Delete(spec, a).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*reader)->Gc().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*reader)->Repair().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*reader)->BeginReprefill(spec, a).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Files(dir.path()), before) << "a read-only engine changed the store's files";

  // The view is as of its open; CatchUp takes in what the writer committed since.
  ASSERT_TRUE(PutSynthetic(**writer, spec, b).ok());
  EXPECT_EQ(*(*reader)->Lookup(spec, b), 0u);
  ASSERT_TRUE((*reader)->CatchUp().ok());
  EXPECT_EQ(*(*reader)->Lookup(spec, b), 4u);
  EXPECT_EQ((*reader)->Stats().chunks, 12u);
  reader->reset();
  EXPECT_EQ((*writer)->Stats().chunks, 12u);
}

TEST(LiveInspectionTest, ASlotTheWriterReusedIsNotFoundForTheReaderNeverOtherBytes) {
  // The reader's view names chunk X at slot s. The writer deletes X and stores Y, whose Put
  // writes over s (the same model's freed slot). Reading X through the old view reads Y's bytes:
  // the checksum does not match, the reader catches up, and X is not found.
  TempDir dir;
  const ModelSpec spec = Spec();
  EngineOptions wo;
  wo.reclaim_margin_bytes = 0;
  auto writer = Engine::Open(wo, dir.path());
  ASSERT_TRUE(writer.ok()) << writer.status();
  const auto x = synth::Tokens(3, 4 * spec.chunk_tokens);
  ASSERT_TRUE(PutSynthetic(**writer, spec, x).ok());
  const auto x_keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, x);
  auto reader = Engine::OpenReadOnly(EngineOptions{}, dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(*(*reader)->Lookup(spec, x), 4u);

  ASSERT_TRUE((*writer)->Delete(spec, x).ok());
  const auto y = synth::Tokens(4, 4 * spec.chunk_tokens);
  ASSERT_TRUE(PutSynthetic(**writer, spec, y).ok());
  const auto y_keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, y);
  auto y_desc = (*writer)->DescribePrefix(y_keys.back());
  ASSERT_TRUE(y_desc.ok()) << y_desc.status();
  // Y took X's slots (the test is about that case).
  auto x_desc = (*reader)->DescribePrefix(x_keys.back());
  ASSERT_TRUE(x_desc.ok()) << x_desc.status();
  ASSERT_EQ(x_desc->chunks.front().slot, y_desc->chunks.front().slot);
  ASSERT_EQ(x_desc->chunks.front().segment, y_desc->chunks.front().segment);

  std::vector<std::byte> got(spec.RecordBytes());
  const absl::Status s = (*reader)->ReadRecord(spec, x_keys[0], 2, got);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("evicted or deleted by the store's writer"));
  // It caught up: Y is there now, bit-exact.
  EXPECT_EQ(*(*reader)->Lookup(spec, x), 0u);
  EXPECT_EQ(*(*reader)->Lookup(spec, y), 4u);
  std::vector<std::byte> want(spec.RecordBytes());
  ASSERT_TRUE((*reader)->ReadRecord(spec, y_keys[0], 2, got).ok());
  synth::FillRecord(spec, y_keys[0], 2, want);
  EXPECT_EQ(got, want);
}

TEST(LiveInspectionTest, ARecordDamagedInPlaceIsDataLossForTheReaderNotAnEviction) {
  // A byte of a stored record flips on disk while the writer holds the store and changes nothing.
  // The reader's read fails its checksum, it looks again in a newer view, finds the chunk still
  // named at the place that failed, and reports the damage: never NotFound, never the bytes.
  TempDir dir;
  const ModelSpec spec = Spec();
  auto writer = Engine::Open(EngineOptions{}, dir.path());
  ASSERT_TRUE(writer.ok()) << writer.status();
  const auto x = synth::Tokens(5, 4 * spec.chunk_tokens);
  ASSERT_TRUE(PutSynthetic(**writer, spec, x).ok());
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, x);
  {
    storage::StoreOptions o;
    o.read_only = true;
    auto located = storage::ChunkStore::Open(o, dir.path());
    ASSERT_TRUE(located.ok()) << located.status();
    auto where = (*located)->LocateRecord(keys[1], 3);
    ASSERT_TRUE(where.ok()) << where.status();
    std::fstream f(where->segment_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(where->offset + 100));
    const char c = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(where->offset + 100));
    f.put(static_cast<char>(c ^ 0x01));
  }
  auto reader = Engine::OpenReadOnly(EngineOptions{}, dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::byte> got(spec.RecordBytes()), want(spec.RecordBytes());
  const absl::Status s = (*reader)->ReadRecord(spec, keys[1], 3, got);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("checksum"));
  // The chunk's other records, and the other chunks, still read exactly.
  ASSERT_TRUE((*reader)->ReadRecord(spec, keys[1], 2, got).ok());
  synth::FillRecord(spec, keys[1], 2, want);
  EXPECT_EQ(got, want);
  ASSERT_TRUE((*reader)->ReadRecord(spec, keys[2], 3, got).ok());
  synth::FillRecord(spec, keys[2], 3, want);
  EXPECT_EQ(got, want);
}

TEST(LiveInspectionTest, KvctlReadsAStoreAServingProcessHolds) {
  TempDir dir;
  const ModelSpec spec = Spec();
  auto writer = Engine::Open(EngineOptions{}, dir.path());  // holds the catalog's lock
  ASSERT_TRUE(writer.ok()) << writer.status();
  const auto a = synth::Tokens(5, 6 * spec.chunk_tokens);
  ASSERT_TRUE(PutSynthetic(**writer, spec, a).ok());
  const std::string store = dir.path();
  const auto before = Files(store);
  for (const char* command : {"ls", "stats", "verify"}) {
    const auto r = testing::RunProgram(CKV_KVCTL_PATH, absl::StrCat(command, " ", store));
    EXPECT_EQ(r.exit_code, 0) << command << ": " << r.output;
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("open in another process"))) << command;
  }
  const std::string tokens_file = dir.Sub("tokens.json");
  {
    std::string json = "[";
    for (size_t i = 0; i < a.size(); ++i) absl::StrAppend(&json, i ? "," : "", a[i]);
    absl::StrAppend(&json, ",7,8,9]");  // a partial chunk after the stored ones
    FILE* f = std::fopen(tokens_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  const auto lookup = testing::RunProgram(
      CKV_KVCTL_PATH,
      absl::StrCat("lookup ", store, " --model qwen2.5-0.5b --tokens-file ", tokens_file));
  EXPECT_EQ(lookup.exit_code, 0) << lookup.output;
  EXPECT_THAT(lookup.output, HasSubstr("6 of 6 chunks stored (96 of 99 tokens)"));
  EXPECT_THAT(lookup.output, HasSubstr("the last 3 tokens are not a whole chunk"));
  const auto other = testing::RunProgram(
      CKV_KVCTL_PATH, absl::StrCat("lookup ", store,
                                   " --model qwen2.5-0.5b --model-id someone-else --json "
                                   "--tokens-file ",
                                   tokens_file));
  EXPECT_EQ(other.exit_code, 0) << other.output;
  EXPECT_THAT(other.output, HasSubstr("\"stored_chunks\":0,"));
  EXPECT_THAT(other.output, HasSubstr("\"breaks_at_chunk\":0}"));
  std::filesystem::remove(tokens_file);
  EXPECT_EQ(Files(store), before) << "kvctl's read-only commands changed the store's files";
  // A write through kvctl still needs the store to itself.
  const auto gc = testing::RunProgram(CKV_KVCTL_PATH, "gc " + store);
  EXPECT_EQ(gc.exit_code, 3) << gc.output;
  EXPECT_THAT(gc.output, HasSubstr("open in another process"));
}

TEST(LiveInspectionTest, ADamagedStoreAtRestIsDataLossAtOnceNotARaceToRetry) {
  // A segment the catalog names is gone, and nothing writes the store: the read-only open does
  // not take that for a writer's Gc racing it (it retries only while the store changes).
  TempDir dir;
  const ModelSpec spec = Spec();
  {
    auto writer = Engine::Open(EngineOptions{}, dir.path());
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE(PutSynthetic(**writer, spec, synth::Tokens(6, 4 * spec.chunk_tokens)).ok());
  }
  ASSERT_TRUE(std::filesystem::remove(dir.path() + "/segments/seg-00000001.ckv"));
  auto reader = Engine::OpenReadOnly(EngineOptions{}, dir.path());
  // Retried, it would end Unavailable ("the writer changed the store under 20 tries").
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << reader.status();
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("is missing"));
}

// The writer in another process: ckv_crash_child runs Puts and Deletes under a cap (so it evicts
// too) until it is killed. Its output is not needed here.
pid_t SpawnWriter(const std::string& store, uint64_t cap, const std::string& known_file) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    const std::string cap_str = std::to_string(cap);
    ::execl(CKV_CRASH_CHILD_PATH, CKV_CRASH_CHILD_PATH, store.c_str(), "7", "puts", cap_str.c_str(),
            known_file.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

TEST(LiveInspectionTest, ReadersInOneProcessVerifyEveryByteWhileAWriterInAnotherEvicts) {
  TempDir dir;
  const std::string store = dir.Sub("store");
  const ModelSpec spec = crash::Spec();
  const uint64_t cap = 48 * ChunkDiskBytes(spec);  // a few prefixes: Puts evict all the time
  {
    EngineOptions o;
    o.max_disk_bytes = cap;
    ASSERT_TRUE(Engine::Open(o, store).ok());
  }
  const std::string known = dir.Sub("known");
  std::fclose(std::fopen(known.c_str(), "w"));
  const pid_t writer = SpawnWriter(store, cap, known);
  ASSERT_GT(writer, 0);

  uint64_t verified = 0, not_found = 0, views = 0, puts_seen = 0;
  std::vector<std::byte> got(spec.RecordBytes()), want(spec.RecordBytes());
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(testing::kSanitizerBuild ? 20 : 6);
  absl::StatusOr<std::unique_ptr<Engine>> reader = absl::UnavailableError("not yet");
  while (std::chrono::steady_clock::now() < deadline && !::testing::Test::HasFailure()) {
    if (!reader.ok()) {
      // The writer creates the store's first segment with its first Put.
      reader = Engine::OpenReadOnly(EngineOptions{}, store);
      if (!reader.ok()) {
        ASSERT_EQ(reader.status().code(), absl::StatusCode::kUnavailable) << reader.status();
        continue;
      }
    } else {
      ASSERT_TRUE((*reader)->CatchUp().ok());
    }
    ++views;
    puts_seen = std::max(puts_seen, (*reader)->Stats().puts);
    for (const PrefixInfo& p : (*reader)->ListPrefixes()) {
      ModelSpec stored;
      auto keys = (*reader)->PrefixChunks(p.id, &stored);
      if (!keys.ok()) {
        ASSERT_EQ(keys.status().code(), absl::StatusCode::kNotFound) << keys.status();
        continue;
      }
      for (const ChunkKey& key : *keys) {
        const uint32_t layer = static_cast<uint32_t>(key.lo % spec.layers);
        const absl::Status s = (*reader)->ReadRecord(spec, key, layer, got);
        if (absl::IsNotFound(s)) {
          ++not_found;  // evicted or deleted since the view: never another chunk's bytes
          continue;
        }
        ASSERT_TRUE(s.ok()) << s;
        synth::FillRecord(spec, key, layer, want);
        ASSERT_EQ(got, want) << "wrong bytes served for chunk " << key.ToHex() << " layer "
                             << layer;
        ++verified;
      }
    }
    if (views % 5 == 0) {
      auto report = (*reader)->Verify();
      ASSERT_TRUE(report.ok()) << report.status();
      EXPECT_TRUE(report->ok()) << report->problems.size()
                                << " problems, first: " << report->problems.front();
    }
  }
  ASSERT_EQ(::kill(writer, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(writer, &status, 0), writer);
  EXPECT_TRUE(WIFSIGNALED(status)) << "the writer ended on its own, status " << status;
  EXPECT_GT(views, 3u);
  EXPECT_GT(verified, 50u);
  EXPECT_GT(puts_seen, 10u) << "the writer made too little progress for the test to mean much";
  std::printf(
      "live inspection: %llu views, %llu records verified, %llu not found (evicted or "
      "deleted meanwhile), the writer at %llu Puts\n",
      static_cast<unsigned long long>(views), static_cast<unsigned long long>(verified),
      static_cast<unsigned long long>(not_found), static_cast<unsigned long long>(puts_seen));
  // And the store, reopened by a writer after the kill, is consistent.
  reader = absl::UnavailableError("closed");
  auto after = Engine::Open(EngineOptions{}, store);
  ASSERT_TRUE(after.ok()) << after.status();
  auto report = (*after)->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok());
}

}  // namespace
}  // namespace ckv
