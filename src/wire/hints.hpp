// SPDX-License-Identifier: Apache-2.0
// An expert hint: a client of a streamed mixture-of-experts model tells the
// daemon which experts of one layer it is about to read (its router chose
// them), before it touches them. One message, client → daemon, never
// answered: on a cooperative client's request socket (wire/requests.hpp)
// or on a lazy client's hint socket (Model.Hints). Both are SOCK_SEQPACKET,
// so a message keeps its boundaries; a hint is never 4 bytes long, which
// tells it from a request word on the request socket (a daemon that does
// not know hints ignores a message of another length).
//
// A prediction has the same layout with its own magic word: the client
// guesses which experts a later layer will read (say, the next layer's
// router on the current hidden state). The daemon may read them ahead, but
// counts no use of them and keeps nothing for them: a guess is not a read.
//
// Layout (host order, both ends run on one machine):
//   uint32 magic (kHintMagic, or kPredictMagic), uint32 layer, uint32 count,
//   count × uint32 expert
// `layer` is the block index (blk.N), `expert` the index in the layer's
// 3-D expert tensors. count is 1..kMaxHintExperts and the message exactly
// 12 + 4·count bytes. Header-only: shared by the daemon's pager and the
// client library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace airs::wire {

inline constexpr uint32_t kHintMagic = 0x48534558;     // "XESH" in memory: expert hint
inline constexpr uint32_t kPredictMagic = 0x50534558;  // "XESP" in memory: expert prediction
inline constexpr uint32_t kMaxHintExperts = 256;
inline constexpr size_t kHintHeaderBytes = 12;
inline constexpr size_t kMaxHintBytes = kHintHeaderBytes + 4 * kMaxHintExperts;

// Writes the hint (or, `predicted`, the prediction) into `out` (at least
// kMaxHintBytes long). Returns its length, 0 for an empty or too long list
// (nothing to send).
[[nodiscard]] inline size_t encode_hint(uint32_t layer, std::span<const uint32_t> experts, std::byte* out,
                                        bool predicted = false) {
  if (experts.empty() || experts.size() > kMaxHintExperts) return 0;
  const uint32_t head[3] = {predicted ? kPredictMagic : kHintMagic, layer, static_cast<uint32_t>(experts.size())};
  std::memcpy(out, head, sizeof head);
  std::memcpy(out + kHintHeaderBytes, experts.data(), experts.size() * 4);
  return kHintHeaderBytes + experts.size() * 4;
}

struct DecodedHint {
  // nullptr: a valid hint; else what is wrong with the message.
  const char* error = nullptr;
  bool predicted = false;  // a prediction (kPredictMagic), not a hint
  uint32_t layer = 0;
  uint32_t count = 0;
  uint32_t experts[kMaxHintExperts] = {};
};

// Checks and decodes one message of `len` bytes (the buffer may be longer:
// `len` is what arrived; a message cut at the buffer's end is too long).
[[nodiscard]] inline DecodedHint decode_hint(const std::byte* msg, size_t len) {
  DecodedHint h;
  if (len < kHintHeaderBytes) {
    h.error = "shorter than a hint's 12-byte header";
    return h;
  }
  if (len > kMaxHintBytes) {
    h.error = "longer than the longest hint (256 experts)";
    return h;
  }
  uint32_t head[3];
  std::memcpy(head, msg, sizeof head);
  if (head[0] != kHintMagic && head[0] != kPredictMagic) {
    h.error = "not a hint (wrong magic word)";
    return h;
  }
  if (head[2] == 0 || head[2] > kMaxHintExperts) {
    h.error = "an expert count of 0 or over 256";
    return h;
  }
  if (len != kHintHeaderBytes + size_t{head[2]} * 4) {
    h.error = "its length does not match its expert count";
    return h;
  }
  h.predicted = head[0] == kPredictMagic;
  h.layer = head[1];
  h.count = head[2];
  std::memcpy(h.experts, msg + kHintHeaderBytes, size_t{h.count} * 4);
  return h;
}

}  // namespace airs::wire
