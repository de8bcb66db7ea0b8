// ckv_crash_child: the process that crash tests kill with SIGKILL.
//
//   ckv_crash_child STORE SEED
//
// Opens STORE and loops forever over synthetic Puts (and now and then a Delete) of a small model,
// writing one line to stdout after each call returns OK, before the next begins:
//   put <seed> <chunks> <shared_chunks>
//   deleting <seed> <chunks> <shared_chunks>   (before a Delete begins)
//   del <seed> <chunks> <shared_chunks>
// The parent treats a printed line as acknowledged: after the kill, every acknowledged Put not
// later deleted must be present and bit-exact.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ckv/engine.h"
#include "tests/crash_spec.h"
#include "tools/synthetic_kv.h"

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
  if (argc != 3) {
    std::fprintf(stderr, "usage: ckv_crash_child STORE SEED\n");
    return 2;
  }
  const std::string store = argv[1];
  const uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  auto engine = ckv::Engine::Open(ckv::EngineOptions{}, store);
  if (!engine.ok()) {
    std::fprintf(stderr, "open %s: %s\n", store.c_str(), std::string(engine.status().message()).c_str());
    return 1;
  }
  const ckv::ModelSpec spec = ckv::crash::Spec();
  std::vector<ckv::crash::Prefix> acked;
  uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;
  auto next = [&rng]() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  for (uint64_t i = 0;; ++i) {
    if (!acked.empty() && next() % 5 == 0) {
      const size_t victim = next() % acked.size();
      const ckv::crash::Prefix p = acked[victim];
      // Announced first: a kill between the Delete's commit and its acknowledgement leaves the
      // parent unsure whether it happened.
      Say(ckv::crash::Format("deleting", p));
      absl::Status s = (*engine)->Delete(spec, ckv::crash::TokensOf(spec, p));
      if (!s.ok()) {
        std::fprintf(stderr, "delete: %s\n", std::string(s.message()).c_str());
        return 1;
      }
      acked.erase(acked.begin() + victim);
      Say(ckv::crash::Format("del", p));
      continue;
    }
    ckv::crash::Prefix p;
    p.seed = seed * 100000 + i;
    p.chunks = 2 + next() % 6;
    p.shared_chunks = (next() % 2 == 0) ? std::min<uint64_t>(p.chunks - 1, 1 + next() % 3) : 0;
    const auto tokens = ckv::crash::TokensOf(spec, p);
    ckv::synth::SyntheticKv kv(spec, tokens);
    auto put = (*engine)->Put(spec, tokens, kv.tensors());
    if (!put.ok()) {
      std::fprintf(stderr, "put: %s\n", std::string(put.status().message()).c_str());
      return 1;
    }
    acked.push_back(p);
    Say(ckv::crash::Format("put", p));
  }
}
