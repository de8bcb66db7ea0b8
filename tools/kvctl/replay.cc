// SPDX-License-Identifier: Apache-2.0
// kvctl replay: run a multi-turn trace against a store, a Re-Prefill and a Put per turn.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <new>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "ckv/log.h"
#include "ckv/session.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "tools/block_trace.h"
#include "tools/json_reader.h"
#include "tools/kvctl/command.h"
#include "tools/kvctl/format.h"
#include "tools/kvctl/progress.h"
#include "tools/replay_trace.h"
#include "tools/synthetic_kv.h"

namespace ckv::kvctl {
namespace {

struct ReplayOptions {
  std::string store;
  std::string trace;
  PresetOptions preset;
  std::string selector = "period-exact";
  std::string budget = "0.1";
  uint64_t gpu_tier_bytes = 0;
  uint64_t cpu_tier_bytes = 0;
  bool no_put = false;
  std::string format = "auto";
  uint32_t block_tokens = 0;
  uint64_t max_requests = 0;
  double speed = 0;
  std::string remote;                 // --remote: the remote tier's cluster
  uint64_t max_request_kv_bytes = 0;  // --max-request-kv-bytes
  cli::JsonOutput json;
};

// --speed: 0 (as fast as possible) or within these. Outside them a replay is either absurdly slow
// (1e-20: a millisecond of the trace becomes an age) or no different from 0.
constexpr double kMinSpeed = 1e-3;
constexpr double kMaxSpeed = 1e6;
// The longest replay waits between two requests (the gap of their timestamps over --speed); a
// trace and speed that would wait longer are refused before the replay starts.
constexpr double kMaxWaitSeconds = 3600;

// One request of the trace, whatever its format.
struct ReplayRequest {
  std::string label;  // ckv: the conversation; bailian: chat_id; mooncake: "r" and its index
  uint64_t turn = 1;
  size_t line = 0;
  double arrival_seconds = 0;  // 0 in the ckv format, which has no timestamps
  uint64_t tokens = 0;         // of the whole request
};

// A trace read in one of its formats (tools/replay_trace.h, tools/block_trace.h): its requests,
// and the prompt of each, made when the replay reaches it.
class ReplayInput {
 public:
  // Reads o.trace in o.format (auto: detected). Errors name the file (and line).
  static absl::StatusOr<ReplayInput> Read(const ReplayOptions& o) {
    const tools::TraceLimits limits;
    CKV_ASSIGN_OR_RETURN(const std::string text, tools::ReadTraceText(o.trace, limits));
    ReplayInput in;
    if (o.format == "auto") {
      CKV_ASSIGN_OR_RETURN(in.format_, tools::DetectTraceFormat(text, o.trace, limits));
    } else {
      CKV_ASSIGN_OR_RETURN(in.format_, tools::ParseTraceFormat(o.format));
    }
    if (in.format_ == tools::TraceFormat::kCkv) {
      CKV_ASSIGN_OR_RETURN(in.turns_, tools::ParseTrace(text, o.trace, limits));
      if (o.max_requests > 0 && in.turns_.size() > o.max_requests) in.turns_.resize(o.max_requests);
      absl::flat_hash_map<std::string, uint64_t> context_tokens;
      for (const tools::TraceTurn& t : in.turns_) {
        in.requests_.push_back(ReplayRequest{t.conversation, t.turn, t.line, 0,
                                             context_tokens[t.conversation] += t.tokens.size()});
      }
      return in;
    }
    tools::BlockTraceOptions options;
    options.block_tokens = o.block_tokens;
    options.max_requests = o.max_requests;
    CKV_ASSIGN_OR_RETURN(in.blocks_,
                         tools::ParseBlockTrace(text, o.trace, in.format_, options, limits));
    for (const tools::BlockRequest& r : in.blocks_.requests) {
      in.requests_.push_back(ReplayRequest{r.label, r.turn, r.line, r.arrival_seconds, r.tokens});
    }
    return in;
  }

