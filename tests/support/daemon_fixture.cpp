// SPDX-License-Identifier: Apache-2.0
#include "daemon_fixture.hpp"
#include "proc_threads.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>
#include <toml++/toml.h>

namespace airs::test {
namespace {

[[noreturn]] void exec_argv(const std::vector<std::string>& argv) {
  // A daemon or bus of a test process that died (a sanitizer's abort, a
  // ctest timeout) goes with it: left behind it would hold the test's
  // output pipe, and ctest would wait for it for ever.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() == 1) ::_exit(127);
  std::vector<char*> a;
  for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  ::execv(a[0], a.data());
  std::fprintf(stderr, "exec %s: %s\n", a[0], std::strerror(errno));
  ::_exit(127);
}

// Reaps `pid` if it exits within `timeout`: true, and `code` is its exit
// status (or -signal).
bool reap_within(pid_t pid, std::chrono::milliseconds timeout, int& code) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int st = 0;
  do {
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

// Waits up to `timeout` for `pid`, then SIGKILLs and reaps it.
int wait_for(pid_t pid, std::chrono::milliseconds timeout) {
  int code = 0;
  if (reap_within(pid, timeout, code)) return code;
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return -SIGKILL;
}

// The processor time `pid` used so far ("utime+stime" in clock ticks, from
// /proc/PID/stat), "" once it is gone.
std::string cpu_ticks(pid_t pid) {
  const std::string stat = read_small_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t comm_end = stat.rfind(')');
  if (comm_end == std::string::npos) return {};
  std::istringstream fields(stat.substr(comm_end + 2));
  std::string f, utime, stime;
  for (int i = 3; i <= 15 && fields >> f; ++i) {  // field 3 is the state
    if (i == 14) utime = f;
    if (i == 15) stime = f;
  }
  return utime + "+" + stime;
}

}  // namespace

namespace {

bool others_can(const std::string& path, mode_t bit) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && (st.st_mode & bit) != 0;
}

// Copies made by reachable_by_all, removed at exit.
std::vector<std::string>& copies_made() {
  static std::vector<std::string> dirs;
  static const bool registered = [] {
    std::atexit([] {
      for (const auto& d : copies_made()) std::filesystem::remove_all(d);
    });
    return true;
  }();
  (void)registered;
  return dirs;
}

}  // namespace

std::string reachable_by_all(const std::string& program) {
  static std::map<std::string, std::string> done;
  if (auto it = done.find(program); it != done.end()) return it->second;
  bool reachable = others_can(program, S_IXOTH);
  for (auto p = std::filesystem::path(program).parent_path(); reachable && !p.empty() && p != p.root_path();
       p = p.parent_path())
    reachable = others_can(p.string(), S_IXOTH);
  if (reachable) return done[program] = program;
  char tmpl[] = "/tmp/airs-test-exe-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr || ::chmod(tmpl, 0755) != 0) {
    ADD_FAILURE() << "reachable_by_all: a directory under /tmp: " << std::strerror(errno);
    return program;
  }
  copies_made().push_back(tmpl);
  const std::string dir = tmpl;
  const std::string name = std::filesystem::path(program).filename().string();
  const std::string copy = dir + "/" + name + ".bin";
  std::error_code ec;
  std::filesystem::copy_file(program, copy, ec);
  if (ec || ::chmod(copy.c_str(), 0755) != 0) {
    ADD_FAILURE() << "reachable_by_all: copying " << program << " to " << copy << ": " << ec.message();
    return program;
  }
  // The libraries it loads from the build tree (its RUNPATH names
  // directories the other uid cannot enter either) go beside it, and a
  // wrapper points the loader at them.
  bool libs = false;
  if (FILE* p = ::popen(("ldd '" + program + "' 2>/dev/null").c_str(), "r")) {
    char line[4096];
    while (std::fgets(line, sizeof line, p) != nullptr) {
      const std::string l = line;
      const auto arrow = l.find("=> /");
      if (arrow == std::string::npos) continue;
      const std::string lib = l.substr(arrow + 3, l.find(" (", arrow) - arrow - 3);
      if (lib.rfind("/lib", 0) == 0 || lib.rfind("/usr/", 0) == 0) continue;
      std::filesystem::copy_file(lib, dir + "/" + std::filesystem::path(lib).filename().string(), ec);
      if (ec) ADD_FAILURE() << "reachable_by_all: copying " << lib << ": " << ec.message();
      libs = true;
    }
    ::pclose(p);
  }
  for (const auto& e : std::filesystem::directory_iterator(dir)) ::chmod(e.path().c_str(), 0755);
  const std::string wrapper = dir + "/" + name;
  {
    std::ofstream w(wrapper);
    w << "#!/bin/sh\n" << (libs ? "LD_LIBRARY_PATH='" + dir + "' " : std::string()) << "exec '" << copy << "' \"$@\"\n";
  }
  if (::chmod(wrapper.c_str(), 0755) != 0) {
    ADD_FAILURE() << "reachable_by_all: " << wrapper << ": " << std::strerror(errno);
    return program;
  }
  return done[program] = wrapper;
}

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
  // Still running at the deadline: say where each of its threads is before
  // it is killed (a hang then names the wait it hangs in).
  // (WNOWAIT: peek, the reaping stays with wait_for.)
  if (siginfo_t si{}; std::chrono::steady_clock::now() >= deadline &&
                      ::waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == 0)
    r.err += "\nrun_process: " + argv.front() + " (pid " + std::to_string(pid) + ") still running after " +
             std::to_string(timeout.count()) + " ms; its threads:\n" + describe_threads(pid);
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

