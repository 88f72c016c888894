// SPDX-License-Identifier: Apache-2.0
#include "harness.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>
#include <sdbus-c++/sdbus-c++.h>

#include "daemon_fixture.hpp"
#include "dbus/variant.hpp"
#include "gguf/file_io.hpp"

namespace airs::test {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint64_t meminfo_kb(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string k;
  uint64_t v = 0;
  std::string unit;
  while (in >> k >> v) {
    std::getline(in, unit);
    if (k == key + ":") return v;
  }
  return 0;
}

}  // namespace

std::string test_client_path() { return AIRS_TEST_CLIENT_PATH; }

TempDir::TempDir() {
  // On the root disk (not a tmpfs): the daemon reads models with O_DIRECT,
  // which the blkio throttle can slow down.
  std::string base = "/var/tmp";
  if (::access(base.c_str(), W_OK) != 0) base = "/tmp";
  std::string tmpl = base + "/airs-ctest-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp: " + std::string(std::strerror(errno)));
  path_ = tmpl;
  // Another uid (nobody) reads nothing here; the dir stays root-only.
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

ModelFile make_model(const TempDir& dir, const std::string& file, const std::string& name, uint64_t target_bytes,
                     uint64_t n_layers, uint64_t seed) {
  gguf::ModelSpec base;
  base.name = name;
  base.n_layers = n_layers;
  base.seed = seed;
  base.types = gguf::TypeScheme::kF16;
  auto spec = gguf::spec_for_size(base, target_bytes);
  if (!spec) throw std::runtime_error("spec_for_size: " + spec.error().message);
  auto plan = gguf::plan_model(*spec);
  if (!plan) throw std::runtime_error("plan_model: " + plan.error().message);
  ModelFile m;
  m.path = dir.file(file);
  m.plan = std::move(plan).value();
  if (auto s = gguf::write_model_file(m.plan, m.path); !s) throw std::runtime_error("write_model_file: " + s.error().message);
  const int fd = ::open(m.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  return m;
}

uint64_t huge_page_size() {
  const uint64_t kb = meminfo_kb("Hugepagesize");
  return kb == 0 ? (uint64_t{2} << 20) : kb * 1024;
}

uint64_t round_up_pages(uint64_t bytes) {
  const uint64_t p = huge_page_size();
  return (bytes + p - 1) / p * p;
}

std::optional<std::string> hugepages_missing(uint64_t bytes) {
  const uint64_t need = (bytes + huge_page_size() - 1) / huge_page_size();
  const uint64_t free_pages = meminfo_kb("HugePages_Free");
  const uint64_t rsvd = meminfo_kb("HugePages_Rsvd");
  const uint64_t avail = free_pages - std::min(free_pages, rsvd);
  if (avail >= need) return std::nullopt;
  return "only " + std::to_string(avail) + " huge pages are free and unreserved, the test needs " +
         std::to_string(need) + ": run `scripts/hugepages.sh " + std::to_string(bytes * 4) + "` as root once";
}

// ---- Child ----

Child::Child(const std::vector<std::string>& argv) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
  char tmpl[] = "/tmp/airs-child-err-XXXXXX";
  const int efd = ::mkostemp(tmpl, O_CLOEXEC);
  if (efd < 0) throw std::runtime_error("mkostemp");
  err_path_ = tmpl;
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork");
  if (pid_ == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(efd, 2);
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    std::fprintf(stderr, "exec %s: %s\n", a[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(efd);
  ::close(in[0]);
  ::close(out[1]);
  in_ = in[1];
  out_ = out[0];
}

Child::~Child() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
  if (in_ >= 0) ::close(in_);
  if (out_ >= 0) ::close(out_);
  if (!err_path_.empty()) ::unlink(err_path_.c_str());
}

std::optional<std::string> Child::read_line(milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (auto nl = buf_.find('\n'); nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      seen_ += line + "\n";
      return line;
    }
    if (out_ < 0) return std::nullopt;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return std::nullopt;
    pollfd p{out_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100)));
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (r <= 0) continue;
    char b[4096];
    const ssize_t n = ::read(out_, b, sizeof b);
    if (n <= 0) {
      ::close(out_);
      out_ = -1;
      if (!buf_.empty()) {
        std::string line = std::move(buf_);
        buf_.clear();
        seen_ += line + "\n";
        return line;
      }
      return std::nullopt;
    }
    buf_.append(b, static_cast<size_t>(n));
  }
}

std::optional<std::string> Child::expect_line(const std::string& prefix, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    auto l = read_line(left);
    if (!l) return std::nullopt;
    if (l->rfind(prefix, 0) == 0) return l;
  }
}

bool Child::send(const std::string& line) {
  if (in_ < 0) return false;
  const std::string s = line + "\n";
  return ::write(in_, s.data(), s.size()) == static_cast<ssize_t>(s.size());
}

void Child::close_stdin() {
  if (in_ >= 0) ::close(in_);
  in_ = -1;
}

void Child::kill(int sig) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
}

bool Child::running() {
  if (reaped_) return false;
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
  return info.si_pid == 0;
}

