// SPDX-License-Identifier: Apache-2.0
// Filled model regions that survive a restart of the daemon: kept in the
// service manager's file descriptor store (systemd FDSTORE=1, the unit's
// FileDescriptorStoreMax=) with the daemon's open fd of the model's file,
// and a manifest per model in <daemon.state_dir>/kept/ saying what the
// file was (stat identity) and what the bytes hash to. A restarted daemon
// (Restart=on-failure after a crash, `systemctl restart`, an upgrade)
// adopts them: the model is resident at once, nothing is read again, and
// clients that mapped it before keep the same pages. `systemctl stop`
// empties the store (the memory goes back when the last mapper leaves).
//
// A kept region is served again only if it is provably the same model:
// the kept file still has the recorded stat identity (device, inode, size,
// mtime, ctime; not deleted) and the region's bytes hash to the recorded
// content id. Anything else is dropped with a log line, never served.
// Without systemd (no NOTIFY_SOCKET) or without a state_dir nothing is
// kept. Loop thread only.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "daemon/models.hpp"
#include "gguf/content_id.hpp"
#include "sys/fd.hpp"

namespace airs::daemon {

struct KeptModel {
  std::string key;       // <content id>-<inode>: names its fds and its manifest
  sys::UniqueFd region;  // the kept region file
  sys::UniqueFd gguf;    // the model's file (the daemon's own open file), checked unchanged
  std::string name;
  uid_t owner_uid = 0;
  bool owner_exempt = false;
  gguf::ContentId content_id;
  uint64_t region_bytes = 0;
};

class KeptModels {
 public:
  // `state_dir` empty: nothing is kept.
  explicit KeptModels(const std::string& state_dir);

  // At start: the regions the service manager passed back, each checked
  // against its manifest (file identity, then content). Those that fail
  // are dropped from the store and logged. Call once, before the pool is
  // created (their pages are not free).
  std::vector<KeptModel> collect();
  // After adoption failed for one of them: drop it.
  void drop(const std::string& key, const std::string& why);

  // `m` is resident and its content id known: keep its region (no-op if
  // kept already, or when nothing can be kept). Sets m.kept_as.
  void keep(ModelEntry& m, int region_fd, int gguf_fd);
  // `m` leaves the table: it is no longer kept.
  void forget(const ModelEntry& m);

  [[nodiscard]] bool enabled() const { return enabled_; }

 private:
  std::string dir_;
  bool enabled_ = false;
};

}  // namespace airs::daemon
