// SPDX-License-Identifier: Apache-2.0
// The Redis Cluster client (see remote/cluster_client.h).
//
// A call runs in rounds. Each round routes every request still pending (by the slot map, or to
// the node a MOVED or ASK answer named), groups them by node, runs the groups in parallel, and
// sorts each request's answer into done, redirected (MOVED, ASK) or to retry (a broken
// connection, CLUSTERDOWN, TRYAGAIN). Redirected and retried requests go into the next round,
// after the slot map is fetched again where it went stale; a request past max_redirects rounds,
// or still pending at the deadline, fails.
#include "remote/cluster_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckv/log.h"
#include "remote/key_slot.h"
#include "remote/resp_reader.h"
#include "remote/slot_map.h"

namespace ckv::remote {

namespace {

// What a round made of one request.
enum class Fate { kDone, kMoved, kAsk, kRetry, kFailed };

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

timeval TimevalOf(absl::Duration d) {
  if (d < absl::Milliseconds(1)) d = absl::Milliseconds(1);  // 0 would mean "no timeout"
  return absl::ToTimeval(d);
}

// Appends `argv` to `out` as one RESP command (an array of bulk strings), as hiredis's
// redisFormatCommandArgv would, into the connection's own output buffer.
void AppendCommand(const std::vector<std::string>& argv, std::string* out) {
  absl::StrAppend(out, "*", argv.size(), "\r\n");
  for (const std::string& a : argv) {
    absl::StrAppend(out, "$", a.size(), "\r\n");
    out->append(a);
    out->append("\r\n");
  }
}

const char* TypeName(Reply::Type type) {
  switch (type) {
    case Reply::Type::kNil:
      return "nil";
    case Reply::Type::kString:
      return "a bulk string";
    case Reply::Type::kStatus:
      return "a status";
    case Reply::Type::kInteger:
      return "an integer";
    case Reply::Type::kArray:
      return "an array";
    case Reply::Type::kError:
      return "an error";
  }
  return "an unknown type";
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// The status of a hiredis context error: DeadlineExceeded for a timeout (EAGAIN on a socket
// with SO_RCVTIMEO, or hiredis's own connect timeout), Unavailable for anything else.
absl::Status ContextError(const redisContext* c, const Endpoint& node, std::string_view what,
                          absl::Duration timeout) {
  // hiredis reports a timed-out read or write as the strerror of EAGAIN, and a timed-out
  // connect as "Connection timed out".
  const std::string_view text(c->errstr);
  const bool timed_out =
      c->err == REDIS_ERR_IO && (text.find("temporarily unavailable") != std::string_view::npos ||
                                 text.find("timed out") != std::string_view::npos);
  const std::string message = absl::StrFormat("redis %s: %s: %s", node.ToString(), Sv(what),
                                              c->errstr[0] != '\0' ? c->errstr : "I/O error");
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(message, " (timeout ", absl::FormatDuration(timeout), ")"));
  }
  return absl::UnavailableError(message);
}

// True for an IPv4 or IPv6 address literal.
bool IsNumericHost(const std::string& host) {
  in6_addr a6;
  in_addr a4;
  return inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

std::string Describe(const Request& request) {
  if (request.argv.empty()) return "";
  if (request.key_index == 0 || request.key_index >= request.argv.size()) {
    return Printable(request.argv[0]);
  }
  return Printable(absl::StrCat(request.argv[0], " ", request.argv[request.key_index]));
}

}  // namespace

struct ClusterClient::Group {
  Endpoint node;
  std::vector<size_t> indices;  // into the call's requests
  std::vector<bool> asking;     // per index: send ASKING first
  const std::vector<Request>* requests = nullptr;
  // Per index, after RunGroup:
  std::vector<Fate> fates;
  std::vector<absl::StatusOr<Reply>> outcomes;
  std::vector<Endpoint> targets;  // kMoved / kAsk
  std::vector<bool> answered;     // a reply arrived (not failed by the connection)
  bool timed_out = false;
  bool io_error = false;
};

std::string Endpoint::ToString() const { return absl::StrCat(host, ":", port); }

absl::StatusOr<std::vector<Endpoint>> ParseEndpoints(std::string_view list) {
  std::vector<Endpoint> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    const std::string_view item = list.substr(start, end - start);
    const size_t colon = item.rfind(':');
    Endpoint e;
    if (colon == std::string_view::npos || colon == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("endpoint \"", Sv(item), "\": expected HOST:PORT"));
    }
    e.host = std::string(item.substr(0, colon));
    const std::string_view port = item.substr(colon + 1);
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), e.port);
    if (ec != std::errc() || ptr != port.data() + port.size() || e.port < 1 || e.port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("endpoint \"", Sv(item), "\": port must be 1..65535"));
    }
    out.push_back(std::move(e));
    start = end + 1;
    if (end == list.size()) break;
  }
  if (out.empty()) return absl::InvalidArgumentError("no endpoint given");
  return out;
}

