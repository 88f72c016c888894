// SPDX-License-Identifier: Apache-2.0
// What a process that did not do what a test waited for is doing, from
// /proc: for a failure message that says where it hangs; and whether a
// thread sleeps on a futex word, to wait for that without a clock.
#pragma once

#include <sys/syscall.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace airs::test {

// A small /proc (or sysfs) file, without its trailing newlines; "" when it
// cannot be read.
inline std::string read_small_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// What each thread of `pid` is doing: its name, state, the kernel function
// it sleeps in, its syscall (number and arguments) and its kernel stack
// (root only).
inline std::string describe_threads(pid_t pid) {
  std::string out;
  const std::string base = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator(base, ec)) {
    const std::string d = t.path().string();
    const std::string stat = read_small_file(d + "/stat");
    const auto close_paren = stat.rfind(')');
    const std::string state = close_paren == std::string::npos ? "?" : stat.substr(close_paren + 2, 1);
    out += "  thread " + t.path().filename().string() + " (" + read_small_file(d + "/comm") + ") state " + state +
           " wchan " + read_small_file(d + "/wchan") + " syscall " + read_small_file(d + "/syscall") + "\n";
    std::istringstream stack(read_small_file(d + "/stack"));
    for (std::string line; std::getline(stack, line);) out += "    " + line + "\n";
  }
  if (ec) out += "  (cannot list " + base + ": " + ec.message() + ")\n";
  return out;
}

// True when thread `tid` of process `pid` sleeps in futex(2) on `word` and
// went to sleep after the word's last change: /proc/PID/task/TID/syscall
// gives the call's number, then its arguments, the third being the value
// the waiter expects. A waiter expects the value it read before it looked
// at what the word guards, so a thread woken by a change but not yet back
// in its wait (or asleep on an older value) does not count. `word` must be
// at the same address in both processes (this one, or a mapping shared
// across a fork).
inline bool sleeps_on_futex(pid_t pid, pid_t tid, const uint32_t* word) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/syscall");
  long nr = -1;
  std::string addr, op, val;
  if (!(f >> nr >> addr >> op >> val) || nr != SYS_futex) return false;
  return std::stoull(addr, nullptr, 16) == reinterpret_cast<uintptr_t>(word) &&
         std::stoull(val, nullptr, 16) == __atomic_load_n(word, __ATOMIC_ACQUIRE);
}

}  // namespace airs::test
