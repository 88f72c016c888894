// SPDX-License-Identifier: Apache-2.0
#include "sys/hugetlbfs.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include "sys/own_devices.hpp"
#include "sys/procfs.hpp"
#include "util/units.hpp"

namespace airs::sys {

uint64_t base_page_size() {
  const long v = ::sysconf(_SC_PAGESIZE);
  return v > 0 ? static_cast<uint64_t>(v) : 4096;
}

Result<uint64_t> default_huge_page_size(const std::string& meminfo) {
  auto mi = read_meminfo(meminfo);
  if (!mi) return std::move(mi).error();
  auto it = mi->find("Hugepagesize");
  return it == mi->end() ? 0 : it->second;
}

namespace {

// "pagesize=2M" / "pagesize=1024M" / "pagesize=1G" → bytes.
std::optional<uint64_t> parse_pagesize_option(const std::string& opts) {
  std::stringstream ss(opts);
  std::string opt;
  while (std::getline(ss, opt, ',')) {
    if (opt.starts_with("pagesize=")) return parse_bytes(opt.substr(9));
  }
  return std::nullopt;
}

}  // namespace

Result<std::optional<std::string>> find_hugetlbfs_mount(uint64_t page_size, uint64_t default_page_size,
                                                        const std::string& mountinfo) {
  auto text = read_text_file(mountinfo, 16 << 20);
  if (!text) return std::move(text).error();
  for (auto& e : parse_mountinfo(*text)) {
    if (e.fstype != "hugetlbfs") continue;
    const uint64_t ps = parse_pagesize_option(e.super_options).value_or(default_page_size);
    if (ps != page_size) continue;
    if (::access(e.mount_point.c_str(), W_OK) != 0) continue;
    return std::optional<std::string>(std::move(e.mount_point));
  }
  return std::optional<std::string>();
}

Result<UniqueFd> create_hugetlb_file(const std::string& mount_dir, uint64_t page_size, const std::string& name) {
  if (!mount_dir.empty()) {
    UniqueFd fd(::open(mount_dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    if (fd) return fd;
    if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
      return make_error(errno, "cannot create a file on hugetlbfs mount {}: {}", mount_dir, std::strerror(errno));
    // No O_TMPFILE on this hugetlbfs: create, then unlink at once so a
    // crash leaks nothing but this instant.
    for (int attempt = 0; attempt < 100; ++attempt) {
      const std::string path = mount_dir + "/.airs-" + std::to_string(::getpid()) + "-" + std::to_string(attempt);
      UniqueFd f(::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
      if (!f) {
        if (errno == EEXIST) continue;
        return make_error(errno, "cannot create {}: {}", path, std::strerror(errno));
      }
      ::unlink(path.c_str());
      return f;
    }
    return make_error(EEXIST, "cannot create a unique file in {}", mount_dir);
  }
  if (!is_pow2(page_size)) return make_error(EINVAL, "huge page size {} is not a power of two", page_size);
  const unsigned shift = static_cast<unsigned>(__builtin_ctzll(page_size));
  const unsigned flags = MFD_CLOEXEC | MFD_HUGETLB | (shift << MFD_HUGE_SHIFT);
  UniqueFd fd(::memfd_create(name.c_str(), flags));
  if (fd) note_own_device(fd.get());  // each page size has its own internal mount
  if (!fd)
    return make_error(errno, "memfd_create(MFD_HUGETLB, {}) for {}: {} (kernel without hugetlbfs, or no pages of that size)",
                      format_bytes(page_size), name, std::strerror(errno));
  // 0777 by default: a read-only fd could be reopened writable through /proc.
  if (::fchmod(fd.get(), 0600) != 0) return make_error(errno, "fchmod 0600 of {}: {}", name, std::strerror(errno));
  return fd;
}

Status resize_file(int fd, uint64_t size, const std::string& what) {
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0)
    return make_error(errno, "{}: ftruncate to {} bytes: {}", what, size, std::strerror(errno));
  return {};
}

Status allocate_range(int fd, uint64_t offset, uint64_t len, const std::string& what) {
  for (;;) {
    if (::fallocate(fd, 0, static_cast<off_t>(offset), static_cast<off_t>(len)) == 0) return {};
    if (errno == EINTR) continue;
    return make_error(errno, "{}: fallocate [{}, +{}): {}", what, offset, len, std::strerror(errno));
  }
}

Status punch_range(int fd, uint64_t offset, uint64_t len, const std::string& what) {
  for (;;) {
    if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                    static_cast<off_t>(len)) == 0)
      return {};
    if (errno == EINTR) continue;
    return make_error(errno, "{}: punch hole [{}, +{}): {}", what, offset, len, std::strerror(errno));
  }
}

Result<uint64_t> allocated_bytes(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error(errno, "fstat: {}", std::strerror(errno));
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

Result<FsUsage> fs_usage(const std::string& path) {
  struct statfs s {};
  if (::statfs(path.c_str(), &s) != 0) return make_error(errno, "statfs {}: {}", path, std::strerror(errno));
  return FsUsage{static_cast<uint64_t>(s.f_bsize), static_cast<uint64_t>(s.f_blocks), static_cast<uint64_t>(s.f_bfree)};
}

}  // namespace airs::sys

namespace airs::sys {

Result<Mapping> map_shared(int fd, uint64_t len, int prot, int extra_flags, const std::string& what) {
  void* p = ::mmap(nullptr, len, prot, MAP_SHARED | extra_flags, fd, 0);
  if (p == MAP_FAILED) return make_error(errno, "{}: mmap of {} bytes: {}", what, len, std::strerror(errno));
  return Mapping(p, len);
}

}  // namespace airs::sys
