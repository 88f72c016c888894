// SPDX-License-Identifier: Apache-2.0
// The eviction notice page shared by the daemon (writer) and one session's
// client (reader): a ring of evicted block ids, and beside it a ring of one
// byte per id saying whether the block's bytes were spilled to the KV spill
// tier (1: a later MatchPrefix of its prefix can restore it instead of a
// recompute). The header also counts the blocks MatchPrefix restored from
// the tier into this session, written before the reply. The daemon appends the ids,
// then publishes `head` (release) and wakes the session's socket; the
// client reads from its own tail up to head (acquire). A client that fell
// more than `capacity` behind has lost track and must treat all its blocks
// as evicted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace airs::wire {

inline constexpr uint32_t kNoticeMagic = 0x4e524941;  // "AIRN"
inline constexpr uint16_t kNoticeVersion = 2;
inline constexpr uint32_t kNoticeHeaderBytes = 64;

struct NoticeHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t header_size;  // entries start here
  uint32_t capacity;     // entries in the ring
  uint32_t reserved;
  uint64_t head;         // block ids ever written; entry i is at i % capacity
  uint64_t generation;   // eviction events ever published
  uint64_t restored_blocks;  // blocks MatchPrefix restored from the spill tier into this session, ever
};
static_assert(sizeof(NoticeHeader) <= kNoticeHeaderBytes);

[[nodiscard]] constexpr uint64_t notice_page_bytes(uint32_t capacity) {
  return kNoticeHeaderBytes + uint64_t{capacity} * (sizeof(uint32_t) + sizeof(uint8_t));
}

// The daemon's side (single writer), over its own writable mapping.
class NoticeWriter {
 public:
  NoticeWriter() = default;
  NoticeWriter(void* base, uint32_t capacity) : base_(static_cast<std::byte*>(base)) {
    auto* h = header();
    h->magic = kNoticeMagic;
    h->version = kNoticeVersion;
    h->header_size = kNoticeHeaderBytes;
    h->capacity = capacity;
  }
  // Appends the ids with their spilled flags (`spilled` may be shorter:
  // missing flags are 0), then publishes head and generation (release).
  template <typename Range, typename Flags>
  void append(const Range& blocks, const Flags& spilled) {
    auto* h = header();
    auto* ring = reinterpret_cast<uint32_t*>(base_ + kNoticeHeaderBytes);
    auto* flags = reinterpret_cast<uint8_t*>(ring + h->capacity);
    uint64_t head = h->head;
    size_t i = 0;
    for (auto b : blocks) {
      flags[head % h->capacity] = i < std::size(spilled) && spilled[i] != 0 ? 1 : 0;
      ring[head++ % h->capacity] = static_cast<uint32_t>(b);
      ++i;
    }
    __atomic_store_n(&h->head, head, __ATOMIC_RELEASE);
    __atomic_add_fetch(&h->generation, 1, __ATOMIC_RELEASE);
  }
  void add_restored(uint64_t n) { __atomic_add_fetch(&header()->restored_blocks, n, __ATOMIC_RELEASE); }

 private:
  NoticeHeader* header() { return reinterpret_cast<NoticeHeader*>(base_); }
  std::byte* base_ = nullptr;
};

// A client's side: reads from its own tail up to head.
class NoticeReader {
 public:
  NoticeReader() = default;
  // Starts at the current head: notices before the session existed are not its.
  explicit NoticeReader(const void* base)
      : base_(static_cast<const std::byte*>(base)), tail_(__atomic_load_n(&header()->head, __ATOMIC_ACQUIRE)) {}
  [[nodiscard]] bool valid() const {
    return base_ != nullptr && header()->magic == kNoticeMagic && header()->version == kNoticeVersion &&
           header()->capacity > 0;
  }
  // Up to `cap` ids into `out` (and their spilled flags into `spilled`, if
  // not null); returns how many, or -1 if the reader fell more than
  // `capacity` behind (it skips to head: treat every block as lost).
  int64_t read(uint32_t* out, size_t cap, uint8_t* spilled = nullptr) {
    const uint64_t head = __atomic_load_n(&header()->head, __ATOMIC_ACQUIRE);
    const uint32_t capacity = header()->capacity;
    if (head - tail_ > capacity) {
      tail_ = head;
      return -1;
    }
    const auto* ring = reinterpret_cast<const uint32_t*>(base_ + kNoticeHeaderBytes);
    const auto* flags = reinterpret_cast<const uint8_t*>(ring + capacity);
    size_t n = 0;
    while (tail_ < head && n < cap) {
      if (spilled != nullptr) spilled[n] = flags[tail_ % capacity];
      out[n++] = ring[tail_++ % capacity];
    }
    return static_cast<int64_t>(n);
  }
  [[nodiscard]] uint64_t restored_blocks() const { return __atomic_load_n(&header()->restored_blocks, __ATOMIC_ACQUIRE); }

 private:
  [[nodiscard]] const NoticeHeader* header() const { return reinterpret_cast<const NoticeHeader*>(base_); }
  const std::byte* base_ = nullptr;
  uint64_t tail_ = 0;
};

}  // namespace airs::wire
