// SPDX-License-Identifier: Apache-2.0
// tools/replay_trace.cc: see replay_trace.h.
#include "tools/replay_trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ckv/log.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "tools/json_reader.h"
#include "tools/synthetic_kv.h"

namespace ckv::tools {
namespace {

constexpr int64_t kMaxTokenId = (int64_t{1} << 31) - 1;

// Per conversation seen so far: its last turn and its context length in tokens.
using Conversations = absl::flat_hash_map<std::string, std::pair<uint64_t, size_t>>;

// Parses one non-blank line of the trace, given the conversations before it.
class LineParser {
 public:
  LineParser(std::string_view name, size_t line, const TraceLimits& limits)
      : name_(name), line_(line), limits_(limits) {}

  absl::Status Error(std::string_view message) const {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(name_), ":", line_, ": ", std::string(message)));
  }

  absl::StatusOr<TraceTurn> Parse(std::string_view text, const Conversations& conversations) const {
    JsonLimits jl;
    jl.max_bytes = limits_.max_line_bytes;
    jl.max_depth = 4;
    absl::StatusOr<JsonValue> value = ParseJson(text, jl);
    if (!value.ok()) return Error(std::string(value.status().message()));
    const JsonValue::Object* object = value->AsObject();
    if (object == nullptr)
      return Error(absl::StrCat("a turn is a JSON object, not ", std::string(value->TypeName())));
    for (const auto& [key, member] : *object) {
      if (key != "conversation" && key != "turn" && key != "tokens" && key != "generate") {
        return Error(absl::StrCat("unknown member \"", key,
                                  "\" (known: conversation, turn, tokens, generate)"));
      }
    }
    TraceTurn turn;
    turn.line = line_;
    const JsonValue* conversation = value->Find("conversation");
    if (conversation == nullptr || conversation->AsString() == nullptr ||
        conversation->AsString()->empty()) {
      return Error("\"conversation\" must be a non-empty string");
    }
    turn.conversation = *conversation->AsString();
    const JsonValue* number = value->Find("turn");
    if (number == nullptr || number->AsInt() == nullptr || *number->AsInt() < 1) {
      return Error("\"turn\" must be an integer >= 1");
    }
    turn.turn = static_cast<uint64_t>(*number->AsInt());
    uint64_t last_turn = 0;
    size_t context = 0;
    if (auto it = conversations.find(turn.conversation); it != conversations.end()) {
      last_turn = it->second.first;
      context = it->second.second;
    }
    if (turn.turn != last_turn + 1) {
      return Error(absl::StrCat("turn ", turn.turn, " of conversation \"", turn.conversation,
                                "\" follows turn ", last_turn, " (turns are 1, 2, 3, ...)"));
    }
    const size_t room = limits_.max_context_tokens - context;

    const JsonValue* tokens = value->Find("tokens");
    const JsonValue* generate = value->Find("generate");
    if ((tokens == nullptr) == (generate == nullptr)) {
      return Error("a turn has either \"tokens\" or \"generate\", not both or neither");
    }
    if (tokens != nullptr) {
      const JsonValue::Array* ids = tokens->AsArray();
      if (ids == nullptr) {
        return Error(absl::StrCat("\"tokens\" is ", std::string(tokens->TypeName()),
                                  ", not an array of token ids"));
      }
      if (ids->size() > room) return TooLong(turn, context, ids->size());
      turn.tokens.reserve(ids->size());
      for (size_t i = 0; i < ids->size(); ++i) {
        const int64_t* id = (*ids)[i].AsInt();
        if (id == nullptr || *id < 0 || *id > kMaxTokenId) {
          return Error(absl::StrCat("token ", i, " is not an integer in [0, ", kMaxTokenId, "]"));
        }
        turn.tokens.push_back(static_cast<int32_t>(*id));
      }
    } else {
      const JsonValue* seed = generate->Find("seed");
      const JsonValue* count = generate->Find("tokens");
      if (generate->AsObject() == nullptr || generate->AsObject()->size() != 2 || seed == nullptr ||
          seed->AsInt() == nullptr || *seed->AsInt() < 0 || count == nullptr ||
          count->AsInt() == nullptr || *count->AsInt() < 0) {
        return Error(
            "\"generate\" must be {\"seed\": S, \"tokens\": N} with integers S >= 0 and N >= 0");
      }
      const auto n = static_cast<uint64_t>(*count->AsInt());
      if (n > room) return TooLong(turn, context, n);
      turn.tokens = synth::Tokens(static_cast<uint64_t>(*seed->AsInt()), n);
    }
    return turn;
  }

