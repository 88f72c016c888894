// SPDX-License-Identifier: Apache-2.0
// Where the reader gets bytes from. The parser never does I/O itself: the
// daemon hands it an FdSource (gguf/file_source.hpp, target airs_gguf_io),
// tests and the fuzzer a MemorySource.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "util/result.hpp"

namespace airs::gguf {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Total size in bytes; constant for the source's lifetime.
  [[nodiscard]] virtual uint64_t size() const = 0;
  // Reads exactly `len` bytes at `offset` into `dst`. An error (EIO, or
  // EBADMSG for a range past size()) leaves `dst` unspecified. Callers keep
  // offset + len <= size(). Thread-safety is the implementation's.
  [[nodiscard]] virtual Status read(uint64_t offset, void* dst, size_t len) const = 0;
};

// A view of bytes owned by the caller, who keeps them alive and unchanged
// while the source is used. Thread-safe.
class MemorySource final : public ByteSource {
 public:
  explicit MemorySource(std::span<const std::byte> bytes) noexcept : bytes_(bytes) {}
  [[nodiscard]] uint64_t size() const override { return bytes_.size(); }
  [[nodiscard]] Status read(uint64_t offset, void* dst, size_t len) const override;

 private:
  std::span<const std::byte> bytes_;
};

}  // namespace airs::gguf
