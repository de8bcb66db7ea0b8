// SPDX-License-Identifier: Apache-2.0
// tools/block_trace.cc: see block_trace.h.
#include "tools/block_trace.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "tools/json_reader.h"
#include "tools/synthetic_kv.h"

namespace ckv::tools {
namespace {

constexpr uint32_t kMaxBlockTokens = 65536;
// Salts the seed of a block's tokens, so that block ids and the seeds of "generate" turns (ckv
// format) do not give the same tokens by accident.
constexpr uint64_t kBlockSeedSalt = 0x626c6f636b696473ull;  // "blockids"

absl::Status LineError(std::string_view name, size_t line, std::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(name), ":", line, ": ", std::string(message)));
}

// One line as a JSON object, bounded by `limits`.
absl::StatusOr<JsonValue> ParseObjectLine(std::string_view content, std::string_view name,
                                          size_t line, const TraceLimits& limits) {
  if (content.size() > limits.max_line_bytes) {
    return LineError(
        name, line,
        absl::StrCat("line of ", content.size(), " bytes; the limit is ", limits.max_line_bytes));
  }
  JsonLimits jl;
  jl.max_bytes = limits.max_line_bytes;
  jl.max_depth = 3;
  absl::StatusOr<JsonValue> value = ParseJson(content, jl);
  if (!value.ok()) return LineError(name, line, std::string(value.status().message()));
  if (value->AsObject() == nullptr) {
    return LineError(
        name, line,
        absl::StrCat("a request is a JSON object, not ", std::string(value->TypeName())));
  }
  return value;
}

// A JSON number (integer or not) as a double.
std::optional<double> Number(const JsonValue* v) {
  if (v == nullptr) return std::nullopt;
  if (const int64_t* i = v->AsInt()) return static_cast<double>(*i);
  if (const double* d = v->AsDouble()) return *d;
  return std::nullopt;
}

// The value of a JSON scalar as the error message shows it.
std::string Shown(const JsonValue* v) {
  if (v == nullptr) return "missing";
  if (const int64_t* i = v->AsInt()) return absl::StrCat(*i);
  if (const double* d = v->AsDouble()) return absl::StrCat(*d);
  if (const std::string* s = v->AsString()) return absl::StrCat("\"", s->substr(0, 64), "\"");
  return std::string(v->TypeName());  // "an array", "an object", ...
}

class RequestParser {
 public:
  RequestParser(std::string_view name, TraceFormat format, uint32_t block_tokens,
                const TraceLimits& limits)
      : name_(name),
        format_(format),
        native_(NativeBlockTokens(format)),
        block_tokens_(block_tokens),
        limits_(limits) {}