Child::Exit Child::wait(milliseconds timeout) {
  Exit e;
  if (reaped_) return e;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int st = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &st, 0);
      reaped_ = true;
      e.exit_code = -2;
      return e;
    }
    std::this_thread::sleep_for(milliseconds(2));
  }
  reaped_ = true;
  // Drain what it printed before it exited.
  while (read_line(milliseconds(50))) {
  }
  if (WIFEXITED(st)) {
    e.exit_code = WEXITSTATUS(st);
  } else {
    e.exit_code = -1;
    e.signal = WTERMSIG(st);
  }
  return e;
}

std::string Child::err() const { return read_file(err_path_); }

std::string Child::transcript() const { return "stdout:\n" + seen_ + buf_ + "stderr:\n" + err(); }

bool Child::thread_waits_in(const std::string& fn) const {
  const std::string dir = "/proc/" + std::to_string(pid_) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (read_file(dir + "/" + e->d_name + "/wchan") == fn) found = true;
  }
  ::closedir(d);
  return found;
}

std::string field(const std::string& line, const std::string& key) {
  const std::string k = key + "=";
  size_t pos = 0;
  while ((pos = line.find(k, pos)) != std::string::npos) {
    if (pos == 0 || line[pos - 1] == ' ') {
      const size_t start = pos + k.size();
      const size_t end = line.find(' ', start);
      return line.substr(start, end == std::string::npos ? std::string::npos : end - start);
    }
    pos += k.size();
  }
  return "";
}

uint64_t field_u64(const std::string& line, const std::string& key) {
  const std::string v = field(line, key);
  return v.empty() ? UINT64_MAX : std::strtoull(v.c_str(), nullptr, 0);
}

// ---- BusClient ----

namespace {
constexpr const char* kBus = "org.aios.Airs1";
constexpr const char* kManager = "/org/aios/Airs1";
constexpr const char* kManagerIf = "org.aios.Airs1.Manager";
constexpr const char* kSessionIf = "org.aios.Airs1.Session";

template <typename F>
CallError guarded(F&& f) {
  try {
    f();
    return {};
  } catch (const sdbus::Error& e) {
    return {e.getName(), e.getMessage()};
  }
}
}  // namespace

BusClient::BusClient(const std::string& address) {
  bus_ = sdbus::createSessionBusConnectionWithAddress(address);
  unique_ = bus_->getUniqueName();
}

BusClient::~BusClient() = default;

nlohmann::json BusClient::status() {
  auto p = sdbus::createProxy(*bus_, kBus, kManager);
  dbus::Dict d;
  p->callMethod("GetStatus").onInterface(kManagerIf).storeResultsTo(d);
  return dbus::to_json(d);
}

nlohmann::json BusClient::list_sessions() {
  auto p = sdbus::createProxy(*bus_, kBus, kManager);
  std::vector<dbus::Dict> v;
  p->callMethod("ListSessions").onInterface(kManagerIf).storeResultsTo(v);
  nlohmann::json j = nlohmann::json::array();
  for (auto& d : v) j.push_back(dbus::to_json(d));
  return j;
}

CallError BusClient::load_model(const std::string& path, std::string* object, std::chrono::seconds timeout) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {"open", path + ": " + std::strerror(errno)};
  sdbus::UnixFd ufd(fd, sdbus::adopt_fd);
  return guarded([&] {
    auto p = sdbus::createProxy(*bus_, kBus, kManager);
    sdbus::ObjectPath o;
    p->callMethod("LoadModel").onInterface(kManagerIf).withTimeout(timeout).withArguments(ufd, dbus::Dict{})
        .storeResultsTo(o);
    if (object != nullptr) *object = o;
  });
}

CallError BusClient::unload(const std::string& object, bool force) {
  return guarded([&] {
    auto p = sdbus::createProxy(*bus_, kBus, kManager);
    p->callMethod("Unload").onInterface(kManagerIf).withArguments(sdbus::ObjectPath(object), force);
  });
}

CallError BusClient::evict_model(const std::string& object) {
  return guarded([&] {
    auto p = sdbus::createProxy(*bus_, kBus, kManager);
    dbus::Dict report;
    p->callMethod("Evict")
        .onInterface(kManagerIf)
        .withArguments(dbus::Dict{{"model", sdbus::Variant(sdbus::ObjectPath(object))}}, false)
        .storeResultsTo(report);
  });
}

CallError BusClient::open_model(const std::string& object, const std::string& proof_path, bool lazy, bool wait) {
  return guarded([&] {
    auto p = sdbus::createProxy(*bus_, kBus, object);
    sdbus::UnixFd region, status;
    uint64_t size = 0;
    dbus::Dict info;
    sdbus::UnixFd proof(::open(proof_path.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd);
    if (lazy) {
      sdbus::UnixFd uffd(static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK)), sdbus::adopt_fd);
      p->callMethod("OpenLazy")
          .onInterface("org.aios.Airs1.Model")
          .withArguments(proof, uffd, dbus::Dict{})
          .storeResultsTo(region, size, status, info);
    } else {
      dbus::Dict options;
      if (!wait) options["wait"] = sdbus::Variant(false);
      p->callMethod("Open")
          .onInterface("org.aios.Airs1.Model")
          .withArguments(proof, options)
          .storeResultsTo(region, size, status, info);
    }
  });
}

