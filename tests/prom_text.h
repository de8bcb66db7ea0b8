// SPDX-License-Identifier: Apache-2.0
// tests/prom_text.h: a strict reader of the Prometheus text exposition format (0.0.4), written
// apart from the engine's writer so that the tests check the text, not the writer against itself.
//
// ParsePromText accepts only: "# HELP name text", "# TYPE name type" (counter, gauge, histogram,
// summary, untyped) and sample lines `name{label="value",...} value`, with names
// [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]*, and \\, \" and \n escapes in label
// values. It checks that every family has one HELP and one TYPE before its samples, that each
// sample belongs to a family declared before it (a histogram's by its _bucket, _sum and _count
// suffixes), that counters end in _total, and, for each histogram series, that its buckets are
// cumulative with ascending le, end with +Inf, and that _count equals the +Inf bucket.
#ifndef CKV_TESTS_PROM_TEXT_H_
#define CKV_TESTS_PROM_TEXT_H_

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ckv::testing {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct PromText {
  std::map<std::string, std::string> help;  // family -> HELP text (unescaped)
  std::map<std::string, std::string> type;  // family -> TYPE
  std::vector<PromSample> samples;

  // The value of the one sample named `name` whose labels include `labels`; NaN when there is
  // none, or more than one.
  double Value(const std::string& name,
               const std::map<std::string, std::string>& labels = {}) const {
    double found = std::nan("");
    int n = 0;
    for (const PromSample& s : samples) {
      if (s.name != name) continue;
      bool match = true;
      for (const auto& [k, v] : labels) {
        auto it = s.labels.find(k);
        if (it == s.labels.end() || it->second != v) match = false;
      }
      if (match) {
        found = s.value;
        ++n;
      }
    }
    return n == 1 ? found : std::nan("");
  }
  size_t Count(const std::string& name) const {
    size_t n = 0;
    for (const PromSample& s : samples) n += s.name == name;
    return n;
  }
};

namespace prom_internal {

inline bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
inline bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

// Reads a metric name (labels: no ':') at `*p`; false when there is none.
inline bool ReadName(std::string_view line, size_t* p, std::string* out, bool label) {
  const size_t start = *p;
  if (*p >= line.size() || !IsNameStart(line[*p]) || (label && line[*p] == ':')) return false;
  while (*p < line.size() && IsNameChar(line[*p]) && !(label && line[*p] == ':')) ++*p;
  *out = std::string(line.substr(start, *p - start));
  return true;
}

inline bool ParseValue(std::string_view text, double* out) {
  if (text == "+Inf") return *out = INFINITY, true;
  if (text == "-Inf") return *out = -INFINITY, true;
  if (text == "NaN") return *out = NAN, true;
  if (text.empty()) return false;
  const std::string s(text);
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

inline std::string_view BaseOf(const std::string& name,
                               const std::map<std::string, std::string>& types) {
  for (std::string_view suffix : {"_bucket", "_sum", "_count"}) {
    std::string_view n = name;
    if (n.size() > suffix.size() && n.substr(n.size() - suffix.size()) == suffix) {
      std::string_view base = n.substr(0, n.size() - suffix.size());
      auto it = types.find(std::string(base));
      if (it != types.end() && it->second == "histogram") return base;
    }
  }
  return name;
}

}  // namespace prom_internal

// Parses `text`; on the first problem returns false with `*error` naming the line.
inline bool ParsePromText(std::string_view text, PromText* out, std::string* error) {
  using namespace prom_internal;
  *out = PromText{};
  size_t line_no = 0;
  auto fail = [&](std::string_view line, const std::string& why) {
    *error = "line " + std::to_string(line_no) + " '" + std::string(line) + "': " + why;
    return false;
  };
  if (!text.empty() && text.back() != '\n') {
    *error = "the text does not end with a newline";
    return false;
  }
  std::vector<std::string> sampled;  // families whose samples have begun, in order
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    ++line_no;
    if (line.empty()) return fail(line, "empty line");
    if (line[0] == '#') {
      const bool is_help = line.starts_with("# HELP ");
      const bool is_type = line.starts_with("# TYPE ");
      if (!is_help && !is_type) return fail(line, "a comment that is not HELP or TYPE");
      size_t p = 7;
      std::string name;
      if (!ReadName(line, &p, &name, false) || p >= line.size() || line[p] != ' ') {
        return fail(line, "bad metric name");
      }
      const std::string rest(line.substr(p + 1));
      for (const std::string& f : sampled) {
        if (f == name) return fail(line, "HELP/TYPE after the family's samples");
      }
      if (is_help) {
        if (out->help.count(name)) return fail(line, "second HELP");
        std::string unescaped;
        for (size_t i = 0; i < rest.size(); ++i) {
          if (rest[i] == '\\' && i + 1 < rest.size() &&
              (rest[i + 1] == '\\' || rest[i + 1] == 'n')) {
            unescaped += rest[i + 1] == 'n' ? '\n' : '\\';
            ++i;
          } else {
            unescaped += rest[i];
          }
        }
        out->help[name] = unescaped;
      } else {
        if (out->type.count(name)) return fail(line, "second TYPE");
        if (rest != "counter" && rest != "gauge" && rest != "histogram" && rest != "summary" &&
            rest != "untyped") {
          return fail(line, "unknown type");
        }
        if (rest == "counter" && !name.ends_with("_total")) {
          return fail(line, "a counter whose name does not end in _total");
        }
        out->type[name] = rest;
      }
      continue;
    }
    PromSample s;
    size_t p = 0;
    if (!ReadName(line, &p, &s.name, false)) return fail(line, "bad metric name");
    if (p < line.size() && line[p] == '{') {
      ++p;
      while (p < line.size() && line[p] != '}') {
        std::string key;
        if (!ReadName(line, &p, &key, true)) return fail(line, "bad label name");
        if (p + 1 >= line.size() || line[p] != '=' || line[p + 1] != '"') {
          return fail(line, "label without =\"");
        }
        p += 2;
        std::string value;
        bool closed = false;
        while (p < line.size()) {
          const char c = line[p++];
          if (c == '"') {
            closed = true;
            break;
          }
          if (c == '\\') {
            if (p >= line.size()) return fail(line, "dangling escape");
            const char e = line[p++];
            if (e == '\\')
              value += '\\';
            else if (e == '"')
              value += '"';
            else if (e == 'n')
              value += '\n';
            else
              return fail(line, "bad escape");
          } else {
            value += c;
          }
        }
        if (!closed) return fail(line, "unterminated label value");
        if (s.labels.count(key)) return fail(line, "repeated label " + key);
        s.labels[key] = value;
        if (p < line.size() && line[p] == ',') ++p;
      }
      if (p >= line.size()) return fail(line, "unterminated labels");
      ++p;
    }
    if (p >= line.size() || line[p] != ' ') return fail(line, "no space before the value");
    if (!ParseValue(line.substr(p + 1), &s.value)) return fail(line, "bad value");
    const std::string family(BaseOf(s.name, out->type));
    if (!out->help.count(family) || !out->type.count(family)) {
      return fail(line, "sample of family " + family + " without HELP and TYPE");
    }
    if (out->type[family] == "histogram" && family == s.name) {
      return fail(line, "a histogram sample without _bucket, _sum or _count");
    }
    if (out->type[family] != "histogram" && family != s.name) {
      return fail(line, "suffixed sample of a non-histogram");
    }
    if (sampled.empty() || sampled.back() != family) {
      for (const std::string& f : sampled) {
        if (f == family) return fail(line, "family " + family + " is not contiguous");
      }
      sampled.push_back(family);
    }
    out->samples.push_back(std::move(s));
  }
  for (const auto& [name, type] : out->type) {
    if (!out->help.count(name)) {
      *error = "family " + name + " has TYPE and no HELP";
      return false;
    }
  }
  for (const auto& [name, h] : out->help) {
    if (!out->type.count(name)) {
      *error = "family " + name + " has HELP and no TYPE";
      return false;
    }
  }
  // Histograms: per series (labels other than le), cumulative buckets ending in +Inf == _count.
  for (const auto& [family, type] : out->type) {
    if (type != "histogram") continue;
    std::map<std::map<std::string, std::string>, std::vector<std::pair<double, double>>> buckets;
    for (const PromSample& s : out->samples) {
      if (s.name != family + "_bucket") continue;
      auto labels = s.labels;
      auto le = labels.find("le");
      double bound = 0;
      if (le == labels.end() || !ParseValue(le->second, &bound)) {
        *error = family + "_bucket without a numeric le";
        return false;
      }
      labels.erase(le);
      buckets[labels].emplace_back(bound, s.value);
    }
    if (buckets.empty()) {
      *error = "histogram " + family + " has no buckets";
      return false;
    }
    for (const auto& [labels, series] : buckets) {
      for (size_t i = 1; i < series.size(); ++i) {
        if (!(series[i].first > series[i - 1].first) || series[i].second < series[i - 1].second) {
          *error = "histogram " + family + ": buckets not ascending or not cumulative at " +
                   std::to_string(i);
          return false;
        }
      }
      if (!std::isinf(series.back().first)) {
        *error = "histogram " + family + " does not end with le=\"+Inf\"";
        return false;
      }
      double count = std::nan("");
      bool has_sum = false;
      for (const PromSample& s : out->samples) {
        if (s.labels != labels) continue;
        if (s.name == family + "_count") count = s.value;
        if (s.name == family + "_sum") has_sum = true;
      }
      if (!has_sum || count != series.back().second) {
        *error = "histogram " + family + ": _sum missing or _count != the +Inf bucket";
        return false;
      }
    }
  }
  return true;
}

}  // namespace ckv::testing

#endif  // CKV_TESTS_PROM_TEXT_H_
