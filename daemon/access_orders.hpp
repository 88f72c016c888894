// SPDX-License-Identifier: Apache-2.0
// The recorded access orders (pager/access_order.hpp) kept in
// <state_dir>/order/<content id>: which to replay at a model's load, which
// to record, and storing a finished recording. Files are untrusted: a
// missing, stale or malformed one means layer order and a new recording,
// with a log line saying why. Loop thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/content_id.hpp"
#include "util/result.hpp"

namespace airs::daemon {

struct OrderPlan {
  std::vector<uint32_t> warmup_order;  // empty: layer order
  bool record = false;
};

class AccessOrders {
 public:
  // `dir` empty: nothing is kept (nothing replayed, nothing recorded).
  explicit AccessOrders(std::string dir) : dir_(std::move(dir)) {}

  // For a model `name` of `unit_count` units of `unit_size` bytes: replay
  // the recording of `id` if there is a valid one, else record (also when
  // the content id is not known yet: it is stored once it is).
  [[nodiscard]] OrderPlan plan_for(const std::string& name, const std::optional<gguf::ContentId>& id,
                                   uint64_t unit_size, uint32_t unit_count) const;
  // Writes the recording of `id` (atomically, 0600; the directory 0700).
  // An empty order is not stored (nothing faulted: cooperative mode, or a
  // model nobody touched before it was resident).
  [[nodiscard]] Status store(const gguf::ContentId& id, uint64_t unit_size, uint32_t unit_count,
                             const std::vector<uint32_t>& order) const;
  [[nodiscard]] std::string path_of(const gguf::ContentId& id) const { return dir_ + "/" + id.hex(); }
  [[nodiscard]] bool enabled() const { return !dir_.empty(); }

 private:
  std::string dir_;
};

}  // namespace airs::daemon