  tools::TraceFormat format() const { return format_; }
  // Tokens per hash id (0 for a ckv trace).
  uint32_t block_tokens() const { return blocks_.block_tokens; }
  const std::vector<ReplayRequest>& requests() const { return requests_; }

  // The prompt of request i; REQUIRES: called for i = 0, 1, 2, ... in order (a ckv turn extends
  // its conversation's context). Valid until the next call.
  std::span<const int32_t> Prompt(size_t i) {
    if (format_ == tools::TraceFormat::kCkv) {
      const tools::TraceTurn& t = turns_[i];
      std::vector<int32_t>& context = contexts_[t.conversation];
      context.insert(context.end(), t.tokens.begin(), t.tokens.end());
      return context;
    }
    prompt_ = tools::RequestTokens(blocks_, blocks_.requests[i]);
    return prompt_;
  }

 private:
  tools::TraceFormat format_ = tools::TraceFormat::kCkv;
  std::vector<ReplayRequest> requests_;
  std::vector<tools::TraceTurn> turns_;  // ckv
  absl::flat_hash_map<std::string, std::vector<int32_t>> contexts_;
  tools::BlockTrace blocks_;  // mooncake, bailian
  std::vector<int32_t> prompt_;
};

struct ReplayTurnFigures {
  std::string conversation;
  uint64_t turn = 0;
  uint64_t prompt_tokens = 0;
  uint64_t prompt_chunks = 0;
  uint64_t matched_chunks = 0;
  SessionStats session;
  double reprefill_seconds = 0;
  uint64_t chunks_written = 0;
  uint64_t chunks_evicted = 0;
  double put_seconds = 0;
};

// One turn: a Re-Prefill over the stored leading chunks of `prompt`, then (unless no_put) a Put.
// `max_disk_bytes`: the store's cap (0: none); a Put whose new chunks' KV alone is over it is
// refused before their KV is generated, as the store would refuse it after.
absl::StatusOr<ReplayTurnFigures> ReplayTurn(Engine& engine, const ModelSpec& spec,
                                             const ReprefillOptions& options,
                                             const ReplayRequest& request,
                                             std::span<const int32_t> prompt, bool no_put,
                                             bool reclaimer, uint64_t max_disk_bytes,
                                             synth::ReplayKv& kv) {
  ReplayTurnFigures f;
  f.conversation = request.label;
  f.turn = request.turn;
  f.prompt_tokens = prompt.size();
  f.prompt_chunks = prompt.size() / spec.chunk_tokens;
  const uint64_t turn_seed = std::hash<std::string>{}(request.label) ^ (request.turn << 32);
  const auto reprefill_start = Clock::now();
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<ReprefillSession> session,
                       engine.BeginReprefill(spec, prompt, options));
  f.matched_chunks = session->matched_chunks();
  if (f.matched_chunks > 0) {
    for (uint32_t layer = 0; layer < spec.layers; ++layer) {
      const std::vector<float> q = synth::ReplayQueries(spec, options.window, turn_seed, layer);
      CKV_RETURN_IF_ERROR(session->SubmitQueries(layer, q));
      CKV_ASSIGN_OR_RETURN(LayerView view, session->AwaitLayer(layer));
    }
  }
  CKV_ASSIGN_OR_RETURN(f.session, session->Finish());
  f.reprefill_seconds = SecondsSince(reprefill_start);
  if (!no_put && f.prompt_chunks > 0) {
    const std::span<const int32_t> whole = prompt.first(f.prompt_chunks * spec.chunk_tokens);
    // Only the chunks the session did not match are generated: the store holds the others and
    // Put does not write them, as long as nothing evicts them before it. Eviction inside Put
    // keeps them; a background reclaimer (`reclaimer`) may not, so with one every chunk is
    // generated.
    const size_t generated_from = reclaimer ? 0 : f.matched_chunks;
    // The bytes the records take on disk (a codec stores fewer than the dtype's).
    const uint64_t new_kv_bytes =
        uint64_t(f.prompt_chunks - f.matched_chunks) * spec.layers * spec.RecordBytes();
    if (max_disk_bytes > 0 && new_kv_bytes > max_disk_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "Put of ", f.prompt_chunks - f.matched_chunks, " new chunks: ", FormatBytes(new_kv_bytes),
          " of KV, more than the store's cap of ", FormatBytes(max_disk_bytes),
          " (max_disk_bytes); not generated"));
    }
    const KvTensors& tensors = kv.Fill(whole, generated_from);
    const auto put_start = Clock::now();
    CKV_ASSIGN_OR_RETURN(PutResult put, engine.Put(spec, whole, tensors));
    if (put.chunks_existing < generated_from) {
      // Chunks the session matched were gone when the Put ran (evicted meanwhile): it wrote
      // chunks chunks_existing..generated_from - 1 from bytes this replay never generated. The
      // prefix is deleted (its chunks from chunks_existing on are this Put's own, extended by
      // nothing else), and the whole prompt is generated and put again.
      CKV_RETURN_IF_ERROR(engine.DeletePrefix(put.prefix_id));
      CKV_ASSIGN_OR_RETURN(const PrefixExtent extent, engine.Probe(spec, whole));
      const uint64_t left = extent.local_chunks;
      if (left > put.chunks_existing) {
        return absl::InternalError(
            absl::StrCat("Put found ", put.chunks_existing, " chunks stored of the ",
                         f.matched_chunks, " the session matched, and ", left - put.chunks_existing,
                         " chunks it wrote from ungenerated bytes could not be removed"));
      }
      const KvTensors& regenerated = kv.Fill(whole, 0);
      CKV_ASSIGN_OR_RETURN(put, engine.Put(spec, whole, regenerated));
    }
    f.put_seconds = SecondsSince(put_start);
    f.chunks_written = put.chunks_written;
    f.chunks_evicted = put.chunks_evicted;
  }
  return f;
}

