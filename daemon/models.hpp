// SPDX-License-Identifier: Apache-2.0
// Models the daemon serves, and the one record of their state: identity (a
// GGUF file is one model however many clients load it), who it is charged
// to, references per bus client, pinning from config, and the fds a client
// needs. The mechanism (pool region, fills, faults) is the Pager's; what is
// loaded, and when it goes, is decided here and nowhere else.
//
// A model is in the table until it is evicted or unloaded, the same
// operation: the entry is dropped and the region truncated at once (every
// remaining mapping gets SIGBUS, never zeros or stale bytes); its pages
// return to the pool once its reads in flight landed (returning_pages(),
// docs/retire.md). A later LoadModel of the same file makes a new model.
//
// Access (every call, not just the first loader's): LoadModel and Open take
// the caller's own fd of the GGUF, which must be a regular file open for
// reading and, for Open, the model's very file (device and inode). Loop
// thread only.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "daemon/access_orders.hpp"
#include "daemon/header_reader.hpp"
#include "dbus/identity.hpp"
#include "gguf/content_id.hpp"
#include "gguf/gguf.hpp"
#include "pager/pager.hpp"
#include "pool/pool.hpp"
#include "sys/fd.hpp"
#include "sys/files.hpp"
#include "util/result.hpp"

namespace airs::daemon {

using Clock = std::chrono::steady_clock;

struct ModelEntry {
  uint64_t id = 0;  // also the object path suffix
  pager::ModelId pager_id = 0;
  std::string name;  // valid (util/text.hpp is_valid_name): safe to print
  std::string object_path;
  sys::FileId file;  // the GGUF's identity
  struct stat file_stat {};  // as loaded: the content-id cache's key
  std::string kept_as;       // its name in the service manager's fd store, once kept (kept_models.hpp)
  // The model by content (gguf/content_id.hpp): from the cache when the file
  // is unchanged since it was hashed, else found once the region is filled
  // (Daemon's ContentHasher). Unset until then.
  std::optional<gguf::ContentId> content_id;
  // The recorded access order, finished (resident) before the content id
  // was known: stored once it is (AccessOrders).
  std::optional<std::vector<uint32_t>> unstored_order;
  uint64_t region_bytes = 0;
  // A streamed model: its budget at load, which a quiet machine gives back
  // after pressure (or an admin's Evict) cut it (Models::restore_budgets).
  // 0: not streamed.
  uint64_t budget_at_load = 0;
  gguf::File meta;   // tensors, geometry (for KV and `airsctl read`)
  uid_t owner_uid = 0;       // charged to this uid (the first loader)
  bool owner_exempt = false;  // loaded by an admin or by the daemon itself: no quota
  std::map<std::string, uint32_t> refs;                          // bus unique name → Open count
  // Uids that proved read access to the GGUF (an fd of the very file, to
  // LoadModel or Open) while this entry lives: only they (and admins) may
  // have KV sessions on it (SECURITY.md rule 5).
  std::set<uid_t> readers;
  // Bus unique name → the pager's keys of its attached mappings (Attach,
  // Follow): whom to detach when it releases or leaves. Who is attached is
  // the pager's record (pager::ModelStats::clients); a key it lets go is
  // pruned here (Models::client_left).
  std::map<std::string, std::vector<pager::ClientKey>> clients;
  Clock::time_point last_used{};
  bool pinned = false;
  bool adopted = false;  // its filled region came from the previous daemon (nothing was read)
  [[nodiscard]] uint32_t refcount() const {
    uint32_t n = 0;
    for (auto& [k, v] : refs) n += v;
    return n;
  }
};

struct OpenResult {
  sys::UniqueFd region;  // O_RDWR for a lazy open, O_RDONLY otherwise
  uint64_t size = 0;
  sys::UniqueFd status;  // read-only status page
  bool resident = false;
  uint64_t unit_size = 0;
  bool streamed = false;
  bool expert_hints = false;  // Pager::takes_hints
};

struct LoadRequest {
  int gguf_fd = -1;         // the caller's; duplicated
  std::string name;         // requested name (valid) or empty: general.name
  uid_t uid = 0;
  bool exempt = false;      // admin or the daemon: no per-uid quota
};

// A filled region kept across a restart (the service manager's fd store),
// checked by the caller: same file (stat identity) and same content.
struct AdoptRequest {
  LoadRequest load;  // gguf_fd: the file reopened by its path; the name and owner as before
  std::unique_ptr<pool::Region> region;
  gguf::ContentId content_id;
};

struct Charge {
  uint32_t models = 0;
  uint64_t bytes = 0;
};

class Models {
 public:
  struct Hooks {
    // A model left the table (unload or eviction); called before the entry
    // is destroyed: drop its bus object, KV arenas, pending opens.
    std::function<void(const ModelEntry&, bool forced, const std::string& reason)> dropped;
  };