  absl::StatusOr<BlockRequest> Parse(const JsonValue& v, size_t line, size_t index) const {
    BlockRequest r;
    r.line = line;
    auto error = [&](std::string_view message) { return LineError(name_, line, message); };
    const std::optional<double> ts = Number(v.Find("timestamp"));
    if (!ts || !(*ts >= 0) || *ts > 1e15) {
      return error(
          absl::StrCat("\"timestamp\" ", Shown(v.Find("timestamp")), " is not a number >= 0 (",
                       format_ == TraceFormat::kMooncake ? "milliseconds" : "seconds", ")"));
    }
    r.arrival_seconds = format_ == TraceFormat::kMooncake ? *ts / 1000 : *ts;
    CKV_ASSIGN_OR_RETURN(const uint64_t input, Count(v, "input_length", 1, line));
    CKV_ASSIGN_OR_RETURN(r.output_tokens, Count(v, "output_length", 0, line));
    if (format_ == TraceFormat::kBailian) {
      CKV_RETURN_IF_ERROR(ParseBailianMembers(v, line, &r));
    } else {
      r.label = absl::StrCat("r", index);
    }
    const JsonValue* ids_value = v.Find("hash_ids");
    const JsonValue::Array* ids = ids_value == nullptr ? nullptr : ids_value->AsArray();
    if (ids == nullptr || ids->empty()) {
      return error(ids == nullptr ? absl::StrCat("\"hash_ids\" is ", Shown(ids_value),
                                                 ", not an array of block ids")
                                  : "\"hash_ids\" is empty; a request has at least one block");
    }
    const uint64_t n = ids->size();
    if (input <= (n - 1) * native_ || input > n * native_) {
      return error(absl::StrCat("\"input_length\" ", input, " does not fit ", n, " blocks of ",
                                native_, " tokens (", (n - 1) * native_ + 1, "..", n * native_,
                                ")"));
    }
    const uint64_t last = input - (n - 1) * native_;
    r.tokens = (n - 1) * block_tokens_ + (last * block_tokens_ + native_ - 1) / native_;
    if (r.tokens > limits_.max_context_tokens) {
      return error(absl::StrCat("the request has ", r.tokens, " tokens at ", block_tokens_,
                                " per block; the limit is ", limits_.max_context_tokens));
    }
    r.hash_ids.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t* id = (*ids)[i].AsInt();
      if (id == nullptr || *id < 0) {
        return error(
            absl::StrCat("hash id ", i, " is ", Shown(&(*ids)[i]), ", not an integer >= 0"));
      }
      r.hash_ids.push_back(static_cast<uint64_t>(*id));
    }
    return r;
  }

 private:
  absl::StatusOr<uint64_t> Count(const JsonValue& v, std::string_view key, int64_t min,
                                 size_t line) const {
    const JsonValue* value = v.Find(key);
    if (value == nullptr || value->AsInt() == nullptr || *value->AsInt() < min) {
      return LineError(
          name_, line,
          absl::StrCat("\"", std::string(key), "\" ", Shown(value), " is not an integer >= ", min));
    }
    return static_cast<uint64_t>(*value->AsInt());
  }

  absl::Status ParseBailianMembers(const JsonValue& v, size_t line, BlockRequest* r) const {
    const JsonValue* chat = v.Find("chat_id");
    if (chat != nullptr && chat->AsInt() != nullptr && *chat->AsInt() >= 0) {
      r->label = absl::StrCat(*chat->AsInt());
    } else if (chat != nullptr && chat->AsString() != nullptr && !chat->AsString()->empty() &&
               chat->AsString()->size() <= 256) {
      r->label = *chat->AsString();
    } else {
      return LineError(
          name_, line,
          absl::StrCat("\"chat_id\" ", Shown(chat), " is not an integer >= 0 or a short string"));
    }
    if (const JsonValue* p = v.Find("parent_chat_id");
        p != nullptr && (p->AsInt() == nullptr || *p->AsInt() < -1)) {
      return LineError(name_, line,
                       absl::StrCat("\"parent_chat_id\" ", Shown(p), " is not an integer >= -1"));
    }
    if (const JsonValue* t = v.Find("type"); t != nullptr && t->AsString() == nullptr) {
      return LineError(name_, line, absl::StrCat("\"type\" ", Shown(t), " is not a string"));
    }
    if (v.Find("turn") != nullptr) {
      CKV_ASSIGN_OR_RETURN(r->turn, Count(v, "turn", 0, line));
    }
    return absl::OkStatus();
  }

  std::string_view name_;
  TraceFormat format_;
  uint64_t native_;
  uint64_t block_tokens_;
  const TraceLimits& limits_;
};

}  // namespace

std::string_view TraceFormatName(TraceFormat format) {
  switch (format) {
    case TraceFormat::kCkv:
      return "ckv";
    case TraceFormat::kMooncake:
      return "mooncake";
    case TraceFormat::kBailian:
      return "bailian";
  }
  return "?";
}

