#include "sys/shmem.hpp"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace airs::sys {

Result<UniqueFd> create_shmem_file(const std::string& name) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC));
  if (!fd) return make_error(errno, "memfd_create for {}: {}", name, std::strerror(errno));
  // memfd inodes are created 0777: anyone handed an O_RDONLY fd could reopen
  // it writable through /proc/self/fd. Only the daemon may write.
  if (::fchmod(fd.get(), 0600) != 0) return make_error(errno, "fchmod 0600 of {}: {}", name, std::strerror(errno));
  return fd;
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

Result<uint64_t> file_inode(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error(errno, "fstat of fd {}: {}", fd, std::strerror(errno));
  return static_cast<uint64_t>(st.st_ino);
}

Result<uint64_t> file_size(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error(errno, "fstat of fd {}: {}", fd, std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace airs::sys
