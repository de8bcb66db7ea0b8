// SPDX-License-Identifier: Apache-2.0
// ckv_hostile_node: tests/remote/hostile_node.h as a program, for the tests that run kvctl or
// Python against a lying cluster node.
//
//   ckv_hostile_node BEHAVIOR [--honest-slot-map] [--seconds N]
//
// Prints "port N" on stdout once it listens on 127.0.0.1, then serves for N seconds (default
// 60, at most 600) or until its standard input closes, and exits 0. BEHAVIOR is one of
// tests/remote/hostile_node.h's names (huge-array, huge-bulk, drip, endless, wrong-types,
// moved-loop, ask-loop, bad-slot-map, out-of-order, honest).
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/time/clock.h"
#include "tests/remote/hostile_node.h"

int main(int argc, char** argv) {
  using ckv::testing::HostileNode;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s BEHAVIOR [--honest-slot-map] [--seconds N]\n", argv[0]);
    return 2;
  }
  std::optional<HostileNode::Behavior> behavior = HostileNode::Parse(argv[1]);
  if (!behavior) {
    std::fprintf(stderr, "ckv_hostile_node: unknown behaviour \"%s\"\n", argv[1]);
    return 2;
  }
  HostileNode::Options o;
  o.behavior = *behavior;
  int seconds = 60;
  for (int i = 2; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--honest-slot-map") {
      o.honest_slot_map = true;
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "ckv_hostile_node: unknown argument \"%s\"\n", argv[i]);
      return 2;
    }
  }
  if (seconds < 1 || seconds > 600) seconds = 60;
  o.serve_limit = absl::Seconds(seconds);
  HostileNode node(o);
  if (!node.Start()) {
    std::perror("ckv_hostile_node: listen");
    return 1;
  }
  std::printf("port %d\n", node.port());
  std::fflush(stdout);
  const absl::Time until = absl::Now() + absl::Seconds(seconds);
  while (absl::Now() < until) {
    pollfd p{0, POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) {
      char c;
      if (::read(0, &c, 1) <= 0) break;  // stdin closed: the test is done
    }
  }
  node.Stop();
  return 0;
}
