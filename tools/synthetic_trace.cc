// SPDX-License-Identifier: Apache-2.0
// tools/synthetic_trace.cc: see synthetic_trace.h.
#include "tools/synthetic_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/synthetic_kv.h"

namespace ckv::tools {
namespace {

constexpr uint32_t kBlock = 512;  // Mooncake's tokens per hash id

class Random {
 public:
  explicit Random(uint64_t seed) : state_(synth::Mix64(seed ^ 0x7472616365ull)) {}
  uint64_t Next() { return synth::Mix64(state_ += 0x9E3779B97F4A7C15ull); }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint64_t Between(uint64_t lo, uint64_t hi) { return lo + Next() % (hi - lo + 1); }

 private:
  uint64_t state_;
};

struct Conversation {
  std::vector<uint64_t> whole_blocks;  // the last prompt's blocks but its partial last one
  uint32_t turns = 0;
};

}  // namespace

std::string SyntheticMooncakeTrace(const SyntheticTraceOptions& o) {
  Random rng(o.seed);
  const uint32_t prefixes = std::max<uint32_t>(o.shared_prefixes, 1);
  const uint32_t pmin = std::max<uint32_t>(o.prefix_blocks_min, 1);
  const uint32_t pmax = std::max(o.prefix_blocks_max, pmin);
  const uint32_t umax = std::max<uint32_t>(o.user_blocks_max, 1);
  // Shared prefix p: ids [first[p], first[p] + length[p]); the Zipf CDF over p.
  std::vector<uint64_t> first(prefixes), length(prefixes);
  std::vector<double> cdf(prefixes);
  uint64_t next_id = 0;
  double sum = 0;
  for (uint32_t p = 0; p < prefixes; ++p) {
    first[p] = next_id;
    length[p] = rng.Between(pmin, pmax);
    next_id += length[p];
    sum += 1.0 / std::pow(p + 1.0, o.zipf_s);
    cdf[p] = sum;
  }
  std::vector<Conversation> conversations;
  std::deque<size_t> recent;  // indices of conversations that may continue, oldest first
  std::string out;
  double now_ms = 0;
  for (uint64_t i = 0; i < o.requests; ++i) {
    now_ms += -std::log(1.0 - rng.Uniform()) * o.mean_gap_ms;
    std::vector<uint64_t> ids;
    size_t conversation = 0;
    if (!recent.empty() && rng.Uniform() < o.continue_probability) {
      const size_t pick = rng.Between(0, recent.size() - 1);
      conversation = recent[pick];
      recent.erase(recent.begin() + static_cast<std::ptrdiff_t>(pick));
      ids = conversations[conversation].whole_blocks;
      ids.push_back(next_id++);  // the previous partial block, now with the answer after it
    } else {
      const auto p = static_cast<uint32_t>(
          std::lower_bound(cdf.begin(), cdf.end(), rng.Uniform() * sum) - cdf.begin());
      const uint32_t prefix = std::min(p, prefixes - 1);
      for (uint64_t b = 0; b < length[prefix]; ++b) ids.push_back(first[prefix] + b);
      conversation = conversations.size();
      conversations.emplace_back();
    }
    const uint64_t user = rng.Between(1, umax);
    for (uint64_t b = 0; b < user; ++b) ids.push_back(next_id++);
    const uint64_t input = (ids.size() - 1) * kBlock + rng.Between(1, kBlock);
    absl::StrAppend(&out, "{\"timestamp\": ", static_cast<uint64_t>(now_ms),
                    ", \"input_length\": ", input, ", \"output_length\": ", rng.Between(16, 512),
                    ", \"hash_ids\": [", absl::StrJoin(ids, ", "), "]}\n");
    Conversation& c = conversations[conversation];
    ids.pop_back();
    c.whole_blocks = std::move(ids);
    // A conversation that cannot continue gives its blocks back: memory stays bounded by the
    // active conversations.
    if (++c.turns < o.max_turns) {
      recent.push_back(conversation);
      if (recent.size() > std::max<uint32_t>(o.active_conversations, 1)) {
        conversations[recent.front()].whole_blocks = {};
        recent.pop_front();
      }
    } else {
      c.whole_blocks = {};
    }
  }
  return out;
}

}  // namespace ckv::tools