  // cooperative: no userfaultfd clients; regions are handed out read-only
  // and clients wait per layer on the status page.
  Models(pool::Pool& pool, pager::Pager& pager, const config::ModelsConfig& cfg, bool cooperative, Hooks hooks);

  // Frees `bytes` more in the pool for a model load, with the daemon's one
  // eviction order (policy::Request::for_model_load); acts only on a plan
  // that covers the request. ENOMEM (with the shortfall) otherwise;
  // EINPROGRESS when the room is in pages still on their way back. Set
  // after construction: the evictor that makes the room reads this table,
  // so it is built after it (the one cycle of the daemon's services).
  // Without one, a load takes only what is free.
  using RoomMaker = std::function<Status(uint64_t bytes, const std::string& why)>;
  void set_room_maker(RoomMaker f) { make_room_ = std::move(f); }

  // Where content ids are remembered (default: nowhere, every load misses).
  void set_content_ids(gguf::ContentIdCache cache) { content_ids_ = std::move(cache); }
  // `m`'s file hashed to `id` (it was unchanged since its load): kept in the
  // entry and the cache.
  void content_id_found(ModelEntry& m, const gguf::ContentId& id);
  // Where access orders are recorded and replayed (default: nowhere).
  void set_access_orders(AccessOrders orders) { orders_ = std::move(orders); }
  // `m`'s recording is over (it became resident, or it is being unloaded):
  // stored under its content id, or kept until the id is found.
  void access_order_done(ModelEntry& m);

  // Returns the model already loaded from the same file, or reserves a new
  // region for the GGUF whose `header` (its identity, stat and parsed
  // header: read_header, off the loop) was read from req.gguf_fd. For a caller that is not exempt, the uid's
  // quota (models.max_models_per_uid, max_pool_bytes_per_uid) is checked
  // before anything is evicted. Errors: EDQUOT quota, ENOMEM/ENOSPC the pool cannot hold it
  // (nothing was evicted for it then); EINPROGRESS its room is in pages on
  // their way back (Hooks::make_room): nothing is loaded or reserved, and
  // the same load once they are back (a drain event) finds them.
  Result<ModelEntry*> load(const LoadRequest& req, const Header& header);
  // The model of a kept region, Resident at once (nothing is read), with
  // the header read from req.load.gguf_fd. Errors: the pager's.
  Result<ModelEntry*> adopt(AdoptRequest req, Header header);

  // Takes a reference for `caller` after checking `proof_fd` is the model's
  // file opened for reading. `lazy`: a writable region fd for a userfaultfd
  // client (the caller checks trust first; refused in cooperative mode).
  // Otherwise read-only: EAGAIN while not resident, unless `nowait` in
  // cooperative mode (the client waits per layer). EACCES wrong file.
  Result<OpenResult> open(ModelEntry& m, const dbus::Caller& caller, int proof_fd, bool lazy, bool nowait);
  Status attach(ModelEntry& m, const dbus::Caller& caller, sys::UniqueFd notify, sys::UniqueFd uffd, uint64_t addr,
                uint64_t length);
  // Cooperative mode: registers the caller's request socket (pager::follow),
  // at most one per reference it holds; it goes with the caller's last
  // reference like an attachment. EPERM without a reference, EDQUOT past
  // one per reference.
  Status follow(ModelEntry& m, const dbus::Caller& caller, sys::UniqueFd requests, sys::UniqueFd opened);
  // A lazy client's expert hint socket (pager::Pager::hints): for a caller
  // that holds a reference, at most a mapping and a hint socket per
  // reference; it goes with the caller's last reference like an
  // attachment. EPERM without a reference, EDQUOT past that, ENOTSUP for a
  // model that is not a streamed mixture of experts.
  Status hints(ModelEntry& m, const dbus::Caller& caller, sys::UniqueFd socket);
  // Drops one reference of `caller` (and its attached mappings when its
  // last reference goes). ENOENT if it holds none.
  Status release(ModelEntry& m, const std::string& caller);
  // Everything `caller` held (it left the bus).
  void drop_caller(const std::string& caller);
  // The pager let client `key` of model `id` go (pager::Pager::Listeners::
  // client_left): it is no longer among its caller's clients.
  void client_left(pager::ModelId id, pager::ClientKey key);
  // What `from` holds (references, attached mappings) is held by `to` from
  // now on (its bus is gone, its process lives). True if it holds any.
  bool rename_caller(const std::string& from, const std::string& to);

