// SPDX-License-Identifier: Apache-2.0
// Integration-test plumbing: a private dbus-daemon and a real airs-memd on
// it, started as child processes and stopped by pid. Nothing here fakes the
// daemon or the bus.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace airs::test {

struct ProcessResult {
  int exit_code = -1;   // -1 if killed by a signal
  int signal = 0;
  std::string out;
  std::string err;
};

// Runs argv to completion, capturing stdout/stderr. `timeout` kills it.
ProcessResult run_process(const std::vector<std::string>& argv,
                          std::chrono::milliseconds timeout = std::chrono::seconds(30));

class PrivateBus {
 public:
  PrivateBus();  // starts dbus-daemon; aborts the test on failure
  // Listens on the unix socket `socket_path` (a bus started again at the
  // same path is "the same address" to clients).
  explicit PrivateBus(const std::string& socket_path);
  ~PrivateBus();  // SIGTERM, and waits until it exited
  PrivateBus(const PrivateBus&) = delete;
  PrivateBus& operator=(const PrivateBus&) = delete;
  [[nodiscard]] const std::string& address() const { return address_; }
  [[nodiscard]] pid_t pid() const { return pid_; }  // the dbus-daemon's

 private:
  pid_t pid_ = -1;
  std::string address_;
};

// `toml` with a pressure source: its own when its [pressure] table names
// one, else source = "off". PSI is machine-wide: any process's stall
// counts, and a 2-core machine building or running sanitizers stalls. With
// the daemon's default triggers, that pressure unloads whatever model a
// test has loaded and not yet opened, between two of its steps (a test that
// then names the model by its object path fails for the machine's sake).
// A test whose subject is pressure names its source.
std::string with_pressure_source(const std::string& toml);

class DaemonProcess {
 public:
  // Writes `config_toml` (with_pressure_source) to a temp file and starts
  // airs-memd on `bus`.
  // Waits until its log says `ready_line` (by default: it owns its name),
  // or it exited: then started() is false and log() says why.
  // Its config, log and state go in a new directory under `files_in`. A
  // test that holds the daemon's reads in a throttled disk puts them on a
  // tmpfs (/dev/shm): appending to its log or writing its state could read
  // a block of that disk back, behind the held reads.
  DaemonProcess(const std::string& bus_address, const std::string& config_toml,
                std::vector<std::string> extra_args = {},
                const std::string& ready_line = "serving org.aios.Airs1", const std::string& files_in = "/tmp");
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  [[nodiscard]] bool started() const { return started_; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  // SIGTERM and wait; returns the exit status (or -signal).
  int stop(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // SIGKILL and reap.
  void kill_hard();
  [[nodiscard]] std::string log() const;  // its stderr so far

 private:
  pid_t pid_ = -1;
  bool started_ = false;
  std::string dir_;
};

// A path to `program` that every uid can execute: the program itself when
// every directory above it is searchable by others (and it is executable by
// them), else a copy in a directory under /tmp that is (made once per
// program and process, removed at exit). A checkout in root's home (0700)
// is not reachable by another uid, so a test that runs a program as
// another uid goes through this. Errors end the test (ADD_FAILURE) and
// return the original path.
std::string reachable_by_all(const std::string& program);

// Paths of the built programs (from CMake).
std::string airs_memd_path();
std::string airsctl_path();
std::string source_dir();

}  // namespace airs::test