CallError BusClient::open_model_fd(const std::string& object, int proof_fd, bool wait) {
  return guarded([&] {
    auto p = sdbus::createProxy(*bus_, kBus, object);
    sdbus::UnixFd region, status;
    uint64_t size = 0;
    dbus::Dict info, options;
    if (!wait) options["wait"] = sdbus::Variant(false);
    p->callMethod("Open")
        .onInterface("org.aios.Airs1.Model")
        .withArguments(sdbus::UnixFd(proof_fd), options)
        .storeResultsTo(region, size, status, info);
  });
}

CallError BusClient::release_model(const std::string& object) {
  return guarded([&] {
    auto p = sdbus::createProxy(*bus_, kBus, object);
    p->callMethod("Release").onInterface("org.aios.Airs1.Model");
  });
}

CallError BusClient::hints(const std::string& object, int socket_fd) {
  return guarded([&] {
    auto p = sdbus::createProxy(*bus_, kBus, object);
    p->callMethod("Hints").onInterface("org.aios.Airs1.Model").withArguments(sdbus::UnixFd(socket_fd));
  });
}

uint64_t BusClient::property_u64(const std::string& object, const std::string& interface, const std::string& name) {
  auto p = sdbus::createProxy(*bus_, kBus, object);
  sdbus::Variant v = p->getProperty(name).onInterface(interface);
  if (v.containsValueOfType<uint32_t>()) return v.get<uint32_t>();
  return v.get<uint64_t>();
}

CallError BusClient::create_session(const std::string& model, const std::string& priority, Session* out) {
  return guarded([&] {
    auto p = sdbus::createProxy(*bus_, kBus, kManager);
    sdbus::ObjectPath path;
    sdbus::UnixFd arena, notice, event;
    dbus::Dict geo;
    p->callMethod("CreateSession")
        .onInterface(kManagerIf)
        .withArguments(sdbus::ObjectPath(model), priority, dbus::Dict{})
        .storeResultsTo(path, arena, notice, event, geo);
    if (out != nullptr) {
      out->path = path;
      out->arena_fd = ::fcntl(arena.get(), F_DUPFD_CLOEXEC, 3);
      out->notice_fd = ::fcntl(notice.get(), F_DUPFD_CLOEXEC, 3);
      out->event_fd = ::fcntl(event.get(), F_DUPFD_CLOEXEC, 3);
      out->arena_bytes = dbus::get<uint64_t>(geo, "arena_bytes").value_or(0);
      out->chunk_bytes = dbus::get<uint64_t>(geo, "chunk_bytes").value_or(0);
      out->blocks_per_chunk = dbus::get<uint32_t>(geo, "blocks_per_chunk").value_or(0);
      out->block_bytes = dbus::get<uint32_t>(geo, "block_bytes").value_or(0);
    }
  });
}

CallError BusClient::allocate(const std::string& session, uint32_t n, std::vector<uint32_t>* blocks) {
  return guarded([&] {
    auto p = sdbus::createProxy(*bus_, kBus, session);
    std::vector<uint32_t> b;
    p->callMethod("Allocate").onInterface(kSessionIf).withArguments(n).storeResultsTo(b);
    if (blocks != nullptr) *blocks = std::move(b);
  });
}

CallError BusClient::free_blocks(const std::string& session, const std::vector<uint32_t>& blocks) {
  return guarded([&] {
    auto p = sdbus::createProxy(*bus_, kBus, session);
    p->callMethod("Free").onInterface(kSessionIf).withArguments(blocks);
  });
}

CallError BusClient::set_length(const std::string& session, uint32_t tokens) {
  return guarded([&] {
    auto p = sdbus::createProxy(*bus_, kBus, session);
    p->callMethod("SetLength").onInterface(kSessionIf).withArguments(tokens);
  });
}

CallError BusClient::close_session(const std::string& session) {
  return guarded([&] {
    auto p = sdbus::createProxy(*bus_, kBus, session);
    p->callMethod("Close").onInterface(kSessionIf);
  });
}

nlohmann::json model_in(const nlohmann::json& status, const std::string& object) {
  if (!status.contains("models")) return nullptr;
  for (const auto& m : status["models"])
    if (m.value("object", "") == object) return m;
  return nullptr;
}

nlohmann::json airsctl_status(const std::string& bus) {
  auto r = run_process({airsctl_path(), "--bus", bus, "--json", "status"});
  if (r.exit_code != 0) throw std::runtime_error("airsctl status failed: " + r.err);
  return nlohmann::json::parse(r.out);
}

std::optional<milliseconds> wait_until(const std::function<bool()>& pred, milliseconds timeout) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    if (pred()) return std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
    if (std::chrono::steady_clock::now() - t0 > timeout) return std::nullopt;
    std::this_thread::sleep_for(milliseconds(5));
  }
}

}  // namespace airs::test
