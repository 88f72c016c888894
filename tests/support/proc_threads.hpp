// SPDX-License-Identifier: Apache-2.0
// What a process that did not do what a test waited for is doing, from
// /proc: for a failure message that says where it hangs.
#pragma once

#include <sys/types.h>

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

}  // namespace airs::test
