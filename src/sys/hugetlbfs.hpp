// SPDX-License-Identifier: Apache-2.0
// hugetlbfs: mount discovery, file creation (unlinked files on a mount, or
// memfd_create(MFD_HUGETLB), which is the same hugetlbfs), fallocate/punch,
// statfs. Nothing here assumes a page size: callers pass the huge page size
// they discovered from sysfs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::sys {

// The base (small) page size from sysconf.
[[nodiscard]] uint64_t base_page_size();

// The kernel's default huge page size (/proc/meminfo Hugepagesize), 0 if none.
[[nodiscard]] Result<uint64_t> default_huge_page_size(const std::string& meminfo = "/proc/meminfo");

// First hugetlbfs mount point whose page size (the pagesize= option, or the
// default size when absent) is `page_size`; nullopt if there is none.
[[nodiscard]] Result<std::optional<std::string>> find_hugetlbfs_mount(
    uint64_t page_size, uint64_t default_page_size, const std::string& mountinfo = "/proc/self/mountinfo");

// A new, already unlinked hugetlbfs file of `page_size` pages: O_TMPFILE in
// `mount_dir` when given (falling back to create+unlink when the mount does
// not support O_TMPFILE), else memfd_create(MFD_HUGETLB | size flag). The
// file is empty; size it with ftruncate. `name` shows in /proc/PID/fd.
[[nodiscard]] Result<UniqueFd> create_hugetlb_file(const std::string& mount_dir, uint64_t page_size,
                                                   const std::string& name);

// ftruncate with an error naming the file.
[[nodiscard]] Status resize_file(int fd, uint64_t size, const std::string& what);
// fallocate(0): allocates (and zeroes) every page of the range. On ENOSPC the
// pages already allocated stay; callers punch them back.
[[nodiscard]] Status allocate_range(int fd, uint64_t offset, uint64_t len, const std::string& what);
// fallocate(PUNCH_HOLE|KEEP_SIZE) over a page-aligned range: the pages go
// back to the kernel's free huge pages and every mapper's PTEs are zapped.
[[nodiscard]] Status punch_range(int fd, uint64_t offset, uint64_t len, const std::string& what);
// Bytes the file really holds (fstat st_blocks * 512).
[[nodiscard]] Result<uint64_t> allocated_bytes(int fd);

struct FsUsage {
  uint64_t block_size = 0;
  uint64_t blocks = 0;       // 0 when the mount has no size= limit
  uint64_t blocks_free = 0;
};
[[nodiscard]] Result<FsUsage> fs_usage(const std::string& path);

}  // namespace airs::sys

namespace airs::sys {

// mmap(nullptr, len, prot, MAP_SHARED | extra_flags, fd, 0) as an owned
// Mapping. On hugetlbfs, MAP_SHARED without MAP_NORESERVE reserves the pages
// (HugePages_Rsvd); ENOMEM then means the pool cannot back the range.
[[nodiscard]] Result<Mapping> map_shared(int fd, uint64_t len, int prot, int extra_flags, const std::string& what);

}  // namespace airs::sys
