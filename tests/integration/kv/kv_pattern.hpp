// SPDX-License-Identifier: Apache-2.0
// The bytes KV tests write into blocks: a pure function of (seed, logical
// block index, byte), so any process can check what another one wrote; and
// the prefix hashes they publish blocks under.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "airs/airs.h"

namespace airs::test {

inline uint8_t kv_pattern(uint64_t seed, uint32_t index, uint64_t byte) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + uint64_t{index} * 0xBF58476D1CE4E5B9ull + byte / 8;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x >> ((byte % 8) * 8));
}

inline void kv_fill(void* block, uint64_t bytes, uint64_t seed, uint32_t index) {
  auto* p = static_cast<uint8_t*>(block);
  for (uint64_t j = 0; j < bytes; ++j) p[j] = kv_pattern(seed, index, j);
}

// Index of the first byte that differs from the pattern, or `bytes`.
inline uint64_t kv_check(const void* block, uint64_t bytes, uint64_t seed, uint32_t index) {
  const auto* p = static_cast<const uint8_t*>(block);
  for (uint64_t j = 0; j < bytes; ++j)
    if (p[j] != kv_pattern(seed, index, j)) return j;
  return bytes;
}

// The chained hashes of `blocks` full blocks of the token stream
// first_token, first_token + 1, ...
inline std::vector<uint64_t> chain(uint32_t blocks, uint32_t tokens_per_block, int32_t first_token = 100) {
  std::vector<uint64_t> h;
  uint64_t parent = 0;
  for (uint32_t b = 0; b < blocks; ++b) {
    std::vector<int32_t> t(tokens_per_block);
    for (uint32_t i = 0; i < tokens_per_block; ++i) t[i] = first_token + static_cast<int32_t>(b * tokens_per_block + i);
    parent = airs_kv_chain_hash(parent, t.data(), t.size());
    h.push_back(parent);
  }
  return h;
}

}  // namespace airs::test
