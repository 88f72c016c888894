// SPDX-License-Identifier: Apache-2.0
#include "sys/uring.hpp"

#include <sys/eventfd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace airs::sys {

Result<Ring> Ring::create(unsigned entries) {
  Ring r;
  const int rc = io_uring_queue_init(entries, &r.ring_, 0);
  if (rc < 0)
    return make_error(-rc, "io_uring_queue_init({}): {} (io_uring disabled? check kernel.io_uring_disabled)", entries,
                      std::strerror(-rc));
  r.live_ = true;
  r.efd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!r.efd_) return make_error(errno, "eventfd for io_uring: {}", std::strerror(errno));
  const int erc = io_uring_register_eventfd(&r.ring_, r.efd_.get());
  if (erc < 0) return make_error(-erc, "io_uring_register_eventfd: {}", std::strerror(-erc));
  return r;
}

Status Ring::set_bounded_workers(unsigned n) {
  unsigned values[2] = {n, 0};  // bounded, unbounded (0: left as it is)
  const int rc = io_uring_register_iowq_max_workers(&ring_, values);
  if (rc < 0) return make_error(-rc, "io_uring_register_iowq_max_workers({}): {}", n, std::strerror(-rc));
  return {};
}

Ring::Ring(Ring&& o) noexcept : ring_(o.ring_), live_(std::exchange(o.live_, false)), efd_(std::move(o.efd_)) {}

Ring::~Ring() {
  if (live_) io_uring_queue_exit(&ring_);
}

bool Ring::queue_read(int fd, void* buf, uint32_t len, uint64_t offset, uint64_t user_data, uint16_t ioprio,
                      bool async) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return false;
  io_uring_prep_read(sqe, fd, buf, len, offset);
  sqe->ioprio = ioprio;
  if (async) sqe->flags |= IOSQE_ASYNC;
  io_uring_sqe_set_data64(sqe, user_data);
  return true;
}

bool Ring::queue_madvise(void* addr, uint32_t len, int advice, uint64_t user_data) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return false;
  io_uring_prep_madvise(sqe, addr, len, advice);
  io_uring_sqe_set_data64(sqe, user_data);
  return true;
}

bool Ring::queue_write_linked(int fd, const void* buf, uint32_t len, uint64_t offset, uint64_t user_data,
                              bool async) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return false;
  io_uring_prep_write(sqe, fd, buf, len, offset);
  io_uring_sqe_set_flags(sqe, IOSQE_IO_LINK | (async ? IOSQE_ASYNC : 0));
  io_uring_sqe_set_data64(sqe, user_data);
  return true;
}

bool Ring::queue_fsync(int fd, uint64_t user_data) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return false;
  io_uring_prep_fsync(sqe, fd, 0);
  io_uring_sqe_set_data64(sqe, user_data);
  return true;
}

Status Ring::submit() {
  for (;;) {
    const int rc = io_uring_submit(&ring_);
    if (rc >= 0) return {};
    if (rc == -EINTR || rc == -EAGAIN) continue;
    return make_error(-rc, "io_uring_submit: {}", std::strerror(-rc));
  }
}

void Ring::reap(const std::function<void(uint64_t, int32_t)>& fn) {
  uint64_t junk = 0;
  // The eventfd only says "look"; the ring is the truth.
  [[maybe_unused]] auto n = ::read(efd_.get(), &junk, sizeof junk);
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    if (io_uring_peek_cqe(&ring_, &cqe) != 0 || cqe == nullptr) return;
    const uint64_t ud = io_uring_cqe_get_data64(cqe);
    const int32_t res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    fn(ud, res);
  }
}

Status Ring::wait_and_reap(const std::function<void(uint64_t, int32_t)>& fn) {
  io_uring_cqe* cqe = nullptr;
  for (;;) {
    const int rc = io_uring_wait_cqe(&ring_, &cqe);
    if (rc == 0) break;
    if (rc == -EINTR || rc == -EAGAIN) continue;
    return make_error(-rc, "io_uring_wait_cqe: {}", std::strerror(-rc));
  }
  reap(fn);
  return {};
}

Status Ring::wait_and_reap_for(int timeout_ms, const std::function<void(uint64_t, int32_t)>& fn) {
  io_uring_cqe* cqe = nullptr;
  __kernel_timespec ts{timeout_ms / 1000, static_cast<long long>(timeout_ms % 1000) * 1000000};
  for (;;) {
    const int rc = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
    if (rc == 0) break;
    if (rc == -EINTR || rc == -EAGAIN) continue;
    return make_error(-rc, "io_uring_wait_cqe_timeout: {}", std::strerror(-rc));
  }
  reap(fn);
  return {};
}

}  // namespace airs::sys
