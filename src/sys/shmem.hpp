// shmem (memfd without MFD_HUGETLB) files and page pinning with mlock: the
// pool's memory on kernels without hugetlbfs (DESIGN §2.7, small-pages and
// cooperative modes).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::sys {

// A new memfd (MFD_CLOEXEC, no MFD_HUGETLB): shmem base pages. Empty; size it
// with resize_file. `name` shows in /proc/PID/fd.
[[nodiscard]] Result<UniqueFd> create_shmem_file(const std::string& name);

// mlock(addr, len): populates the range and keeps its pages unevictable for
// as long as this mapping exists. Errors name RLIMIT_MEMLOCK and the fix
// (LimitMEMLOCK=infinity or CAP_IPC_LOCK).
[[nodiscard]] Status lock_range(void* addr, uint64_t len, const std::string& what);
// mlock2(addr, len, MLOCK_ONFAULT): nothing is populated; every page that
// is faulted into the range from now on (a write through it, an O_DIRECT
// read's page pinning, MADV_POPULATE_WRITE) is locked as it is mapped, with
// no further call. The limit is charged for the whole range at once. Same
// errors as lock_range.
[[nodiscard]] Status lock_range_on_fault(void* addr, uint64_t len, const std::string& what);
// munlock(addr, len).
[[nodiscard]] Status unlock_range(void* addr, uint64_t len, const std::string& what);

// The file's inode number (identifies a memfd for as long as it is open).
[[nodiscard]] Result<uint64_t> file_inode(int fd);
// The file's size (fstat st_size).
[[nodiscard]] Result<uint64_t> file_size(int fd);

// RLIMIT_MEMLOCK soft limit in bytes (UINT64_MAX for unlimited).
[[nodiscard]] uint64_t memlock_limit();

}  // namespace airs::sys