void WriteTurnJson(tools::JsonWriter& w, const ReplayTurnFigures& f) {
  const SessionStats& s = f.session;
  w.BeginObject()
      .Key("conversation")
      .String(f.conversation)
      .Key("turn")
      .Uint(f.turn)
      .Key("prompt_tokens")
      .Uint(f.prompt_tokens)
      .Key("prompt_chunks")
      .Uint(f.prompt_chunks)
      .Key("matched_chunks")
      .Uint(f.matched_chunks)
      .Key("records_served")
      .Uint(s.records_served)
      .Key("bytes_needed")
      .Uint(s.bytes_needed)
      .Key("bytes_read")
      .Uint(s.bytes_read)
      .Key("read_amplification")
      .Double(s.read_amplification())
      .Key("gpu_hits")
      .Uint(s.gpu_hits)
      .Key("cpu_hits")
      .Uint(s.cpu_hits)
      .Key("nvme_records")
      .Uint(s.nvme_records)
      .Key("summary_cache_hits")
      .Uint(s.summary_cache_hits)
      .Key("prefetched_bytes_used")
      .Uint(s.prefetched_bytes_used)
      .Key("prefetched_bytes_wasted")
      .Uint(s.prefetched_bytes_wasted)
      .Key("await_blocked_seconds")
      .Double(s.await_blocked_seconds)
      .Key("reprefill_seconds")
      .Double(f.reprefill_seconds)
      .Key("chunks_written")
      .Uint(f.chunks_written)
      .Key("chunks_evicted")
      .Uint(f.chunks_evicted)
      .Key("put_seconds")
      .Double(f.put_seconds)
      .EndObject();
}

// The KV bytes of every request, added up; an error names a request past `max_request_kv_bytes`
// (ResourceExhausted, see CheckRequestKvBytes), before any is generated.
absl::StatusOr<uint64_t> TraceKvBytes(const std::string& trace_path, const ModelSpec& spec,
                                      const std::vector<ReplayRequest>& requests,
                                      uint64_t max_request_kv_bytes) {
  uint64_t total_kv_bytes = 0;
  for (const ReplayRequest& r : requests) {
    CKV_RETURN_IF_ERROR(CheckRequestKvBytes(
        absl::StrCat(trace_path, ":", r.line, ": turn ", r.turn, " of \"", r.label, "\""), r.tokens,
        spec, max_request_kv_bytes));
    total_kv_bytes += r.tokens * spec.KvBytesPerToken();
  }
  return total_kv_bytes;
}

