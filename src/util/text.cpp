// SPDX-License-Identifier: Apache-2.0
#include "util/text.hpp"

namespace airs {
namespace {

// Length of the valid, printable UTF-8 sequence at s[i], or 0.
size_t printable_char(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x20 || c == 0x7f || c == '\\' || c == '"') return 0;
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0;
  if ((c & 0xe0) == 0xc0) {
    n = 2;
    cp = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    n = 3;
    cp = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3f);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;  // overlong, surrogate
  if (cp >= 0x80 && cp <= 0x9f) return 0;                                       // C1 controls (CSI)
  // Bidirectional formatting (LRM/RLM, embeddings and overrides, isolates):
  // they reorder what follows on a terminal or a dashboard, so a name could
  // show as another.
  if (cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069)) return 0;
  return n;
}

}  // namespace

bool is_valid_name(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameBytes) return false;
  for (size_t i = 0; i < s.size();) {
    const size_t n = printable_char(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string printable_name(std::string_view s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t n = printable_char(s, i);
    const std::string_view piece = n == 0 ? std::string_view("?") : s.substr(i, n);
    if (out.size() + piece.size() > max) break;
    out += piece;
    i += n == 0 ? 1 : n;
  }
  return out.empty() ? std::string("?") : out;
}

}  // namespace airs
