// SPDX-License-Identifier: Apache-2.0
// remote/resp_reader.h: every RESP2 reply type, a stream cut at every byte and in reads of every
// size (so a large value is entered at every offset of its header and payload), pipelines of
// large and small replies back to back, and the protocol errors.
#include "remote/resp_reader.h"

#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ckv::remote {
namespace {

// Feeds `stream` to a reader in reads of at most `step` bytes, collecting every reply; fails the
// test on a protocol error.
std::vector<Reply> ReadAll(const std::string& stream, size_t step, RespReader* reader) {
  std::vector<Reply> out;
  size_t pos = 0;
  while (pos < stream.size()) {
    const ssize_t got = reader->ReadFrom([&](const iovec* iov, int iovcnt) -> ssize_t {
      size_t budget = std::min(step, stream.size() - pos);
      size_t copied = 0;
      for (int k = 0; k < iovcnt && budget > 0; ++k) {
        const size_t n = std::min(budget, iov[k].iov_len);
        std::memcpy(iov[k].iov_base, stream.data() + pos + copied, n);
        copied += n;
        budget -= n;
      }
      return static_cast<ssize_t>(copied);
    });
    EXPECT_GT(got, 0);
    if (got <= 0) break;
    pos += static_cast<size_t>(got);
    while (true) {
      absl::StatusOr<std::optional<Reply>> r = reader->Next();
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok() || !r->has_value()) break;
      out.push_back(std::move(**r));
    }
  }
  return out;
}

std::string Bulk(const std::string& s) { return absl::StrCat("$", s.size(), "\r\n", s, "\r\n"); }

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7) % 251);
  return s;
}

TEST(RespReaderTest, EveryTypeAtEveryCut) {
  const std::string large = Pattern(RespReader::kDirectBytes + 3, 1);
  const std::string stream = absl::StrCat(
      "+OK\r\n", "-MOVED 3999 127.0.0.1:6381\r\n", ":-42\r\n", "$-1\r\n", Bulk("small\r\nvalue"),
      Bulk(""), "*3\r\n:1\r\n", Bulk("x"), "*-1\r\n", "*0\r\n", Bulk(large), "+after\r\n");
  for (size_t step :
       {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{100}, size_t{4096}, stream.size()}) {
    SCOPED_TRACE(absl::StrCat("reads of ", step, " bytes"));
    RespReader reader;
    std::vector<Reply> got = ReadAll(stream, step, &reader);
    ASSERT_EQ(got.size(), 10u);
    EXPECT_EQ(got[0].type, Reply::Type::kStatus);
    EXPECT_EQ(got[0].str, "OK");
    EXPECT_EQ(got[1].type, Reply::Type::kError);
    EXPECT_EQ(got[1].str, "MOVED 3999 127.0.0.1:6381");
    EXPECT_EQ(got[2].type, Reply::Type::kInteger);
    EXPECT_EQ(got[2].integer, -42);
    EXPECT_EQ(got[3].type, Reply::Type::kNil);
    EXPECT_EQ(got[4].type, Reply::Type::kString);
    EXPECT_EQ(got[4].str, "small\r\nvalue");
    EXPECT_EQ(got[5].type, Reply::Type::kString);
    EXPECT_EQ(got[5].str, "");
    ASSERT_EQ(got[6].type, Reply::Type::kArray);
    ASSERT_EQ(got[6].elements.size(), 3u);
    EXPECT_EQ(got[6].elements[0].integer, 1);
    EXPECT_EQ(got[6].elements[1].str, "x");
    EXPECT_EQ(got[6].elements[2].type, Reply::Type::kNil);
    EXPECT_EQ(got[7].type, Reply::Type::kArray);
    EXPECT_TRUE(got[7].elements.empty());
    EXPECT_EQ(got[8].type, Reply::Type::kString);
    EXPECT_EQ(got[8].str, large);
    EXPECT_EQ(got[9].str, "after");
    EXPECT_TRUE(reader.idle());
  }
}

