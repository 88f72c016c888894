// Models the daemon serves: identity (a GGUF file is one model however many
// clients load it), references per bus client, LRU eviction of unreferenced
// models, pinning from config, and the fds a client needs to attach. The
// mechanism (pool region, fills, faults) is the Pager's; this is policy and
// bookkeeping. Loop thread only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dbus/identity.hpp"
#include "gguf/gguf.hpp"
#include "pager/pager.hpp"
#include "pool/pool.hpp"
#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::daemon {

using Clock = std::chrono::steady_clock;

struct ModelEntry {
  uint64_t id = 0;               // also the object path suffix
  pager::ModelId pager_id = 0;
  std::string name;
  std::string object_path;
  dev_t dev = 0;
  ino_t ino = 0;
  uint64_t file_size = 0;
  int64_t mtime_ns = 0;
  gguf::File meta;               // tensors, geometry (for KV and `airsctl read`)
  std::map<std::string, uint32_t> refs;                         // bus unique name → Open count
  std::map<std::string, std::vector<pager::ClientKey>> clients; // bus unique name → attached mappings
  Clock::time_point last_used{};
  bool pinned = false;
  bool evicted = false;
  [[nodiscard]] uint32_t refcount() const {
    uint32_t n = 0;
    for (auto& [k, v] : refs) n += v;
    return n;
  }
};

struct OpenResult {
  sys::UniqueFd region;  // O_RDWR for lazy attach, O_RDONLY once resident
  uint64_t size = 0;
  sys::UniqueFd status;  // read-only status page
  bool resident = false;
  uint64_t unit_size = 0;
};

class Models {
 public:
  // cooperative: no userfaultfd clients; regions are handed out read-only
  // and clients wait per layer on the status page.
  Models(pool::Pool& pool, pager::Pager& pager, std::vector<std::string> pinned, bool cooperative);

  // Parses the GGUF behind `gguf_fd` (the caller's; duplicated), and either
  // returns the model already loaded from the same file or reserves a new
  // region (evicting unreferenced models LRU-first if the pool is short).
  // EBADMSG/ENOTSUP for a malformed file, ENOMEM when the pool cannot hold it.
  Result<ModelEntry*> load(int gguf_fd, const std::string& name_hint);

  // Takes a reference for `caller`; refills an evicted model first.
  Result<OpenResult> open(ModelEntry& m, const std::string& caller, bool lazy);
  Status attach(ModelEntry& m, const dbus::Caller& caller, sys::UniqueFd notify, sys::UniqueFd uffd, uint64_t addr,
                uint64_t length);
  // Drops one reference of `caller` (and its attached mappings when its
  // last reference goes). ENOENT if it holds none.
  Status release(ModelEntry& m, const std::string& caller);
  // Everything `caller` held (it left the bus).
  void drop_caller(const std::string& caller);

  // Evicts unreferenced, unpinned models, least recently used first, until
  // `bytes` are free in the pool or none is left. Returns bytes freed.
  uint64_t evict_lru(uint64_t bytes, std::vector<std::string>* evicted_names = nullptr);
  Status evict(ModelEntry& m);
  Status unload(ModelEntry& m, bool force);

  ModelEntry* find_by_path(const std::string& path);
  ModelEntry* find_by_name(const std::string& name);
  std::vector<ModelEntry*> all();
  [[nodiscard]] std::optional<pager::ModelStats> stats(const ModelEntry& m) const;

 private:
  Result<pager::ModelId> load_with_room(pager::ModelSpec spec, uint64_t region_bytes);
  pool::Pool& pool_;
  pager::Pager& pager_;
  std::set<std::string> pinned_;
  std::map<uint64_t, std::unique_ptr<ModelEntry>> models_;
  uint64_t next_id_ = 1;
  uint64_t next_client_ = 1;
  bool cooperative_ = false;
};

}  // namespace airs::daemon
