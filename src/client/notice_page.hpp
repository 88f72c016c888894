// The eviction notice page shared by the daemon (writer) and one session's
// client (reader): a ring of evicted block ids. The daemon appends the ids,
// then publishes `head` (release) and signals the session's eventfd; the
// client reads from its own tail up to head (acquire). A client that fell
// more than `capacity` behind has lost track and must treat all its blocks
// as evicted.
#pragma once

#include <cstddef>
#include <cstdint>

namespace airs::client {

inline constexpr uint32_t kNoticeMagic = 0x4e524941;  // "AIRN"
inline constexpr uint16_t kNoticeVersion = 1;
inline constexpr uint32_t kNoticeHeaderBytes = 64;

struct NoticeHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t header_size;  // entries start here
  uint32_t capacity;     // entries in the ring
  uint32_t reserved;
  uint64_t head;         // block ids ever written; entry i is at i % capacity
  uint64_t generation;   // eviction events ever published
};
static_assert(sizeof(NoticeHeader) <= kNoticeHeaderBytes);

[[nodiscard]] constexpr uint64_t notice_page_bytes(uint32_t capacity) {
  return kNoticeHeaderBytes + uint64_t{capacity} * sizeof(uint32_t);
}

}  // namespace airs::client
