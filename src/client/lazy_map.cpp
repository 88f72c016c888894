#include "client/lazy_map.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "sys/hugetlbfs.hpp"
#include "sys/uffd.hpp"

namespace airs::client {

Status check_no_mlock_future() {
  const uint64_t ps = sys::base_page_size();
  void* p = ::mmap(nullptr, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return make_error(errno, "probing for mlockall: mmap: {}", std::strerror(errno));
  sys::Mapping probe(p, ps);
  unsigned char vec = 0;
  if (::mincore(p, ps, &vec) != 0) return make_error(errno, "probing for mlockall: mincore: {}", std::strerror(errno));
  if ((vec & 1U) != 0)
    return make_error(EBUSY, "mlockall(MCL_FUTURE) is active in this process: it would fill the model mapping with "
                             "zero pages before the daemon could load it; call munlockall() or lock only your own "
                             "buffers (mlock) before attaching a model lazily");
  return {};
}

Result<LazyMapping> LazyMapping::create(int region_fd, uint64_t size, LazyBacking backing) {
  AIRS_TRY(check_no_mlock_future());
  const int acc = ::fcntl(region_fd, F_GETFL);
  if (acc < 0) return make_error(errno, "model region fd: {}", std::strerror(errno));
  if ((acc & O_ACCMODE) != O_RDWR)
    return make_error(EPERM, "model region fd is not O_RDWR: userfaultfd registration needs a writable fd");
  LazyMapping lm;
  // No MAP_POPULATE, no MAP_LOCKED: nothing may touch the range before the
  // registration below.
  auto m = sys::map_shared(region_fd, size, PROT_READ, 0, "model region");
  if (!m) return std::move(m).error();
  lm.map_ = std::move(m).value();
  if (::madvise(lm.map_.get(), size, MADV_DONTFORK) != 0)
    return make_error(errno, "madvise(MADV_DONTFORK) on the model mapping: {}", std::strerror(errno));
  auto fd = sys::uffd_create();
  if (!fd) return std::move(fd).error();
  lm.uffd_ = std::move(fd).value();
  const uint64_t features = backing == LazyBacking::Hugetlbfs
                                ? (UFFD_FEATURE_MISSING_HUGETLBFS | UFFD_FEATURE_MINOR_HUGETLBFS)
                                : (UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_MINOR_SHMEM);
  auto api = sys::uffd_api(lm.uffd_.get(), features);
  if (!api) return std::move(api).error();
  auto reg = sys::uffd_register(lm.uffd_.get(), lm.address(), size,
                                UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR);
  if (!reg) return std::move(reg).error();
  if ((*reg & (uint64_t{1} << _UFFDIO_CONTINUE)) == 0)
    return make_error(EOPNOTSUPP, "the kernel does not allow UFFDIO_CONTINUE on the model mapping");
  lm.registered_ = true;
  return lm;
}

Result<sys::UniqueFd> LazyMapping::dup_uffd() const {
  sys::UniqueFd fd(::fcntl(uffd_.get(), F_DUPFD_CLOEXEC, 0));
  if (!fd) return make_error(errno, "dup of the userfaultfd: {}", std::strerror(errno));
  return fd;
}

Status LazyMapping::unregister() {
  if (!registered_) return {};
  AIRS_TRY(sys::uffd_unregister(uffd_.get(), address(), size()));
  registered_ = false;
  return {};
}

Result<std::unique_ptr<FallbackServer>> FallbackServer::create(const LazyMapping& mapping, int region_fd, int gguf_fd,
                                                               uint64_t file_size, StatusPageView status) {
  if (!status.valid()) return make_error(EINVAL, "fallback: the model's status page is not valid");
  auto s = std::unique_ptr<FallbackServer>(new FallbackServer());
  s->uffd_ = mapping.uffd();
  s->base_ = mapping.address();
  s->size_ = mapping.size();
  s->unit_ = status.unit_size();
  s->gguf_fd_ = gguf_fd;
  s->file_size_ = file_size;
  s->status_ = status;
  // Our own writable view: filling through it puts bytes into the shared
  // page cache; the registered mapping then gets them by CONTINUE.
  auto w = sys::map_shared(region_fd, mapping.size(), PROT_READ | PROT_WRITE, 0, "fallback view of the model region");
  if (!w) return std::move(w).error();
  ::madvise(w->get(), mapping.size(), MADV_DONTFORK);
  s->writable_ = std::move(w).value();
  s->filled_.assign(status.unit_count(), false);
  return s;
}

Status FallbackServer::takeover() { return sys::uffd_wake(uffd_, base_, size_); }

Result<int> FallbackServer::run_once(std::chrono::milliseconds timeout) {
  pollfd p{uffd_, POLLIN, 0};
  const int rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (rc < 0 && errno != EINTR) return make_error(errno, "fallback: poll: {}", std::strerror(errno));
  if (rc <= 0) return 0;
  std::vector<uffd_msg> msgs;
  AIRS_TRY(sys::uffd_read_events(uffd_, msgs));
  int served = 0;
  for (const uffd_msg& m : msgs) {
    if (m.event != UFFD_EVENT_PAGEFAULT) continue;
    AIRS_TRY(serve(m.arg.pagefault.address));
    ++served;
  }
  return served;
}

Status FallbackServer::serve(uint64_t address) {
  if (address < base_ || address >= base_ + size_) return {};
  const auto unit = static_cast<uint32_t>((address - base_) / unit_);
  const uint64_t addr = base_ + uint64_t{unit} * unit_;
  if (!status_.unit_ready(unit) && !filled_[unit]) {
    const uint64_t off = uint64_t{unit} * unit_;
    const uint64_t want = off < file_size_ ? std::min(unit_, file_size_ - off) : 0;
    uint64_t done = 0;
    while (done < want) {
      const ssize_t n = ::pread(gguf_fd_, writable_.bytes() + off + done, want - done, static_cast<off_t>(off + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<uint64_t>(n);
    }
    if (done < want) {
      // The file shrank or cannot be read: SIGBUS for the faulting thread,
      // never a page of zeros.
      auto r = sys::uffd_poison(uffd_, addr, unit_, unit_);
      if (!r) return std::move(r).error();
      return {};
    }
    filled_[unit] = true;
    ++units_filled_;
  }
  auto r = sys::uffd_continue(uffd_, addr, unit_, unit_);
  if (!r) return std::move(r).error();
  if (r->already_mapped_bytes > 0) AIRS_TRY(sys::uffd_wake(uffd_, addr, unit_));
  return {};
}

}  // namespace airs::client
