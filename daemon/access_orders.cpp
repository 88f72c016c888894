// SPDX-License-Identifier: Apache-2.0
#include "daemon/access_orders.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "pager/access_order.hpp"
#include "sys/files.hpp"

namespace airs::daemon {

OrderPlan AccessOrders::plan_for(const std::string& name, const std::optional<gguf::ContentId>& id,
                                 uint64_t unit_size, uint32_t unit_count) const {
  OrderPlan plan;
  if (dir_.empty()) return plan;
  plan.record = true;
  if (!id) return plan;  // not hashed yet: layer order, and the id comes with the fill
  const std::string path = path_of(*id);
  auto bytes = sys::read_small_file(path, pager::access_order_max_bytes());
  if (!bytes) {
    if (bytes.error().code != ENOENT)
      spdlog::warn("model '{}': recorded access order not used ({}); warm-up in layer order, recording again", name,
                   bytes.error().message);
    return plan;
  }
  auto order = pager::parse_access_order(bytes->data(), bytes->size(), unit_size, unit_count);
  if (!order) {
    spdlog::warn("model '{}': recorded access order {} rejected: {}; warm-up in layer order, recording again", name,
                 path, order.error().message);
    return plan;
  }
  plan.warmup_order = std::move(order).value();
  plan.record = false;
  return plan;
}

Status AccessOrders::store(const gguf::ContentId& id, uint64_t unit_size, uint32_t unit_count,
                           const std::vector<uint32_t>& order) const {
  if (dir_.empty() || order.empty()) return {};
  AIRS_TRY(sys::make_dir(dir_, 0700));
  const auto bytes = pager::encode_access_order(unit_size, unit_count, order);
  // Written on the loop, so without fsync: after a crash a torn order fails
  // parse_access_order (checked at load, as above) and is recorded again.
  return sys::write_file_atomic(path_of(id), std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                                0600, sys::Durability::Readers);
}

}  // namespace airs::daemon
