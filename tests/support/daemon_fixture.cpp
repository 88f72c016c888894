#include "daemon_fixture.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

namespace airs::test {
namespace {

[[noreturn]] void exec_argv(const std::vector<std::string>& argv) {
  std::vector<char*> a;
  for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  ::execv(a[0], a.data());
  std::fprintf(stderr, "exec %s: %s\n", a[0], std::strerror(errno));
  ::_exit(127);
}

int wait_for(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int st = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &st, 0);
  return -SIGKILL;
}

}  // namespace

std::string airs_memd_path() { return AIRS_MEMD_PATH; }
std::string airsctl_path() { return AIRSCTL_PATH; }
std::string source_dir() { return AIRS_SOURCE_DIR; }

ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    exec_argv(argv);
  }
  ::close(out[1]);
  ::close(err[1]);
  ProcessResult r;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int open_fds = 2;
  while (open_fds > 0 && std::chrono::steady_clock::now() < deadline) {
    if (::poll(fds, 2, 100) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[65536];
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int code = wait_for(pid, std::chrono::milliseconds(std::max<int64_t>(
                               0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now()).count()) + 100));
  if (code < 0) {
    r.signal = -code;
    r.exit_code = -1;
  } else {
    r.exit_code = code;
  }
  return r;
}

PrivateBus::PrivateBus() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(p[1], 3);  // dup2 clears CLOEXEC on the new fd
    exec_argv({"/usr/bin/dbus-daemon", "--config-file=" + source_dir() + "/tests/support/test-bus.conf",
               "--print-address=3", "--nofork", "--nopidfile"});
  }
  ::close(p[1]);
  std::string addr;
  char c;
  pollfd pf{p[0], POLLIN, 0};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (::poll(&pf, 1, 100) <= 0) continue;
    if (::read(p[0], &c, 1) != 1 || c == '\n') break;
    addr.push_back(c);
  }
  ::close(p[0]);
  if (addr.empty()) throw std::runtime_error("dbus-daemon did not print its address (is dbus-daemon installed?)");
  address_ = addr;
}

PrivateBus::~PrivateBus() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    wait_for(pid_, std::chrono::seconds(5));
  }
}

DaemonProcess::DaemonProcess(const std::string& bus_address, const std::string& config_toml,
                             std::vector<std::string> extra_args) {
  char tmpl[] = "/tmp/airs-test-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp");
  dir_ = tmpl;
  std::ofstream(dir_ + "/airs-memd.conf") << config_toml;
  std::vector<std::string> argv = {airs_memd_path(), "--config", dir_ + "/airs-memd.conf", "--bus", bus_address,
                                   "--log-level", "debug"};
  // Each daemon keeps its state in its own directory unless the test chose
  // one (a restart that must find the state again names it).
  if (config_toml.find("state_dir") == std::string::npos) argv.insert(argv.end(), {"--state-dir", dir_ + "/state"});
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  pid_ = ::fork();
  if (pid_ == 0) {
    int fd = ::open((dir_ + "/stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ::dup2(fd, 2);
    ::dup2(fd, 1);
    exec_argv(argv);
  }
  // Ready when it logs that it serves the name; gone if it exited.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    if (log().find("serving org.aios.Airs1") != std::string::npos) {
      started_ = true;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) stop();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

int DaemonProcess::stop(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int r = wait_for(pid_, timeout);
  pid_ = -1;
  return r;
}

void DaemonProcess::kill_hard() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  wait_for(pid_, std::chrono::seconds(5));
  pid_ = -1;
}

std::string DaemonProcess::log() const {
  std::ifstream in(dir_ + "/stderr");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace airs::test
