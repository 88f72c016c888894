// SPDX-License-Identifier: Apache-2.0
// The devices of the kernel's internal mounts the daemon's memfds live on
// (one per huge page size, and one for base pages). No other party serves
// them, so closing one of their files never waits on anyone (the daemon's
// close(), in daemon/close_guard.cpp, asks). A device is noted when the
// daemon creates a memfd there, and by that close() for the libraries'
// memfds. Only those: they live as long as the kernel, so their numbers are
// never given to another file system, as a tmpfs's number is once it is
// gone. Lock-free: read from any thread, in any close().
#pragma once

#include <cstdint>

namespace airs::sys {

// Notes the device of `fd`'s file system (its st_dev).
void note_own_device(int fd) noexcept;
[[nodiscard]] bool is_own_device(uint64_t dev) noexcept;

}  // namespace airs::sys
