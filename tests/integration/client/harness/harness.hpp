// SPDX-License-Identifier: Apache-2.0
// Shared plumbing of the client and KV integration suites (issues 3 and 4):
// synthetic model files, client processes (fork+exec of the helper
// programs, talked to over pipes, killed by pid), a blkio throttle that slows
// the daemon's O_DIRECT reads so a load can be caught half-way, and raw D-Bus
// calls so errors are checked by their D-Bus names. Nothing here fakes the
// daemon, the bus or the kernel.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "blkio_throttle.hpp"
#include "gguf/writer.hpp"

namespace sdbus {
class IConnection;
}

namespace airs::test {

using std::chrono::milliseconds;

// A temporary directory, removed with everything in it.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A synthetic GGUF written to disk (and fsynced, so O_DIRECT reads of it
// never wait for write-back).
struct ModelFile {
  std::string path;
  gguf::ModelPlan plan;
  [[nodiscard]] uint64_t size() const { return plan.file_size; }
};

// A llama-shaped model of about `target_bytes` (n_layers layers), named
// `name`, written to dir/file. Aborts the test on failure (ASSERT in caller
// via the returned optional being empty is not needed: throws).
ModelFile make_model(const TempDir& dir, const std::string& file, const std::string& name, uint64_t target_bytes,
                     uint64_t n_layers = 8, uint64_t seed = 1);

// The huge page size of the kernel's default hugetlbfs pool.
uint64_t huge_page_size();
uint64_t round_up_pages(uint64_t bytes);

// A client process: fork+exec of `argv`, stdin and stdout are pipes, stderr
// goes to a file (read with err()). Killed (SIGKILL) and reaped by pid in the
// destructor if still running.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  [[nodiscard]] pid_t pid() const { return pid_; }
  // Next stdout line (without '\n'); nullopt on EOF or time-out.
  std::optional<std::string> read_line(milliseconds timeout = milliseconds(20000));
  // Reads lines until one starts with `prefix`; returns it (nullopt on EOF/time-out).
  std::optional<std::string> expect_line(const std::string& prefix, milliseconds timeout = milliseconds(20000));
  // Writes `line` + '\n' to its stdin.
  bool send(const std::string& line);
  void close_stdin();
  void kill(int sig);
  // Waits for exit. exit_code -1 and signal set if killed; exit_code -2 on time-out (then it is killed).
  struct Exit {
    int exit_code = -2;
    int signal = 0;
  };
  Exit wait(milliseconds timeout = milliseconds(30000));
  [[nodiscard]] bool running();
  // Everything printed to stdout so far that was read, plus stderr.
  [[nodiscard]] std::string transcript() const;
  [[nodiscard]] std::string err() const;
  // /proc/PID/task/*/wchan: true if a thread sleeps in `fn` (e.g. handle_userfault).
  [[nodiscard]] bool thread_waits_in(const std::string& fn) const;

 private:
  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  std::string err_path_;
  std::string buf_;
  std::string seen_;
  bool reaped_ = false;
};

// "key=value key=value" → value of key ("" if absent).
std::string field(const std::string& line, const std::string& key);
uint64_t field_u64(const std::string& line, const std::string& key);

// Result of a raw D-Bus method call: the reply or the error's name and text.
struct CallError {
  std::string name;
  std::string message;
  [[nodiscard]] bool ok() const { return name.empty(); }
};

// A plain D-Bus client of the daemon (sdbus-c++), for status, listings and
// for calls whose D-Bus error names the tests check.
class BusClient {
 public:
  explicit BusClient(const std::string& address);
  ~BusClient();
  BusClient(const BusClient&) = delete;
  BusClient& operator=(const BusClient&) = delete;

  nlohmann::json status();
  nlohmann::json list_sessions();
  // LoadModel(fd of `path`); the object path in *object on success.
  // `timeout`: how long the call may wait for its reply (sd-bus's default
  // is 25 s).
  CallError load_model(const std::string& path, std::string* object = nullptr,
                       std::chrono::seconds timeout = std::chrono::seconds(25));
  CallError unload(const std::string& object, bool force);
  // Manager.Evict({model: object}): what an admin's `airsctl evict --model` does.
  CallError evict_model(const std::string& object);
  // Model.Open(lazy); the returned fds are closed at once.
  // Open (read-only; waits until resident unless `wait` is false) or
  // OpenLazy (with a fresh userfaultfd), proving access with an fd of
  // `proof_path`. Either holds a reference until Release or disconnect.
  CallError open_model(const std::string& object, const std::string& proof_path, bool lazy, bool wait = true);
  // Open (read-only) proving access with `proof_fd` (the caller keeps it).
  CallError open_model_fd(const std::string& object, int proof_fd, bool wait);
  // A reference on `object` that maps nothing (Open without waiting, which
  // every mode allows), for a test that names the model by its object path
  // across a wait: an unused model goes whenever the machine's memory
  // pressure crosses the daemon's PSI triggers (other processes' stalls
  // count), and the next client loads it under another path.
  CallError hold_model(const std::string& object, const std::string& proof_path) {
    return open_model(object, proof_path, false, false);
  }
  CallError release_model(const std::string& object);
  // Model.Hints with `socket_fd` (the caller keeps its own copy).
  CallError hints(const std::string& object, int socket_fd);
  // A property of type t (u is widened) of `object` on `interface`.
  uint64_t property_u64(const std::string& object, const std::string& interface, const std::string& name);
  // CreateSession; on success *session and the arena fd (owned by caller, -1 if not wanted).
  struct Session {
    std::string path;
    int arena_fd = -1;
    int notice_fd = -1;  // kept like a real client keeps them (the fd quota counts held fds)
    int event_fd = -1;
    uint64_t arena_bytes = 0;
    uint64_t chunk_bytes = 0;
    uint32_t blocks_per_chunk = 0;
    uint32_t block_bytes = 0;
  };
  CallError create_session(const std::string& model, const std::string& priority, Session* out);
  CallError allocate(const std::string& session, uint32_t n, std::vector<uint32_t>* blocks = nullptr);
  CallError free_blocks(const std::string& session, const std::vector<uint32_t>& blocks);
  CallError set_length(const std::string& session, uint32_t tokens);
  CallError close_session(const std::string& session);
  [[nodiscard]] const std::string& unique_name() const { return unique_; }

 private:
  std::unique_ptr<sdbus::IConnection> bus_;
  std::string unique_;
};

// The model's entry in a status document (by object path); null if absent.
nlohmann::json model_in(const nlohmann::json& status, const std::string& object);
// `airsctl --bus ADDR --json status` parsed (asserts it worked).
nlohmann::json airsctl_status(const std::string& bus);

// Polls `pred` every 5 ms until it is true or `timeout` passed; returns the
// time it took (nullopt on time-out).
std::optional<milliseconds> wait_until(const std::function<bool()>& pred, milliseconds timeout);

// Huge pages must be there for a pool of `bytes`: scripts/hugepages.sh does
// it once; tests skip loudly when it was not run (nothing lowers the count).
[[nodiscard]] std::optional<std::string> hugepages_missing(uint64_t bytes);

// Paths of the helper programs (from CMake).
std::string test_client_path();

}  // namespace airs::test