// With --speed: an error names the first request that would wait more than kMaxWaitSeconds after
// the one before it. Timestamps out of order wait for nothing.
absl::Status CheckWaits(const std::string& trace_path, const std::vector<ReplayRequest>& requests,
                        double speed) {
  if (speed <= 0 || requests.empty()) return absl::OkStatus();
  double latest = requests[0].arrival_seconds;
  for (const ReplayRequest& r : requests) {
    const double wait = (r.arrival_seconds - latest) / speed;
    if (wait > kMaxWaitSeconds) {
      return absl::InvalidArgumentError(
          absl::StrCat(trace_path, ":", r.line, ": request \"", r.label, "\" arrives ",
                       r.arrival_seconds - latest, " s after the one before it; at --speed ", speed,
                       " replay would wait ", wait, " s, and it waits at most ", kMaxWaitSeconds,
                       " s between requests (raise --speed, or 0 to replay as fast as possible)"));
    }
    latest = std::max(latest, r.arrival_seconds);
  }
  return absl::OkStatus();
}

// The totals over the turns.
struct ReplayTotals {
  SessionStats session;
  uint64_t prompt_chunks = 0, matched = 0, written = 0;
  double seconds = 0, put_seconds = 0, reprefill_seconds = 0;
};

ReplayTotals Totals(const std::vector<ReplayTurnFigures>& figures, double seconds) {
  ReplayTotals t;
  t.seconds = seconds;
  for (const ReplayTurnFigures& f : figures) {
    t.prompt_chunks += f.prompt_chunks;
    t.matched += f.matched_chunks;
    t.written += f.chunks_written;
    t.put_seconds += f.put_seconds;
    t.reprefill_seconds += f.reprefill_seconds;
    t.session.records_served += f.session.records_served;
    t.session.bytes_needed += f.session.bytes_needed;
    t.session.bytes_read += f.session.bytes_read;
    t.session.gpu_hits += f.session.gpu_hits;
    t.session.cpu_hits += f.session.cpu_hits;
    t.session.nvme_records += f.session.nvme_records;
  }
  return t;
}

int PrintReplayJson(const ReplayOptions& o, const ReplayInput& input, const ModelSpec& spec,
                    const ReprefillOptions& options, const std::vector<ReplayTurnFigures>& figures,
                    const ReplayTotals& t, const EngineStats& stats) {
  tools::JsonWriter w;
  w.BeginObject()
      .Key("store")
      .String(o.store)
      .Key("trace")
      .String(o.trace)
      .Key("format")
      .String(std::string(tools::TraceFormatName(input.format())))
      .Key("block_tokens")
      .Uint(input.block_tokens())
      .Key("model_id")
      .String(spec.model_id)
      .Key("selector")
      .String(std::string(SelectorName(options.selector)))
      .Key("budget")
      .Double(options.budget_fraction)
      .Key("put")
      .Bool(!o.no_put)
      .Key("turns")
      .BeginArray();
  for (const ReplayTurnFigures& f : figures) WriteTurnJson(w, f);
  w.EndArray()
      .Key("prompt_chunks")
      .Uint(t.prompt_chunks)
      .Key("matched_chunks")
      .Uint(t.matched)
      .Key("chunks_written")
      .Uint(t.written)
      .Key("records_served")
      .Uint(t.session.records_served)
      .Key("bytes_needed")
      .Uint(t.session.bytes_needed)
      .Key("bytes_read")
      .Uint(t.session.bytes_read)
      .Key("read_amplification")
      .Double(t.session.read_amplification())
      .Key("gpu_hits")
      .Uint(t.session.gpu_hits)
      .Key("cpu_hits")
      .Uint(t.session.cpu_hits)
      .Key("nvme_records")
      .Uint(t.session.nvme_records)
      .Key("seconds")
      .Double(t.seconds)
      .Key("put_seconds")
      .Double(t.put_seconds)
      .Key("reprefill_seconds")
      .Double(t.reprefill_seconds)
      .Key("engine");
  WriteStatsJson(w, stats);
  if (!o.remote.empty()) WriteRemoteJson(w, stats);
  w.EndObject();
  return EmitJson(o.json, w);
}

