// SPDX-License-Identifier: Apache-2.0
#include "util/units.hpp"

#include <cctype>
#include <charconv>

#include <fmt/format.h>

namespace airs {

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < kKiB) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++u;
  }
  if (v == static_cast<double>(static_cast<uint64_t>(v))) return fmt::format("{} {}", static_cast<uint64_t>(v), kUnits[u]);
  return fmt::format("{:.1f} {}", v, kUnits[u]);
}

std::optional<uint64_t> parse_bytes(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  uint64_t n = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc{} || p == text.data()) return std::nullopt;
  std::string_view unit(p, static_cast<size_t>(text.data() + text.size() - p));
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  uint64_t mul = 1;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "K" || unit == "KiB" || unit == "k") mul = kKiB;
  else if (unit == "M" || unit == "MiB") mul = kMiB;
  else if (unit == "G" || unit == "GiB") mul = kGiB;
  else if (unit == "T" || unit == "TiB") mul = kGiB * 1024;
  else return std::nullopt;
  if (n > UINT64_MAX / mul) return std::nullopt;
  return n * mul;
}

}  // namespace airs
