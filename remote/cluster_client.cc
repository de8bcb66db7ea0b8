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

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "remote/key_slot.h"
#include "remote/resp_reader.h"

namespace ckv::remote {

// The slot map: for each slot the index of its master in `masters` (-1: no master).
struct ClusterClient::SlotMap {
  std::vector<Endpoint> masters;
  std::vector<Endpoint> replicas;  // known for the refresh only
  std::vector<int32_t> slot_master = std::vector<int32_t>(kClusterSlots, -1);
};

namespace {

// What a round made of one request.
enum class Fate { kDone, kMoved, kAsk, kRetry, kFailed };

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

timeval TimevalOf(absl::Duration d) {
  if (d < absl::Milliseconds(1)) d = absl::Milliseconds(1);  // 0 would mean "no timeout"
  return absl::ToTimeval(d);
}

// hiredis builds replies through these functions: straight into ckv's own Reply, so that a
// value is copied once out of the reader's buffer (as hiredis's own objects would be), not once
// more into a Reply. The root is allocated; an array's elements live in its vector, sized when
// the array is created, and are never freed on their own (hiredis frees only the root).
Reply* NewReplyObject(const redisReadTask* task) {
  if (task->parent != nullptr) {
    Reply* parent = static_cast<Reply*>(task->parent->obj);
    return &parent->elements[static_cast<size_t>(task->idx)];
  }
  return new Reply();
}
void* CreateString(const redisReadTask* task, char* str, size_t len) {
  Reply* r = NewReplyObject(task);
  r->type = task->type == REDIS_REPLY_ERROR    ? Reply::Type::kError
            : task->type == REDIS_REPLY_STATUS ? Reply::Type::kStatus
                                               : Reply::Type::kString;
  r->str.assign(str, len);
  return r;
}
void* CreateArray(const redisReadTask* task, int elements) {
  Reply* r = NewReplyObject(task);
  r->type = Reply::Type::kArray;
  r->elements.resize(elements > 0 ? static_cast<size_t>(elements) : 0);
  return r;
}
void* CreateInteger(const redisReadTask* task, long long value) {
  Reply* r = NewReplyObject(task);
  r->type = Reply::Type::kInteger;
  r->integer = value;
  return r;
}
void* CreateNil(const redisReadTask* task) {
  Reply* r = NewReplyObject(task);
  r->type = Reply::Type::kNil;
  return r;
}
void FreeReply(void* reply) { delete static_cast<Reply*>(reply); }

redisReplyObjectFunctions kReplyFunctions = {CreateString, CreateArray, CreateInteger, CreateNil,
                                             FreeReply};

// A reply that redisGetReply or redisCommand returned on a context made by Acquire.
using OwnedReply = std::unique_ptr<Reply>;
OwnedReply TakeReply(void* raw) { return OwnedReply(static_cast<Reply*>(raw)); }

// Parses the "host:port" of a MOVED or ASK answer ("MOVED 3999 127.0.0.1:6381"). An empty host
// (a node that does not know its address) means the host of the node that answered.
std::optional<Endpoint> RedirectTarget(std::string_view error, const Endpoint& answered_by) {
  const size_t last_space = error.rfind(' ');
  if (last_space == std::string_view::npos) return std::nullopt;
  std::string_view address = error.substr(last_space + 1);
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  Endpoint e;
  e.host = std::string(address.substr(0, colon));
  if (e.host.empty()) e.host = answered_by.host;
  std::string_view port = address.substr(colon + 1);
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), e.port);
  if (ec != std::errc() || ptr != port.data() + port.size() || e.port <= 0) return std::nullopt;
  return e;
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
  const bool timed_out = c->err == REDIS_ERR_IO &&
                         (text.find("temporarily unavailable") != std::string_view::npos ||
                          text.find("timed out") != std::string_view::npos);
  const std::string message = absl::StrFormat("redis %s: %s: %s", node.ToString(), Sv(what),
                                              c->errstr[0] != '\0' ? c->errstr : "I/O error");
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(message, " (timeout ", absl::FormatDuration(timeout), ")"));
  }
  return absl::UnavailableError(message);
}

