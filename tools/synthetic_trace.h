// SPDX-License-Identifier: Apache-2.0
// tools/synthetic_trace.h: a SYNTHETIC trace in the Mooncake format (see block_trace.h), for tests,
// the docs and bench/replay_bench when no recorded trace is at hand. It is not a recording of
// any production system; its shape imitates what the Mooncake and Bailian papers describe:
//
//   - shared prefixes (system prompts, documents): `shared_prefixes` of them, each of
//     prefix_blocks_min..max blocks; a new conversation picks one with Zipf(zipf_s) popularity,
//     so a few prefixes are reused by most conversations and most are rare;
//   - multi-turn extension: with probability continue_probability a request continues a recent
//     conversation (one of the last `active_conversations`, picked uniformly): its prompt is the
//     previous prompt's whole blocks, one new block for the previous answer's tail and the
//     previous partial block, and 1..user_blocks_max new blocks; a conversation ends after
//     max_turns;
//   - otherwise a new conversation: its shared prefix, then 1..user_blocks_max blocks of its own;
//   - the last block is partial (1..512 tokens); arrivals are a Poisson process.
//
// Deterministic: a pure function of the options (seed included).
//
// Thread-safety: pure functions.
#ifndef CKV_TOOLS_SYNTHETIC_TRACE_H_
#define CKV_TOOLS_SYNTHETIC_TRACE_H_

#include <cstdint>
#include <string>

namespace ckv::tools {

struct SyntheticTraceOptions {
  // Requests in the trace. Default: 2000.
  uint64_t requests = 2000;
  // Seed of every random choice. Default: 1.
  uint64_t seed = 1;
  // Distinct shared prefixes. Default: 200.
  uint32_t shared_prefixes = 200;
  // Zipf exponent of the shared prefixes' popularity. Default: 1.0.
  double zipf_s = 1.0;
  // Blocks of 512 tokens in one shared prefix, uniform in min..max. Default: 2..12.
  uint32_t prefix_blocks_min = 2;
  uint32_t prefix_blocks_max = 12;
  // New user blocks per request, uniform in 1..max. Default: 4.
  uint32_t user_blocks_max = 4;
  // Probability that a request continues a recent conversation. Default: 0.5.
  double continue_probability = 0.5;
  // Conversations a continuation picks from (the most recent ones). Default: 64.
  uint32_t active_conversations = 64;
  // Turns after which a conversation ends. Default: 8.
  uint32_t max_turns = 8;
  // Mean gap between arrivals, milliseconds. Default: 200.
  double mean_gap_ms = 200;
};

// The trace as JSON Lines text, one Mooncake request per line.
std::string SyntheticMooncakeTrace(const SyntheticTraceOptions& options = {});

}  // namespace ckv::tools

#endif  // CKV_TOOLS_SYNTHETIC_TRACE_H_
