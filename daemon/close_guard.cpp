// SPDX-License-Identifier: Apache-2.0
// close(2) as every part of airs-memd calls it: its own code, sdbus-c++ and
// sd-bus, which closes the descriptors a bus message carries when it frees
// the message, on the loop. Any caller can attach descriptors to a message,
// and closing some of them waits on a party the caller controls:
// - a TCP socket with SO_LINGER set and unsent data waits for the peer to
//   take the data, up to the linger time (hours, if the caller says so);
// - a file on a FUSE mount sends FLUSH at every close and waits for the
//   server's answer, which a caller's own server may never give; a network
//   file system flushes and waits for its server the same way.
// So such a close is handed to a closer thread and returns at once; every
// other close is the plain one. The kind is told without asking the file
// system: statx with AT_STATX_DONT_SYNC (the kernel's attributes) for the
// type and device, and the device's file system type from
// /proc/self/mountinfo. By device, not mount id: the caller's mount may be
// in another mount namespace (the unit gives the daemon its own), where
// the same file system has other mount ids but the same device. A device
// of an anonymous file system (major 0: FUSE, NFS, tmpfs, ...) that the
// daemon's table does not list (a FUSE server's in a user namespace) counts
// as slow, unless it is an internal mount memfds live on
// (sys/own_devices.hpp; the daemon's, and those of base pages and default
// huge pages, noted here for the libraries' memfds). The daemon's own detached
// tmpfs (pool.shmem without a huge_dir) is not listed either: closes of its
// files go to a closer thread, which costs a thread hand-over, no more.
// A close that is handed over still returns 0: the descriptor's number
// stays taken until the closer closes it, so it is not reused before.
//
// Defined in the executable, this close() comes before libc's for the
// libraries too (they call it through their PLT); the next one does the
// closing: a sanitizer's interceptor where there is one, else libc's. GCC
// links the sanitizer runtimes as shared libraries, so the next close() is
// the interceptor; Clang links them into the executable, where this close()
// replaces the interceptor's (a weak alias) and the next one is libc's, so
// the interceptor is called by its own name. TSan must see every close: it
// follows each descriptor number, and a reuse it has not seen closed is a
// race to it.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "sys/own_devices.hpp"

// The sanitizers' close interceptor, where a sanitizer runtime is linked.
extern "C" int __interceptor_close(int fd) __attribute__((weak));

namespace {

using CloseFn = int (*)(int);

CloseFn next_close() {
  static CloseFn fn = __interceptor_close != nullptr ? &__interceptor_close
                                                     : reinterpret_cast<CloseFn>(::dlsym(RTLD_NEXT, "close"));
  return fn;
}

int really_close(int fd) {
  CloseFn fn = next_close();
  return fn != nullptr ? fn(fd) : static_cast<int>(::syscall(SYS_close, fd));
}

// File system types whose close may wait for a server.
bool waits_for_a_server(const std::string& type) {
  if (type == "fuse" || type.rfind("fuse.", 0) == 0 || type == "fuseblk") return true;
  for (const char* t : {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "9p", "afs", "gfs2", "ocfs2", "glusterfs",
                        "lustre", "sshfs", "davfs", "virtiofs"})
    if (type == t) return true;
  return false;
}

// Notes the kernel's internal mount of memfds of `flags` as trusted (for
// memfds the libraries make: sd-bus's of base pages).
void note_memfd_mount(unsigned flags) {
  const int fd = ::memfd_create("airs-close-probe", MFD_CLOEXEC | flags);
  if (fd < 0) return;
  airs::sys::note_own_device(fd);
  really_close(fd);
}

// device → whether a close there may wait, from /proc/self/mountinfo, read
// again when the mount table changed (the kernel flags the open file with
// POLLPRI then) and otherwise answered from memory.
class Devices {
 public:
  Devices() {
    for (unsigned flags : {0u, unsigned{MFD_HUGETLB}}) note_memfd_mount(flags);
  }
  bool slow(uint64_t dev) {
    if (airs::sys::is_own_device(dev)) return false;  // lock-free: the daemon's memfds close here often
    std::lock_guard lock(mu_);
    if (fd_ < 0) fd_ = ::open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (fd_ >= 0) {
      pollfd p{fd_, POLLPRI, 0};
      if (!read_ || (::poll(&p, 1, 0) > 0 && (p.revents & (POLLPRI | POLLERR)) != 0)) reread();
    }
    if (auto it = slow_.find(dev); it != slow_.end()) return it->second;
    return major(dev) == 0;  // a block device's file system is local
  }

