// SPDX-License-Identifier: Apache-2.0
// Real memory pressure for tests: a memory cgroup with a small limit and a
// child process in it whose file-backed working set is larger than the
// limit. The child keeps refaulting its own page cache, so it stalls in
// memcg reclaim (PSI "some" and "full") without being OOM-killed.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "sys/fd.hpp"
#include "sys/procfs.hpp"
#include "util/result.hpp"
#include "util/units.hpp"

namespace airs::test {

// Triggers that one stressor crosses within seconds (it stalls ~75-160
// ms/s "some" and ~30-65 ms/s "full" here), 2 s windows (a VM may withhold
// CAP_SYS_RESOURCE), and a target larger than everything evictable, so one
// event shows the whole eviction order: the [pressure] table of a config.
inline constexpr const char* kStressorPsiTriggers = R"(source = "psi"
some_threshold = "50ms"
some_window = "2000ms"
full_threshold = "20ms"
full_window = "2000ms"
target_some_bytes = "1G"
target_full_bytes = "1G"
min_eviction_interval = "500ms"
grow_after = "3s"
)";

class MemcgStressor {
 public:
  // Prefers cgroup v2 where its hierarchy has the memory controller, else
  // the v1 memory controller. Errors say what is missing (for a loud skip).
  static Result<std::unique_ptr<MemcgStressor>> create(uint64_t limit_bytes, uint64_t working_set_bytes) {
    std::unique_ptr<MemcgStressor> s(new MemcgStressor());
    for (const char* v2 : {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}) {
      auto ctl = sys::read_text_file(std::string(v2) + "/cgroup.controllers");
      if (ctl && ctl->find("memory") != std::string::npos) {
        s->base_ = v2;
        s->v2_ = true;
        break;
      }
    }
    if (s->base_.empty()) {
      if (!std::filesystem::exists("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
        return make_error(ENOENT, "no memory cgroup controller (neither v2 with 'memory' nor v1 /sys/fs/cgroup/memory)");
      s->base_ = "/sys/fs/cgroup/memory";
    }
    s->cg_ = s->base_ + "/airs-pressure-test-" + std::to_string(::getpid());
    std::error_code ec;
    std::filesystem::create_directory(s->cg_, ec);
    if (ec) return make_error(ec.value(), "mkdir {}: {}", s->cg_, ec.message());
    s->made_cg_ = true;
    AIRS_TRY(sys::write_text_file(s->cg_ + (s->v2_ ? "/memory.max" : "/memory.limit_in_bytes"),
                                  std::to_string(limit_bytes)));
    if (s->v2_) (void)sys::write_text_file(s->cg_ + "/memory.swap.max", "0");

    // The working set: a disk file, dropped from the page cache so the child
    // faults it in (and is charged for it) itself.
    s->file_ = "/var/tmp/airs-pressure-test-" + std::to_string(::getpid());
    {
      sys::UniqueFd fd(::open(s->file_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
      if (!fd) return make_error(errno, "create {}: {}", s->file_, std::strerror(errno));
      std::vector<char> buf(kMiB);
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 131 + 7);
      for (uint64_t done = 0; done < working_set_bytes; done += buf.size())
        if (::write(fd.get(), buf.data(), buf.size()) != static_cast<ssize_t>(buf.size()))
          return make_error(errno, "write {}: {}", s->file_, std::strerror(errno));
      ::fdatasync(fd.get());
      ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
    }
    s->size_ = working_set_bytes;
    return s;
  }

  // Forks the child, moves it into the cgroup, then lets it read its
  // working set (through a mapping) until killed.
  Status start() {
    int go[2];
    if (::pipe2(go, O_CLOEXEC) != 0) return make_error(errno, "pipe2: {}", std::strerror(errno));
    const pid_t pid = ::fork();
    if (pid < 0) return make_error(errno, "fork: {}", std::strerror(errno));
    if (pid == 0) {
      // Child: plain syscalls only. Waits until it is in the cgroup so every
      // page it faults is charged there.
      ::close(go[1]);
      char c = 0;
      if (::read(go[0], &c, 1) != 1) ::_exit(3);
      const int fd = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC);
      void* p = fd < 0 ? MAP_FAILED : ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) ::_exit(2);
      touch_forever(static_cast<const unsigned char*>(p), size_);
    }
    ::close(go[0]);
    pid_ = pid;
    auto moved = sys::write_text_file(cg_ + "/cgroup.procs", std::to_string(pid));
    const ssize_t n = ::write(go[1], "g", 1);
    ::close(go[1]);
    if (!moved) return moved;
    if (n != 1) return make_error(EIO, "cannot start stress child {}", pid);
    return {};
  }

  // Kills our own child (by pid) and waits for it.
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  ~MemcgStressor() {
    stop();
    if (made_cg_) {
      // The group is empty once the child is reaped; page cache charged to
      // it does not keep a v1/v2 group from being removed.
      for (int i = 0; i < 50 && ::rmdir(cg_.c_str()) != 0 && errno == EBUSY; ++i) ::usleep(20000);
    }
    if (!file_.empty()) ::unlink(file_.c_str());
  }

  [[nodiscard]] const std::string& cgroup() const { return cg_; }
  [[nodiscard]] bool v2() const { return v2_; }
  [[nodiscard]] pid_t pid() const { return pid_; }

 private:
  MemcgStressor() = default;
  // Reads one byte per page of the mapping, round and round. Not
  // instrumented: under TSan each read also writes shadow memory, which is
  // anonymous, charged to the child's small cgroup, and got the child
  // OOM-killed within a second (anon-rss 68 MB of a 64 MiB limit), so the
  // "pressure" was over before a trigger could see it.
  __attribute__((no_sanitize("thread"), noreturn)) static void touch_forever(const volatile unsigned char* b,
                                                                              size_t size) {
    // A volatile read in a discarded-value expression is still a read.
    for (;;)
      for (size_t off = 0; off < size; off += 4096) static_cast<void>(b[off]);
  }
  std::string base_, cg_, file_;
  bool v2_ = false;
  bool made_cg_ = false;
  uint64_t size_ = 0;
  pid_t pid_ = -1;
};

}  // namespace airs::test
