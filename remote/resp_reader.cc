// SPDX-License-Identifier: Apache-2.0
// The RESP2 reply reader (see remote/resp_reader.h).
//
// Small replies are parsed from the reader's buffer in two passes: the first only checks that
// the whole reply has arrived (skipping bulk payloads by their length, so an incomplete reply
// costs no copy), the second builds it. A top-level bulk string of at least kDirectBytes whose
// payload has not all arrived leaves the buffer: its string is sized at once, what was buffered
// is copied in, and later reads go straight into it, with the reader's buffer as a second iovec
// for the CRLF and whatever follows.
#include "remote/resp_reader.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckv::remote {
namespace {

// What an incomplete reply may hold beyond its limit: its header line, or one element's.
constexpr uint64_t kLineSlackBytes = 4096;

// The end of the line starting at `p` (its '\r'), nullptr when its CRLF has not arrived.
// A '\r' not followed by '\n', or a line longer than RespReader::kMaxLineBytes (ended or not),
// sets `error`.
const char* LineEnd(const char* p, const char* end, std::string* error) {
  const size_t scan = std::min<size_t>(static_cast<size_t>(end - p), RespReader::kMaxLineBytes + 1);
  const void* cr = std::memchr(p, '\r', scan);
  if (cr == nullptr) {
    if (scan > RespReader::kMaxLineBytes) {
      *error = absl::StrCat("a line of more than ", RespReader::kMaxLineBytes,
                            " bytes without its CRLF");
    }
    return nullptr;
  }
  const char* q = static_cast<const char*>(cr);
  if (q + 1 == end) return nullptr;
  if (q[1] != '\n') {
    *error = "a line ended by CR without LF";
    return nullptr;
  }
  return q;
}

// The integer of [p, end); false unless all of it is one.
bool ParseInteger(const char* p, const char* end, long long* value) {
  auto [ptr, ec] = std::from_chars(p, end, *value);
  return ec == std::errc() && ptr == end && p != end;
}

}  // namespace

const char* RespReader::Parse(const char* p, const char* end, int depth, Reply* out,
                              std::string* error) const {
  if (p == end) return nullptr;
  const char type = *p;
  const char* line_end = LineEnd(p + 1, end, error);
  if (line_end == nullptr) return nullptr;
  const char* after_line = line_end + 2;
  switch (type) {
    case '+':
    case '-':
      if (out != nullptr) {
        out->type = type == '+' ? Reply::Type::kStatus : Reply::Type::kError;
        out->str.assign(p + 1, line_end);
      }
      return after_line;
    case ':': {
      long long value = 0;
      if (!ParseInteger(p + 1, line_end, &value)) {
        *error = absl::StrCat("integer reply \"", absl::string_view(p + 1, line_end - p - 1),
                              "\" is not an integer");
        return nullptr;
      }
      if (out != nullptr) {
        out->type = Reply::Type::kInteger;
        out->integer = value;
      }
      return after_line;
    }
    case '$': {
      long long length = 0;
      if (!ParseInteger(p + 1, line_end, &length) || length < -1) {
        *error = absl::StrCat("bulk length \"", absl::string_view(p + 1, line_end - p - 1),
                              "\" is not -1 or more");
        return nullptr;
      }
      if (static_cast<unsigned long long>(length) > max_bytes_ && length != -1) {
        *error = absl::StrCat("bulk string of ", length, " bytes announced, over the ", max_bytes_,
                              " bytes the reply may be");
        return nullptr;
      }
      if (length == -1) {
        if (out != nullptr) out->type = Reply::Type::kNil;
        return after_line;
      }
      const size_t n = static_cast<size_t>(length);
      if (static_cast<size_t>(end - after_line) < n + 2) return nullptr;
      if (after_line[n] != '\r' || after_line[n + 1] != '\n') {
        *error = absl::StrCat("bulk string of ", n, " bytes not ended by CRLF");
        return nullptr;
      }
      if (out != nullptr) {
        out->type = Reply::Type::kString;
        out->str.assign(after_line, n);
      }
      return after_line + n + 2;
    }
    case '*': {
      long long count = 0;
      if (!ParseInteger(p + 1, line_end, &count) || count < -1) {
        *error = absl::StrCat("array length \"", absl::string_view(p + 1, line_end - p - 1),
                              "\" is not -1 or more");
        return nullptr;
      }
      if (count > kMaxArrayElements) {
        *error = absl::StrCat("array of ", count, " elements announced, over the limit of ",
                              kMaxArrayElements);
        return nullptr;
      }
      if (count == -1) {
        if (out != nullptr) out->type = Reply::Type::kNil;
        return after_line;
      }
      if (!arrays_) {
        *error =
            absl::StrCat("an array of ", count, " elements answered a request that takes none");
        return nullptr;
      }
      // Each element costs a Reply (72 bytes) however short it is on the wire ("+\r\n"): the
      // reply's elements, at every depth, are held to its byte limit / 32.
      elements_seen_ += static_cast<uint64_t>(count);
      if (elements_seen_ > MaxElements()) {
        *error = absl::StrCat("more than ", MaxElements(),
                              " array elements in one reply, over what its ", max_bytes_,
                              " bytes allow");
        return nullptr;
      }
      if (depth + 1 > kMaxDepth) {
        *error = absl::StrCat("arrays nested deeper than ", kMaxDepth);
        return nullptr;
      }
      if (out != nullptr) {
        // Only after the first pass found every element: `count` is bounded by the data.
        out->type = Reply::Type::kArray;
        out->elements.assign(static_cast<size_t>(count), Reply{});
      }
      const char* q = after_line;
      for (long long i = 0; i < count; ++i) {
        q = Parse(q, end, depth + 1,
                  out != nullptr ? &out->elements[static_cast<size_t>(i)] : nullptr, error);
        if (q == nullptr) return nullptr;
      }
      return q;
    }
    default:
      *error = absl::StrFormat("unknown reply type byte 0x%02x",
                               static_cast<unsigned>(static_cast<unsigned char>(type)));
      return nullptr;
  }
}