 private:
  void reread() {
    // Read through the one file kept open, to its end: that clears the
    // change flag.
    std::string text;
    char buf[8192];
    for (off_t at = 0;;) {
      const ssize_t n = ::pread(fd_, buf, sizeof buf, at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
      at += n;
    }
    slow_.clear();
    read_ = true;
    // "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw":
    // the third field is the device, the one after " - " the type.
    for (size_t at = 0; at < text.size();) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      const std::string l = text.substr(at, end - at);
      at = end + 1;
      unsigned maj = 0, min = 0;
      const auto dash = l.find(" - ");
      if (dash == std::string::npos || std::sscanf(l.c_str(), "%*s %*s %u:%u", &maj, &min) != 2) continue;
      const auto type_end = l.find(' ', dash + 3);
      const std::string type =
          l.substr(dash + 3, type_end == std::string::npos ? std::string::npos : type_end - dash - 3);
      bool& slow = slow_[makedev(maj, min)];
      slow = slow || waits_for_a_server(type);
    }
  }
  std::mutex mu_;
  int fd_ = -1;  // kept open for the change flag
  bool read_ = false;
  std::unordered_map<uint64_t, bool> slow_;
};

// The queue a close that may wait goes to (see Closer), or nothing for a
// plain close: a socket with a linger time (its last close waits for the
// peer) or a file on a device whose closes may wait.
std::optional<uint64_t> slow_queue(int fd) {
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, &sx) != 0 || (sx.stx_mask & STATX_TYPE) == 0)
    return std::nullopt;
  if (S_ISSOCK(sx.stx_mode)) {
    linger l{};
    socklen_t len = sizeof l;
    if (::getsockopt(fd, SOL_SOCKET, SO_LINGER, &l, &len) != 0 || l.l_onoff == 0 || l.l_linger == 0)
      return std::nullopt;
    return UINT64_MAX;  // lingering sockets: a queue of their own
  }
  // Files and directories; the kernel's other objects (pipes, eventfds)
  // never wait on a server.
  if (!S_ISREG(sx.stx_mode) && !S_ISDIR(sx.stx_mode)) return std::nullopt;
  const uint64_t dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
  static auto* devices = new Devices;  // never destroyed: closes run until the very end
  if (!devices->slow(dev)) return std::nullopt;
  return dev;
}

// Closer threads, one per queue (a device, or lingering sockets) while it
// has closes: a server that never answers holds its own device's closes,
// no other's. At most kMaxThreads run; a queue without one waits for one.
class Closer {
 public:
  static constexpr size_t kMaxThreads = 16;
  void close(uint64_t queue, int fd) {
    std::lock_guard lock(mu_);
    queues_[queue].fds.push_back(fd);
    start_threads();
  }

 private:
  struct Queue {
    std::deque<int> fds;
    bool served = false;  // a thread takes its closes
  };
  // A thread for each queue that has closes and none, while there are
  // fewer than kMaxThreads. Under mu_.
  void start_threads() {
    for (auto& [id, q] : queues_) {
      if (q.served || q.fds.empty() || threads_ >= kMaxThreads) continue;
      // Every signal blocked from its first instruction: the daemon takes
      // its signals through a signalfd, which works only while no thread
      // can take them.
      sigset_t all, old;
      ::sigfillset(&all);
      ::pthread_sigmask(SIG_BLOCK, &all, &old);
      try {
        std::thread([this, id = id] { run(id); }).detach();
        q.served = true;
        ++threads_;
      } catch (...) {
        // No thread now (none to be had, or no memory for one): the next
        // close, or a thread that ends, tries again.
      }
      ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
  }
  void run(uint64_t id) {
    ::pthread_setname_np(::pthread_self(), "airs-close");
    std::unique_lock lock(mu_);
    for (;;) {
      auto it = queues_.find(id);
      if (it->second.fds.empty()) {
        queues_.erase(it);
        --threads_;
        start_threads();  // a queue that waited for a thread
        return;
      }
      const int fd = it->second.fds.front();
      it->second.fds.pop_front();
      lock.unlock();
      really_close(fd);
      lock.lock();
    }
  }
  std::mutex mu_;
  std::map<uint64_t, Queue> queues_;
  size_t threads_ = 0;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) int close(int fd) {
  // Nothing may leave a C function: where memory runs out on the way, the
  // plain close (which may wait) rather than none.
  try {
    const auto queue = fd < 0 ? std::nullopt : slow_queue(fd);
    if (!queue) return really_close(fd);
    // The descriptor stays open until the closer takes it: its number is
    // not reused before then, and the caller is told it is closed.
    static auto* closer = new Closer;  // never destroyed, as above
    closer->close(*queue, fd);         // throws only before it took the fd
    return 0;
  } catch (...) {
    return really_close(fd);
  }
}
