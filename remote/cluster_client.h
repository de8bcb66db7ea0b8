// SPDX-License-Identifier: Apache-2.0
// remote/cluster_client.h: a thin Redis Cluster client over hiredis.
//
// No cluster client is packaged for Debian's hiredis (0.14), so ckv routes by slot itself:
//   - The slot map comes from CLUSTER SLOTS, asked of any node it knows (the seeds first time,
//     then the nodes of the last map, then the seeds again). It is fetched on first use and again
//     after a MOVED redirection, a connection failure or a CLUSTERDOWN/TRYAGAIN answer.
//   - Each request goes to the master of its key's slot (remote/key_slot.h). A MOVED answer
//     sends it to the node named there (and marks the map stale); an ASK answer sends ASKING and
//     then the request to the node named there, once, without touching the map (the slot is
//     being migrated). At most `max_redirects` rounds of redirections or retries per call; past
//     them the request fails with Unavailable naming the last answer.
//   - A call's requests are grouped by node; each group is one pipeline on one connection
//     (all commands written, then all replies read), and the groups of different nodes run in
//     parallel: one poll loop on the caller's thread writes every pipeline and reads the
//     replies as they arrive from whichever node answers. Replies are parsed by ckv's own
//     reader (remote/resp_reader.h), which reads a large value's payload straight from the
//     socket into the string the caller gets: no copy through an intermediate buffer.
//   - Every call has a deadline (`call_timeout` from its start). Connecting is bounded by
//     `connect_timeout` and by what is left of the deadline; after that every socket is
//     non-blocking and every request, CLUSTER SLOTS included, is written and read by the one
//     poll loop, which stops at the deadline. So a node that is stopped (SIGSTOP), unreachable,
//     or that sends its reply one byte at a time becomes DeadlineExceeded or Unavailable for the
//     requests routed to it, never a hang. A call therefore returns within about call_timeout
//     (plus one connect_timeout where a retry connects at the very end).
//   - Nothing a node sends is trusted for memory (remote/resp_reader.h): each reply may be at
//     most the bytes its request allows (Request::max_reply_bytes, ClusterOptions'
//     max_reply_bytes by default), an array at most 16384 elements, made only as they arrive.
//     A reply over its limit, a malformed reply, a redirection to an invalid endpoint and a
//     reply of the wrong type (a SET not answered +OK, an EXISTS not answered by an integer)
//     fail their request with Internal, and are not retried. Error texts and host names from
//     the wire are escaped (ckv::Printable) before they enter a message.
// Connections are kept in a per-node pool (up to `idle_connections_per_node` idle ones) and
// dropped after any I/O error.
//
// Errors, per request: Unavailable for a refused or broken connection, a cluster that is down,
// a slot no master serves or too many redirections; DeadlineExceeded for a timed-out read,
// write or connect; ResourceExhausted for an OOM answer; Internal for any other error answer.
// Messages name the node, the command and the key.
//
// Thread-safety: all methods are thread-safe; concurrent calls use different connections.
#ifndef CKV_REMOTE_CLUSTER_CLIENT_H_
#define CKV_REMOTE_CLUSTER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

struct redisContext;

namespace ckv::remote {

struct SlotMap;

// A node's address.
struct Endpoint {
  std::string host;
  int port = 0;

  // "host:port".
  std::string ToString() const;
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

// Parses "host:port[,host:port...]" (at least one; port 1..65535). InvalidArgument naming the
// bad item otherwise.
absl::StatusOr<std::vector<Endpoint>> ParseEndpoints(std::string_view list);

struct ClusterOptions {
  // Nodes to ask for the slot map first; any node of the cluster will do. At least one.
  std::vector<Endpoint> seeds;
  // Longest a connection attempt may take (also bounded by what is left of the call's
  // deadline). Default: 200 ms.
  absl::Duration connect_timeout = absl::Milliseconds(200);
  // Deadline of one call, from its start, over all its requests, redirections and retries.
  // Default: 1 s.
  absl::Duration call_timeout = absl::Seconds(1);
  // Rounds of redirection (MOVED, ASK) or retry (a broken connection, CLUSTERDOWN, TRYAGAIN)
  // a request may go through before it fails. Default: 5.
  int max_redirects = 5;
  // Idle connections kept per node for later calls. Default: 8.
  int idle_connections_per_node = 8;
  // Longest reply accepted for a request that does not state its own (Request::max_reply_bytes):
  // the longest value a GET may return. Default: 8 MiB (a chunk of qwen2.5-32b at c = 16 is
  // 4 MiB; the remote tier states each request's exact size).
  uint64_t max_reply_bytes = 8 << 20;
};

// One reply of the server, owned (a copy of hiredis's reply tree).
struct Reply {
  enum class Type { kNil, kString, kStatus, kInteger, kArray, kError };
  Type type = Type::kNil;
  std::string str;              // kString, kStatus, kError
  long long integer = 0;        // kInteger
  std::vector<Reply> elements;  // kArray
};

// One command of a pipelined call: its arguments, argv[0] the command name. It is routed by the
// slot of argv[key_index].
struct Request {
  std::vector<std::string> argv;
  size_t key_index = 1;
  // Where the reply's string may be built (a GET's value): moved from into the reply, keeping
  // its memory, so a caller that hands the same strings back call after call reads values
  // without allocating or touching fresh pages. Left alone when the reply is not a string; may
  // be left moved from (empty) when the request failed. nullptr: a fresh string. Not owned.
  std::string* reply_storage = nullptr;
  // Longest reply accepted, in bytes: a bulk string (a GET's value, a GETRANGE's range) of at
  // most this, or another reply of at most this on the wire. A longer one fails the request
  // with Internal before anything of its announced size is allocated. 0: the client's
  // ClusterOptions::max_reply_bytes.
  uint64_t max_reply_bytes = 0;
  // Whether the reply may be an array (CLUSTER SLOTS, ExecuteOn's commands). A GET, SET,
  // GETRANGE or EXISTS answered by one fails with Internal at the array's header.
  bool array_reply = false;
};

// Counters since the client was made.
struct ClusterClientStats {
  uint64_t calls = 0;
  uint64_t requests = 0;
  uint64_t moved_redirects = 0;
  uint64_t ask_redirects = 0;
  uint64_t slot_map_refreshes = 0;
  uint64_t connections_opened = 0;
  uint64_t io_errors = 0;  // refused, broken or timed-out connections
  uint64_t timeouts = 0;   // of which timed out
};

class ClusterClient {
 public:
  // Checks the options; connects to nothing yet (the first call fetches the slot map).
  // InvalidArgument for no seeds or a non-positive timeout.
  static absl::StatusOr<std::unique_ptr<ClusterClient>> Create(const ClusterOptions& options);
  ~ClusterClient();
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // Runs `requests` (pipelined per node, nodes in parallel) and returns one outcome per request,
  // in order: the server's reply (an error reply other than a redirection or retry becomes an
  // error status, see the file comment), or the request's error.
  std::vector<absl::StatusOr<Reply>> Execute(const std::vector<Request>& requests);