absl::StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Create(
    const ClusterOptions& options) {
  if (options.seeds.empty()) {
    return absl::InvalidArgumentError("cluster client: no seed endpoint");
  }
  if (options.connect_timeout <= absl::ZeroDuration() ||
      options.call_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster client: timeouts must be positive (connect ",
                     absl::FormatDuration(options.connect_timeout), ", call ",
                     absl::FormatDuration(options.call_timeout), ")"));
  }
  if (options.max_redirects < 1 || options.max_redirects > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster client: max_redirects ", options.max_redirects, " not in 1..64"));
  }
  return std::unique_ptr<ClusterClient>(new ClusterClient(options));
}

ClusterClient::ClusterClient(const ClusterOptions& options) : options_(options) {}

ClusterClient::~ClusterClient() {
  absl::MutexLock lock(&mu_);
  for (auto& [name, contexts] : idle_) {
    for (redisContext* c : contexts) redisFree(c);
  }
}

ClusterClientStats ClusterClient::stats() const {
  ClusterClientStats s;
  s.calls = calls_.load(std::memory_order_relaxed);
  s.requests = requests_.load(std::memory_order_relaxed);
  s.moved_redirects = moved_.load(std::memory_order_relaxed);
  s.ask_redirects = ask_.load(std::memory_order_relaxed);
  s.slot_map_refreshes = refreshes_.load(std::memory_order_relaxed);
  s.connections_opened = connections_opened_.load(std::memory_order_relaxed);
  s.io_errors = io_errors_.load(std::memory_order_relaxed);
  s.timeouts = timeouts_.load(std::memory_order_relaxed);
  return s;
}

absl::StatusOr<redisContext*> ClusterClient::Acquire(const Endpoint& node, absl::Time deadline) {
  while (true) {
    redisContext* c = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = idle_.find(node.ToString());
      if (it == idle_.end() || it->second.empty()) break;
      c = it->second.back();
      it->second.pop_back();
    }
    // An idle connection has nothing to read. Bytes (a reply nobody asked for, which would be
    // taken for the next call's first answer, such as a stale +OK for a SET) or its end: drop it.
    pollfd p{c->fd, POLLIN, 0};
    if (poll(&p, 1, 0) == 0) return c;
    redisFree(c);
  }
  // A name is resolved with a blocking getaddrinfo that no deadline bounds: only the seeds the
  // operator gave may be names; a node the cluster names (CLUSTER SLOTS, MOVED, ASK) must be an
  // address, as Redis Cluster announces them by default.
  if (!IsNumericHost(node.host) &&
      std::none_of(options_.seeds.begin(), options_.seeds.end(),
                   [&](const Endpoint& seed) { return seed.host == node.host; })) {
    io_errors_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnavailableError(absl::StrCat(
        "redis ", node.ToString(),
        ": a host name the cluster announced, not an address; only seeds are resolved"));
  }
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) {
    timeouts_.fetch_add(1, std::memory_order_relaxed);
    return absl::DeadlineExceededError(
        absl::StrCat("redis ", node.ToString(), ": deadline passed before connecting"));
  }
  const absl::Duration timeout = std::min(options_.connect_timeout, left);
  redisContext* c = redisConnectWithTimeout(node.host.c_str(), node.port, TimevalOf(timeout));
  if (c == nullptr) {
    io_errors_.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(
        absl::StrCat("redis ", node.ToString(), ": cannot allocate a connection"));
  }
  if (c->err != 0) {
    absl::Status s = ContextError(c, node, "connect", timeout);
    redisFree(c);
    io_errors_.fetch_add(1, std::memory_order_relaxed);
    if (absl::IsDeadlineExceeded(s)) timeouts_.fetch_add(1, std::memory_order_relaxed);
    return s;
  }
  // From here on the socket is only polled, written with send(MSG_DONTWAIT) and read by
  // RespReader: non-blocking, so no read or write can outlast the call's deadline. hiredis's
  // own reader and writer are never used on it.
  const int flags = ::fcntl(c->fd, F_GETFL);
  if (flags < 0 || ::fcntl(c->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    const int e = errno;
    redisFree(c);
    io_errors_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnavailableError(absl::StrCat("redis ", node.ToString(),
                                               ": cannot make the socket non-blocking: errno ", e));
  }
  connections_opened_.fetch_add(1, std::memory_order_relaxed);
  return c;
}