TEST(RespReaderTest, PipelineOfLargeValuesBackToBack) {
  // As a GET pipeline answers: large values, a miss between them, sizes on both sides of the
  // direct threshold, read in steps that do and do not divide them.
  std::vector<std::string> values;
  std::string stream;
  for (int i = 0; i < 6; ++i) {
    values.push_back(Pattern(i % 2 == 0 ? 196856 + i : RespReader::kDirectBytes - 1 + i, i));
    stream += Bulk(values.back());
    if (i == 2) stream += "$-1\r\n";
  }
  for (size_t step : {size_t{1000}, size_t{65536}, size_t{200000}, stream.size()}) {
    SCOPED_TRACE(absl::StrCat("reads of ", step, " bytes"));
    RespReader reader;
    std::vector<Reply> got = ReadAll(stream, step, &reader);
    ASSERT_EQ(got.size(), 7u);
    size_t v = 0;
    for (size_t k = 0; k < got.size(); ++k) {
      if (k == 3) {
        EXPECT_EQ(got[k].type, Reply::Type::kNil);
        continue;
      }
      EXPECT_EQ(got[k].type, Reply::Type::kString);
      EXPECT_EQ(got[k].str, values[v]) << "value " << v;
      ++v;
    }
    EXPECT_TRUE(reader.idle());
  }
}

TEST(RespReaderTest, NotIdleUntilTheLargeValuesCrlfArrived) {
  const std::string value = Pattern(RespReader::kDirectBytes * 2, 3);
  const std::string stream = Bulk(value);
  RespReader reader;
  // Everything but the final LF.
  std::vector<Reply> got = ReadAll(stream.substr(0, stream.size() - 1), 5000, &reader);
  EXPECT_TRUE(got.empty());
  EXPECT_FALSE(reader.idle());
  got = ReadAll("\n", 1, &reader);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].str, value);
  EXPECT_TRUE(reader.idle());
}

TEST(RespReaderTest, ReadsIntoTheStorageGiven) {
  const std::string large = Pattern(RespReader::kDirectBytes * 3, 5);
  const std::string small = "a short value";
  for (size_t step : {size_t{1000}, size_t{1} << 20}) {
    SCOPED_TRACE(absl::StrCat("reads of ", step, " bytes"));
    const std::string stream = absl::StrCat(Bulk(large), Bulk(small), "$-1\r\n", ":7\r\n");
    std::vector<std::string> storage(4);
    for (std::string& s : storage) s.reserve(large.size());
    std::vector<const char*> memory;
    for (const std::string& s : storage) memory.push_back(s.data());
    RespReader reader;
    std::vector<Reply> got;
    size_t pos = 0;
    while (pos < stream.size()) {
      const ssize_t n = reader.ReadFrom([&](const iovec* iov, int iovcnt) -> ssize_t {
        size_t copied = 0;
        for (int k = 0; k < iovcnt && pos + copied < stream.size(); ++k) {
          const size_t c = std::min({iov[k].iov_len, stream.size() - pos - copied, step - copied});
          std::memcpy(iov[k].iov_base, stream.data() + pos + copied, c);
          copied += c;
        }
        return static_cast<ssize_t>(copied);
      });
      ASSERT_GT(n, 0);
      pos += static_cast<size_t>(n);
      while (true) {
        reader.ExpectNextReply(0, &storage[got.size()]);
        absl::StatusOr<std::optional<Reply>> r = reader.Next();
        ASSERT_TRUE(r.ok()) << r.status();
        if (!r->has_value()) break;
        got.push_back(std::move(**r));
      }
    }
    ASSERT_EQ(got.size(), 4u);
    // The strings were built in the memory given, not allocated.
    EXPECT_EQ(got[0].str, large);
    EXPECT_EQ(got[0].str.data(), memory[0]);
    EXPECT_EQ(got[1].str, small);
    EXPECT_EQ(got[1].str.data(), memory[1]);
    // A nil or an integer leaves its storage alone.
    EXPECT_EQ(got[2].type, Reply::Type::kNil);
    EXPECT_EQ(storage[2].data(), memory[2]);
    EXPECT_EQ(got[3].integer, 7);
    EXPECT_EQ(storage[3].data(), memory[3]);
  }
}

absl::Status FirstError(const std::string& stream) {
  RespReader reader;
  reader.ReadFrom([&](const iovec* iov, int) -> ssize_t {
    const size_t n = std::min(iov[0].iov_len, stream.size());
    std::memcpy(iov[0].iov_base, stream.data(), n);
    return static_cast<ssize_t>(n);
  });
  while (true) {
    absl::StatusOr<std::optional<Reply>> r = reader.Next();
    if (!r.ok()) return r.status();
    if (!r->has_value()) return absl::OkStatus();
  }
}