void PrintReplayText(const ReplayOptions& o, const ModelSpec& spec, const ReprefillOptions& options,
                     const std::vector<ReplayTurnFigures>& figures, const ReplayTotals& t) {
  const SessionStats& total = t.session;
  std::printf("replay %s: %zu turns, %s, %s at %.0f%%\n", Printable(o.trace).c_str(),
              figures.size(), Printable(spec.DebugString()).c_str(),
              std::string(SelectorName(options.selector)).c_str(), options.budget_fraction * 100);
  std::printf("%-14s %5s %8s %15s %8s %10s %6s %7s %7s %9s %8s %9s\n", "conversation", "turn",
              "tokens", "matched", "records", "read", "amp", "gpu", "cpu", "reprefill", "written",
              "put");
  for (const ReplayTurnFigures& f : figures) {
    const std::string matched_text = absl::StrCat(f.matched_chunks, "/", f.prompt_chunks);
    std::printf("%-14s %5llu %8llu %15s %8llu %10s %6.2f %7llu %7llu %8.1fms %8llu %8.1fms\n",
                Printable(f.conversation).substr(0, 14).c_str(),
                static_cast<unsigned long long>(f.turn),
                static_cast<unsigned long long>(f.prompt_tokens), matched_text.c_str(),
                static_cast<unsigned long long>(f.session.records_served),
                FormatBytes(f.session.bytes_read).c_str(), f.session.read_amplification(),
                static_cast<unsigned long long>(f.session.gpu_hits),
                static_cast<unsigned long long>(f.session.cpu_hits), f.reprefill_seconds * 1e3,
                static_cast<unsigned long long>(f.chunks_written), f.put_seconds * 1e3);
  }
  const double hit_rate =
      total.records_served == 0
          ? 0
          : static_cast<double>(total.gpu_hits + total.cpu_hits) / total.records_served;
  std::printf(
      "totals: %llu of %llu request chunks matched, %llu records served, %s read "
      "(amplification %.2f), tier hits %.0f%% (gpu %llu, cpu %llu), %llu chunks "
      "written, %.2fs (Put %.2fs, Re-Prefill %.2fs)\n",
      static_cast<unsigned long long>(t.matched), static_cast<unsigned long long>(t.prompt_chunks),
      static_cast<unsigned long long>(total.records_served), FormatBytes(total.bytes_read).c_str(),
      total.read_amplification(), hit_rate * 100, static_cast<unsigned long long>(total.gpu_hits),
      static_cast<unsigned long long>(total.cpu_hits), static_cast<unsigned long long>(t.written),
      t.seconds, t.put_seconds, t.reprefill_seconds);
}

