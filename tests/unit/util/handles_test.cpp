// SPDX-License-Identifier: Apache-2.0
// The small descriptor helpers of src/sys that the client library and the
// daemon use instead of raw calls.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "sys/files.hpp"
#include "sys/proc_handles.hpp"

namespace airs::sys {
namespace {

TEST(Handles, DupCloexecIsANewCloseOnExecDescriptorAboveStdio) {
  auto e = eventfd_create();
  ASSERT_TRUE(e.ok()) << e.error().message;
  auto d = dup_cloexec(e->get());
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_GE(d->get(), 3);
  EXPECT_NE(d->get(), e->get());
  EXPECT_EQ(::fcntl(d->get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  // The same file: a signal on one is read from the other.
  ASSERT_TRUE(eventfd_signal(e->get(), 5).ok());
  EXPECT_EQ(eventfd_drain(d->get()), 5u);
  EXPECT_EQ(eventfd_drain(d->get()), 0u);  // non-blocking, nothing pending

  auto bad = dup_cloexec(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, EBADF);
  EXPECT_EQ(bad.error().message, "dup: " + std::string(std::strerror(EBADF)));
}

TEST(Handles, OpenFileIsCloseOnExecAndNamesThePathOnError) {
  auto f = open_file("/proc/self/status", O_RDONLY);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(::fcntl(f->get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  auto missing = open_file("/nonexistent/airs-model.gguf", O_RDONLY);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ENOENT);
  EXPECT_EQ(missing.error().message, "/nonexistent/airs-model.gguf: " + std::string(std::strerror(ENOENT)));
}

TEST(Handles, MessageChannelCarriesWholeMessagesBothWays) {
  auto ch = message_channel();
  ASSERT_TRUE(ch.ok()) << ch.error().message;
  auto& [rd, wr] = *ch;
  EXPECT_EQ(::fcntl(rd.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_EQ(::fcntl(wr.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  ASSERT_EQ(::send(wr.get(), "abc", 3, 0), 3);
  ASSERT_EQ(::send(wr.get(), "de", 2, 0), 2);
  char buf[8] = {};
  EXPECT_EQ(::recv(rd.get(), buf, sizeof buf, 0), 3);  // one message per read
  EXPECT_EQ(std::string(buf, 3), "abc");
  EXPECT_EQ(::recv(rd.get(), buf, sizeof buf, 0), 2);
  // And back (the daemon asks a touch-guard client to close units this way).
  EXPECT_TRUE(send_message(rd.get(), "fg", 2));
  const auto back = read_message(wr.get(), buf, sizeof buf);
  EXPECT_EQ(back.state, MessageRead::Message);
  EXPECT_EQ(back.bytes, 2U);
  EXPECT_EQ(read_message(wr.get(), buf, sizeof buf).state, MessageRead::Again);
  EXPECT_TRUE(check_message_socket(wr.get(), "the test's end").ok());
  rd.reset();
  EXPECT_EQ(read_message(wr.get(), buf, sizeof buf).state, MessageRead::Closed);
  EXPECT_FALSE(send_message(wr.get(), "x", 1)) << "a send to a closed peer must fail, not raise SIGPIPE";
}

bool polls_readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

// A KV session's wake-up: the client's end polls readable once woken, one
// drain makes it quiet, any number of wakes leave one wake-up waiting, and
// nothing the client does to its end (blocking it, writing to it, filling
// it, closing it) makes the daemon's wake block or fail.
TEST(Handles, AWakeChannelNeverBlocksTheDaemonWhateverTheClientDoes) {
  auto ch = wake_channel();
  ASSERT_TRUE(ch.ok()) << ch.error().message;
  const int ours = ch->ours.get(), theirs = ch->theirs.get();
  EXPECT_EQ(::fcntl(theirs, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_FALSE(polls_readable(theirs));
  EXPECT_EQ(drain_wakeups(theirs), 0U);
  for (int i = 0; i < 100; ++i) wake(ours);
  EXPECT_TRUE(polls_readable(theirs));
  EXPECT_EQ(drain_wakeups(theirs), 1U) << "wake-ups are not coalesced: a slow client's queue would grow";
  EXPECT_FALSE(polls_readable(theirs));

  // The attack on an eventfd: clear O_NONBLOCK on the shared file and
  // saturate the counter. Here the flag is the client's end's alone. What
  // it sends goes to the daemon's end (KV access reports): a client that
  // fills that queue still gets its wake-ups, and the daemon's reads of it
  // never block.
  ASSERT_EQ(::fcntl(theirs, F_SETFL, 0), 0);
  EXPECT_EQ(::fcntl(ours, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
  const uint64_t max = 0xfffffffffffffffeULL;
  size_t queued = 0;
  while (::send(theirs, &max, sizeof max, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(sizeof max)) ++queued;
  EXPECT_EQ(errno, EAGAIN) << std::strerror(errno);
  EXPECT_GT(queued, 0U);
  wake(ours);
  EXPECT_TRUE(polls_readable(theirs));
  EXPECT_EQ(drain_wakeups(theirs), 1U) << "a blocking end must not block the drain";
  size_t read = 0;
  for (;;) {
    uint64_t word = 0;
    const MessageRead r = read_message(ours, &word, sizeof word);
    if (r.state != MessageRead::Message) {
      EXPECT_EQ(r.state, MessageRead::Again);
      break;
    }
    EXPECT_EQ(word, max);
    ++read;
  }
  EXPECT_EQ(read, queued);

  // A client that closed its end: the wake is a no-op, no SIGPIPE.
  ch->theirs.reset();
  wake(ours);
  wake(ours);
}

TEST(Handles, IsEventfdTellsAnEventfdFromAPipeAndAFile) {
  auto efd = eventfd_create();
  ASSERT_TRUE(efd.ok()) << efd.error().message;
  EXPECT_TRUE(is_eventfd(efd->get()));
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd r(p[0]), w(p[1]);
  EXPECT_FALSE(is_eventfd(w.get()));
  auto ch = wake_channel();
  ASSERT_TRUE(ch.ok()) << ch.error().message;
  EXPECT_FALSE(is_eventfd(ch->theirs.get()));
  EXPECT_FALSE(is_eventfd(-1));
  // The kind whole, not a prefix or another kind.
  EXPECT_TRUE(is_anon_inode(efd->get(), "eventfd"));
  EXPECT_FALSE(is_anon_inode(efd->get(), "event"));
  EXPECT_FALSE(is_anon_inode(efd->get(), "eventfd]"));
  EXPECT_FALSE(is_anon_inode(efd->get(), "userfaultfd"));
  EXPECT_FALSE(is_anon_inode(w.get(), "pipe"));
}

// The client library drains what an older daemon gave it: an eventfd.
TEST(Handles, DrainWakeupsEmptiesAnEventfdToo) {
  auto efd = eventfd_create();
  ASSERT_TRUE(efd.ok()) << efd.error().message;
  ASSERT_TRUE(eventfd_signal(efd->get(), 3).ok());
  EXPECT_TRUE(polls_readable(efd->get()));
  EXPECT_EQ(drain_wakeups(efd->get()), 3U);
  EXPECT_FALSE(polls_readable(efd->get()));
}

TEST(Handles, PollFdsReportsReadinessAndErrors) {
  auto e = eventfd_create();
  ASSERT_TRUE(e.ok());
  pollfd p{e->get(), POLLIN, 0};
  auto none = poll_fds(&p, 1, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);
  ASSERT_TRUE(eventfd_signal(e->get()).ok());
  auto one = poll_fds(&p, 1, 0);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, 1);
  EXPECT_TRUE(p.revents & POLLIN);
  auto bad = poll_fds(nullptr, 1, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, EFAULT);
  EXPECT_EQ(bad.error().message, "poll: " + std::string(std::strerror(EFAULT)));
}

}  // namespace
}  // namespace airs::sys
