// SPDX-License-Identifier: Apache-2.0
// Printable and IsPrintable (see include/ckv/log.h).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ckv/log.h"

namespace ckv {
namespace {

// Bytes of the valid UTF-8 sequence starting at s[i] whose code point is not a C0 or C1
// control or DEL; 0 when there is none there (a control, a stray or truncated byte).
size_t PrintableSequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = b(i);
  if (lead < 0x80) return lead >= 0x20 && lead != 0x7f ? 1 : 0;
  size_t n = 0;
  uint32_t cp = 0;
  if (lead >= 0xc2 && lead <= 0xdf) {
    n = 2;
    cp = lead & 0x1f;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    n = 3;
    cp = lead & 0x0f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    n = 4;
    cp = lead & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (b(i + k) & 0x3f);
  }
  // Overlong forms, surrogates, past U+10FFFF, and the C1 controls (U+0080..U+009F, which some
  // terminals obey as CSI, OSC, ... when they arrive UTF-8 encoded).
  const uint32_t min = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
  if (cp < min || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff || cp <= 0x9f) return 0;
  return n;
}

}  // namespace

bool IsPrintable(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = PrintableSequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string Printable(std::string_view s) {
  if (IsPrintable(s)) return std::string(s);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    const size_t n = PrintableSequence(s, i);
    if (n > 0) {
      out.append(s, i, n);
      i += n;
      continue;
    }
    const char c = s[i++];
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