PrivateBus::PrivateBus() : PrivateBus(std::string()) {}

PrivateBus::PrivateBus(const std::string& socket_path) {
  std::vector<std::string> argv = {"/usr/bin/dbus-daemon",
                                   "--config-file=" + source_dir() + "/tests/support/test-bus.conf",
                                   "--print-address=3", "--nofork", "--nopidfile"};
  if (!socket_path.empty()) argv.push_back("--address=unix:path=" + socket_path);
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(p[1], 3);  // dup2 clears CLOEXEC on the new fd
    exec_argv(argv);
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

std::string with_pressure_source(const std::string& toml) {
  // Whether the test names a source is the parser's answer, not a text
  // search: a key that only starts with "source", or a source in another
  // table, names none. A configuration that does not parse is a test of
  // the daemon's refusal and goes to it as written.
  toml::table parsed;
  try {
    parsed = toml::parse(toml);
  } catch (const toml::parse_error&) {
    return toml;
  }
  if (parsed.at_path("pressure.source")) return toml;
  constexpr const char* kOff = "source = \"off\"\n";
  const auto header = toml.find("[pressure]");
  if (header == std::string::npos)
    return toml + (toml.empty() || toml.back() == '\n' ? "" : "\n") + "[pressure]\n" + kOff;
  const auto body = toml.find('\n', header);
  if (body == std::string::npos) return toml + "\n" + kOff;
  return toml.substr(0, body + 1) + kOff + toml.substr(body + 1);
}

DaemonProcess::DaemonProcess(const std::string& bus_address, const std::string& config_toml,
                             std::vector<std::string> extra_args, const std::string& ready_line,
                             const std::string& files_in) {
  std::string tmpl = files_in + "/airs-test-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp in " + files_in + ": " + std::strerror(errno));
  dir_ = tmpl;
  std::ofstream(dir_ + "/airs-memd.conf") << with_pressure_source(config_toml);
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
  // Ready when it logs `ready_line` (that it serves the name); gone if it
  // exited. Hung when it made no progress for 30 s: neither its log nor
  // its processor time moved. A start that works (a pool of gigabytes
  // faulted in and zeroed, slow under an emulator on a busy machine) is
  // waited for, however long it takes.
  std::string last_log, last_cpu;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::string now_log = log();
    if (now_log.find(ready_line) != std::string::npos) {
      started_ = true;
      return;
    }
    std::string now_cpu = cpu_ticks(pid_);
    if (now_log.size() != last_log.size() || now_cpu != last_cpu) {
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      last_log = std::move(now_log);
      last_cpu = std::move(now_cpu);
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
  // Not exited in time: where each of its threads is goes into its log
  // (log() shows it), then wait_for kills it.
  int r = 0;
  if (!reap_within(pid_, timeout, r)) {
    std::ofstream(dir_ + "/stderr", std::ios::app)
        << "daemon_fixture: airs-memd (pid " << pid_ << ") has not exited " << timeout.count()
        << " ms after SIGTERM; its threads:\n"
        << describe_threads(pid_) << "daemon_fixture: SIGKILL\n";
    r = wait_for(pid_, std::chrono::milliseconds(0));
  }
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
