// SPDX-License-Identifier: Apache-2.0
// Byte-count helpers. Sizes are uint64_t bytes everywhere; nothing here
// assumes a page size (those come from sysconf/sysfs at run time).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace airs {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;
inline constexpr uint64_t kGiB = 1024 * kMiB;

// Round `v` up to a multiple of `align` (align > 0, any value). Returns
// nullopt on overflow.
[[nodiscard]] constexpr std::optional<uint64_t> round_up(uint64_t v, uint64_t align) {
  const uint64_t rem = v % align;
  if (rem == 0) return v;
  const uint64_t add = align - rem;
  if (v > UINT64_MAX - add) return std::nullopt;
  return v + add;
}

[[nodiscard]] constexpr uint64_t div_round_up(uint64_t v, uint64_t d) { return v / d + (v % d != 0); }

[[nodiscard]] constexpr bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// "1.5 GiB", "512 KiB", "17 B".
[[nodiscard]] std::string format_bytes(uint64_t bytes);

// Parses "4G", "512M", "2GiB", "1048576", "64 KiB" (binary units). nullopt on
// malformed input or overflow.
[[nodiscard]] std::optional<uint64_t> parse_bytes(std::string_view text);

}  // namespace airs
