// SPDX-License-Identifier: Apache-2.0
#include "gguf/byte_source.hpp"

#include <cstring>

namespace airs::gguf {

Status MemorySource::read(uint64_t offset, void* dst, size_t len) const {
  if (offset > bytes_.size() || len > bytes_.size() - offset) {
    return make_error(EBADMSG, "memory source: read of {} bytes at {} is past the end ({} bytes)", len, offset,
                      bytes_.size());
  }
  if (len != 0) std::memcpy(dst, bytes_.data() + offset, len);
  return {};
}

}  // namespace airs::gguf