void ClusterClient::Release(const Endpoint& node, redisContext* c, bool healthy) {
  if (healthy) {
    absl::MutexLock lock(&mu_);
    std::vector<redisContext*>& pool = idle_[node.ToString()];
    if (static_cast<int>(pool.size()) < options_.idle_connections_per_node) {
      pool.push_back(c);
      return;
    }
  }
  redisFree(c);
}

std::shared_ptr<const SlotMap> ClusterClient::CurrentMap() {
  absl::MutexLock lock(&mu_);
  return map_;
}

absl::Status ClusterClient::RefreshSlotMap() {
  return RefreshSlotMapBy(absl::Now() + options_.call_timeout);
}

absl::Status ClusterClient::RefreshSlotMapBy(absl::Time deadline) {
  refreshes_.fetch_add(1, std::memory_order_relaxed);
  // Candidates: the masters, then the replicas of the last map (a replica promoted by a
  // failover knows the new map), then the seeds.
  std::vector<Endpoint> candidates;
  if (std::shared_ptr<const SlotMap> old = CurrentMap(); old != nullptr) {
    candidates = old->masters;
    candidates.insert(candidates.end(), old->replicas.begin(), old->replicas.end());
  }
  for (const Endpoint& seed : options_.seeds) {
    if (std::find(candidates.begin(), candidates.end(), seed) == candidates.end()) {
      candidates.push_back(seed);
    }
  }
  absl::Status last = absl::UnavailableError("no node to ask for the slot map");
  Request request;
  request.argv = {"CLUSTER", "SLOTS"};
  // 16384 ranges, each with a master and replicas: about 100 bytes a node on the wire.
  request.max_reply_bytes = 16 << 20;
  request.array_reply = true;
  for (const Endpoint& node : candidates) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("slot map: deadline passed; last error: ", last.message()));
    }
    absl::StatusOr<Reply> reply = RunOn(node, request, deadline);
    if (!reply.ok()) {
      // A node that broke the protocol or answered an error has given no map: Unavailable, as
      // one that did not answer (a timeout stays DeadlineExceeded).
      last = absl::IsDeadlineExceeded(reply.status())
                 ? reply.status()
                 : absl::UnavailableError(reply.status().message());
      continue;
    }
    absl::StatusOr<SlotMap> map = ParseSlotMap(*reply, node);
    if (!map.ok()) {
      last = map.status();
      continue;
    }
    absl::MutexLock lock(&mu_);
    map_ = std::make_shared<const SlotMap>(*std::move(map));
    map_stale_ = false;
    return absl::OkStatus();
  }
  return last;
}

absl::StatusOr<Endpoint> ClusterClient::MasterOf(uint32_t slot) {
  std::shared_ptr<const SlotMap> map = CurrentMap();
  if (map == nullptr) {
    absl::Status s = RefreshSlotMap();
    if (!s.ok()) return s;
    map = CurrentMap();
  }
  if (slot >= kClusterSlots || map->slot_master[slot] < 0) {
    return absl::UnavailableError(absl::StrCat("slot ", slot, ": no master serves it"));
  }
  return map->masters[map->slot_master[slot]];
}

absl::StatusOr<std::vector<std::pair<Endpoint, uint32_t>>> ClusterClient::Masters() {
  std::shared_ptr<const SlotMap> map = CurrentMap();
  if (map == nullptr) {
    absl::Status s = RefreshSlotMap();
    if (!s.ok()) return s;
    map = CurrentMap();
  }
  std::vector<std::pair<Endpoint, uint32_t>> out;
  for (const Endpoint& m : map->masters) out.emplace_back(m, 0);
  for (int32_t m : map->slot_master) {
    if (m >= 0) out[m].second++;
  }
  return out;
}

