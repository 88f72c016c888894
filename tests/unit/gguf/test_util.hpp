// SPDX-License-Identifier: Apache-2.0
// Shared helpers for the gguf tests.
#pragma once

#include <cstring>
#include <vector>

#include "gguf/gguf.hpp"

namespace airs::gguf::testing {

// A large virtual file: `head` bytes, then zeros up to `size` (to test
// 1 GiB alignment without allocating it).
class SparseSource final : public ByteSource {
 public:
  SparseSource(std::vector<std::byte> head, uint64_t size) : head_(std::move(head)), size_(size) {}
  uint64_t size() const override { return size_; }
  Status read(uint64_t offset, void* dst, size_t len) const override {
    if (offset > size_ || len > size_ - offset) return make_error(EBADMSG, "sparse: past end");
    auto* p = static_cast<std::byte*>(dst);
    std::memset(p, 0, len);
    if (offset < head_.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(head_.size() - offset, len));
      std::memcpy(p, head_.data() + offset, n);
    }
    return {};
  }

 private:
  std::vector<std::byte> head_;
  uint64_t size_;
};

inline Result<File> parse_bytes(const std::vector<std::byte>& b, const ParseLimits& lim = {}) {
  MemorySource src(b);
  return parse(src, lim);
}

}  // namespace airs::gguf::testing
