// SPDX-License-Identifier: Apache-2.0
// Helpers every file of the hostile suite uses: a call as another uid, and
// the check that a call fails with a named error saying what was wrong.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <sdbus-c++/sdbus-c++.h>

namespace airs::test {

// Runs `fn` in a child process as uid/gid `uid`, with the supplementary
// groups `groups` (none by default), and returns what it returned, or
// "<error name>: <message>" for a D-Bus call that failed.
inline std::string as_user(uid_t uid, const std::vector<gid_t>& groups, const std::function<std::string()>& fn) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    std::string out;
    if (::setgroups(groups.size(), groups.data()) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) {
      out = std::string("setuid: ") + std::strerror(errno);
    } else {
      try {
        out = fn();
      } catch (const sdbus::Error& e) {
        out = e.getName() + ": " + e.getMessage();
      } catch (const std::exception& e) {
        out = std::string("exception: ") + e.what();
      }
    }
    (void)!::write(p[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(p[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (WIFSIGNALED(st)) out += "<the child was killed by signal " + std::to_string(WTERMSIG(st)) + ">";
  // A sanitizer report ends the child with its own exit code, before it writes.
  if (WIFEXITED(st) && WEXITSTATUS(st) != 0) out += "<the child exited with " + std::to_string(WEXITSTATUS(st)) + ">";
  return out;
}
inline std::string as_user(uid_t uid, const std::function<std::string()>& fn) { return as_user(uid, {}, fn); }

// Expects `call` to fail with D-Bus error `name` and a message containing `part`.
template <typename F>
void expect_error(F&& call, const std::string& name, const std::string& part) {
  try {
    call();
    ADD_FAILURE() << "expected " << name;
  } catch (const sdbus::Error& e) {
    EXPECT_EQ(e.getName(), name) << e.getMessage();
    EXPECT_NE(e.getMessage().find(part), std::string::npos) << e.getMessage();
  }
}

}  // namespace airs::test
