// SPDX-License-Identifier: Apache-2.0
#include "gguf/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "sys/files.hpp"

namespace airs::gguf {

Result<FdSource> FdSource::adopt(sys::UniqueFd fd, std::string name) {
  auto st = sys::stat_of(fd.get(), name);
  if (!st) return make_error(st.error().code, "gguf: stat '{}': {}", name, std::strerror(st.error().code));
  if (!S_ISREG(st->st_mode)) return make_error(EINVAL, "gguf: '{}' is not a regular file", name);
  return FdSource(std::move(fd), static_cast<uint64_t>(st->st_size), std::move(name));
}

Result<FdSource> FdSource::open(const std::string& path) {
  auto fd = sys::open_file(path, O_RDONLY);
  if (!fd) return make_error(fd.error().code, "gguf: cannot open '{}': {}", path, std::strerror(fd.error().code));
  return adopt(std::move(fd).value(), path);
}

void FdSource::mark_in_flight(std::atomic<int64_t>* since) noexcept {
  if (since == nullptr) return;
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  since->store(std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()),
               std::memory_order_relaxed);
}

Status FdSource::read(uint64_t offset, void* dst, size_t len) const {
  auto* p = static_cast<char*>(dst);
  while (len > 0) {
    mark_in_flight(read_since_);
    const auto n = sys::read_at(fd_.get(), p, len, offset);
    mark_done(read_since_);
    if (!n)
      return make_error(n.error().code, "'{}': read of {} bytes at {} failed: {}", name_, len, offset,
                        std::strerror(n.error().code));
    if (*n == 0) return make_error(EBADMSG, "'{}': unexpected end of file at byte {} (file shrank?)", name_, offset);
    p += *n;
    len -= *n;
    offset += *n;
  }
  return {};
}

Status write_model(const ModelPlan& plan, int fd, const std::string& name) {
  constexpr size_t kChunk = 8 << 20;
  std::vector<std::byte> buf(static_cast<size_t>(std::min<uint64_t>(kChunk, plan.file_size)));
  for (uint64_t off = 0; off < plan.file_size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), plan.file_size - off));
    std::span<std::byte> chunk(buf.data(), n);
    AIRS_TRY(expected_file_bytes(plan, off, chunk));
    size_t done = 0;
    if (auto st = sys::write_all(fd, chunk, &done); !st)
      return make_error(st.error().code, "writing model '{}' at byte {}: {}", name, off + done,
                        std::strerror(st.error().code));
    off += n;
  }
  return {};
}

Status write_model_file(const ModelPlan& plan, const std::string& path) {
  auto fd = sys::open_file(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (!fd) return make_error(fd.error().code, "cannot create model file '{}': {}", path, std::strerror(fd.error().code));
  AIRS_TRY(write_model(plan, fd->get(), path));
  if (auto st = sys::close_file(std::move(fd).value()); !st)
    return make_error(st.error().code, "closing model file '{}': {}", path, std::strerror(st.error().code));
  return {};
}

}  // namespace airs::gguf
