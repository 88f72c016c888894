// SPDX-License-Identifier: Apache-2.0
// The test clients' byte check: whether n bytes of a model's mapping are
// the file's. Elsewhere it is memcmp (under ASan, its interceptor checks
// each range once; a loop of ours at -O0 checked every byte, and was half
// of a streaming test's time). Under TSan it is a loop that is not
// instrumented: a client compares every byte of models of tens of MiB, and
// through TSan's shadow memory (its page faults, on every range compared)
// that was nearly all of a test's time there. Nothing it reads is written
// by a thread of ours: the pages are filled by the kernel (a read, a
// CONTINUE), which TSan does not see either way, and the expected bytes
// are the client's own buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "util/sanitizers.hpp"

namespace airs::test {

#if defined(AIRS_TSAN)
__attribute__((no_sanitize("thread"))) inline bool same_bytes(const void* got, const void* want, uint64_t n) {
  const auto* a = static_cast<const unsigned char*>(got);
  const auto* b = static_cast<const unsigned char*>(want);
  for (uint64_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}
#else
inline bool same_bytes(const void* got, const void* want, uint64_t n) {
  return n == 0 || std::memcmp(got, want, n) == 0;
}
#endif

}  // namespace airs::test