  // Drops the model: the entry is destroyed (`m` dangles after) and its
  // region truncated (every mapping SIGBUS on next access) at once; the
  // pages return to the pool once the model's reads in flight landed, on
  // the loop (returning_pages() until then; nothing waits for them).
  // Without `force`: EBUSY while it has references or `in_use` (KV
  // sessions on it: callers go through Evictor::unload, which knows them),
  // and pinned models stay. `reason` goes to the log and the Evicted signal.
  Status unload(ModelEntry& m, bool force, bool in_use, const std::string& reason);

  // A streamed model gives back `bytes` of its budget (whole units, never
  // below its floor): the units the policy drops anyway go first, then the
  // pages are free in the pool (returning_pages() until the drops ended).
  Status shrink(ModelEntry& m, uint64_t bytes, const std::string& reason);
  // Whether a streamed model's budget is below its budget at load.
  [[nodiscard]] bool budgets_below_load() const;
  // After a quiet period (the pressure loop's grow): each streamed model
  // whose budget was cut gets pages back toward its budget at load, as far
  // as the pool has free pages.
  void restore_budgets();
  // What a streamed model could give back (budget above its floor); 0
  // otherwise.
  [[nodiscard]] uint64_t spare_bytes(const ModelEntry& m) const;

  ModelEntry* find(uint64_t id);
  ModelEntry* find_by_path(const std::string& path);
  ModelEntry* find_by_name(const std::string& name);
  std::vector<ModelEntry*> all();
  [[nodiscard]] Charge charged_to(uid_t uid) const;
  [[nodiscard]] std::optional<pager::ModelStats> stats(const ModelEntry& m) const;
  // Per layer: what is in the pool, being read, being dropped.
  struct Residency {
    std::vector<pager::Pager::RankResidency> ranks;
    uint64_t unit_size = 0;
    bool streamed = false;
    uint64_t budget_bytes = 0;
  };
  [[nodiscard]] Result<Residency> residency(const ModelEntry& m) const;
  // Pool pages of unloaded models that their reads still in flight hold
  // (pager::Pager::returning_pages): the entries are gone, the pages come
  // back once those reads landed. Every planner counts them as free, so
  // nothing is evicted twice for one need.
  [[nodiscard]] uint64_t returning_pages() const { return pager_.returning_pages(); }
  // The pool's and the status pages' inodes of every model (fd accounting).
  void add_inodes(sys::InodeSet& out) const;

 private:
  Status check_quota(const LoadRequest& req, uint64_t region_bytes) const;
  // Pool bytes the caller's share still allows (no limit for the exempt).
  [[nodiscard]] uint64_t share_left(const LoadRequest& req) const;
  // Whether uid `uid` may use the pool's copy `m` of the file now `now`.
  static bool may_share(const ModelEntry& m, const sys::FileId& now, uid_t uid);
  std::unique_ptr<ModelEntry> new_entry(const sys::FileId& file, const struct stat& st, gguf::File meta,
                                        const LoadRequest& req);
  void store_order(const ModelEntry& m, const std::vector<uint32_t>& order);
  // Detaches every mapping `caller` attached to `m`.
  void detach_all(ModelEntry& m, const std::string& caller);
  pool::Pool& pool_;
  pager::Pager& pager_;
  std::set<std::string> pinned_;
  uint32_t max_models_per_uid_;
  config::PoolShare max_pool_share_;
  Hooks hooks_;
  RoomMaker make_room_;
  gguf::ContentIdCache content_ids_{""};
  AccessOrders orders_{""};
  std::map<uint64_t, std::unique_ptr<ModelEntry>> models_;
  uint64_t next_id_ = 1;
  uint64_t next_client_ = 1;
  bool cooperative_ = false;
};

}  // namespace airs::daemon