int RunReplay(const ReplayOptions& o) {
  std::string error;
  ModelSpec spec;
  if (!PresetSpec(o.preset, &spec, &error)) return UsageError("replay", error);
  ReprefillOptions options;
  auto selector = ParseSelector(o.selector);
  if (!selector.ok()) {
    return UsageError("replay", "--selector: '" + o.selector +
                                    "' is not period-exact, quest, mean-key, outlier-key or "
                                    "oracle");
  }
  options.selector = *selector;
  if (!cli::ParseDouble(o.budget, &options.budget_fraction) || !(options.budget_fraction > 0) ||
      options.budget_fraction > 1) {
    return UsageError("replay", "--budget: '" + o.budget + "' is not a number in (0, 1]");
  }
  EngineOptions engine_options;
  engine_options.create_if_missing = false;
  engine_options.gpu_tier_bytes = o.gpu_tier_bytes;
  engine_options.cpu_tier_bytes = o.cpu_tier_bytes;
  ApplyRemote(o.remote, &engine_options);

  if (o.speed != 0 && !(o.speed >= kMinSpeed && o.speed <= kMaxSpeed)) {
    return UsageError("replay", absl::StrCat("--speed: ", o.speed, " is not 0 or a number in [",
                                             kMinSpeed, ", ", kMaxSpeed, "]"));
  }
  auto input = ReplayInput::Read(o);
  if (!input.ok()) return StoreError("replay " + o.trace, input.status());
  if (input->format() == tools::TraceFormat::kCkv && (o.block_tokens > 0 || o.speed > 0)) {
    return UsageError("replay",
                      "--block-tokens and --speed need a trace of hash blocks "
                      "(mooncake, bailian); " +
                          o.trace + " is a ckv trace");
  }
  const std::vector<ReplayRequest>& requests = input->requests();
  const absl::StatusOr<uint64_t> total_kv_bytes =
      TraceKvBytes(o.trace, spec, requests, o.max_request_kv_bytes);
  if (!total_kv_bytes.ok()) return StoreError("replay " + o.trace, total_kv_bytes.status());
  if (absl::Status waits = CheckWaits(o.trace, requests, o.speed); !waits.ok()) {
    return StoreError("replay " + o.trace, waits);
  }

  auto engine = Engine::Open(engine_options, o.store);
  if (!engine.ok()) return StoreError("open " + o.store, engine.status());

  std::vector<ReplayTurnFigures> figures;
  synth::ReplayKv kv(spec);
  const bool reclaimer = (*engine)->Stats().reclaim_margin_bytes > 0;
  const uint64_t max_disk_bytes = (*engine)->Stats().max_disk_bytes;
  const auto start = Clock::now();
  {
    ProgressBar bar("replay", *total_kv_bytes);
    uint64_t done = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const ReplayRequest& r = requests[i];
      if (o.speed > 0) {  // arrive at the trace's time, o.speed times faster
        const double due = (r.arrival_seconds - requests[0].arrival_seconds) / o.speed;
        const double wait = due - SecondsSince(start);
        if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      }
      absl::StatusOr<ReplayTurnFigures> f;
      std::span<const int32_t> prompt;
      try {
        prompt = input->Prompt(i);
        f = ReplayTurn(**engine, spec, options, r, prompt, o.no_put, reclaimer, max_disk_bytes, kv);
      } catch (const std::bad_alloc&) {
        // The request's KV (checked against --max-request-kv-bytes) did not fit this process.
        f = OutOfMemory("the request's KV", r.tokens * spec.KvBytesPerToken());
      }
      if (!f.ok()) {
        bar.Finish();
        return StoreError(absl::StrCat("replay ", o.trace, ":", r.line, " (\"", r.label,
                                       "\", turn ", r.turn, ")"),
                          f.status());
      }
      figures.push_back(*std::move(f));
      done += prompt.size() * spec.KvBytesPerToken();
      bar.Update(done);
    }
  }
  const ReplayTotals totals = Totals(figures, SecondsSince(start));
  if (!o.remote.empty() && !AwaitRemotePublished(**engine)) {
    std::fprintf(stderr, "kvctl: replay: the remote tier had not published every chunk in 60 s\n");
  }
  if (o.json.enabled) {
    const int rc = PrintReplayJson(o, *input, spec, options, figures, totals, (*engine)->Stats());
    if (rc != kExitOk || o.json.ToStdout()) return rc;
  }
  PrintReplayText(o, spec, options, figures, totals);
  if (!o.remote.empty()) PrintRemoteLine((*engine)->Stats());
  return kExitOk;
}

}  // namespace