absl::StatusOr<Reply> ClusterClient::ExecuteOn(const Endpoint& node,
                                               const std::vector<std::string>& argv) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  requests_.fetch_add(1, std::memory_order_relaxed);
  if (argv.empty()) return absl::InvalidArgumentError("ExecuteOn: no command");
  Request request;
  request.argv = argv;
  request.key_index = 0;  // named in messages; not routed
  request.array_reply = true;
  return RunOn(node, request, absl::Now() + options_.call_timeout);
}

absl::StatusOr<Reply> ClusterClient::RunOn(const Endpoint& node, const Request& request,
                                           absl::Time deadline) {
  const std::vector<Request> requests = {request};
  std::vector<Group> groups(1);
  groups[0].node = node;
  groups[0].indices = {0};
  groups[0].asking = {false};
  groups[0].requests = &requests;
  RunGroups(groups, deadline);
  return std::move(groups[0].outcomes[0]);
}

void ClusterClient::FailGroup(Group& g, const absl::Status& s) {
  g.io_error = true;
  g.timed_out = absl::IsDeadlineExceeded(s);
  io_errors_.fetch_add(1, std::memory_order_relaxed);
  if (g.timed_out) timeouts_.fetch_add(1, std::memory_order_relaxed);
  for (size_t i = 0; i < g.indices.size(); ++i) {
    if (g.answered[i]) continue;
    // A broken connection is retried (after a map refresh) unless it timed out (the deadline
    // is spent anyway) or the node broke the protocol (it would again).
    g.fates[i] = absl::IsUnavailable(s) ? Fate::kRetry : Fate::kFailed;
    g.outcomes[i] = absl::Status(
        s.code(), absl::StrCat(s.message(), " (", Describe((*g.requests)[g.indices[i]]), ")"));
  }
}

void ClusterClient::HandleReply(Group& g, size_t i, Reply reply) {
  g.answered[i] = true;
  if (reply.type != Reply::Type::kError) {
    g.fates[i] = Fate::kDone;
    g.outcomes[i] = std::move(reply);
    return;
  }
  const Request& r = (*g.requests)[g.indices[i]];
  const std::string_view error(reply.str);
  const std::string what =
      absl::StrFormat("redis %s: %s: %s", g.node.ToString(), Describe(r), Printable(error));
  if (StartsWith(error, "MOVED ") || StartsWith(error, "ASK ")) {
    std::optional<Endpoint> target = RedirectTarget(error, g.node);
    if (!target) {
      g.fates[i] = Fate::kFailed;
      g.outcomes[i] = absl::InternalError(absl::StrCat(what, " (malformed redirection)"));
      return;
    }
    const bool ask = StartsWith(error, "ASK ");
    (ask ? ask_ : moved_).fetch_add(1, std::memory_order_relaxed);
    g.fates[i] = ask ? Fate::kAsk : Fate::kMoved;
    g.targets[i] = *target;
    g.outcomes[i] = absl::UnavailableError(what);
  } else if (StartsWith(error, "CLUSTERDOWN") || StartsWith(error, "TRYAGAIN") ||
             StartsWith(error, "LOADING") || StartsWith(error, "MASTERDOWN")) {
    g.fates[i] = Fate::kRetry;
    g.outcomes[i] = absl::UnavailableError(what);
  } else if (StartsWith(error, "OOM")) {
    g.fates[i] = Fate::kFailed;
    g.outcomes[i] = absl::ResourceExhaustedError(what);
  } else {
    g.fates[i] = Fate::kFailed;
    g.outcomes[i] = absl::InternalError(what);
  }
}

