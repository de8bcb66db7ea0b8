// SPDX-License-Identifier: Apache-2.0
// tests/remote/hostile_node.h: a Redis Cluster node that lies, for tests of everything that talks
// to one (the cluster client, the remote tier, kvctl, Python).
//
// A loopback server that speaks enough RESP to be taken for a one-node cluster, and that can be
// told to misbehave (Behavior below): announce huge counts and lengths, drip its replies one
// byte at a time, stream without end, answer with the wrong types, redirect without end, send
// an invalid slot map, or answer a pipeline out of order. `kHonest` is a small working node (an
// in-memory map for GET, GETRANGE, SET, EXISTS), which the out-of-order behaviour also is, except
// for the order of its replies.
//
// Every behaviour stops by itself: each connection is served for at most `Options::serve_limit`
// and sends at most `Options::max_send_bytes`, and the node serves at most kMaxConnections at
// once. It listens on 127.0.0.1 only, on a free port the kernel picks.
//
// Thread-safety: Start and Stop from one thread; the node serves from its own threads.
#ifndef CKV_TESTS_HOSTILE_NODE_H_
#define CKV_TESTS_HOSTILE_NODE_H_

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ckv::testing {

class HostileNode {
 public:
  enum class Behavior {
    kHonest,       // a working one-node cluster
    kHugeArray,    // "*2147483647\r\n", then silence
    kHugeBulk,     // "$524288000\r\n" and a few bytes, then silence
    kDrip,         // a status line that never ends, one byte every 100 ms
    kEndless,      // a status line that never ends, as fast as the socket takes it
    kWrongTypes,   // GET/GETRANGE answered by an array, SET by an array, EXISTS by a string
    kMovedLoop,    // every data command answered MOVED to itself
    kAskLoop,      // every data command answered ASK to itself
    kMovedToName,  // every data command answered MOVED to a host name (resolving it could block)
    kBadSlotMap,   // CLUSTER SLOTS names port 99999 and a host with an escape sequence
    kOutOfOrder,   // a working node whose pipelined replies come back in reverse order
  };
  static constexpr Behavior kAllBehaviors[] = {
      Behavior::kHugeArray,  Behavior::kHugeBulk,  Behavior::kDrip,    Behavior::kEndless,
      Behavior::kWrongTypes, Behavior::kMovedLoop, Behavior::kAskLoop, Behavior::kMovedToName,
      Behavior::kBadSlotMap, Behavior::kOutOfOrder};
  static constexpr int kMaxConnections = 64;

  struct Options {
    Behavior behavior = Behavior::kHonest;
    // The hostile behaviours that concern replies (huge, drip, endless) start only after an
    // honest CLUSTER SLOTS: the data commands meet them. False: CLUSTER SLOTS meets them too.
    bool honest_slot_map = false;
    absl::Duration serve_limit = absl::Seconds(30);
    uint64_t max_send_bytes = uint64_t{1} << 30;
  };

  static const char* Name(Behavior b) {
    switch (b) {
      case Behavior::kHonest:
        return "honest";
      case Behavior::kHugeArray:
        return "huge-array";
      case Behavior::kHugeBulk:
        return "huge-bulk";
      case Behavior::kDrip:
        return "drip";
      case Behavior::kEndless:
        return "endless";
      case Behavior::kWrongTypes:
        return "wrong-types";
      case Behavior::kMovedLoop:
        return "moved-loop";
      case Behavior::kAskLoop:
        return "ask-loop";
      case Behavior::kMovedToName:
        return "moved-to-name";
      case Behavior::kBadSlotMap:
        return "bad-slot-map";
      case Behavior::kOutOfOrder:
        return "out-of-order";
    }
    return "?";
  }
  static std::optional<Behavior> Parse(std::string_view name) {
    for (Behavior b : kAllBehaviors) {
      if (name == Name(b)) return b;
    }
    if (name == Name(Behavior::kHonest)) return Behavior::kHonest;
    return std::nullopt;
  }

  explicit HostileNode(Options options) : options_(options) {}
  ~HostileNode() { Stop(); }
  HostileNode(const HostileNode&) = delete;
  HostileNode& operator=(const HostileNode&) = delete;

  // Listens on 127.0.0.1 (`port` 0: a free one) and serves on a thread. False on failure.
  bool Start(int port = 0) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return false;
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_fd_, 64) != 0) {
      return false;
    }
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
    return true;
  }

  void Stop() {
    if (!acceptor_.joinable()) return;
    stop_ = true;
    acceptor_.join();
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
    ::close(listen_fd_);
  }

  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // Commands received, all connections together.
  uint64_t commands() const { return commands_.load(); }

 private:
  using Command = std::vector<std::string>;

  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (live_ >= kMaxConnections) {
        ::close(fd);
        continue;
      }
      ++live_;
      threads_.emplace_back([this, fd] {
        Serve(fd);
        ::close(fd);
        std::lock_guard<std::mutex> lock(mu_);
        --live_;
      });
    }
  }

  // Sends all of `data` unless the peer goes, the node stops or a limit is reached.
  bool Send(int fd, std::string_view data, absl::Time until, uint64_t* sent) {
    while (!data.empty()) {
      if (stop_ || absl::Now() > until || *sent >= options_.max_send_bytes) return false;
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        return false;
      }
      data.remove_prefix(static_cast<size_t>(n));
      *sent += static_cast<uint64_t>(n);
    }
    return true;
  }

  // Parses one command (an array of bulk strings) at the front of `in`; nullopt when it has not
  // all arrived. Sets `bad` for anything else.
  static std::optional<Command> ParseCommand(std::string& in, bool* bad) {
    size_t pos = 0;
    auto line = [&](long long* value) -> int {  // 1 parsed, 0 incomplete, -1 bad
      const size_t crlf = in.find("\r\n", pos);
      if (crlf == std::string::npos) return in.size() - pos > 64 ? -1 : 0;
      auto [p, ec] = std::from_chars(in.data() + pos + 1, in.data() + crlf, *value);
      if (ec != std::errc() || p != in.data() + crlf) return -1;
      pos = crlf + 2;
      return 1;
    };
    if (in.empty()) return std::nullopt;
    long long count = 0;
    if (in[0] != '*') {
      *bad = true;
      return std::nullopt;
    }
    int r = line(&count);
    if (r <= 0 || count < 1 || count > 64) {
      *bad = r != 0;
      return std::nullopt;
    }
    Command cmd;
    for (long long i = 0; i < count; ++i) {
      if (pos >= in.size()) return std::nullopt;
      if (in[pos] != '$') {
        *bad = true;
        return std::nullopt;
      }
      long long len = 0;
      r = line(&len);
      if (r <= 0 || len < 0 || len > (64 << 20)) {
        *bad = r != 0;
        return std::nullopt;
      }
      if (in.size() - pos < static_cast<size_t>(len) + 2) return std::nullopt;
      cmd.emplace_back(in, pos, static_cast<size_t>(len));
      pos += static_cast<size_t>(len) + 2;
    }
    in.erase(0, pos);
    return cmd;
  }

  static std::string Bulk(std::string_view s) {
    std::string out = absl::StrCat("$", s.size(), "\r\n");
    out.append(s);
    out += "\r\n";
    return out;
  }

  std::string SlotMap(bool bad) const {
    if (bad) {
      // One range on port 99999 (not a port), one on a host that would retitle a terminal.
      return absl::StrCat("*2\r\n*3\r\n:0\r\n:8191\r\n*2\r\n", Bulk("127.0.0.1"), ":99999\r\n",
                          "*3\r\n:8192\r\n:16383\r\n*2\r\n", Bulk("\x1b]0;pwned\x07"), ":", port_,
                          "\r\n");
    }
    return absl::StrCat("*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n", Bulk("127.0.0.1"), ":", port_,
                        "\r\n");
  }

  // The honest answer to `cmd`.
  std::string Answer(const Command& cmd) {
    std::string name = cmd[0];
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    std::lock_guard<std::mutex> lock(mu_);
    if (name == "CLUSTER" && cmd.size() >= 2) return SlotMap(false);
    if (name == "ASKING") return "+OK\r\n";
    if (name == "SET" && cmd.size() == 3) {
      data_[cmd[1]] = cmd[2];
      return "+OK\r\n";
    }
    if (name == "GET" && cmd.size() == 2) {
      auto it = data_.find(cmd[1]);
      return it == data_.end() ? std::string("$-1\r\n") : Bulk(it->second);
    }
    if (name == "EXISTS" && cmd.size() == 2) return data_.contains(cmd[1]) ? ":1\r\n" : ":0\r\n";
    if (name == "GETRANGE" && cmd.size() == 4) {
      auto it = data_.find(cmd[1]);
      if (it == data_.end()) return Bulk("");
      const long long from = std::stoll(cmd[2]), to = std::stoll(cmd[3]);
      const long long size = static_cast<long long>(it->second.size());
      if (from >= size || to < from) return Bulk("");
      return Bulk(std::string_view(it->second)
                      .substr(static_cast<size_t>(from),
                              static_cast<size_t>(std::min(to, size - 1) - from + 1)));
    }
    if (name == "DBSIZE") return absl::StrCat(":", data_.size(), "\r\n");
    if (name == "INFO") return Bulk("# Memory\r\nused_memory:1024\r\n");
    return "-ERR unknown command\r\n";
  }

  // The hostile answer to `cmd`, or nullopt for the honest one.
  std::optional<std::string> Lie(const Command& cmd, int port) const {
    const bool slots = cmd[0] == "CLUSTER";
    const bool data = cmd[0] != "CLUSTER" && cmd[0] != "ASKING";
    switch (options_.behavior) {
      case Behavior::kHonest:
      case Behavior::kOutOfOrder:
      case Behavior::kHugeArray:  // replies that follow are decided by the caller
      case Behavior::kHugeBulk:
      case Behavior::kDrip:
      case Behavior::kEndless:
        return std::nullopt;
      case Behavior::kWrongTypes:
        if (!data) return std::nullopt;
        if (cmd[0] == "EXISTS") return Bulk("1");
        if (cmd[0] == "DBSIZE") return std::string("+OK\r\n");
        return std::string("*1\r\n+OK\r\n");
      case Behavior::kMovedLoop:
      case Behavior::kAskLoop:
        if (!data) return std::nullopt;
        return absl::StrCat(options_.behavior == Behavior::kMovedLoop ? "-MOVED " : "-ASK ",
                            "42 127.0.0.1:", port, "\r\n");
      case Behavior::kMovedToName:
        if (!data) return std::nullopt;
        return absl::StrCat("-MOVED 42 node-", port, ".invalid:", port, "\r\n");
      case Behavior::kBadSlotMap:
        if (slots) return SlotMap(true);
        return std::nullopt;
    }
    return std::nullopt;
  }

  void Serve(int fd) {
    const absl::Time until = absl::Now() + options_.serve_limit;
    uint64_t sent = 0;
    std::string in;
    char buf[65536];
    const Behavior b = options_.behavior;
    while (!stop_ && absl::Now() < until) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0) return;
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        return;
      }
      in.append(buf, static_cast<size_t>(n));
      std::vector<std::string> replies;
      bool bad = false;
      while (std::optional<Command> cmd = ParseCommand(in, &bad)) {
        commands_.fetch_add(1);
        const bool slots = (*cmd)[0] == "CLUSTER";
        const bool reply_lies = b == Behavior::kHugeArray || b == Behavior::kHugeBulk ||
                                b == Behavior::kDrip || b == Behavior::kEndless;
        if (reply_lies && !(slots && options_.honest_slot_map)) {
          // Whatever was asked: the lie, and nothing after it.
          switch (b) {
            case Behavior::kHugeArray:
              Send(fd, "*2147483647\r\n", until, &sent);
              break;
            case Behavior::kHugeBulk:
              Send(fd, "$524288000\r\nabc", until, &sent);
              break;
            case Behavior::kDrip:
              // A status line that never ends, a byte at a time: each read of the client gets
              // something, so only a deadline over the whole call ends it.
              for (const char* piece = "+"; Send(fd, piece, until, &sent); piece = "x") {
                absl::SleepFor(absl::Milliseconds(100));
              }
              return;
            case Behavior::kEndless: {
              const std::string block(65536, 'A');
              if (!Send(fd, "+", until, &sent)) return;
              while (Send(fd, block, until, &sent)) {
              }
              return;
            }
            default:
              break;
          }
          // Silence until the client goes.
          while (!stop_ && absl::Now() < until) {
            pollfd q{fd, POLLIN, 0};
            if (::poll(&q, 1, 20) > 0 && ::recv(fd, buf, sizeof buf, MSG_DONTWAIT) == 0) return;
          }
          return;
        }
        std::optional<std::string> lie = Lie(*cmd, port_);
        replies.push_back(lie ? *std::move(lie) : Answer(*cmd));
      }
      if (bad) return;
      if (b == Behavior::kOutOfOrder) std::reverse(replies.begin(), replies.end());
      std::string out;
      for (const std::string& r : replies) out += r;
      if (!out.empty() && !Send(fd, out, until, &sent)) return;
    }
  }

  const Options options_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> commands_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> threads_;         // guarded by mu_
  int live_ = 0;                             // guarded by mu_
  std::map<std::string, std::string> data_;  // guarded by mu_
};

}  // namespace ckv::testing

#endif  // CKV_TESTS_HOSTILE_NODE_H_
