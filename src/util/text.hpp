// SPDX-License-Identifier: Apache-2.0
// Names that reach a terminal, a log line or a metrics label: model names
// come from callers and from GGUF metadata, so they are checked where they
// enter and made printable wherever they are shown.
#pragma once

#include <cstddef>
#include <string>
#include <cstdint>
#include <string_view>

namespace airs {

inline constexpr size_t kMaxNameBytes = 64;

// 1..kMaxNameBytes bytes, no control characters (C0, DEL, C1 as UTF-8), no
// backslash or quote (metrics labels, JSON, shells), valid UTF-8.
[[nodiscard]] bool is_valid_name(std::string_view s);

// `s` with every byte that is_valid_name would refuse replaced by '?' and cut
// to `max` bytes (at a character boundary). Never empty ("?" for "").
[[nodiscard]] std::string printable_name(std::string_view s, size_t max = kMaxNameBytes);

}  // namespace airs
