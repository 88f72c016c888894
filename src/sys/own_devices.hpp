// SPDX-License-Identifier: Apache-2.0
// The devices of file systems the daemon makes itself: its private tmpfs,
// and the kernel's internal mounts its memfds live on. No other party
// serves them, so closing one of their files never waits on anyone (the
// daemon's close(), in daemon/close_guard.cpp, asks). A device is noted when
// the daemon creates a file or mount there. Lock-free: read from any thread,
// in any close().
#pragma once

#include <cstdint>

namespace airs::sys {

// Notes the device of `fd`'s file system (its st_dev).
void note_own_device(int fd) noexcept;
[[nodiscard]] bool is_own_device(uint64_t dev) noexcept;

}  // namespace airs::sys