absl::StatusOr<TraceFormat> ParseTraceFormat(std::string_view name) {
  for (TraceFormat f : {TraceFormat::kCkv, TraceFormat::kMooncake, TraceFormat::kBailian}) {
    if (name == TraceFormatName(f)) return f;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("trace format '", std::string(name), "' is not ckv, mooncake or bailian"));
}

uint32_t NativeBlockTokens(TraceFormat format) {
  switch (format) {
    case TraceFormat::kMooncake:
      return 512;
    case TraceFormat::kBailian:
      return 16;
    case TraceFormat::kCkv:
      return 0;
  }
  return 0;
}

absl::StatusOr<TraceFormat> DetectTraceFormat(std::string_view text, std::string_view name,
                                              const TraceLimits& limits) {
  std::optional<TraceFormat> format;
  size_t first_line = 0;
  CKV_RETURN_IF_ERROR(
      ForEachLine(text, [&](size_t line, std::string_view content) -> absl::StatusOr<bool> {
        first_line = line;
        CKV_ASSIGN_OR_RETURN(const JsonValue v, ParseObjectLine(content, name, line, limits));
        if (v.Find("conversation") != nullptr) {
          format = TraceFormat::kCkv;
        } else if (v.Find("hash_ids") != nullptr) {
          format = v.Find("chat_id") != nullptr ? TraceFormat::kBailian : TraceFormat::kMooncake;
        }
        return false;
      }));
  if (first_line == 0) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(name), ": the trace is empty"));
  }
  if (!format) {
    return LineError(name, first_line,
                     "cannot tell the trace format: the first request has no \"conversation\" "
                     "(ckv) or \"hash_ids\" (mooncake; bailian with \"chat_id\"); name it with "
                     "--format");
  }
  return *format;
}

absl::StatusOr<BlockTrace> ParseBlockTrace(std::string_view text, std::string_view name,
                                           TraceFormat format, const BlockTraceOptions& options,
                                           const TraceLimits& limits) {
  if (format == TraceFormat::kCkv) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(name), ": a ckv trace has no hash blocks (use ParseTrace)"));
  }
  if (options.block_tokens > kMaxBlockTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("block of ", options.block_tokens, " tokens; the limit is ", kMaxBlockTokens));
  }
  BlockTrace trace;
  trace.format = format;
  trace.block_tokens = options.block_tokens == 0 ? NativeBlockTokens(format) : options.block_tokens;
  const RequestParser parser(name, format, trace.block_tokens, limits);
  uint64_t total = 0;
  CKV_RETURN_IF_ERROR(
      ForEachLine(text, [&](size_t line, std::string_view content) -> absl::StatusOr<bool> {
        CKV_ASSIGN_OR_RETURN(const JsonValue v, ParseObjectLine(content, name, line, limits));
        CKV_ASSIGN_OR_RETURN(BlockRequest r, parser.Parse(v, line, trace.requests.size()));
        total += r.tokens;
        if (total > limits.max_total_tokens) {
          return LineError(
              name, line,
              absl::StrCat("the trace reaches ", total, " tokens at ", trace.block_tokens,
                           " per block; the limit is ", limits.max_total_tokens));
        }
        trace.requests.push_back(std::move(r));
        return options.max_requests == 0 || trace.requests.size() < options.max_requests;
      }));
  return trace;
}

std::vector<int32_t> BlockTokens(uint64_t hash_id, size_t count) {
  return synth::Tokens(synth::Mix64(hash_id ^ kBlockSeedSalt), count);
}

std::vector<int32_t> RequestTokens(const BlockTrace& trace, const BlockRequest& request) {
  std::vector<int32_t> tokens;
  tokens.reserve(request.tokens);
  for (uint64_t id : request.hash_ids) {
    const size_t take = std::min<uint64_t>(trace.block_tokens, request.tokens - tokens.size());
    const std::vector<int32_t> block = BlockTokens(id, take);
    tokens.insert(tokens.end(), block.begin(), block.end());
  }
  return tokens;
}

}  // namespace ckv::tools
