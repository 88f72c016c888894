// SPDX-License-Identifier: Apache-2.0
// The I/O half of gguf (target airs_gguf_io): a pread-backed ByteSource and
// streaming the synthetic models to disk. Kept out of airs_gguf so the
// parser and writer stay pure.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "gguf/byte_source.hpp"
#include "gguf/writer.hpp"
#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::gguf {

// Reads a file through pread. Owns the fd. size() is taken once at open
// (fstat); a file that shrinks later gives EBADMSG on read past its end.
// Thread-safe (pread has no shared position).
class FdSource final : public ByteSource {
 public:
  // Opens `path` O_RDONLY|O_CLOEXEC. Errors: errno of open/fstat, or EINVAL
  // for something that is not a regular file or block device.
  [[nodiscard]] static Result<FdSource> open(const std::string& path);
  // Takes ownership of an already open, readable fd (e.g. one a client sent).
  [[nodiscard]] static Result<FdSource> adopt(sys::UniqueFd fd, std::string name);

  [[nodiscard]] uint64_t size() const override { return size_; }
  [[nodiscard]] Status read(uint64_t offset, void* dst, size_t len) const override;
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  // While a read is in flight, `*since` holds when it started (steady clock,
  // nanoseconds, never 0); between reads it holds 0. Lets another thread tell
  // a read that does not return from a parse that is merely long.
  void watch_reads(std::atomic<int64_t>* since) noexcept { read_since_ = since; }
  // What a read does to `*since` (null: nothing): marks one in flight from
  // now, and none. For other blocking calls on the same file, timed alike.
  static void mark_in_flight(std::atomic<int64_t>* since) noexcept;
  static void mark_done(std::atomic<int64_t>* since) noexcept {
    if (since != nullptr) since->store(0, std::memory_order_relaxed);
  }

 private:
  FdSource(sys::UniqueFd fd, uint64_t size, std::string name) : fd_(std::move(fd)), size_(size), name_(std::move(name)) {}
  sys::UniqueFd fd_;
  uint64_t size_ = 0;
  std::string name_;
  std::atomic<int64_t>* read_since_ = nullptr;
};

// Writes the planned model to `fd` from its current position, sequentially,
// in large chunks (streams multi-GiB files; memory use is one chunk).
// Errors: errno of write (ENOSPC...), naming `name`.
[[nodiscard]] Status write_model(const ModelPlan& plan, int fd, const std::string& name);

// Creates or truncates `path` (mode 0644) and writes the model to it.
[[nodiscard]] Status write_model_file(const ModelPlan& plan, const std::string& path);

}  // namespace airs::gguf