std::string Describe(const Request& request) {
  std::string key = request.key_index < request.argv.size() ? request.argv[request.key_index] : "";
  return absl::StrCat(request.argv.empty() ? "" : request.argv[0], " ", key);
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
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster client: timeouts must be positive (connect ",
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
  {
    absl::MutexLock lock(&mu_);
    auto it = idle_.find(node.ToString());
    if (it != idle_.end() && !it->second.empty()) {
      redisContext* c = it->second.back();
      it->second.pop_back();
      return c;
    }
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
  connections_opened_.fetch_add(1, std::memory_order_relaxed);
  c->reader->fn = &kReplyFunctions;  // nothing is buffered yet
  // Keep the reader's buffer when it drains: hiredis frees an idle buffer past 16 KiB, which for
  // values of hundreds of KiB means a fresh allocation (and its page faults) per reply.
  c->reader->maxbuf = 0;
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

std::shared_ptr<const ClusterClient::SlotMap> ClusterClient::CurrentMap() {
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
  for (const Endpoint& node : candidates) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("slot map: deadline passed; last error: ", last.message()));
    }
    absl::StatusOr<redisContext*> c = Acquire(node, deadline);
    if (!c.ok()) {
      last = c.status();
      continue;
    }
    const absl::Duration left = deadline - absl::Now();  // what the call may take
    redisSetTimeout(*c, TimevalOf(left));
    void* raw = redisCommand(*c, "CLUSTER SLOTS");
    if (raw == nullptr) {
      last = ContextError(*c, node, "CLUSTER SLOTS", left);
      io_errors_.fetch_add(1, std::memory_order_relaxed);
      Release(node, *c, false);
      continue;
    }
    OwnedReply reply = TakeReply(raw);
    Release(node, *c, true);
    if (reply->type != Reply::Type::kArray) {
      last = absl::UnavailableError(absl::StrFormat(
          "redis %s: CLUSTER SLOTS: %s", node.ToString(),
          reply->type == Reply::Type::kError ? reply->str : "not an array"));
      continue;
    }
    auto map = std::make_shared<SlotMap>();
    size_t covered = 0;
    auto index_of = [&](const Endpoint& e, std::vector<Endpoint>& list) {
      auto it = std::find(list.begin(), list.end(), e);
      if (it != list.end()) return static_cast<int32_t>(it - list.begin());
      list.push_back(e);
      return static_cast<int32_t>(list.size() - 1);
    };
    auto endpoint_of = [&](const Reply& r) -> std::optional<Endpoint> {
      if (r.type != Reply::Type::kArray || r.elements.size() < 2 ||
          r.elements[0].type != Reply::Type::kString ||
          r.elements[1].type != Reply::Type::kInteger) {
        return std::nullopt;
      }
      Endpoint e;
      e.host = r.elements[0].str;
      // A node that does not know its own address reports "": the address we reached it by.
      if (e.host.empty() || e.host == "?") e.host = node.host;
      e.port = static_cast<int>(r.elements[1].integer);
      return e;
    };
    bool malformed = false;
    for (size_t i = 0; i < reply->elements.size() && !malformed; ++i) {
      const Reply& range = reply->elements[i];
      if (range.type != Reply::Type::kArray || range.elements.size() < 3 ||
          range.elements[0].type != Reply::Type::kInteger ||
          range.elements[1].type != Reply::Type::kInteger) {
        malformed = true;
        break;
      }
      const long long first = range.elements[0].integer;
      const long long last_slot = range.elements[1].integer;
      std::optional<Endpoint> master = endpoint_of(range.elements[2]);
      if (!master || first < 0 || last_slot >= kClusterSlots || first > last_slot) {
        malformed = true;
        break;
      }
      const int32_t m = index_of(*master, map->masters);
      for (long long s = first; s <= last_slot; ++s) map->slot_master[s] = m;
      covered += static_cast<size_t>(last_slot - first + 1);
      for (size_t r = 3; r < range.elements.size(); ++r) {
        if (std::optional<Endpoint> replica = endpoint_of(range.elements[r])) {
          index_of(*replica, map->replicas);
        }
      }
    }
    if (malformed) {
      last = absl::UnavailableError(
          absl::StrCat("redis ", node.ToString(), ": CLUSTER SLOTS: malformed reply"));
      continue;
    }
    if (covered == 0) {
      last = absl::UnavailableError(
          absl::StrCat("redis ", node.ToString(), ": CLUSTER SLOTS: no slot is served"));
      continue;
    }
    absl::MutexLock lock(&mu_);
    map_ = std::move(map);
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
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  absl::StatusOr<redisContext*> c = Acquire(node, deadline);
  if (!c.ok()) return c.status();
  redisSetTimeout(*c, TimevalOf(deadline - absl::Now()));
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  void* raw = redisCommandArgv(*c, static_cast<int>(args.size()), args.data(), lens.data());
  const std::string what = argv.empty() ? std::string() : argv[0];
  if (raw == nullptr) {
    absl::Status s = ContextError(*c, node, what, options_.call_timeout);
    io_errors_.fetch_add(1, std::memory_order_relaxed);
    if (absl::IsDeadlineExceeded(s)) timeouts_.fetch_add(1, std::memory_order_relaxed);
    Release(node, *c, false);
    return s;
  }
  OwnedReply reply = TakeReply(raw);
  Release(node, *c, true);
  if (reply->type == Reply::Type::kError) {
    return absl::InternalError(
        absl::StrFormat("redis %s: %s: %s", node.ToString(), what, reply->str));
  }
  return std::move(*reply);
}

void ClusterClient::FailGroup(Group& g, const absl::Status& s) {
  g.io_error = true;
  g.timed_out = absl::IsDeadlineExceeded(s);
  io_errors_.fetch_add(1, std::memory_order_relaxed);
  if (g.timed_out) timeouts_.fetch_add(1, std::memory_order_relaxed);
  for (size_t i = 0; i < g.indices.size(); ++i) {
    if (g.answered[i]) continue;
    // A broken connection is retried (after a map refresh) unless it timed out: then the
    // deadline is spent anyway.
    g.fates[i] = g.timed_out ? Fate::kFailed : Fate::kRetry;
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
      absl::StrFormat("redis %s: %s: %s", g.node.ToString(), Describe(r), Sv(error));
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

// The groups of one round, on one thread: every group's pipeline is written into its
// connection's output buffer, then one poll loop over all the connections writes what is left and
// reads whatever replies arrive, from whichever node answers first, until every group has all
// its replies or the deadline passes. The nodes work in parallel. Replies are read by ckv's own
// RespReader (remote/resp_reader.h), not hiredis's: a value's payload goes from the socket
// straight into the string the caller gets, with no copy through a reader buffer.
void ClusterClient::RunGroups(std::vector<Group>& groups, absl::Time deadline) {
  struct Live {
    Group* g = nullptr;
    redisContext* c = nullptr;
    // The replies expected, in order: (request index in the group, is the ASKING reply).
    std::vector<std::pair<size_t, bool>> expected;
    size_t next = 0;
    RespReader reader;
    bool writing = false;
    bool done = false;
  };
  std::vector<Live> live;
  live.reserve(groups.size());
  std::vector<const char*> argv;
  std::vector<size_t> argvlen;
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
    // A blocking write of a large pipeline (SETs) waits at most for what is left.
    redisSetTimeout(l.c, TimevalOf(deadline - absl::Now()));
    for (size_t i = 0; i < n; ++i) {
      const Request& r = (*g.requests)[g.indices[i]];
      if (g.asking[i]) {
        redisAppendCommand(l.c, "ASKING");
        l.expected.emplace_back(i, true);
      }
      argv.clear();
      argvlen.clear();
      for (const std::string& a : r.argv) {
        argv.push_back(a.data());
        argvlen.push_back(a.size());
      }
      redisAppendCommandArgv(l.c, static_cast<int>(argv.size()), argv.data(), argvlen.data());
      l.expected.emplace_back(i, false);
    }
    l.writing = true;
    live.push_back(std::move(l));
  }
  auto finish = [&](Live& l, const absl::Status* error) {
    l.done = true;
    if (error != nullptr) FailGroup(*l.g, *error);
    // A connection with bytes left over (none are expected past the last reply) is not reused.
    Release(l.g->node, l.c, error == nullptr && l.reader.idle());
  };
  std::vector<pollfd> fds;
  std::vector<Live*> polled;
  while (true) {
    fds.clear();
    polled.clear();
    for (Live& l : live) {
      if (l.done) continue;
      fds.push_back(pollfd{l.c->fd, static_cast<short>(POLLIN | (l.writing ? POLLOUT : 0)), 0});
      polled.push_back(&l);
    }
    if (fds.empty()) break;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      for (Live* l : polled) {
        const absl::Status s = absl::DeadlineExceededError(absl::StrCat(
            "redis ", l->g->node.ToString(), ": no reply within the deadline (",
            absl::FormatDuration(options_.call_timeout), ")"));
        finish(*l, &s);
      }
      break;
    }
    const int ready = poll(fds.data(), fds.size(),
                           static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(left))));
    if (ready < 0 && errno != EINTR) {
      const absl::Status s = absl::UnavailableError(absl::StrCat("poll: errno ", errno));
      for (Live* l : polled) finish(*l, &s);
      break;
    }
    for (size_t k = 0; k < fds.size() && ready > 0; ++k) {
      Live& l = *polled[k];
      const short ev = fds[k].revents;
      if (ev == 0) continue;
      if (l.writing && (ev & POLLOUT) != 0) {
        int written_all = 0;
        if (redisBufferWrite(l.c, &written_all) != REDIS_OK) {
          const absl::Status s = ContextError(l.c, l.g->node, "write", options_.call_timeout);
          finish(l, &s);
          continue;
        }
        l.writing = written_all == 0;
      }
      if ((ev & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t got = l.reader.ReadFrom(l.c->fd);
      if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (got <= 0) {
        const absl::Status s = absl::UnavailableError(absl::StrCat(
            "redis ", l.g->node.ToString(), ": ",
            got == 0 ? std::string("connection closed by the server")
                     : absl::StrCat("read: errno ", errno)));
        finish(l, &s);
        continue;
      }
      bool broken = false;
      while (l.next < l.expected.size()) {
        const auto [next_i, next_is_asking] = l.expected[l.next];
        l.reader.UseStorageForNextReply(
            next_is_asking ? nullptr : (*l.g->requests)[l.g->indices[next_i]].reply_storage);
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
  std::vector<absl::StatusOr<Reply>> out(requests.size(),
                                         absl::UnknownError("request not run"));
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
      out[i] = absl::InvalidArgumentError(absl::StrCat(
          "request ", i, ": key index ", requests[i].key_index, " past its ",
          requests[i].argv.size(), " arguments"));
      continue;
    }
    pending.push_back(Pending{i, std::nullopt, false});
  }
  bool backoff = false;
  for (int round = 0; !pending.empty(); ++round) {
    if (round > options_.max_redirects) {
      for (const Pending& p : pending) {
        out[p.index] = absl::UnavailableError(absl::StrCat(
            "too many redirections or retries (", options_.max_redirects, "); last: ",
            out[p.index].status().message()));
      }
      break;
    }
    if (backoff) {
      // A cluster in failover or a node restarting: wait a little before asking again, never
      // past the deadline.
      const absl::Duration pause = std::min(absl::Milliseconds(20 * round),
                                            deadline - absl::Now());
      if (pause > absl::ZeroDuration()) absl::SleepFor(pause);
    }
    if (absl::Now() >= deadline) {
      for (const Pending& p : pending) {
        std::string message = absl::StrCat(Describe(requests[p.index]), ": deadline of ",
                                           absl::FormatDuration(options_.call_timeout),
                                           " passed");
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
          out[p.index] = absl::UnavailableError(absl::StrCat(
              Describe(r), ": slot ", KeySlot(r.argv[r.key_index]), " has no master"));
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
    const std::vector<std::string>& keys) {
  // Fresh strings, each value allocated as it arrives (no memory handed back).
  std::vector<std::string> values;
  std::vector<absl::StatusOr<bool>> found = MultiGetInto(keys, &values);
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

std::vector<absl::StatusOr<bool>> ClusterClient::MultiGetInto(
    const std::vector<std::string>& keys, std::vector<std::string>* values) {
  values->resize(keys.size());
  std::vector<Request> requests(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    requests[i].argv = {"GET", keys[i]};
    requests[i].reply_storage = &(*values)[i];
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
      out.push_back(absl::InternalError(absl::StrCat("GET ", keys[i], ": not a string reply")));
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
  for (size_t i = 0; i < items.size(); ++i) out.push_back(replies[i].status());
  return out;
}

std::vector<absl::StatusOr<bool>> ClusterClient::MultiExists(
    const std::vector<std::string>& keys) {
  std::vector<Request> requests(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) requests[i].argv = {"EXISTS", keys[i]};
  std::vector<absl::StatusOr<Reply>> replies = Execute(requests);
  std::vector<absl::StatusOr<bool>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!replies[i].ok()) {
      out.push_back(replies[i].status());
    } else {
      out.push_back(replies[i]->type == Reply::Type::kInteger && replies[i]->integer > 0);
    }
  }
  return out;
}

}  // namespace ckv::remote
