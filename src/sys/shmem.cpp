// SPDX-License-Identifier: Apache-2.0
#include "sys/shmem.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "sys/hugetlbfs.hpp"
#include "sys/own_devices.hpp"
#include "sys/procfs.hpp"

namespace airs::sys {

Result<UniqueFd> create_shmem_file(const std::string& name, uint64_t size, bool fixed_size) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return make_error(errno, "memfd_create for {}: {}", name, std::strerror(errno));
  note_own_device(fd.get());
  // memfd inodes are created 0777: anyone handed an O_RDONLY fd could reopen
  // it writable through /proc/self/fd. Only the daemon may write.
  if (::fchmod(fd.get(), 0600) != 0) return make_error(errno, "fchmod 0600 of {}: {}", name, std::strerror(errno));
  AIRS_TRY(resize_file(fd.get(), size, name));
  const int seals = F_SEAL_SEAL | (fixed_size ? F_SEAL_GROW : 0);
  if (::fcntl(fd.get(), F_ADD_SEALS, seals) != 0)
    return make_error(errno, "sealing {}: {}", name, std::strerror(errno));
  return fd;
}

bool sealed_against_growth(int fd) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & F_SEAL_GROW) != 0;
}

namespace {

// The new mount API (Linux 5.2); glibc 2.36 wraps it, older ones do not.
constexpr unsigned kFsopenCloexec = 1;        // FSOPEN_CLOEXEC
constexpr unsigned kFsconfigSetString = 1;    // FSCONFIG_SET_STRING
constexpr unsigned kFsconfigCmdCreate = 6;    // FSCONFIG_CMD_CREATE
constexpr unsigned kFsmountCloexec = 1;       // FSMOUNT_CLOEXEC

}  // namespace

Result<UniqueFd> mount_huge_tmpfs() {
  UniqueFd fs(static_cast<int>(::syscall(SYS_fsopen, "tmpfs", kFsopenCloexec)));
  if (!fs) return make_error(errno, "fsopen(tmpfs): {}", std::strerror(errno));
  for (const auto& [key, value] : {std::pair{"huge", "within_size"}, {"size", "0"}, {"nr_inodes", "0"}, {"mode", "0700"}})
    if (::syscall(SYS_fsconfig, fs.get(), kFsconfigSetString, key, value, 0) != 0)
      return make_error(errno, "tmpfs option {}={}: {}", key, value, std::strerror(errno));
  if (::syscall(SYS_fsconfig, fs.get(), kFsconfigCmdCreate, nullptr, nullptr, 0) != 0)
    return make_error(errno, "creating a tmpfs instance (huge=within_size): {}", std::strerror(errno));
  UniqueFd mnt(static_cast<int>(::syscall(SYS_fsmount, fs.get(), kFsmountCloexec, 0)));
  if (!mnt) return make_error(errno, "fsmount(tmpfs): {}", std::strerror(errno));
  return mnt;
}

Result<UniqueFd> create_tmpfs_file(int mount, const std::string& name) {
  std::string n = name.empty() ? std::string("airs") : name.substr(0, 200);
  std::replace(n.begin(), n.end(), '/', '_');
  // Each file is unlinked as soon as it exists, so a name is taken only for
  // that moment: by another daemon sharing the directory (pool.shmem_mount),
  // then the next suffix is tried.
  for (int i = 0; i < 64; ++i) {
    const std::string path = i == 0 ? n : n + "." + std::to_string(i);
    UniqueFd fd(::openat(mount, path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd && errno == EEXIST) continue;
    if (!fd) return make_error(errno, "creating {} on the huge-page tmpfs: {}", path, std::strerror(errno));
    if (::unlinkat(mount, path.c_str(), 0) != 0)
      return make_error(errno, "unlinking {} on the huge-page tmpfs: {}", path, std::strerror(errno));
    return fd;
  }
  return make_error(EEXIST, "creating {} on the huge-page tmpfs: 64 names in use", n);
}

Result<bool> tmpfs_gives_huge_folios(int dir, uint64_t pmd) {
  auto fd = create_tmpfs_file(dir, "airs-huge-folio-probe");
  if (!fd) return std::move(fd).error();
  if (::ftruncate(fd->get(), static_cast<off_t>(pmd)) != 0)
    return make_error(errno, "sizing the huge folio probe: {}", std::strerror(errno));
  const char byte = 1;
  if (::pwrite(fd->get(), &byte, 1, 0) != 1)
    return make_error(errno, "writing the huge folio probe: {}", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return make_error(errno, "fstat of the huge folio probe: {}", std::strerror(errno));
  return static_cast<uint64_t>(st.st_blocks) * 512 >= pmd;
}

uint64_t thp_pmd_size(const std::string& path) {
  auto v = read_u64_file(path);
  return v ? *v : 0;
}

std::string thp_shmem_enabled(const std::string& path) {
  auto t = read_text_file(path);
  if (!t) return {};
  const auto b = t->find('[');
  const auto e = t->find(']', b);
  return b == std::string::npos || e == std::string::npos ? std::string() : t->substr(b + 1, e - b - 1);
}

uint64_t memlock_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 0;
  return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(rl.rlim_cur);
}

namespace {

Status lock_error(int err, uint64_t len, const std::string& what) {
  if (err == EPERM || err == EAGAIN || err == ENOMEM) {
    const uint64_t lim = memlock_limit();
    return make_error(err,
                      "mlock of {} bytes of {} failed: {} (RLIMIT_MEMLOCK is {}): the shmem pool pins its pages; "
                      "run the daemon with CAP_IPC_LOCK or LimitMEMLOCK=infinity in its systemd unit "
                      "(`ulimit -l unlimited` by hand), or make the pool smaller",
                      len, what, std::strerror(err), lim == UINT64_MAX ? std::string("unlimited") : std::to_string(lim));
  }
  return make_error(err, "mlock of {} bytes of {}: {}", len, what, std::strerror(err));
}

}  // namespace

Status lock_range(void* addr, uint64_t len, const std::string& what) {
  if (len == 0) return {};
  if (::mlock(addr, len) == 0) return {};
  return lock_error(errno, len, what);
}

Status lock_range_on_fault(void* addr, uint64_t len, const std::string& what) {
  if (len == 0) return {};
  if (::mlock2(addr, len, MLOCK_ONFAULT) == 0) return {};
  return lock_error(errno, len, what);
}

Status unlock_range(void* addr, uint64_t len, const std::string& what) {
  if (len == 0) return {};
  if (::munlock(addr, len) != 0) return make_error(errno, "munlock of {} bytes of {}: {}", len, what, std::strerror(errno));
  return {};
}

Result<InodeKey> inode_key(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error(errno, "fstat of fd {}: {}", fd, std::strerror(errno));
  return InodeKey{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

Result<uint64_t> file_size(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error(errno, "fstat of fd {}: {}", fd, std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace airs::sys
