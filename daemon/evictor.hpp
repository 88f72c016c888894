// SPDX-License-Identifier: Apache-2.0
// The one executor of eviction plans. KV allocation, model loading, the
// pressure loop and admin eviction all plan with policy::plan_eviction over
// snapshot() and carry the plan out here: cached prefix blocks and session
// KV through KvService, models through Models::unload (the entry goes, the
// region is truncated; its pages follow once its reads landed, counted as
// free meanwhile). Loop thread only.
#pragma once

#include <cstdint>
#include <string>

#include "policy/policy.hpp"
#include "pool/pool.hpp"
#include "util/result.hpp"

namespace airs::daemon {

class Models;
class KvService;
struct ModelEntry;

class Evictor {
 public:
  Evictor(pool::Pool& pool, Models& models, KvService& kv, policy::Config cfg);

  // KV (sessions, cached blocks) and models; a model's refcount is users().
  [[nodiscard]] policy::PoolState snapshot() const;
  // Who uses model `m`: its clients' references (Open) and the KV sessions
  // on it. The one count of "in use": the plans, keep-alive and every
  // unload (unload() below) ask here.
  [[nodiscard]] uint32_t users(const ModelEntry& m) const;
  // Models::unload with the model's KV sessions counted here: without
  // `force`, EBUSY while it has users.
  Status unload(ModelEntry& m, bool force, const std::string& reason);
  [[nodiscard]] policy::Plan plan(const policy::Request& req) const;
  // Carries out one action. Returns the pool bytes it freed (a model's
  // pages count though they may still be on their way back: returning).
  Result<uint64_t> execute(const policy::Action& a);
  // Plans `req` and acts only on a plan that covers it (nothing is lost for
  // a request that fails anyway). ENOMEM naming `why` and the shortfall.
  // Pages of unloaded models still in flight back to the pool count as
  // free in the plan; when the caller's pages are among them, EINPROGRESS
  // (what it did evict stays done): the caller is parked and runs again
  // once a drain ended (DrainWaits, docs/retire.md). Nothing here waits.
  Status make_room(const policy::Request& req, const std::string& why);
  // The object an action names, for reports ("kv-arena:<id>" for cached blocks).
  [[nodiscard]] std::string object_of(const policy::Action& a) const;
  [[nodiscard]] const policy::Config& config() const { return cfg_; }
  [[nodiscard]] bool has_session(uint64_t id) const;

 private:
  pool::Pool& pool_;
  Models& models_;
  KvService& kv_;
  [[nodiscard]] uint64_t available_bytes() const;  // free + returning
  policy::Config cfg_;
};

}  // namespace airs::daemon