  // GET of each key: the value, nullopt for a missing key. A value longer than
  // `max_value_bytes` (0: ClusterOptions::max_reply_bytes) is an Internal error for its key.
  std::vector<absl::StatusOr<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, uint64_t max_value_bytes = 0);
  // GET of each key into `values` (resized to keys.size()), building each value in the memory
  // its string held from the last call (Request::reply_storage): a caller that reads values of
  // a similar size again and again passes the same vector each time, and no value is allocated
  // after the first call. Per key: true (values[i] holds the value), false (a missing key:
  // values[i] is empty, its capacity kept), or the error (values[i] unspecified).
  std::vector<absl::StatusOr<bool>> MultiGetInto(const std::vector<std::string>& keys,
                                                 std::vector<std::string>* values,
                                                 uint64_t max_value_bytes = 0);
  // SET of each (key, value): OK only for a "+OK" answer.
  std::vector<absl::Status> MultiSet(const std::vector<std::pair<std::string, std::string>>& items);
  // EXISTS of each key (Internal for an answer that is not an integer).
  std::vector<absl::StatusOr<bool>> MultiExists(const std::vector<std::string>& keys);

  // Runs one command on `node` (not routed: CLUSTER INFO, INFO, DBSIZE, ...), under the call
  // deadline, with a reply of at most ClusterOptions::max_reply_bytes. Errors as Execute's.
  absl::StatusOr<Reply> ExecuteOn(const Endpoint& node, const std::vector<std::string>& argv);
  // The masters of the current slot map (fetching it first if there is none), each with the
  // number of slots it serves.
  absl::StatusOr<std::vector<std::pair<Endpoint, uint32_t>>> Masters();

  // Fetches the slot map now. Errors: Unavailable when no known node answers, DeadlineExceeded
  // when the call's deadline passed first.
  absl::Status RefreshSlotMap();
  // The master serving `slot` in the current map (fetching it first if there is none).
  absl::StatusOr<Endpoint> MasterOf(uint32_t slot);

  ClusterClientStats stats() const;

 private:
  struct Group;
  explicit ClusterClient(const ClusterOptions& options);

  absl::Status RefreshSlotMapBy(absl::Time deadline);
  std::shared_ptr<const SlotMap> CurrentMap();
  // Runs every group's pipeline, the nodes in parallel, on the calling thread.
  void RunGroups(std::vector<Group>& groups, absl::Time deadline);
  // Runs `request` on `node` alone (not routed), by the deadline.
  absl::StatusOr<Reply> RunOn(const Endpoint& node, const Request& request, absl::Time deadline);
  // Records `reply` as the answer to request `i` of `group`.
  void HandleReply(Group& group, size_t i, Reply reply);
  // Fails the requests of `group` that have no answer yet with `status` (a connection error).
  void FailGroup(Group& group, const absl::Status& status);
  // A connection to `node` from the pool, or a new one.
  absl::StatusOr<redisContext*> Acquire(const Endpoint& node, absl::Time deadline);
  void Release(const Endpoint& node, redisContext* context, bool healthy);

  const ClusterOptions options_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const SlotMap> map_ ABSL_GUARDED_BY(mu_);
  bool map_stale_ ABSL_GUARDED_BY(mu_) = true;
  absl::flat_hash_map<std::string, std::vector<redisContext*>> idle_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> moved_{0};
  std::atomic<uint64_t> ask_{0};
  std::atomic<uint64_t> refreshes_{0};
  std::atomic<uint64_t> connections_opened_{0};
  std::atomic<uint64_t> io_errors_{0};
  std::atomic<uint64_t> timeouts_{0};
};

}  // namespace ckv::remote

#endif  // CKV_REMOTE_CLUSTER_CLIENT_H_
