// SPDX-License-Identifier: Apache-2.0
// ckv_crash_child: the process that crash tests kill with SIGKILL.
//
//   ckv_crash_child STORE SEED [MODE CAP_BYTES KNOWN_FILE]
//
// Opens STORE (with the cap CAP_BYTES when it is not 0) and runs a crash::Workload
// (tests/reliability/crash_workload.h) forever: MODE "puts" (the default) Puts and now and then
// Deletes, "mixed" also runs Re-Prefill sessions and Gc. KNOWN_FILE lists the prefixes stored by
// earlier children, one crash::Format line each ("known <seed> <chunks> <shared> <leading chunks
// stored>"), so that this child deletes and reads them too. Each acknowledged operation is one
// line on stdout, written before the next operation begins; the parent treats a printed line as
// acknowledged.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "ckv/engine.h"
#include "tests/reliability/crash_spec.h"
#include "tests/reliability/crash_workload.h"

namespace {

void Say(const std::string& line) {
  const std::string out = line + "\n";
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::write(1, out.data() + done, out.size() - done);
    if (n <= 0) std::_Exit(3);
    done += static_cast<size_t>(n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 6) {
    std::fprintf(stderr, "usage: ckv_crash_child STORE SEED [MODE CAP_BYTES KNOWN_FILE]\n");
    return 2;
  }
  const std::string store = argv[1];
  const uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  ckv::crash::Mode mode = ckv::crash::Mode::kPuts;
  uint64_t cap = 0;
  std::vector<ckv::crash::Known> known;
  if (argc == 6) {
    const std::string m = argv[3];
    if (m == "mixed") {
      mode = ckv::crash::Mode::kMixed;
    } else if (m != "puts") {
      std::fprintf(stderr, "unknown mode %s (puts or mixed)\n", m.c_str());
      return 2;
    }
    cap = std::strtoull(argv[4], nullptr, 10);
    std::ifstream in(argv[5]);
    std::string line, verb;
    ckv::crash::Known k;
    while (std::getline(in, line)) {
      if (!ckv::crash::Parse(line, &verb, &k.prefix, &k.matched) || verb != "known") {
        std::fprintf(stderr, "%s: bad line '%s'\n", argv[5], line.c_str());
        return 2;
      }
      known.push_back(k);
    }
  }
  ckv::EngineOptions options;
  if (cap > 0) {
    options.max_disk_bytes = cap;
    // A third of the cap free: most Puts find room, and the background reclaimer
    // does most evictions, on its own thread, at any moment of the workload.
    options.reclaim_margin_bytes = cap / 3;
  }
  auto engine = ckv::Engine::Open(options, store);
  if (!engine.ok()) {
    std::fprintf(stderr, "open %s: %s\n", store.c_str(),
                 std::string(engine.status().message()).c_str());
    return 1;
  }
  ckv::crash::Workload workload(**engine, mode, seed, cap > 0, std::move(known), Say);
  while (true) {
    absl::Status s = workload.Step();
    if (!s.ok()) {
      std::fprintf(stderr, "ckv_crash_child: %s\n", s.ToString().c_str());
      return 1;
    }
  }
}
