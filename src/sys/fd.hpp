// SPDX-License-Identifier: Apache-2.0
// RAII for file descriptors and mappings. Everything the daemon opens is
// O_CLOEXEC; a UniqueFd closes exactly once and never throws.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace airs::sys {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// An mmap'd range, unmapped on destruction.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t len) noexcept : addr_(addr), len_(len) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  Mapping(Mapping&& o) noexcept : addr_(std::exchange(o.addr_, nullptr)), len_(std::exchange(o.len_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      addr_ = std::exchange(o.addr_, nullptr);
      len_ = std::exchange(o.len_, 0);
    }
    return *this;
  }
  ~Mapping() { reset(); }

  [[nodiscard]] void* get() const noexcept { return addr_; }
  [[nodiscard]] std::byte* bytes() const noexcept { return static_cast<std::byte*>(addr_); }
  [[nodiscard]] size_t size() const noexcept { return len_; }
  [[nodiscard]] bool valid() const noexcept { return addr_ != nullptr; }
  void reset() noexcept {
    if (addr_ != nullptr) ::munmap(addr_, len_);
    addr_ = nullptr;
    len_ = 0;
  }
  // Gives up ownership without unmapping.
  void* release() noexcept {
    len_ = 0;
    return std::exchange(addr_, nullptr);
  }

 private:
  void* addr_ = nullptr;
  size_t len_ = 0;
};

}  // namespace airs::sys
