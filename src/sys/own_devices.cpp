// SPDX-License-Identifier: Apache-2.0
#include "sys/own_devices.hpp"

#include <sys/stat.h>

#include <array>
#include <atomic>

namespace airs::sys {

namespace {

// A few at most: a tmpfs, and one internal mount per memfd page size.
std::array<std::atomic<uint64_t>, 32> g_devices{};  // 0: a free slot

}  // namespace

void note_own_device(int fd) noexcept {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_dev == 0) return;
  const auto dev = static_cast<uint64_t>(st.st_dev);
  for (auto& slot : g_devices) {
    uint64_t seen = slot.load(std::memory_order_acquire);
    if (seen == dev) return;
    if (seen == 0 && slot.compare_exchange_strong(seen, dev, std::memory_order_acq_rel)) return;
    if (seen == dev) return;  // another thread noted it here first
  }
}

bool is_own_device(uint64_t dev) noexcept {
  for (const auto& slot : g_devices) {
    const uint64_t d = slot.load(std::memory_order_acquire);
    if (d == dev) return true;
    if (d == 0) return false;  // slots fill in order
  }
  return false;
}

}  // namespace airs::sys