TEST(RespReaderTest, ProtocolErrorsAreInternal) {
  for (const std::string& bad :
       {std::string("?what\r\n"), std::string(":12x\r\n"), std::string("$-2\r\n"),
        std::string("$3\r\nabcde\r\n"), std::string("*-5\r\n"), std::string("+OK\rX"),
        absl::StrCat("$", RespReader::kMaxBulkBytes + 1, "\r\n"),
        std::string("*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n")}) {
    const absl::Status s = FirstError(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << bad << ": " << s;
  }
  // A large value's payload must end with CRLF too.
  const std::string value = Pattern(RespReader::kDirectBytes, 4);
  RespReader reader;
  std::string stream = absl::StrCat("$", value.size(), "\r\n", value, "XY");
  size_t pos = 0;
  absl::Status last;
  while (pos < stream.size() && last.ok()) {
    reader.ReadFrom([&](const iovec* iov, int iovcnt) -> ssize_t {
      size_t copied = 0;
      for (int k = 0; k < iovcnt && pos + copied < stream.size(); ++k) {
        const size_t n = std::min(iov[k].iov_len, stream.size() - pos - copied);
        std::memcpy(iov[k].iov_base, stream.data() + pos + copied, n);
        copied += n;
      }
      pos += copied;
      return static_cast<ssize_t>(copied);
    });
    last = reader.Next().status();
  }
  EXPECT_EQ(last.code(), absl::StatusCode::kInternal) << last;
}

// Regressions of the report "a 13-byte reply kills the process": what a node announces is
// refused as soon as its header arrives, before anything of that size is made, and a reply that
// never ends is refused once it passes its limit.
TEST(RespReaderTest, AnnouncedSizesOverTheLimitAreRefusedAtTheirHeader) {
  // A 2^31-element array: refused from its 13 bytes alone (hiredis resized a vector to it).
  absl::Status s = FirstError("*2147483647\r\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("array of 2147483647 elements announced"), std::string::npos) << s;
  // 16384 elements (CLUSTER SLOTS's most) are still allowed to arrive.
  EXPECT_TRUE(FirstError("*16384\r\n").ok());
  // Nested arrays of 3-byte elements, each a 72-byte Reply: at most one per 32 bytes of the
  // limit, counted at every depth as they arrive.
  RespReader reader;
  reader.ExpectNextReply(64 * 32);  // 64 elements
  std::string nested = "*2\r\n*40\r\n";
  for (int i = 0; i < 40; ++i) nested += "+\r\n";
  nested += "*40\r\n";
  reader.ReadFrom([&](const iovec* iov, int) -> ssize_t {
    std::memcpy(iov[0].iov_base, nested.data(), nested.size());
    return static_cast<ssize_t>(nested.size());
  });
  s = reader.Next().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("more than 64 array elements"), std::string::npos) << s;
  // A request that takes no array (a GET, a SET) refuses one at its header.
  RespReader get;
  get.ExpectNextReply(1 << 20, nullptr, /*arrays=*/false);
  get.ReadFrom([&](const iovec* iov, int) -> ssize_t {
    std::memcpy(iov[0].iov_base, "*1\r\n", 4);
    return 4;
  });
  s = get.Next().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("answered a request that takes none"), std::string::npos) << s;
  // A 500 MiB string against an unannounced reply's 1 MiB: refused at its header, so the
  // string is never sized (it was resized to 500 MiB before its payload arrived).
  s = FirstError("$524288000\r\nabc");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("bulk string of 524288000 bytes announced"), std::string::npos) << s;
}

