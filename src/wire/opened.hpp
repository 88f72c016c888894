// SPDX-License-Identifier: Apache-2.0
// A cooperative client's record of the units of a streamed model it has
// open (mapped PROT_READ): one bit per unit, in a memfd the client writes,
// seals against shrinking and growing, and hands the daemon with
// Model.Follow; the daemon maps it read-only. Together with the status
// page's READY bits it makes "drop a unit" and "open a unit" exclusive
// (a Dekker-style handshake, each side with a full fence between its
// write and its read, so at least one of them sees the other's write):
//   client, opening u:  set bit u; fence; READY(u)? mprotect PROT_READ
//                       : clear bit u and wait for it
//   daemon, dropping u: clear READY(u); fence; no client has bit u set?
//                       punch u : ask those clients to close u, and punch
//                       once each has (their bit is clear)
//   client, closing u:  mprotect PROT_NONE; clear bit u; answer Closed
// In one client a unit's open and its close take the same per-unit lock,
// so a close never slips between an open's check and its mprotect.
// Host order; header-only, shared by the daemon's pager and libairs.
#pragma once

#include <cstdint>

#include "util/sanitizers.hpp"

namespace airs::wire {

[[nodiscard]] constexpr uint64_t opened_bytes(uint32_t units) { return (uint64_t{units} + 63) / 64 * 8; }

class OpenedBits {
 public:
  OpenedBits() = default;
  OpenedBits(void* base, uint32_t units) : words_(static_cast<uint64_t*>(base)), units_(units) {}
  [[nodiscard]] bool valid() const { return words_ != nullptr; }
  [[nodiscard]] bool test(uint32_t u) const {
    return u < units_ && ((__atomic_load_n(&words_[u / 64], __ATOMIC_ACQUIRE) >> (u % 64)) & 1U) != 0;
  }
  // Client side.
  void set(uint32_t u) { __atomic_fetch_or(&words_[u / 64], uint64_t{1} << (u % 64), __ATOMIC_SEQ_CST); }
  void clear(uint32_t u) { __atomic_fetch_and(&words_[u / 64], ~(uint64_t{1} << (u % 64)), __ATOMIC_SEQ_CST); }
  // Either side, between its write and its read.
#if defined(AIRS_TSAN)
  // GCC refuses a fence under -fsanitize=thread (TSan does not model
  // fences); a seq_cst read-modify-write is a full barrier on the targets
  // we build, and TSan sees it.
  static void fence() {
    static uint64_t word = 0;
    (void)__atomic_fetch_add(&word, 0, __ATOMIC_SEQ_CST);
  }
#else
  static void fence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
#endif

 private:
  uint64_t* words_ = nullptr;
  uint32_t units_ = 0;
};

}  // namespace airs::wire