Command AddReplay(CLI::App& kvctl) {
  auto o = std::make_shared<ReplayOptions>();
  CLI::App* cmd = kvctl.add_subcommand(
      "replay", "Run a multi-turn trace against the store: per turn, a Re-Prefill, then a Put.");
  cmd->footer(
      "TRACE is JSON Lines, one turn per line, in arrival order:\n"
      "  {\"conversation\": \"c1\", \"turn\": 1, \"generate\": {\"seed\": 7, \"tokens\": 1024}}\n"
      "  {\"conversation\": \"c1\", \"turn\": 2, \"tokens\": [151644, 8948, 198]}\n"
      "A turn's tokens (listed, or generated from a seed as 'kvctl put' does) are appended to its\n"
      "conversation's context, and the turn's request is the whole context. For each turn, replay\n"
      "runs a Re-Prefill session over the stored leading chunks of the request (every layer, with\n"
      "synthetic queries, through the selector and tiers), then stores the request's whole chunks\n"
      "with synthetic KV (as 'kvctl put'; chunks already stored are not written again), so the\n"
      "next turn matches them. It prints per turn the match length and the Re-Prefill figures,\n"
      "then the totals. The tiers live only as long as the replay. A request's KV is held in\n"
      "memory while it is stored: replay refuses a trace with a request of more than\n"
      "--max-request-kv-bytes of KV (exit 3) before it starts.\n"
      "Public traces of hash blocks are read too (--format, default: told from the first line):\n"
      "  mooncake: {\"timestamp\": MS, \"input_length\": N, \"output_length\": N, \"hash_ids\": "
      "[..]}\n"
      "  bailian:  {\"chat_id\": ID, \"parent_chat_id\": ID, \"timestamp\": S, \"input_length\": "
      "N,\n"
      "             \"output_length\": N, \"type\": T, \"turn\": N, \"hash_ids\": [..]}\n"
      "A hash id stands for a block of 512 (mooncake) or 16 (bailian) tokens, generated from the "
      "id\n"
      "(equal ids, equal tokens); --block-tokens B makes every block B tokens (the partial last "
      "one\n"
      "in proportion), so that long prompts fit a small machine.\n"
      "--speed X sends each request at its timestamp, X times faster (X in [0.001, 1e6]); a trace\n"
      "that would wait more than an hour between two requests at that speed is refused.\n"
      "Example: kvctl replay ./store trace.jsonl --model qwen2.5-7b --gpu-tier-bytes 1G");
  AddStoreArg(*cmd, &o->store);
  cmd->add_option("TRACE", o->trace, "the trace, JSON Lines")->required()->type_name("");
  AddPresetOptions(*cmd, &o->preset);
  cmd->add_option("--selector", o->selector,
                  "period-exact (default), quest, mean-key, outlier-key or oracle")
      ->type_name("S");
  cmd->add_option("--budget", o->budget,
                  "fraction of the matched chunks loaded per layer, (0, 1] (default 0.1)")
      ->type_name("F");
  cli::AddBytes(*cmd, "--gpu-tier-bytes", &o->gpu_tier_bytes,
                "GPU tier budget (host memory here; default 0: none)");
  cli::AddBytes(*cmd, "--cpu-tier-bytes", &o->cpu_tier_bytes, "CPU tier budget (default 0: none)");
  cmd->add_flag("--no-put", o->no_put,
                "do not store the turns (measure Re-Prefill of what is stored)");
  cli::AddChoice(*cmd, "--format", &o->format, {"auto", "ckv", "mooncake", "bailian"},
                 "the trace's format (default auto: told from its first line)");
  cli::AddUint(*cmd, "--block-tokens", &o->block_tokens,
               "tokens per hash id of a mooncake or bailian trace, 1..65536 (default: the "
               "format's own, 512 or 16)",
               "B");
  cli::AddUint(*cmd, "--max-requests", &o->max_requests,
               "replay only the first N requests (default 0: all)");
  cli::AddDouble(*cmd, "--speed", &o->speed,
                 "send requests at their timestamps, X times faster than recorded, X in "
                 "[0.001, 1e6] (default 0: as fast as possible)");
  AddRemoteOption(*cmd, &o->remote);
  AddMaxRequestKvBytes(*cmd, &o->max_request_kv_bytes);
  cli::AddJson(*cmd, &o->json);
  return {cmd, [o] { return RunReplay(*o); }};
}

}  // namespace ckv::kvctl
