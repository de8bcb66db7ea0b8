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
// Errors (Next): Internal for a protocol error (an unknown type byte, a malformed length or
// line, nesting deeper than kMaxDepth, a bulk string longer than kMaxBulkBytes or not ended by
// CRLF); the connection must then be dropped.
//
// Thread-safety: none; one reader per connection, used by one thread.
#ifndef CKV_REMOTE_RESP_READER_H_
#define CKV_REMOTE_RESP_READER_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
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
  // Longest bulk string accepted (Redis's proto-max-bulk-len default).
  static constexpr long long kMaxBulkBytes = 512LL << 20;
  // Deepest nesting of arrays accepted.
  static constexpr int kMaxDepth = 8;
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

  // Memory for the next reply, if it is a bulk string: its string is moved from `*storage`
  // (keeping its capacity, so a value that fits is read without allocating, and without
  // zero-filling when `*storage` already has the value's size) rather than allocated. Applies
  // to the reply that Next returns next (and is forgotten once it has); nullptr: allocate.
  // `*storage` is left alone when that reply is not a bulk string, and moved from once the
  // reader has seen its header. It must outlive that reply's Next.
  void UseStorageForNextReply(std::string* storage) { storage_ = storage; }

 private:
  // Parses one reply at [p, end) into `out` (nothing built when null). Returns the end of the
  // reply, nullptr when it has not all arrived; sets `error` (and returns nullptr) for a protocol
  // error.
  const char* Parse(const char* p, const char* end, int depth, Reply* out,
                    std::string* error) const;
  void Compact();

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
  std::string* storage_ = nullptr;  // UseStorageForNextReply
};

}  // namespace ckv::remote

#endif  // CKV_REMOTE_RESP_READER_H_
