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
// So a close of a socket that is not AF_UNIX, or of a file on FUSE or a
// network file system, is handed to a closer thread and returns at once;
// every other close is the plain one. The kind is told without asking the
// file system: statx with AT_STATX_DONT_SYNC (the kernel's attributes) for
// the type and mount id, and the mount's type from /proc/self/mountinfo.
// A close that is handed over still returns 0: the descriptor's number
// stays taken until the closer closes it, so it is not reused before.
//
// Defined in the executable, this close() comes before libc's for the
// libraries too (they call it through their PLT); the next one (libc's, or
// a sanitizer's interceptor) does the closing.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>

namespace {

using CloseFn = int (*)(int);

CloseFn next_close() {
  static CloseFn fn = reinterpret_cast<CloseFn>(::dlsym(RTLD_NEXT, "close"));
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

// mount id → whether a close there may wait, from /proc/self/mountinfo.
// Read again when the mount table changed (the kernel flags the open file
// with POLLPRI then; a new mount may take the id of one unmounted), and
// otherwise answered from memory. An id the table does not list (the
// kernel's own mounts: memfds, pipes, sockets) is not a server's.
class Mounts {
 public:
  bool slow(uint64_t mnt_id) {
    std::lock_guard lock(mu_);
    if (fd_ < 0) fd_ = ::open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLPRI, 0};
    if (!read_ || (::poll(&p, 1, 0) > 0 && (p.revents & (POLLPRI | POLLERR)) != 0)) reread();
    auto it = slow_.find(mnt_id);
    return it != slow_.end() && it->second;
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
    // "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw"
    for (size_t at = 0; at < text.size();) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      const std::string l = text.substr(at, end - at);
      at = end + 1;
      const auto dash = l.find(" - ");
      if (dash == std::string::npos) continue;
      const auto type_end = l.find(' ', dash + 3);
      const std::string type =
          l.substr(dash + 3, type_end == std::string::npos ? std::string::npos : type_end - dash - 3);
      slow_[std::strtoull(l.c_str(), nullptr, 10)] = waits_for_a_server(type);
    }
  }
  std::mutex mu_;
  int fd_ = -1;  // kept open for the change flag
  bool read_ = false;
  std::unordered_map<uint64_t, bool> slow_;
};

// True when closing `fd` may wait on another party (see above).
bool may_wait(int fd) {
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE | STATX_MNT_ID, &sx) != 0) return false;
  if ((sx.stx_mask & STATX_TYPE) != 0 && S_ISSOCK(sx.stx_mode)) {
    int domain = 0;
    socklen_t len = sizeof domain;
    return ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 && domain != AF_UNIX;
  }
  // Files and directories; the kernel's own objects (pipes, eventfds,
  // memfds of its internal mounts) never wait on a server.
  if ((sx.stx_mask & STATX_MNT_ID) == 0 || (!S_ISREG(sx.stx_mode) && !S_ISDIR(sx.stx_mode))) return false;
  static Mounts* mounts = new Mounts;  // never destroyed: closes run until the very end
  return mounts->slow(sx.stx_mnt_id);
}

// Closer threads: one more is started while every one is busy (waiting on
// a close), up to kMaxThreads; past that the queue waits for one.
class Closer {
 public:
  static constexpr int kMaxThreads = 16;
  void close(int fd) {
    std::lock_guard lock(mu_);
    queue_.push_back(fd);
    if (idle_ == 0 && threads_ < kMaxThreads) {
      try {
        std::thread([this] { run(); }).detach();
        ++threads_;
      } catch (const std::system_error&) {
        // No thread: a running one takes it when it can.
      }
    }
    if (threads_ == 0) {  // none at all: close it here after all
      queue_.pop_back();
      really_close(fd);
      return;
    }
    cv_.notify_one();
  }

 private:
  void run() {
    ::pthread_setname_np(::pthread_self(), "airs-close");
    std::unique_lock lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return !queue_.empty(); });
      --idle_;
      const int fd = queue_.front();
      queue_.pop_front();
      lock.unlock();
      really_close(fd);
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  int threads_ = 0;
  int idle_ = 0;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) int close(int fd) {
  if (fd < 0 || !may_wait(fd)) return really_close(fd);
  // The descriptor stays open until the closer takes it: its number is not
  // reused before then, and the caller is told it is closed.
  static Closer* closer = new Closer;  // never destroyed, as above
  closer->close(fd);
  return 0;
}
