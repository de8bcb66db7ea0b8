// SPDX-License-Identifier: Apache-2.0
// remote/resp_reader.h: reads Redis replies (RESP2) off a connection, each large value read
// straight into the string that is handed to the caller.
//
// hiredis's reader copies every byte twice on its way to ckv: from the read buffer into the
// reader's own buffer (redisReaderFeed), then into the reply object. For the values of the
// remote tier (a chunk's records, hundreds of KiB each) those copies were a large part of the
// client's CPU time per GET, and on a machine whose cores the cluster's servers share, CPU the
// client spends is throughput the servers lose. This reader parses the small replies (status,
// error, integer, nil, arrays, short strings) from its own buffer, and once it has seen the header
// of a top-level bulk string of at least `kDirectBytes`, sizes the reply's string and reads the
// rest of the payload into it: the kernel's copy out of the socket is the only one.
//
// Use: ReadFrom when the connection is readable, then Next until it returns nullopt. Replies
// come out in the order the server sent them.
//
// Nothing the server announces is trusted for memory: a reply may be at most the bytes its
// caller said it could be (ExpectNextReply; kDefaultMaxReplyBytes otherwise). A bulk string is
// sized by its header only once that header is within the limit, an array's elements are made
// only after all of them arrived, an array may have at most kMaxArrayElements elements and a
// reply at most one per 32 bytes of its limit (an array only where the request takes one), and a
// reply that is not a large value is buffered up to the limit and no further. A line (a header,
// a status, an error, an integer) may be at most kMaxLineBytes long. A node that announces
// "*2147483647" or "$524288000", or sends a line that never ends, is a protocol error as soon as
// its header or its bytes show it.
//
// Errors (Next): Internal for a protocol error (an unknown type byte, a malformed length or
// line, nesting deeper than kMaxDepth, an array of more than kMaxArrayElements, a reply over its
// limit, a bulk string not ended by CRLF); the connection must then be dropped.
//
// Thread-safety: none; one reader per connection, used by one thread.
#ifndef CKV_REMOTE_RESP_READER_H_
#define CKV_REMOTE_RESP_READER_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "remote/cluster_client.h"

namespace ckv::remote {

class RespReader {
 public:
  // A top-level bulk string at least this long is read straight into its reply.
  static constexpr size_t kDirectBytes = 16 << 10;
  // Longest bulk string ever accepted (Redis's proto-max-bulk-len default); a reply's own limit
  // (ExpectNextReply) is at most this.
  static constexpr long long kMaxBulkBytes = 512LL << 20;
  // The limit of a reply no one announced (ExpectNextReply not called for it).
  static constexpr uint64_t kDefaultMaxReplyBytes = 1 << 20;
  // Most elements of one array: CLUSTER SLOTS's ranges at most (one per slot); no command ckv
  // sends gets a longer array.
  static constexpr long long kMaxArrayElements = 16384;
  // Deepest nesting of arrays accepted.
  static constexpr int kMaxDepth = 8;
  // Longest line (without its CRLF) accepted: a length header, a status, an error (a MOVED with
  // its host name), an integer. Redis's own lines are far shorter; an endless line is refused
  // after this many bytes, not after the reply's whole limit.
  static constexpr size_t kMaxLineBytes = 64 * 1024;
  // Bytes asked of one read into the reader's own buffer.
  static constexpr size_t kReadBytes = 64 << 10;

  RespReader() = default;
  RespReader(const RespReader&) = delete;
  RespReader& operator=(const RespReader&) = delete;
  RespReader(RespReader&&) = default;
  RespReader& operator=(RespReader&&) = default;

  // Calls `read_fn(iov, iovcnt)` once, as readv(2) would be called (its result is returned as
  // is: bytes read, 0 at end of stream, -1 with errno set). Where a large value is being read,
  // the first buffer is the rest of its string and the second the reader's buffer (for its CRLF
  // and the replies after it, in the same call); otherwise the one buffer is the reader's.
  using ReadFn = std::function<ssize_t(const iovec* iov, int iovcnt)>;
  ssize_t ReadFrom(const ReadFn& read_fn);
  // ReadFrom with readv(2) on `fd`.
  ssize_t ReadFrom(int fd);

  // The next complete reply, nullopt when it has not all arrived yet; Internal for a protocol
  // error (see the file comment).
  absl::StatusOr<std::optional<Reply>> Next();

  // True when nothing is buffered or partly read: the connection can be reused.
  bool idle() const;

  // What the next reply (the one Next returns next) may be, and where its string goes. It may be
  // at most `max_bytes` long (capped at kMaxBulkBytes; 0 means kDefaultMaxReplyBytes): a bulk
  // string of at most that many bytes, refused at its header; any other reply is buffered until
  // it is complete, and refused once more than max_bytes + 4 KiB of it arrived (the buffer
  // doubles as it grows, so it may take up to twice that).
  // `storage`, if not null and the reply is a bulk string: its string is moved from `*storage`
  // (keeping its capacity, so a value that fits is read without allocating, and without
  // zero-filling when `*storage` already has the value's size) rather than allocated. `*storage`
  // is left alone when that reply is not a bulk string, and moved from once the reader has seen
  // its header; it must outlive that reply's Next. Both are forgotten once the reply is out.
  // `arrays`: whether the reply may be an array (CLUSTER SLOTS; a GET, SET or EXISTS never
  // gets one). Its elements, at every depth, number at most max(64, max_bytes / 32): an element
  // costs a Reply of 72 bytes however few bytes it took on the wire.
  void ExpectNextReply(uint64_t max_bytes, std::string* storage = nullptr, bool arrays = true);

 private:
  // Parses one reply at [p, end) into `out` (nothing built when null). Returns the end of the
  // reply, nullptr when it has not all arrived; sets `error` (and returns nullptr) for a protocol
  // error.
  const char* Parse(const char* p, const char* end, int depth, Reply* out,
                    std::string* error) const;
  void Compact();
  // Back to an unannounced reply's limit and no storage.
  void ForgetExpectation();
  uint64_t MaxElements() const;

  std::unique_ptr<char[]> buf_;
  size_t buf_size_ = 0;
  size_t begin_ = 0;  // first unparsed byte
  size_t end_ = 0;    // one past the last byte read
  // The top-level bulk string being read straight into its reply, and how much of it arrived.
  std::optional<Reply> large_;
  size_t large_have_ = 0;
  // The large value that has all arrived, waiting for Next (its CRLF may still be unread).
  std::optional<Reply> ready_;
  // Bytes of a finished large value's trailing CRLF still to consume from the buffer.
  size_t crlf_left_ = 0;
  std::string* storage_ = nullptr;  // ExpectNextReply
  uint64_t max_bytes_ = kDefaultMaxReplyBytes;
  bool arrays_ = true;
  mutable uint64_t elements_seen_ = 0;  // by the Parse under way
};

}  // namespace ckv::remote

#endif  // CKV_REMOTE_RESP_READER_H_