// The groups of one round, on one thread: every group's pipeline is formatted into its own
// output buffer, then one poll loop over all the connections writes what is left and reads
// whatever replies arrive, from whichever node answers first, until every group has all its
// replies or the deadline passes. The nodes work in parallel. The sockets are non-blocking, so
// the loop, and with it the call, ends at the deadline whatever a node does. Replies are read by
// ckv's own RespReader (remote/resp_reader.h), each within its request's limit: a value's
// payload goes from the socket straight into the string the caller gets.
void ClusterClient::RunGroups(std::vector<Group>& groups, absl::Time deadline) {
  struct Live {
    Group* g = nullptr;
    redisContext* c = nullptr;
    // The replies expected, in order: (request index in the group, is the ASKING reply).
    std::vector<std::pair<size_t, bool>> expected;
    size_t next = 0;
    RespReader reader;
    std::string out;  // the pipeline's commands
    size_t sent = 0;
    bool done = false;
  };
  std::vector<Live> live;
  live.reserve(groups.size());
  for (Group& g : groups) {
    const size_t n = g.indices.size();
    g.fates.assign(n, Fate::kFailed);
    g.outcomes.assign(n, absl::UnknownError("not run"));
    g.targets.assign(n, Endpoint{});
    g.answered.assign(n, false);
    absl::StatusOr<redisContext*> acquired = Acquire(g.node, deadline);
    if (!acquired.ok()) {
      // Acquire counted the error already.
      g.io_error = true;
      g.timed_out = absl::IsDeadlineExceeded(acquired.status());
      for (size_t i = 0; i < n; ++i) {
        g.fates[i] = g.timed_out ? Fate::kFailed : Fate::kRetry;
        g.outcomes[i] = absl::Status(acquired.status().code(),
                                     absl::StrCat(acquired.status().message(), " (",
                                                  Describe((*g.requests)[g.indices[i]]), ")"));
      }
      continue;
    }
    Live l;
    l.g = &g;
    l.c = *acquired;
    for (size_t i = 0; i < n; ++i) {
      const Request& r = (*g.requests)[g.indices[i]];
      if (g.asking[i]) {
        AppendCommand({"ASKING"}, &l.out);
        l.expected.emplace_back(i, true);
      }
      AppendCommand(r.argv, &l.out);
      l.expected.emplace_back(i, false);
    }
    live.push_back(std::move(l));
  }
  auto finish = [&](Live& l, const absl::Status* error) {
    l.done = true;
    if (error != nullptr) FailGroup(*l.g, *error);
    // A connection with bytes left over (none are expected past the last reply) is not reused.
    Release(l.g->node, l.c, error == nullptr && l.reader.idle());
  };
  // Tells the reader what the next reply may be: its request's limit, and its storage.
  auto expect_next = [&](Live& l) {
    if (l.next >= l.expected.size()) return;
    const auto [i, is_asking] = l.expected[l.next];
    const Request& r = (*l.g->requests)[l.g->indices[i]];
    if (is_asking) {
      l.reader.ExpectNextReply(64, nullptr, /*arrays=*/false);  // +OK
    } else {
      l.reader.ExpectNextReply(
          r.max_reply_bytes != 0 ? r.max_reply_bytes : options_.max_reply_bytes, r.reply_storage,
          r.array_reply);
    }
  };
  std::vector<pollfd> fds;
  std::vector<Live*> polled;
  while (true) {
    fds.clear();
    polled.clear();
    for (Live& l : live) {
      if (l.done) continue;
      const bool writing = l.sent < l.out.size();
      fds.push_back(pollfd{l.c->fd, static_cast<short>(POLLIN | (writing ? POLLOUT : 0)), 0});
      polled.push_back(&l);
    }
    if (fds.empty()) break;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      for (Live* l : polled) {
        const absl::Status s = absl::DeadlineExceededError(
            absl::StrCat("redis ", l->g->node.ToString(), ": no reply within the deadline (",
                         absl::FormatDuration(options_.call_timeout), ")"));
        finish(*l, &s);
      }
      break;
    }
    // Rounded up, so that a poll never returns just before the deadline and spins.
    const int64_t wait_ms = (absl::ToInt64Microseconds(left) + 999) / 1000;
    const int ready = poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(1, wait_ms)));
    if (ready < 0 && errno != EINTR) {
      const absl::Status s = absl::UnavailableError(absl::StrCat("poll: errno ", errno));
      for (Live* l : polled) finish(*l, &s);
      break;
    }
    for (size_t k = 0; k < fds.size() && ready > 0; ++k) {
      Live& l = *polled[k];
      const short ev = fds[k].revents;
      if (ev == 0) continue;
      if (l.sent < l.out.size() && (ev & POLLOUT) != 0) {
        const ssize_t n = ::send(l.c->fd, l.out.data() + l.sent, l.out.size() - l.sent,
                                 MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
          l.sent += static_cast<size_t>(n);
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          const absl::Status s = absl::UnavailableError(
              absl::StrCat("redis ", l.g->node.ToString(), ": write: errno ", errno));
          finish(l, &s);
          continue;
        }
      }
      if ((ev & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      expect_next(l);
      const ssize_t got = l.reader.ReadFrom(l.c->fd);
      if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (got <= 0) {
        const absl::Status s = absl::UnavailableError(
            absl::StrCat("redis ", l.g->node.ToString(), ": ",
                         got == 0 ? std::string("connection closed by the server")
                                  : absl::StrCat("read: errno ", errno)));
        finish(l, &s);
        continue;
      }
      bool broken = false;
      while (l.next < l.expected.size()) {
        expect_next(l);
        absl::StatusOr<std::optional<Reply>> reply = l.reader.Next();
        if (!reply.ok()) {
          const absl::Status s = absl::InternalError(
              absl::StrCat("redis ", l.g->node.ToString(), ": ", reply.status().message()));
          finish(l, &s);
          broken = true;
          break;
        }
        if (!reply->has_value()) break;  // the rest has not arrived yet
        const auto [i, is_asking] = l.expected[l.next++];
        if (!is_asking) HandleReply(*l.g, i, std::move(**reply));
      }
      if (!broken && l.next == l.expected.size()) finish(l, nullptr);
    }
  }
}

