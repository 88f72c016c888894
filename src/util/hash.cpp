// SPDX-License-Identifier: Apache-2.0
#include "util/hash.hpp"

#include <sys/random.h>

#include <xxhash.h>

namespace airs {

uint64_t process_hash_seed() {
  static const uint64_t seed = [] {
    uint64_t s = 0;
    // getrandom never fails for 8 bytes once the pool is initialised; if it
    // did, a fixed seed only loses flood resistance, not correctness.
    if (getrandom(&s, sizeof s, 0) != static_cast<ssize_t>(sizeof s)) s = 0x9e3779b97f4a7c15ULL;
    return s;
  }();
  return seed;
}

uint64_t hash_bytes(const void* data, size_t len, uint64_t seed) { return XXH3_64bits_withSeed(data, len, seed); }

}  // namespace airs
