// SPDX-License-Identifier: Apache-2.0
// Printable and IsPrintable (see include/ckv/log.h).
#include "ckv/log.h"

#include <algorithm>

namespace ckv {
namespace {

bool NeedsEscape(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u < 0x20 || u == 0x7f;
}

}  // namespace

bool IsPrintable(std::string_view s) { return std::none_of(s.begin(), s.end(), NeedsEscape); }

std::string Printable(std::string_view s) {
  if (IsPrintable(s)) return std::string(s);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 8);
  for (const char c : s) {
    if (!NeedsEscape(c)) {
      out.push_back(c);
      continue;
    }
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default: {
        const auto u = static_cast<unsigned char>(c);
        out += "\\x";
        out.push_back(kHex[u >> 4]);
        out.push_back(kHex[u & 0xf]);
      }
    }
  }
  return out;
}

}  // namespace ckv
