// SPDX-License-Identifier: Apache-2.0
// Test-only wire format between the in-test "daemon" and the client helper
// processes: fixed structs plus fds over a SOCK_SEQPACKET socketpair.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

namespace airs::test {

// Daemon → client: what to map. fds: region (O_RDWR), status page (O_RDONLY).
inline constexpr int32_t kBackingHugetlbfs = 0;
inline constexpr int32_t kBackingShmem = 1;
inline constexpr int32_t kBackingCooperative = 2;  // shmem, no userfaultfd
struct Hello {
  uint64_t region_size;
  uint64_t file_size;
  int32_t daemon_pid;
  int32_t backing;  // kBacking*
};
// Client → daemon: where it registered. fds: uffd, notify eventfd.
struct AttachMsg {
  uint64_t addr;
  uint64_t len;
};

inline bool send_msg(int sock, const void* data, size_t len, const std::vector<int>& fds) {
  iovec iov{const_cast<void*>(data), len};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  std::vector<char> ctrl(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    mh.msg_control = ctrl.data();
    mh.msg_controllen = ctrl.size();
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    if (c == nullptr) return false;
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do n = ::sendmsg(sock, &mh, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(len);
}

inline bool recv_msg(int sock, void* data, size_t len, std::vector<int>& fds, size_t nfds) {
  iovec iov{data, len};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  std::vector<char> ctrl(CMSG_SPACE(sizeof(int) * nfds));
  mh.msg_control = ctrl.data();
  mh.msg_controllen = ctrl.size();
  // EINTR happens here for real: io_uring task work of the in-test daemon
  // interrupts a socket wait that has a timeout.
  ssize_t n;
  do n = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(len)) return false;
  fds.clear();
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.push_back(fd);
    }
  }
  return fds.size() == nfds;
}

// Deterministic, nowhere-zero-for-long content: splitmix64 of the 8-byte
// word index. Byte `off` of the test model.
inline uint64_t pattern_word(uint64_t word_index) {
  uint64_t z = word_index + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace airs::test
