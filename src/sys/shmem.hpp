// SPDX-License-Identifier: Apache-2.0
// shmem files (memfds without MFD_HUGETLB, or files on a private tmpfs
// mounted huge=within_size) and page pinning with mlock: the pool's memory on
// kernels without hugetlbfs (the small-pages and cooperative modes).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::sys {

// A new memfd (MFD_CLOEXEC, no MFD_HUGETLB): shmem base pages, `size` bytes,
// no pages yet. `name` shows in /proc/PID/fd. Sealed: F_SEAL_SEAL (nobody,
// not even a holder of an O_RDWR fd, adds seals later: a client's
// F_SEAL_SHRINK would stop an unload's truncation) and, with `fixed_size`,
// F_SEAL_GROW: a write or fallocate past the end fails with EPERM, so a
// write that lands after an unload truncated the file cannot bring it back
// (and with it zero-filled holes below the write).
[[nodiscard]] Result<UniqueFd> create_shmem_file(const std::string& name, uint64_t size, bool fixed_size);
// True when `fd` is sealed against growth (F_SEAL_GROW).
[[nodiscard]] bool sealed_against_growth(int fd);

// A tmpfs instance of our own, mounted huge=within_size with no size or inode
// limit (the pool bounds what it holds): fsopen + fsmount, a detached mount in
// no mount namespace, alive while the returned fd or a file on it is open.
// Its files get transparent huge pages (PMD-sized folios) whatever
// /sys/kernel/mm/transparent_hugepage/shmem_enabled says ("never" by
// default), which governs memfds only; "deny" turns them off here too (the
// caller checks). docs/shmem-huge-folios.md. Errors: ENOSYS (before 5.2),
// EPERM (no CAP_SYS_ADMIN, or a seccomp filter without @mount), EINVAL (a
// kernel without transparent huge pages refuses huge=).
[[nodiscard]] Result<UniqueFd> mount_huge_tmpfs();
// A new regular file on `mount` (a mount_huge_tmpfs fd or a directory on a
// tmpfs), 0600, unlinked at once: like a memfd, it lives as long as an fd or
// a mapping of it. `name` (a '/' becomes '_'; ".N" appended while another
// creator holds the name) shows in /proc/PID/maps as "/NAME (deleted)".
[[nodiscard]] Result<UniqueFd> create_tmpfs_file(int mount, const std::string& name);
// Whether files on the tmpfs holding directory `dir` get PMD-sized folios:
// a probe file (made and unlinked there) of `pmd` bytes takes one byte and
// must then hold all `pmd` of them. Errors: the probe file's.
[[nodiscard]] Result<bool> tmpfs_gives_huge_folios(int dir, uint64_t pmd);
// The PMD size of transparent huge pages
// (/sys/kernel/mm/transparent_hugepage/hpage_pmd_size), 0 when the kernel has
// none.
[[nodiscard]] uint64_t thp_pmd_size(
    const std::string& path = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
// The bracketed choice of /sys/kernel/mm/transparent_hugepage/shmem_enabled
// ("never", "deny", ...), empty when unreadable.
[[nodiscard]] std::string thp_shmem_enabled(
    const std::string& path = "/sys/kernel/mm/transparent_hugepage/shmem_enabled");

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

// The file's device and inode numbers (identify a file, memfd or tmpfs, for
// as long as it is open; inode numbers alone repeat across tmpfs instances).
struct InodeKey {
  uint64_t dev = 0;
  uint64_t ino = 0;
  auto operator<=>(const InodeKey&) const = default;
};
[[nodiscard]] Result<InodeKey> inode_key(int fd);
// The file's size (fstat st_size).
[[nodiscard]] Result<uint64_t> file_size(int fd);

// RLIMIT_MEMLOCK soft limit in bytes (UINT64_MAX for unlimited).
[[nodiscard]] uint64_t memlock_limit();

}  // namespace airs::sys