TEST(RespReaderTest, EachReplyIsHeldToTheLimitItsRequestStated) {
  const std::string value = Pattern(RespReader::kDirectBytes * 2, 6);
  const std::string stream = absl::StrCat("$", value.size(), "\r\n", value, "\r\n");
  for (const uint64_t limit : {value.size(), value.size() - 1}) {
    SCOPED_TRACE(limit);
    RespReader reader;
    reader.ExpectNextReply(limit);
    size_t pos = 0;
    absl::StatusOr<std::optional<Reply>> got = std::optional<Reply>();
    while (got.ok() && !got->has_value() && pos < stream.size()) {
      reader.ReadFrom([&](const iovec* iov, int iovcnt) -> ssize_t {
        size_t copied = 0;  // 4 KiB a read, as readv fills its buffers: in order
        for (int k = 0; k < iovcnt && pos < stream.size() && copied < 4096; ++k) {
          const size_t n = std::min({iov[k].iov_len, stream.size() - pos, 4096 - copied});
          std::memcpy(iov[k].iov_base, stream.data() + pos, n);
          pos += n;
          copied += n;
        }
        return static_cast<ssize_t>(copied);
      });
      got = reader.Next();
    }
    if (limit == value.size()) {
      ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
      EXPECT_EQ((*got)->str, value);
    } else {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
      EXPECT_LT(pos, size_t{8192});  // refused at the header, not after the payload
    }
  }
}

// Feeds `head`, then 'A's without end, 4 KiB a read, until Next() fails or after `max_reads`
// reads. Returns Next()'s last status and the bytes fed.
std::pair<absl::Status, uint64_t> FeedEndless(RespReader& reader, const std::string& head,
                                              int max_reads) {
  uint64_t fed = 0;
  absl::Status last;
  for (int i = 0; i < max_reads && last.ok(); ++i) {
    reader.ReadFrom([&](const iovec* iov, int) -> ssize_t {
      std::string piece = fed == 0 ? head : std::string();
      while (piece.size() < 4096) piece += "AAAA";
      const size_t n = std::min(iov[0].iov_len, piece.size());
      std::memcpy(iov[0].iov_base, piece.data(), n);
      fed += n;
      return static_cast<ssize_t>(n);
    });
    last = reader.Next().status();
  }
  return {last, fed};
}

TEST(RespReaderTest, AReplyThatNeverEndsIsRefusedPastItsLimit) {
  // A status line without end, alone and inside an array: the reader buffers
  // what arrives up to the reply's limit (and a line's worth), then gives up.
  for (const std::string& head : {std::string("+"), std::string("*1\r\n+")}) {
    SCOPED_TRACE(head);
    RespReader reader;
    reader.ExpectNextReply(20000);
    const auto [last, fed] = FeedEndless(reader, head, 1000);
    EXPECT_EQ(last.code(), absl::StatusCode::kInternal);
    EXPECT_NE(last.message().find("reply still incomplete"), std::string::npos) << last;
    EXPECT_LT(fed, uint64_t{20000} + 4096 + 4096 * 2);
  }
}

TEST(RespReaderTest, ALineThatNeverEndsIsRefusedPastTheLineLimitWhateverTheReplysLimit) {
  // CLUSTER SLOTS may be 16 MiB, but none of its lines is longer than a host name: an endless
  // status line, alone or as an element, is refused after kMaxLineBytes, not after 16 MiB.
  for (const std::string& head : {std::string("+"), std::string("*2\r\n:1\r\n-ERR ")}) {
    SCOPED_TRACE(head);
    RespReader reader;
    reader.ExpectNextReply(uint64_t{16} << 20, nullptr, /*arrays=*/true);
    const auto [last, fed] = FeedEndless(reader, head, 10000);
    EXPECT_EQ(last.code(), absl::StatusCode::kInternal);
    EXPECT_NE(last.message().find("a line of more than 65536 bytes without its CRLF"),
              std::string::npos)
        << last;
    EXPECT_LT(fed, RespReader::kMaxLineBytes + 3 * 4096);
  }
  // A line just under the limit is still a reply.
  RespReader reader;
  std::string line(RespReader::kMaxLineBytes + 2, 'e');
  line.front() = '-';
  line[line.size() - 2] = '\r';
  line.back() = '\n';
  size_t at = 0;
  absl::StatusOr<std::optional<Reply>> got = std::optional<Reply>();
  while (got.ok() && !got->has_value() && at < line.size()) {
    reader.ReadFrom([&](const iovec* iov, int) -> ssize_t {
      const size_t n = std::min(iov[0].iov_len, line.size() - at);
      std::memcpy(iov[0].iov_base, line.data() + at, n);
      at += n;
      return static_cast<ssize_t>(n);
    });
    got = reader.Next();
  }
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  EXPECT_EQ((*got)->type, Reply::Type::kError);
  EXPECT_EQ((*got)->str.size(), RespReader::kMaxLineBytes - 1);
}

}  // namespace
}  // namespace ckv::remote
