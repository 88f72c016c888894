// SPDX-License-Identifier: Apache-2.0
// The request socket between a cooperative client and the daemon (Model.Follow:
// one end of a SOCK_SEQPACKET socket pair the client made): one 4-byte word
// per message, host order (both ends run on one machine). The top two bits
// are the kind, the other 30 the unit (a model has fewer than 2^30 units).
//   client → daemon: Wait (read this unit next, I wait for it), Opened (I
//                    opened this ready unit of a streamed model: where I am),
//                    Closed (I closed this unit as asked: PROT_NONE again)
//   daemon → client: Close (close this unit of a streamed model and answer
//                    Closed; until you answer it stays in the pool)
// A message a side does not expect is ignored. Header-only: shared by the
// daemon's pager and the client library.
#pragma once

#include <cstdint>

namespace airs::wire {

enum class RequestKind : uint32_t { Wait = 0, Opened = 1, Closed = 2, Close = 3 };

inline constexpr uint32_t kRequestUnitMask = (uint32_t{1} << 30) - 1;

struct Request {
  RequestKind kind = RequestKind::Wait;
  uint32_t unit = 0;
};

[[nodiscard]] constexpr uint32_t encode_request(Request r) {
  return (static_cast<uint32_t>(r.kind) << 30) | (r.unit & kRequestUnitMask);
}

[[nodiscard]] constexpr Request decode_request(uint32_t word) {
  return Request{static_cast<RequestKind>(word >> 30), word & kRequestUnitMask};
}

}  // namespace airs::wire
