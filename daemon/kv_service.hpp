// SPDX-License-Identifier: Apache-2.0
// KV sessions on the pool: the pure allocator (src/kv) decides, this class
// carries it out on real memory (one pool region per (model, uid) arena,
// chunks fallocated and punched, COW copies through the daemon's mapping),
// publishes eviction notices (notice page + wake socket + signal) before any
// reply that follows an eviction, and keeps per-connection ownership.
// Loop thread only.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "daemon/kv_spill.hpp"
#include "daemon/models.hpp"
#include "daemon/status.hpp"
#include "dbus/identity.hpp"
#include "dbus/variant.hpp"
#include "kv/allocator.hpp"
#include "pool/pool.hpp"
#include "wire/notice_page.hpp"
#include "sys/fd.hpp"
#include "sys/files.hpp"
#include "sys/event_loop.hpp"
#include "sys/proc_handles.hpp"

namespace airs::daemon {

// The loop's watch of a session's wake channel, for its client's KV access
// reports (wire/kv_access.hpp). Ends before the fd it watches closes: a
// KvSession declares it after event_fd.
class ReportWatch {
 public:
  ReportWatch() = default;
  ReportWatch(const ReportWatch&) = delete;
  ReportWatch& operator=(const ReportWatch&) = delete;
  ~ReportWatch() { stop(); }
  [[nodiscard]] Status start(sys::EventLoop& loop, int fd, sys::EventLoop::Callback cb);
  void stop();

 private:
  sys::EventLoop* loop_ = nullptr;
  int fd_ = -1;
};

struct KvSession {
  kv::SessionId id = 0;
  std::string path;   // object path
  std::string owner;  // bus unique name of the creator
  uid_t uid = 0;
  uint64_t model = 0;
  std::string model_name;
  policy::Priority priority = policy::Priority::Background;
  bool admin = false;  // an admin's allocations may push out idle models; others' only KV
  kv::ArenaId arena = 0;
  sys::SealedMemfd notice_page;  // we write, the client reads (read-only fd)
  wire::NoticeWriter notices;
  sys::UniqueFd event_fd;  // our end of the wake channel (sys::wake)
  std::optional<std::pair<dev_t, ino_t>> wake_inode;  // the client's end
  ReportWatch reports;  // of event_fd; declared after it, so it ends first
  uint64_t access_reports = 0;  // KV access reports taken
  bool reports_refused = false;  // after a malformed one (refuse_reports)
  uint64_t evicted_blocks = 0;
  uint64_t restored_blocks = 0;  // restored from the spill tier by MatchPrefix
};

struct CreatedSession {
  KvSession* session = nullptr;
  sys::UniqueFd arena_fd;
  sys::UniqueFd notice_fd;  // read-only
  sys::UniqueFd event_fd;
  SessionGeometry geometry;
};

class KvService final : public kv::ChunkOps {
 public:
  // Called for every eviction notice after it was written to the notice
  // page and the wake socket (for the D-Bus signals).
  using EvictedFn = std::function<void(const KvSession&, const std::vector<uint32_t>& blocks, uint64_t bytes,
                                       const std::string& reason)>;

  KvService(pool::Pool& pool, Models& models, const config::KvConfig& cfg, EvictedFn on_evicted);
  ~KvService() override;

  Result<CreatedSession> create(ModelEntry& model, const dbus::Caller& caller, policy::Priority priority,
                                bool admin = false);
  // The caller's session at `path`; AccessDenied for another connection's,
  // NotFound for none or one whose arena is closing (cut too often).
  Result<KvSession*> get(const std::string& path, const dbus::Caller& caller);

  // EINPROGRESS when the room it needs is in pages still on their way back
  // to the pool (Evictor::make_room): nothing is allocated, the same call
  // once a drain ended finds them (Daemon's DrainWaits).
  Result<std::vector<uint32_t>> allocate(KvSession& s, uint32_t n);
  // One block at table index `index` (a hole or the end), see
  // kv::Allocator::allocate_at.
  Result<uint32_t> allocate_at(KvSession& s, uint32_t index);
  Status free(KvSession& s, const std::vector<uint32_t>& blocks);
  Status commit(KvSession& s, const std::vector<uint32_t>& blocks, const std::vector<uint64_t>& hashes);
  // The longest run of blocks for hashes[0..]: first those in memory, then
  // those in the spill tier, read back into fresh blocks of the session
  // (published again) before this returns — so the reply lists only blocks
  // whose bytes are there. An entry that fails validation ends the run (the
  // client recomputes from there); so does a pool without room for the
  // restored blocks.
  Result<std::vector<uint32_t>> match_prefix(KvSession& s, const std::vector<uint64_t>& hashes);
  Result<uint32_t> prepare_write(KvSession& s, uint32_t block);
  Status set_length(KvSession& s, uint32_t tokens);
  Status close(KvSession& s);
  // Every session of a connection that left the bus.
  std::vector<std::string> drop_caller(const std::string& caller);
  // The sessions of `from` belong to `to` from now on (its bus is gone, its
  // process lives: only `to` may use them, and no bus name is `to`). True
  // if it has any.
  bool rename_caller(const std::string& from, const std::string& to);
  // KV sessions open on a model (they use it: it is not idle).
  [[nodiscard]] uint32_t sessions_on(uint64_t model) const;
  // The model is gone: its sessions are closed (their clients are told every
  // block was lost; the arena is truncated, so a stale mapping gets SIGBUS)
  // and its arenas released, cached prefixes included. Returns the closed
  // sessions' object paths.
  std::vector<std::string> close_model(uint64_t model, const std::string& reason);
  // Room across the pool for a KV allocation: the daemon's one eviction
  // order (Evictor::make_room with policy::Request::for_kv_allocation).
  using RoomMaker = std::function<Status(const policy::Request&, const std::string& why)>;
  void set_room_maker(RoomMaker f) { make_room_ = std::move(f); }
  // Sessions made from here on are watched on `loop` for their clients' KV
  // access reports (wire/kv_access.hpp), which rank idle KV in eviction.
  void watch_reports(sys::EventLoop& loop) { loop_ = &loop; }
  // Inodes of the fds handed out: arenas, notice pages, wake sockets.
  void add_inodes(sys::InodeSet& out) const;

