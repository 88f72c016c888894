// SPDX-License-Identifier: Apache-2.0
// The KV spill tier: published KV blocks (full blocks carrying a
// prefix hash) that eviction frees are kept on disk under
// `<daemon.state_dir>/kv/`, so a later MatchPrefix — by another process,
// after the model was unloaded and loaded again, after a restart or a
// reboot — restores them instead of recomputing them.
//
// Layout: one directory per uid (`<dir>/<uid>/`, mode 0700, root's own; a
// uid never matches another uid's entries: the uid is in the path and in
// the header) and one file per block (mode 0600) named
// `<content id>-<tokens per block>-<block bytes>-<prefix hash>` (hex): the
// model by content (gguf/content_id.hpp), never by path or name. A file is
// a 64-byte header (magic, version, the same key fields, an XXH3-64
// checksum of header and payload) and then the block's bytes.
//
// Writes: put() copies the block into a heap buffer (so eviction gives the
// pool memory back at once: copy-then-free), then writes it with io_uring —
// a temporary file, a linked write + fsync, and on completion (reaped by
// the event loop through the ring's eventfd) a rename to the final name, so
// an entry appears whole or not at all. Bytes in flight are bounded
// (kInflightLimit): past it a block is dropped, not kept (put says Busy).
// Opening, renaming and unlinking are small metadata calls on the loop.
//
// Reads: get() reads an entry (preadv, on the loop: a MatchPrefix reply
// waits for it), validates it in the store's own buffer and copies it into
// a fresh KV block through the kernel (the block's client may have cut its
// arena: EFAULT, never SIGBUS); a torn, corrupt or foreign entry is deleted
// with a log line and never served.
//
// Limit: LRU within `limit` bytes (file bytes); the oldest entries are
// deleted to make room. The order outlives the process: an entry's mtime is
// set when it is written and when it is read back, strictly increasing
// (so the kernel's coarse clock cannot tie two), and a fresh store indexes
// the directory at open oldest mtime first, checking each entry's name,
// size and header (the checksum is checked at every read); leftovers of
// interrupted writes are deleted.
//
// Thread: the event loop's only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gguf/content_id.hpp"
#include "sys/event_loop.hpp"
#include "sys/fd.hpp"
#include "sys/uring.hpp"
#include "util/result.hpp"

namespace airs::daemon {

struct SpillKey {
  uint64_t model_high = 0;  // the model's content id
  uint64_t model_low = 0;
  uint32_t uid = 0;
  uint32_t tokens_per_block = 0;
  uint32_t block_bytes = 0;
  uint64_t hash = 0;  // the block's chained prefix hash
  [[nodiscard]] std::string file_name() const;
  // The key a file name stands for (uid from its directory); nullopt if it is not one.
  [[nodiscard]] static std::optional<SpillKey> from_file_name(std::string_view name, uint32_t uid);
  friend auto operator<=>(const SpillKey&, const SpillKey&) = default;
};

struct SpillStats {
  uint64_t used_bytes = 0;     // bytes of complete entries on disk
  uint64_t limit_bytes = 0;
  uint64_t entries = 0;
  uint64_t hits = 0;           // blocks restored by MatchPrefix
  uint64_t misses = 0;         // MatchPrefix calls whose first block not in memory was not in the tier either
  uint64_t rejected = 0;       // entries found torn, corrupt or foreign (deleted, recomputed by the client)
  uint64_t written_bytes = 0;  // entry bytes written (since start)
  uint64_t read_bytes = 0;     // entry bytes read back
  uint64_t dropped = 0;        // blocks not kept: writes in flight at their bound, or a write failed
  uint64_t inflight_bytes = 0;
};

class SpillStore {
 public:
  // Bytes copied out and not yet written, at most; past it blocks are dropped.
  static constexpr uint64_t kInflightLimit = uint64_t{64} << 20;
  static constexpr uint32_t kHeaderBytes = 64;

  // Opens (creating, mode 0700) `dir` and indexes it; watches the ring on `loop`.
  static Result<std::unique_ptr<SpillStore>> open(sys::EventLoop& loop, std::string dir, uint64_t limit);
  ~SpillStore();
  SpillStore(const SpillStore&) = delete;
  SpillStore& operator=(const SpillStore&) = delete;

  // Complete entry on disk (written, renamed).
  [[nodiscard]] bool contains(const SpillKey& k) const { return index_.contains(k); }

  enum class Put { Kept, Busy, Refused };
  // Keeps key.block_bytes bytes at `bytes` (copied before it returns): Kept
  // if stored or queued (or already stored), Busy if the writes in flight
  // are at their bound (try later), Refused otherwise (bigger than the
  // limit, the directory failed; logged).
  Put put(const SpillKey& k, const void* bytes);

  // Reads the entry into `dst` (key.block_bytes bytes) and validates it.
  // EBADMSG for a torn, corrupt or foreign entry (deleted, logged); ENOENT
  // if there is none; EFAULT if `dst` is gone (its file was cut: the entry
  // stays). `dst` holds garbage after a failure.
  Status get(const SpillKey& k, void* dst);

  void count_miss() { ++stats_.misses; }
  void count_dropped() { ++stats_.dropped; }

  // Waits for the writes in flight, at most until `deadline`; returns how
  // many are still in flight.
  size_t drain(std::chrono::steady_clock::time_point deadline);

  // fsyncs the store's directories, so renamed entries survive a power
  // cut (a clean stop calls it; an entry lost to a crash is only a miss).
  void sync_dirs() const;

  [[nodiscard]] SpillStats stats() const;
  [[nodiscard]] const std::string& dir() const { return dir_; }

 private:
  struct Entry {
    uint64_t bytes = 0;
    uint64_t seq = 0;  // LRU order
  };
  struct Pending {
    SpillKey key;
    std::vector<std::byte> buf;  // header + payload
    sys::UniqueFd fd;
    std::string tmp;
    int done = 0;
    bool ok = true;
  };
  SpillStore(sys::EventLoop& loop, sys::Ring ring, std::string dir, uint64_t limit);
  Status scan();
  void on_completion(uint64_t user_data, int32_t res);
  void finish(uint64_t id);
  void touch(const SpillKey& k);
  void remove(SpillKey k, const char* why);  // by value: callers pass keys held by lru_
  void insert(const SpillKey& k, uint64_t bytes, uint64_t seq);
  [[nodiscard]] std::string uid_dir(uint32_t uid) const;
  Status ensure_uid_dir(uint32_t uid);
  void reject(const SpillKey& k, const std::string& why);
  // Sets the mtime of `fd` (or of `path`, fd < 0) to the next use stamp.
  void stamp(int fd, const std::string& path);

  sys::EventLoop& loop_;
  sys::Ring ring_;
  std::string dir_;
  uint64_t limit_ = 0;
  std::map<SpillKey, Entry> index_;
  std::map<uint64_t, SpillKey> lru_;  // seq → key, oldest first
  uint64_t next_seq_ = 1;
  timespec last_stamp_{};  // the latest mtime set or found
  std::map<uint64_t, Pending> pending_;  // by write id
  std::set<SpillKey> pending_keys_;
  uint64_t next_id_ = 1;
  std::set<uint32_t> uid_dirs_;
  std::vector<std::byte> scratch_;  // get(): an entry's payload, checked before it reaches a KV block
  SpillStats stats_;
};

}  // namespace airs::daemon
