// SPDX-License-Identifier: Apache-2.0
#include "blkio_throttle.hpp"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "sys/procfs.hpp"

namespace airs::test {
namespace {

constexpr const char* kV1Root = "/sys/fs/cgroup/blkio";

std::string read_file(const std::string& path) {
  auto r = sys::read_text_file(path);
  return r ? *r : std::string();
}
bool write_file(const std::string& path, const std::string& text) { return sys::write_text_file(path, text).ok(); }

bool has_word(const std::string& text, const std::string& word) {
  std::istringstream in(text);
  std::string w;
  while (in >> w)
    if (w == word) return true;
  return false;
}

// The root of the cgroup v2 hierarchy when its io controller can be used
// there (pure v2 at /sys/fs/cgroup, or the unified part of a hybrid), or "".
std::string v2_root_with_io() {
  for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    const std::string controllers = read_file(std::string(root) + "/cgroup.controllers");
    if (has_word(controllers, "io")) return root;
  }
  return {};
}

}  // namespace

BlkioThrottle::BlkioThrottle(const std::string& file, uint64_t bytes_per_s) {
  std::string root = v2_root_with_io();
  v2_ = !root.empty();
  if (!v2_) {
    root = kV1Root;
    if (::access((root + "/blkio.throttle.read_bps_device").c_str(), W_OK) != 0) {
      why_ = "no cgroup io controller to throttle with: neither cgroup v2 io (cgroup.controllers of /sys/fs/cgroup "
             "or /sys/fs/cgroup/unified) nor a cgroup v1 blkio throttle at " + root;
      return;
    }
  } else if (!has_word(read_file(root + "/cgroup.subtree_control"), "io") &&
             !write_file(root + "/cgroup.subtree_control", "+io")) {
    why_ = "cannot enable the io controller for children of " + root + " (cgroup.subtree_control): " +
           std::strerror(errno);
    return;
  }
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) {
    why_ = "stat " + file + ": " + std::strerror(errno);
    return;
  }
  unsigned maj = major(st.st_dev), min = minor(st.st_dev);
  // A partition is throttled through its disk.
  const std::string sys = "/sys/dev/block/" + std::to_string(maj) + ":" + std::to_string(min);
  if (::access((sys + "/partition").c_str(), F_OK) == 0) {
    const std::string parent = read_file(sys + "/../dev");
    if (std::sscanf(parent.c_str(), "%u:%u", &maj, &min) != 2) {
      why_ = "cannot find the disk of partition " + sys;
      return;
    }
  } else if (::access(sys.c_str(), F_OK) != 0) {
    why_ = file + " is not on a block device (" + sys + " missing): nothing to throttle";
    return;
  }
  std::string dir = root + "/airs-ctest-" + std::to_string(::getpid()) + "-" +
                    std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  if (::mkdir(dir.c_str(), 0755) != 0) {
    why_ = "mkdir " + dir + ": " + std::strerror(errno);
    return;
  }
  root_ = root;
  dir_ = dir;
  device_ = std::to_string(maj) + ":" + std::to_string(min);
  if (!set_rate(bytes_per_s)) {
    why_ = std::string("cannot set the read limit of ") + device_ + " to " + std::to_string(bytes_per_s) + " B/s in " +
           dir + " (" + kind() + "): " + std::strerror(errno);
    ::rmdir(dir.c_str());
    dir_.clear();
  }
}

BlkioThrottle::~BlkioThrottle() {
  if (dir_.empty()) return;
  // Anything still inside goes back to the root group first.
  std::istringstream procs(read_file(dir_ + "/cgroup.procs"));
  std::string pid;
  while (procs >> pid) write_file(root_ + "/cgroup.procs", pid);
  for (int i = 0; i < 200 && ::rmdir(dir_.c_str()) != 0 && errno == EBUSY; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

bool BlkioThrottle::add(pid_t pid) { return !dir_.empty() && write_file(dir_ + "/cgroup.procs", std::to_string(pid)); }

bool BlkioThrottle::set_rate(uint64_t bytes_per_s) {
  if (dir_.empty()) return false;
  if (v2_)
    return write_file(dir_ + "/io.max",
                      device_ + " rbps=" + (bytes_per_s == 0 ? std::string("max") : std::to_string(bytes_per_s)));
  return write_file(dir_ + "/blkio.throttle.read_bps_device", device_ + " " + std::to_string(bytes_per_s));
}

}  // namespace airs::test