std::vector<absl::StatusOr<Reply>> ClusterClient::Execute(const std::vector<Request>& requests) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  requests_.fetch_add(requests.size(), std::memory_order_relaxed);
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  std::vector<absl::StatusOr<Reply>> out(requests.size(), absl::UnknownError("request not run"));
  // Per pending request: where a redirection sent it, and whether to send ASKING first.
  struct Pending {
    size_t index;
    std::optional<Endpoint> target;
    bool asking = false;
  };
  std::vector<Pending> pending;
  pending.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].key_index >= requests[i].argv.size()) {
      out[i] = absl::InvalidArgumentError(absl::StrCat("request ", i, ": key index ",
                                                       requests[i].key_index, " past its ",
                                                       requests[i].argv.size(), " arguments"));
      continue;
    }
    pending.push_back(Pending{i, std::nullopt, false});
  }
  bool backoff = false;
  for (int round = 0; !pending.empty(); ++round) {
    if (round > options_.max_redirects) {
      for (const Pending& p : pending) {
        out[p.index] = absl::UnavailableError(
            absl::StrCat("too many redirections or retries (", options_.max_redirects,
                         "); last: ", out[p.index].status().message()));
      }
      break;
    }
    if (backoff) {
      // A cluster in failover or a node restarting: wait a little before asking again, never
      // past the deadline.
      const absl::Duration pause = std::min(absl::Milliseconds(20 * round), deadline - absl::Now());
      if (pause > absl::ZeroDuration()) absl::SleepFor(pause);
    }
    if (absl::Now() >= deadline) {
      for (const Pending& p : pending) {
        std::string message = absl::StrCat(Describe(requests[p.index]), ": deadline of ",
                                           absl::FormatDuration(options_.call_timeout), " passed");
        if (round > 0 && !out[p.index].ok()) {
          absl::StrAppend(&message, "; last: ", out[p.index].status().message());
        }
        out[p.index] = absl::DeadlineExceededError(message);
      }
      break;
    }
    bool stale;
    {
      absl::MutexLock lock(&mu_);
      stale = map_stale_ || map_ == nullptr;
    }
    if (stale) {
      absl::Status s = RefreshSlotMapBy(deadline);
      if (!s.ok() && CurrentMap() == nullptr) {
        for (const Pending& p : pending) out[p.index] = s;
        break;
      }
    }
    std::shared_ptr<const SlotMap> map = CurrentMap();
    // Group by node.
    std::vector<Group> groups;
    absl::flat_hash_map<std::string, size_t> group_of;
    for (const Pending& p : pending) {
      const Request& r = requests[p.index];
      Endpoint node;
      if (p.target) {
        node = *p.target;
      } else {
        const int32_t m = map->slot_master[KeySlot(r.argv[r.key_index])];
        if (m < 0) {
          out[p.index] = absl::UnavailableError(
              absl::StrCat(Describe(r), ": slot ", KeySlot(r.argv[r.key_index]), " has no master"));
          continue;
        }
        node = map->masters[m];
      }
      auto [it, inserted] = group_of.try_emplace(node.ToString(), groups.size());
      if (inserted) {
        groups.emplace_back();
        groups.back().node = node;
        groups.back().requests = &requests;
      }
      groups[it->second].indices.push_back(p.index);
      groups[it->second].asking.push_back(p.asking);
    }
    RunGroups(groups, deadline);

    std::vector<Pending> next;
    backoff = false;
    bool moved = false;
    for (Group& g : groups) {
      for (size_t i = 0; i < g.indices.size(); ++i) {
        const size_t index = g.indices[i];
        out[index] = std::move(g.outcomes[i]);
        switch (g.fates[i]) {
          case Fate::kDone:
          case Fate::kFailed:
            break;
          case Fate::kMoved:
            moved = true;
            next.push_back(Pending{index, g.targets[i], false});
            break;
          case Fate::kAsk:
            next.push_back(Pending{index, g.targets[i], true});
            break;
          case Fate::kRetry:
            backoff = true;
            next.push_back(Pending{index, std::nullopt, false});
            break;
        }
      }
    }
    if (moved || backoff) {
      absl::MutexLock lock(&mu_);
      map_stale_ = true;
    }
    pending = std::move(next);
  }
  return out;
}

