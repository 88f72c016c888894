// SPDX-License-Identifier: Apache-2.0
// io_uring for the pager's reads: a ring with an eventfd registered for the
// event loop (the eventfd is only a hint: reap() takes every completion).
// Never used with fixed buffers over pool pages (a later hole punch would
// free nothing while they are registered).
#pragma once

#include <liburing.h>

#include <cstdint>
#include <functional>

#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::sys {

class Ring {
 public:
  // A ring with `entries` submission slots and an eventfd (EFD_NONBLOCK,
  // EFD_CLOEXEC) registered for completions. Errors: io_uring_setup's
  // (ENOSYS/EPERM when io_uring is disabled: kernel.io_uring_disabled).
  static Result<Ring> create(unsigned entries);
  Ring(Ring&& o) noexcept;
  Ring& operator=(Ring&&) = delete;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring();

  // The eventfd to watch for EPOLLIN.
  [[nodiscard]] int event_fd() const { return efd_.get(); }
  // At most `n` io-wq workers for work on regular files, for this thread's
  // rings (the kernel shares one set of workers among the rings a thread
  // submits to; its own bound is 4 per CPU, or the ring's size if smaller).
  // Errors: EINVAL before Linux 5.15, which has no such setting.
  Status set_bounded_workers(unsigned n);

  // Queue a read of `len` bytes at `offset` of `fd` into `buf`; submitted by
  // the next submit(). `ioprio` (IOPRIO_PRIO_VALUE; 0: the thread's own) is
  // the request's I/O priority: the kernel carries it into the bios of an
  // O_DIRECT read, where the device's scheduler sees it; a buffered read's
  // page-cache reads go at the process's priority. Returns false if the
  // submission queue is full.
  // `async`: straight to one of the ring's io-wq workers (IOSQE_ASYNC),
  // never started in the submitting thread, which a read of a file system
  // that cannot take it without blocking (FUSE) would otherwise hold.
  bool queue_read(int fd, void* buf, uint32_t len, uint64_t offset, uint64_t user_data, uint16_t ioprio = 0,
                  bool async = false);
  // Queue madvise(addr, len, advice) on this process's mappings; the kernel
  // always runs it in one of the ring's io-wq workers (kernel threads of this
  // process, not ours), so MADV_POPULATE_WRITE allocates and zeroes pages
  // there, off the submitting thread. Completion res is 0 or -errno. Returns
  // false if the submission queue is full.
  bool queue_madvise(void* addr, uint32_t len, int advice, uint64_t user_data);
  // Queue a write of `len` bytes of `buf` at `offset` of `fd`, linked to the
  // next queued entry (IOSQE_IO_LINK: that one runs only after this one
  // completed in full, else it completes with -ECANCELED). Returns false if
  // the submission queue is full. `async`: straight to one of the ring's
  // io-wq workers (IOSQE_ASYNC), without first trying it inline in the
  // submitting thread.
  bool queue_write_linked(int fd, const void* buf, uint32_t len, uint64_t offset, uint64_t user_data,
                          bool async = false);
  // Queue fsync(fd). Returns false if the submission queue is full.
  bool queue_fsync(int fd, uint64_t user_data);
  // Free submission slots (a caller that needs two linked slots checks first).
  [[nodiscard]] unsigned sq_space() { return io_uring_sq_space_left(&ring_); }
  // Submit queued entries. Errors: io_uring_submit's.
  Status submit();
  // Drain the eventfd and call `fn(user_data, res)` for every completion
  // (res is bytes or -errno). Never blocks.
  void reap(const std::function<void(uint64_t, int32_t)>& fn);
  // Block until at least one completion is available, then reap.
  Status wait_and_reap(const std::function<void(uint64_t, int32_t)>& fn);
  // Like wait_and_reap, but waits at most `timeout_ms`; ETIME when nothing came.
  Status wait_and_reap_for(int timeout_ms, const std::function<void(uint64_t, int32_t)>& fn);

 private:
  Ring() = default;
  io_uring ring_{};
  bool live_ = false;
  UniqueFd efd_;
};

}  // namespace airs::sys
