// SPDX-License-Identifier: Apache-2.0
// A KV access report: how much of a session's KV its client read in one
// round of access sampling. libairs' sampler drops chunks that hold the
// session's blocks from the session's own mapping, and a round later counts
// how many of them came back (a touch maps a page again): `touched` of
// `chunks`, over `period_ms`. One message, client → daemon, never answered,
// on the session's wake channel (the socket the daemon's eviction wake-ups
// come on the other way: SOCK_SEQPACKET, so a message keeps its bounds).
//
// Layout (host order, both ends run on one machine):
//   uint32 magic (kKvAccessMagic), uint32 period_ms, uint32 chunks,
//   uint32 touched
// Exactly 16 bytes; 1 ≤ chunks, touched ≤ chunks, period_ms within
// [kMinKvSamplePeriodMs, kMaxKvSamplePeriodMs]. Header-only: shared by the
// daemon's KV service and the client library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace airs::wire {

inline constexpr uint32_t kKvAccessMagic = 0x4B414B58;  // "XKAK" in memory: KV access
inline constexpr size_t kKvAccessBytes = 16;
inline constexpr uint32_t kMinKvSamplePeriodMs = 10;
// At most 10 s: a report says whether a chunk was touched within one
// period, so a longer one would make rare reads look as busy as steady ones.
inline constexpr uint32_t kMaxKvSamplePeriodMs = 10'000;

struct KvAccess {
  uint32_t period_ms = 0;
  uint32_t chunks = 0;
  uint32_t touched = 0;
  // The share of the sampled chunks touched within the period.
  [[nodiscard]] double share() const { return static_cast<double>(touched) / static_cast<double>(chunks); }
};

// Writes the report into `out` (kKvAccessBytes); returns its length.
inline size_t encode_kv_access(const KvAccess& a, std::byte* out) {
  const uint32_t w[4] = {kKvAccessMagic, a.period_ms, a.chunks, a.touched};
  std::memcpy(out, w, sizeof w);
  return sizeof w;
}

struct DecodedKvAccess {
  const char* error = nullptr;  // nullptr: valid; else what is wrong
  KvAccess access;
};

// Checks and decodes one message of `len` bytes.
inline DecodedKvAccess decode_kv_access(const std::byte* msg, size_t len) {
  DecodedKvAccess d;
  if (len != kKvAccessBytes) {
    d.error = "not 16 bytes long";
    return d;
  }
  uint32_t w[4];
  std::memcpy(w, msg, sizeof w);
  d.access = KvAccess{w[1], w[2], w[3]};
  if (w[0] != kKvAccessMagic) d.error = "not a KV access report (wrong magic word)";
  else if (d.access.period_ms < kMinKvSamplePeriodMs || d.access.period_ms > kMaxKvSamplePeriodMs)
    d.error = "a sampling period out of range (10 ms to 10 s)";
  else if (d.access.chunks == 0) d.error = "a report over no chunks";
  else if (d.access.touched > d.access.chunks) d.error = "more chunks touched than sampled";
  return d;
}

}  // namespace airs::wire