  // For the pressure loop and admin eviction.
  [[nodiscard]] policy::PoolState snapshot() const;
  Result<uint64_t> execute(const policy::Action& a);  // bytes freed

  [[nodiscard]] KvStatus status() const;
  [[nodiscard]] kv::KvStats totals() const { return alloc_.total_stats(); }
  [[nodiscard]] std::vector<SessionStatus> sessions() const;
  [[nodiscard]] const KvSession* find_id(kv::SessionId id) const;
  // The allocator's view of the session at `path` (for bus properties).
  [[nodiscard]] std::optional<kv::SessionInfo> info(const std::string& path) const;
  [[nodiscard]] kv::Allocator& allocator() { return alloc_; }

  // The spill tier (none: published blocks are dropped when evicted).
  void set_spill_store(std::unique_ptr<SpillStore> store) { spill_ = std::move(store); }
  [[nodiscard]] const SpillStore* spill_store() const { return spill_.get(); }
  // A clean stop: keeps every published block still in memory (cached or
  // held) in the spill tier, waiting for the writes until `deadline`.
  // Returns how many blocks were kept.
  uint64_t spill_all(std::chrono::steady_clock::time_point deadline);

  // Puts every arena back as the pool made it (Pool::restore_kv_region):
  // a client holds its arena O_RDWR and may have resized it or filled its
  // holes. Runs from housekeeping, before status is taken and when a
  // session ends, so what a client added is never held for long, and never
  // uncounted in what status reports.
  //
  // A cut is the one change whose repair costs the daemon work (the pages
  // past the cut are allocated, and so zeroed, again), and it costs the
  // client one ftruncate. So an arena is refilled after kCutRepairs cuts at
  // most; at the next one it is marked closing: nothing is refilled or
  // allocated in it, and close_cut_arenas() ends it.
  static constexpr uint32_t kCutRepairs = 2;
  void restore_arenas();
  // Closes the arenas cut once too often, with every session on them (their
  // clients are told each block was lost; the arena is truncated). Returns
  // the closed sessions' object paths. Housekeeping calls it, outside any
  // bus handler, since a session object may not go inside its own call.
  std::vector<std::string> close_cut_arenas();

  // kv::ChunkOps
  Status commit_chunk(kv::ArenaId arena, uint32_t chunk) override;
  void release_chunk(kv::ArenaId arena, uint32_t chunk) override;
  void copy_block(kv::ArenaId arena, kv::BlockId src, kv::BlockId dst) override;
  bool spill_block(kv::ArenaId arena, kv::BlockId block, uint64_t hash) override;

 private:
  struct Arena;
  void restore(kv::ArenaId id, Arena& a);
  void on_reports(kv::SessionId id, uint32_t events);
  static void refuse_reports(KvSession& s);
  struct Arena {
    std::unique_ptr<pool::Region> region;
    sys::Mapping map;  // the daemon's view, for COW copies (MAP_NORESERVE: touches only committed chunks)
    kv::KvGeometry geo;
    uint64_t pages_per_chunk = 1;
    uint64_t model = 0;
    uid_t uid = 0;
    bool exempt = false;  // an admin's: no pool share (config kv.max_pool_bytes_per_uid)
    std::optional<gguf::ContentId> content_id;  // kept: the model entry may be gone when the arena closes
    uint32_t cuts = 0;     // times its client cut it (each found by a repair)
    bool closing = false;  // cut past kCutRepairs: never refilled, closed by close_cut_arenas
  };
  // Closes every arena `which` names with the sessions on it (close_model, close_cut_arenas).
  std::vector<std::string> close_arenas(const std::function<bool(const Arena&)>& which, const std::string& reason);
  void publish(std::vector<kv::EvictionNotice>& notices);
  // The spill key of the arena's blocks (hash 0), if the tier is on and the model's content id is known.
  std::optional<SpillKey> spill_key(Arena& a);
  void restore_spilled(KvSession& s, const std::vector<uint64_t>& hashes, std::vector<uint32_t>& out);
  Status make_room(KvSession& s, uint64_t bytes);
  // Runs `attempt` (an allocation of n blocks for s), publishes its
  // notices, and on ENOMEM makes room across arenas and runs it once more.
  Status allocate_with_room(KvSession& s, uint32_t n,
                            const std::function<Status(std::vector<kv::EvictionNotice>&)>& attempt);

  pool::Pool& pool_;
  Models& models_;
  config::KvConfig cfg_;
  EvictedFn on_evicted_;
  RoomMaker make_room_;
  sys::EventLoop* loop_ = nullptr;  // watch_reports
  std::unique_ptr<SpillStore> spill_;
  kv::Allocator alloc_;
  std::map<kv::ArenaId, Arena> arenas_;
  std::map<kv::SessionId, std::unique_ptr<KvSession>> sessions_;
  std::map<std::string, kv::SessionId> by_path_;
  uint64_t arena_repairs_ = 0;
  uint64_t arenas_closed_ = 0;  // by close_cut_arenas
  // Set by commit_chunk when a uid's share refused a chunk (the allocator
  // sees only "the pool refused"): allocate() then says so and evicts
  // nothing across the pool for it.
  std::optional<std::string> share_refusal_;
};

}  // namespace airs::daemon