std::vector<absl::StatusOr<std::optional<std::string>>> ClusterClient::MultiGet(
    const std::vector<std::string>& keys, uint64_t max_value_bytes) {
  // Fresh strings, each value allocated as it arrives (no memory handed back).
  std::vector<std::string> values;
  std::vector<absl::StatusOr<bool>> found = MultiGetInto(keys, &values, max_value_bytes);
  std::vector<absl::StatusOr<std::optional<std::string>>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!found[i].ok()) {
      out.push_back(found[i].status());
    } else if (*found[i]) {
      out.push_back(std::optional<std::string>(std::move(values[i])));
    } else {
      out.push_back(std::optional<std::string>());
    }
  }
  return out;
}

std::vector<absl::StatusOr<bool>> ClusterClient::MultiGetInto(const std::vector<std::string>& keys,
                                                              std::vector<std::string>* values,
                                                              uint64_t max_value_bytes) {
  values->resize(keys.size());
  std::vector<Request> requests(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    requests[i].argv = {"GET", keys[i]};
    requests[i].reply_storage = &(*values)[i];
    requests[i].max_reply_bytes = max_value_bytes;
  }
  std::vector<absl::StatusOr<Reply>> replies = Execute(requests);
  std::vector<absl::StatusOr<bool>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!replies[i].ok()) {
      out.push_back(replies[i].status());
    } else if (replies[i]->type == Reply::Type::kNil) {
      (*values)[i].clear();
      out.push_back(false);
    } else if (replies[i]->type == Reply::Type::kString) {
      (*values)[i] = std::move(replies[i]->str);
      out.push_back(true);
    } else {
      out.push_back(
          absl::InternalError(absl::StrCat("GET ", Printable(keys[i]), ": answered ",
                                           TypeName(replies[i]->type), ", not a string")));
    }
  }
  return out;
}

std::vector<absl::Status> ClusterClient::MultiSet(
    const std::vector<std::pair<std::string, std::string>>& items) {
  std::vector<Request> requests(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    requests[i].argv = {"SET", items[i].first, items[i].second};
  }
  std::vector<absl::StatusOr<Reply>> replies = Execute(requests);
  std::vector<absl::Status> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (!replies[i].ok()) {
      out.push_back(replies[i].status());
    } else if (replies[i]->type != Reply::Type::kStatus || replies[i]->str != "OK") {
      // Only +OK means the value was stored.
      out.push_back(absl::InternalError(
          absl::StrCat("SET ", Printable(items[i].first), ": answered ", TypeName(replies[i]->type),
                       replies[i]->type == Reply::Type::kStatus
                           ? absl::StrCat(" \"", Printable(replies[i]->str), "\"")
                           : std::string(),
                       ", not +OK")));
    } else {
      out.push_back(absl::OkStatus());
    }
  }
  return out;
}

std::vector<absl::StatusOr<bool>> ClusterClient::MultiExists(const std::vector<std::string>& keys) {
  std::vector<Request> requests(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) requests[i].argv = {"EXISTS", keys[i]};
  std::vector<absl::StatusOr<Reply>> replies = Execute(requests);
  std::vector<absl::StatusOr<bool>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!replies[i].ok()) {
      out.push_back(replies[i].status());
    } else if (replies[i]->type != Reply::Type::kInteger) {
      out.push_back(
          absl::InternalError(absl::StrCat("EXISTS ", Printable(keys[i]), ": answered ",
                                           TypeName(replies[i]->type), ", not an integer")));
    } else {
      out.push_back(replies[i]->integer > 0);
    }
  }
  return out;
}

}  // namespace ckv::remote
