// SPDX-License-Identifier: Apache-2.0
// tests/remote/redis_cluster.h: a real Redis Cluster on loopback, started by a test and torn down
// by it.
//
// RedisCluster::Start runs `masters` redis-server processes (and `replicas_per_master` replicas
// of each) on free loopback ports, each with cluster-enabled yes, no persistence (--save '',
// --appendonly no), no delay before a replica's first sync, and its files in a temporary
// directory, joins them with `redis-cli --cluster create ... --cluster-yes`, and waits until
// every node says cluster_state:ok and every replica has finished its first sync. The
// destructor sends SIGCONT then SIGKILL to every server it started (whatever state a test left
// them in), reaps them and removes the directory. Start fails with NotFound, naming the binary,
// where redis-server or redis-cli is absent: tests skip then (CKV_SKIP_OR_FAIL_WITHOUT_CLUSTER),
// and fail on any other error.
//
// Thread-safety: none; one test thread drives a cluster.
#ifndef CKV_TESTS_REDIS_CLUSTER_H_
#define CKV_TESTS_REDIS_CLUSTER_H_

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "remote/cluster_client.h"
#include "tests/test_util.h"

namespace ckv::testing {

// The full path of `name` on PATH, or "".
inline std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  std::string all(path);
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(':', start);
    if (end == std::string::npos) end = all.size();
    std::string candidate = all.substr(start, end - start) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// Polls `done` every 20 ms until it is true or `timeout` passed; its last answer.
inline bool WaitUntil(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (true) {
    if (done()) return true;
    if (absl::Now() >= end) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

class RedisCluster {
 public:
  struct Options {
    int masters = 3;
    int replicas_per_master = 0;
    // cluster-node-timeout: how long a silent master takes to be failed over.
    int node_timeout_ms = 3000;
  };

  // Starts a cluster; a failed start (a port taken between choosing it and binding it, by a
  // test starting beside this one) is retried twice on other ports. NotFound at once where a
  // binary is missing.
  static absl::StatusOr<std::unique_ptr<RedisCluster>> Start(const Options& options) {
    absl::StatusOr<std::unique_ptr<RedisCluster>> started;
    for (int attempt = 0; attempt < 3; ++attempt) {
      started = StartOnce(options);
      if (started.ok() || absl::IsNotFound(started.status())) break;
    }
    return started;
  }

  static absl::StatusOr<std::unique_ptr<RedisCluster>> StartOnce(const Options& options) {
    const std::string server = FindOnPath("redis-server");
    const std::string cli = FindOnPath("redis-cli");
    if (server.empty()) return absl::NotFoundError("redis-server is not on PATH");
    if (cli.empty()) return absl::NotFoundError("redis-cli is not on PATH");
    std::unique_ptr<RedisCluster> c(new RedisCluster());
    c->cli_ = cli;
    std::string templ = (std::filesystem::temp_directory_path() / "ckv-redis-XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) return absl::InternalError("mkdtemp failed");
    c->dir_ = templ;
    const int nodes = options.masters * (1 + options.replicas_per_master);
    for (int i = 0; i < nodes; ++i) {
      const int port = FreePortPair();
      if (port == 0) return absl::UnavailableError("no free port pair on loopback");
      c->ports_.push_back(port);
      const std::string p = std::to_string(port);
      const std::string node_timeout = std::to_string(options.node_timeout_ms);
      const std::string conf = c->dir_ + "/nodes-" + p + ".conf";
      const std::string log = c->dir_ + "/redis-" + p + ".log";
      const pid_t pid = fork();
      if (pid < 0) return absl::InternalError("fork failed");
      if (pid == 0) {
        execl(server.c_str(), server.c_str(), "--port", p.c_str(), "--bind", "127.0.0.1",
              "--cluster-enabled", "yes", "--cluster-config-file", conf.c_str(),
              "--cluster-node-timeout", node_timeout.c_str(), "--dir", c->dir_.c_str(), "--save",
              "", "--appendonly", "no", "--repl-diskless-sync-delay", "0", "--logfile", log.c_str(),
              "--daemonize", "no", "--protected-mode", "no", static_cast<char*>(nullptr));
        _exit(127);
      }
      c->pids_.push_back(pid);
    }
    for (int i = 0; i < nodes; ++i) {
      if (!WaitUntil([&] { return c->Cli(i, "PING").find("PONG") != std::string::npos; },
                     absl::Seconds(10))) {
        return absl::UnavailableError(
            absl::StrCat("redis-server on port ", c->ports_[i], " did not answer PING"));
      }
    }
    std::vector<std::string> addresses;
    for (int port : c->ports_) addresses.push_back(absl::StrCat("127.0.0.1:", port));
    const std::string create =
        RunProgram(cli, absl::StrCat("--cluster create ", absl::StrJoin(addresses, " "),
                                     " --cluster-replicas ", options.replicas_per_master,
                                     " --cluster-yes"))
            .output;
    if (create.find("All 16384 slots covered") == std::string::npos) {
      return absl::UnavailableError(absl::StrCat("redis-cli --cluster create failed: ", create));
    }
    for (int i = 0; i < nodes; ++i) {
      if (!WaitUntil([&] { return c->ClusterOk(i); }, absl::Seconds(20))) {
        return absl::UnavailableError(
            absl::StrCat("node ", c->ports_[i], " never reached cluster_state:ok"));
      }
    }
    // Every replica has finished its first sync: a master killed from now on has a replica that
    // holds what it acknowledged (WAIT), so a failover loses nothing.
    for (int i = 0; i < nodes; ++i) {
      if (c->IsMaster(i)) continue;
      if (!WaitUntil(
              [&] {
                return c->Cli(i, "INFO replication").find("master_link_status:up") !=
                       std::string::npos;
              },
              absl::Seconds(20))) {
        return absl::UnavailableError(
            absl::StrCat("replica on port ", c->ports_[i], " never finished its first sync"));
      }
    }
    return c;
  }

  ~RedisCluster() {
    for (pid_t pid : pids_) {
      if (pid <= 0) continue;
      kill(pid, SIGCONT);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  int size() const { return static_cast<int>(ports_.size()); }
  int port(int node) const { return ports_[node]; }
  remote::Endpoint endpoint(int node) const { return {"127.0.0.1", ports_[node]}; }
  // Every node, as seeds.
  std::vector<remote::Endpoint> endpoints() const {
    std::vector<remote::Endpoint> out;
    for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
    return out;
  }

  // redis-cli -p <node's port> <args> (args are passed through /bin/sh).
  std::string Cli(int node, const std::string& args) const {
    return RunProgram(cli_, absl::StrCat("-p ", ports_[node], " ", args)).output;
  }
  bool ClusterOk(int node) const {
    return Cli(node, "CLUSTER INFO").find("cluster_state:ok") != std::string::npos;
  }
  // The node whose port is `port`, or -1.
  int NodeOfPort(int port) const {
    for (int i = 0; i < size(); ++i) {
      if (ports_[i] == port) return i;
    }
    return -1;
  }
  std::string NodeId(int node) const {
    std::string id = Cli(node, "CLUSTER MYID");
    while (!id.empty() && (id.back() == '\n' || id.back() == '\r')) id.pop_back();
    return id;
  }
  bool IsMaster(int node) const { return Cli(node, "ROLE").rfind("master", 0) == 0; }

  void Signal(int node, int sig) { kill(pids_[node], sig); }
  // SIGKILLs the node and reaps it.
  void Kill(int node) {
    kill(pids_[node], SIGKILL);
    waitpid(pids_[node], nullptr, 0);
    pids_[node] = -1;
  }

  const std::string& dir() const { return dir_; }

 private:
  RedisCluster() = default;

  // A port p on 127.0.0.1 such that p and its cluster bus port p + 10000 are both free (bound
  // and released here; a race with another process is possible but unlikely).
  static int FreePortPair() {
    for (int attempt = 0; attempt < 50; ++attempt) {
      const int p = BindAndRelease(0);
      if (p == 0 || p + 10000 > 65535) continue;
      if (BindAndRelease(p + 10000) != 0) return p;
    }
    return 0;
  }
  static int BindAndRelease(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    int result = 0;
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      socklen_t len = sizeof(addr);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
        result = ntohs(addr.sin_port);
      }
    }
    close(fd);
    return result;
  }

  std::string cli_;
  std::string dir_;
  std::vector<int> ports_;
  std::vector<pid_t> pids_;
};

}  // namespace ckv::testing

// In a test: skips, saying why, when `status` (of RedisCluster::Start) is NotFound (redis-server
// or redis-cli is not installed); fails the test for any other error, which a test must not
// hide as a skip.
#define CKV_SKIP_OR_FAIL_WITHOUT_CLUSTER(status)                                       \
  do {                                                                                 \
    const ::absl::Status ckv_cluster_status_ = (status);                               \
    if (::absl::IsNotFound(ckv_cluster_status_)) {                                     \
      GTEST_SKIP() << "no Redis Cluster: " << ckv_cluster_status_;                     \
    }                                                                                  \
    ASSERT_TRUE(ckv_cluster_status_.ok()) << "Redis Cluster: " << ckv_cluster_status_; \
  } while (false)

namespace ckv::testing {

// A fixture whose suite shares one cluster: the derived fixture's SetUpTestSuite calls
// StartSuiteCluster, the cluster is torn down after the suite's last test, and a test whose
// cluster is not up skips (redis not installed) or fails (any other error) in SetUp. Suites run
// one after another, so the one static cluster is never shared by two.
class SuiteClusterTest : public ::testing::Test {
 protected:
  static void StartSuiteCluster(const RedisCluster::Options& options) {
    auto started = RedisCluster::Start(options);
    if (started.ok()) {
      cluster_ = started->release();
    } else {
      start_status_ = new absl::Status(started.status());
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete start_status_;
    start_status_ = nullptr;
  }
  void SetUp() override {
    if (cluster_ == nullptr) {
      CKV_SKIP_OR_FAIL_WITHOUT_CLUSTER(
          start_status_ != nullptr ? *start_status_ : absl::InternalError("the cluster is gone"));
    }
  }

  inline static RedisCluster* cluster_ = nullptr;
  inline static absl::Status* start_status_ = nullptr;  // why there is no cluster_
};

}  // namespace ckv::testing

#endif  // CKV_TESTS_REDIS_CLUSTER_H_
