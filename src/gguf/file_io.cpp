// SPDX-License-Identifier: Apache-2.0
#include "gguf/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace airs::gguf {

Result<FdSource> FdSource::adopt(sys::UniqueFd fd, std::string name) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return make_error(errno, "gguf: stat '{}': {}", name, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return make_error(EINVAL, "gguf: '{}' is not a regular file", name);
  return FdSource(std::move(fd), static_cast<uint64_t>(st.st_size), std::move(name));
}

Result<FdSource> FdSource::open(const std::string& path) {
  sys::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return make_error(errno, "gguf: cannot open '{}': {}", path, std::strerror(errno));
  return adopt(std::move(fd), path);
}

Status FdSource::read(uint64_t offset, void* dst, size_t len) const {
  auto* p = static_cast<char*>(dst);
  while (len > 0) {
    const ssize_t n = ::pread(fd_.get(), p, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(errno, "'{}': read of {} bytes at {} failed: {}", name_, len, offset, std::strerror(errno));
    }
    if (n == 0) return make_error(EBADMSG, "'{}': unexpected end of file at byte {} (file shrank?)", name_, offset);
    p += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
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
    while (done < n) {
      const ssize_t w = ::write(fd, chunk.data() + done, n - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        return make_error(errno, "writing model '{}' at byte {}: {}", name, off + done, std::strerror(errno));
      }
      done += static_cast<size_t>(w);
    }
    off += n;
  }
  return {};
}

Status write_model_file(const ModelPlan& plan, const std::string& path) {
  sys::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return make_error(errno, "cannot create model file '{}': {}", path, std::strerror(errno));
  AIRS_TRY(write_model(plan, fd.get(), path));
  if (::close(fd.release()) != 0) return make_error(errno, "closing model file '{}': {}", path, std::strerror(errno));
  return {};
}

}  // namespace airs::gguf
