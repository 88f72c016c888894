// The bytes KV tests write into blocks: a pure function of (seed, logical
// block index, byte), so any process can check what another one wrote.
#pragma once

#include <cstddef>
#include <cstdint>

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

}  // namespace airs::test
