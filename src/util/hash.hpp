// SPDX-License-Identifier: Apache-2.0
// Hashing for untrusted keys. Tensor names and metadata keys come from files
// an attacker may craft; std::hash<string> in libstdc++ is unseeded, so a file
// full of colliding names would turn duplicate detection quadratic. XXH3 with
// a per-process random seed keeps lookups linear. The KV prefix chain uses the
// same function with seed 0 so clients and daemon agree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace airs {

// Per-process random seed, drawn once (getrandom) on first use.
[[nodiscard]] uint64_t process_hash_seed();

[[nodiscard]] uint64_t hash_bytes(const void* data, size_t len, uint64_t seed);

// A hasher for unordered containers keyed by untrusted strings.
struct SeededStringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept {
    return static_cast<size_t>(hash_bytes(s.data(), s.size(), process_hash_seed()));
  }
};

}  // namespace airs