 private:
  absl::Status TooLong(const TraceTurn& turn, size_t context, uint64_t adding) const {
    return Error(absl::StrCat("conversation \"", turn.conversation, "\" would reach ",
                              context + adding, " tokens at turn ", turn.turn, "; the limit is ",
                              limits_.max_context_tokens));
  }

  std::string_view name_;
  size_t line_;
  const TraceLimits& limits_;
};

}  // namespace

absl::Status ForEachLine(
    std::string_view text,
    const std::function<absl::StatusOr<bool>(size_t line, std::string_view content)>& fn) {
  size_t line = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view content = text.substr(begin, end - begin);
    begin = end + 1;
    ++line;
    if (!content.empty() && content.back() == '\r') content.remove_suffix(1);
    if (content.find_first_not_of(" \t") == std::string_view::npos) continue;
    CKV_ASSIGN_OR_RETURN(const bool more, fn(line, content));
    if (!more) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TraceTurn>> ParseTrace(std::string_view text, std::string_view name,
                                                  const TraceLimits& limits) {
  std::vector<TraceTurn> turns;
  Conversations conversations;
  size_t total = 0;
  CKV_RETURN_IF_ERROR(
      ForEachLine(text, [&](size_t line, std::string_view content) -> absl::StatusOr<bool> {
        const LineParser parser(name, line, limits);
        if (content.size() > limits.max_line_bytes) {
          return parser.Error(absl::StrCat("line of ", content.size(), " bytes; the limit is ",
                                           limits.max_line_bytes));
        }
        CKV_ASSIGN_OR_RETURN(TraceTurn turn, parser.Parse(content, conversations));
        total += turn.tokens.size();
        if (total > limits.max_total_tokens) {
          return parser.Error(absl::StrCat("the trace reaches ", total, " tokens; the limit is ",
                                           limits.max_total_tokens));
        }
        auto& [last_turn, context] = conversations[turn.conversation];
        last_turn = turn.turn;
        context += turn.tokens.size();
        turns.push_back(std::move(turn));
        return true;
      }));
  return turns;
}

absl::StatusOr<std::string> ReadTraceText(const std::string& path, const TraceLimits& limits) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  std::string text;
  absl::Status status;
  size_t line = 1;
  size_t line_bytes = 0;      // of the line being read, so far
  bool line_started = false;  // a character other than space or tab seen on it
  char buf[65536];
  while (status.ok()) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = ErrnoToStatus(errno, absl::StrCat("read ", path));
      break;
    }
    if (n == 0) break;
    if (text.size() + static_cast<size_t>(n) > limits.max_file_bytes) {
      status = absl::InvalidArgumentError(
          absl::StrCat(path, ": over the trace size limit of ", limits.max_file_bytes, " bytes"));
      break;
    }
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      const char c = buf[i];
      if (c == '\n') {
        ++line;
        line_bytes = 0;
        line_started = false;
        continue;
      }
      if (c == '\0') {
        status = absl::InvalidArgumentError(
            absl::StrCat(path, ":", line, ": a NUL byte at byte ", text.size() + i,
                         " of the file: binary data, not a JSON Lines trace"));
        break;
      }
      if (++line_bytes > limits.max_line_bytes) {
        status = absl::InvalidArgumentError(
            absl::StrCat(path, ":", line, ": line of more than ", limits.max_line_bytes,
                         " bytes; the limit is ", limits.max_line_bytes));
        break;
      }
      if (!line_started && c != ' ' && c != '\t' && c != '\r') {
        line_started = true;
        if (c != '{') {
          status = absl::InvalidArgumentError(absl::StrCat(
              path, ":", line, ": the line starts with '", Printable(std::string_view(&c, 1)),
              "', not '{': every line of a trace is a JSON object"));
          break;
        }
      }
    }
    if (status.ok()) text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  CKV_RETURN_IF_ERROR(status);
  return text;
}

absl::StatusOr<std::vector<TraceTurn>> ReadTraceFile(const std::string& path,
                                                     const TraceLimits& limits) {
  CKV_ASSIGN_OR_RETURN(const std::string text, ReadTraceText(path, limits));
  return ParseTrace(text, path, limits);
}

}  // namespace ckv::tools