void RespReader::Compact() {
  if (begin_ == end_) {
    begin_ = end_ = 0;
  } else if (begin_ > 0 && buf_size_ - end_ < kReadBytes / 2) {
    std::memmove(buf_.get(), buf_.get() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  // A reply longer than the buffer (an array, or a string short of kDirectBytes spanning the
  // end) grows it.
  if (buf_size_ - end_ < kReadBytes / 4) {
    const size_t size = std::max(kReadBytes, 2 * buf_size_);
    std::unique_ptr<char[]> bigger(new char[size]);
    if (end_ > begin_) std::memcpy(bigger.get(), buf_.get() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
    buf_ = std::move(bigger);
    buf_size_ = size;
  }
}

ssize_t RespReader::ReadFrom(const ReadFn& read_fn) {
  Compact();
  iovec iov[2];
  int count = 0;
  size_t direct = 0;
  if (large_.has_value()) {
    direct = large_->str.size() - large_have_;
    iov[count++] = iovec{large_->str.data() + large_have_, direct};
  }
  iov[count++] = iovec{buf_.get() + end_, buf_size_ - end_};
  const ssize_t got = read_fn(iov, count);
  if (got <= 0) return got;
  const size_t into_large = std::min(static_cast<size_t>(got), direct);
  end_ += static_cast<size_t>(got) - into_large;
  if (large_.has_value()) {
    large_have_ += into_large;
    if (large_have_ == large_->str.size()) {
      ready_ = std::move(large_);
      large_.reset();
      crlf_left_ = 2;
    }
  }
  return got;
}

ssize_t RespReader::ReadFrom(int fd) {
  return ReadFrom([fd](const iovec* iov, int iovcnt) { return ::readv(fd, iov, iovcnt); });
}

absl::StatusOr<std::optional<Reply>> RespReader::Next() {
  if (large_.has_value()) return std::nullopt;
  if (ready_.has_value()) {
    while (crlf_left_ > 0 && begin_ < end_) {
      const char expected = crlf_left_ == 2 ? '\r' : '\n';
      if (buf_[begin_] != expected) {
        return absl::InternalError(
            absl::StrCat("bulk string of ", ready_->str.size(), " bytes not ended by CRLF"));
      }
      ++begin_;
      --crlf_left_;
    }
    if (crlf_left_ > 0) return std::nullopt;
    std::optional<Reply> reply = std::move(ready_);
    ready_.reset();
    ForgetExpectation();
    return reply;
  }
  if (begin_ == end_) return std::nullopt;
  const char* p = buf_.get() + begin_;
  const char* end = buf_.get() + end_;
  std::string error;
  if (*p == '$') {
    // A large value whose payload has not all arrived: read the rest straight into its string.
    const char* line_end = LineEnd(p + 1, end, &error);
    long long length = 0;
    if (line_end != nullptr && ParseInteger(p + 1, line_end, &length) &&
        length >= static_cast<long long>(kDirectBytes) &&
        static_cast<unsigned long long>(length) <= max_bytes_ &&
        static_cast<size_t>(end - (line_end + 2)) < static_cast<size_t>(length)) {
      const char* data = line_end + 2;
      const size_t have = static_cast<size_t>(end - data);
      large_.emplace();
      large_->type = Reply::Type::kString;
      if (storage_ != nullptr) large_->str = std::move(*storage_);
      large_->str.resize(static_cast<size_t>(length));
      std::memcpy(large_->str.data(), data, have);
      large_have_ = have;
      begin_ = end_ = 0;
      return std::nullopt;
    }
  }
  elements_seen_ = 0;
  const char* reply_end = Parse(p, end, 0, nullptr, &error);
  if (!error.empty()) return absl::InternalError(absl::StrCat("protocol error: ", error));
  if (reply_end == nullptr) {
    // Incomplete: everything buffered belongs to this reply. A header line, an array's element
    // headers or an endless line are allowed the reply's limit and a line's worth more.
    if (end_ - begin_ > max_bytes_ + kLineSlackBytes) {
      return absl::InternalError(absl::StrCat("protocol error: reply still incomplete after ",
                                              end_ - begin_, " bytes, over the ", max_bytes_,
                                              " bytes it may be"));
    }
    return std::nullopt;
  }
  Reply reply;
  // A bulk string (not nil) is assigned into the given storage, within its capacity.
  if (storage_ != nullptr && *p == '$' && p[1] != '-') reply.str = std::move(*storage_);
  elements_seen_ = 0;
  Parse(p, end, 0, &reply, &error);
  begin_ += static_cast<size_t>(reply_end - p);
  ForgetExpectation();
  return reply;
}

void RespReader::ExpectNextReply(uint64_t max_bytes, std::string* storage, bool arrays) {
  max_bytes_ =
      max_bytes == 0 ? kDefaultMaxReplyBytes : std::min<uint64_t>(max_bytes, kMaxBulkBytes);
  storage_ = storage;
  arrays_ = arrays;
}

void RespReader::ForgetExpectation() {
  max_bytes_ = kDefaultMaxReplyBytes;
  storage_ = nullptr;
  arrays_ = true;
}

uint64_t RespReader::MaxElements() const { return std::max<uint64_t>(64, max_bytes_ / 32); }

bool RespReader::idle() const {
  return begin_ == end_ && !large_.has_value() && !ready_.has_value() && crlf_left_ == 0;
}

}  // namespace ckv::remote
