// SPDX-License-Identifier: Apache-2.0
#include "daemon/kept_models.hpp"

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "sys/files.hpp"
#include "sys/notify.hpp"
#include "util/text.hpp"

namespace airs::daemon {

namespace {

constexpr int kManifestVersion = 1;
// Two fds per model: its region and its file (the daemon's own open file:
// found again whatever the sandbox lets it see by path).
constexpr const char* kRegionPrefix = "region-";
constexpr const char* kFilePrefix = "file-";

// What a kept region must still match: the file's stat identity.
nlohmann::json identity_of(const struct stat& st) {
  return {{"dev", static_cast<uint64_t>(st.st_dev)},
          {"ino", static_cast<uint64_t>(st.st_ino)},
          {"size", static_cast<uint64_t>(st.st_size)},
          {"mtime_ns", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec},
          {"ctime_ns", static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec}};
}


}  // namespace

KeptModels::KeptModels(const std::string& state_dir) {
  if (state_dir.empty() || std::getenv("NOTIFY_SOCKET") == nullptr) return;
  dir_ = state_dir + "/kept";
  if (auto st = sys::make_dir(dir_, 0700); !st) {
    spdlog::warn("kept models: {}; regions are not kept across restarts", st.error().message);
    return;
  }
  enabled_ = true;
}

std::vector<KeptModel> KeptModels::collect() {
  std::vector<KeptModel> out;
  std::map<std::string, sys::UniqueFd> regions, files;
  for (auto& [name, fd] : sys::listen_fds_with_names()) {
    if (is_valid_name(name) && name.starts_with(kRegionPrefix)) {
      regions[name.substr(std::strlen(kRegionPrefix))] = std::move(fd);
    } else if (is_valid_name(name) && name.starts_with(kFilePrefix)) {
      files[name.substr(std::strlen(kFilePrefix))] = std::move(fd);
    } else {
      spdlog::warn("kept models: ignoring an fd named '{}' from the service manager", printable_name(name, 64));
      if (!name.empty() && is_valid_name(name)) sys::fd_store_remove(name);
    }
  }
  for (auto& [key, gguf] : files)
    if (!regions.contains(key)) drop(key, "its region was not kept");
  for (auto& [key, region] : regions) {
    KeptModel k;
    k.key = key;
    k.region = std::move(region);
    std::string why;
    if (auto f = files.find(key); f != files.end()) k.gguf = std::move(f->second);
    if (!enabled_) why = "no state_dir to check it against";
    else if (!k.gguf) why = "its file was not kept";
    // The manifest is ours, but checked like any input.
    if (why.empty()) try {
      auto text = sys::read_small_file(dir_ + "/" + key + ".json", 64 * 1024);
      if (!text) throw std::runtime_error(text.error().message);
      const auto j = nlohmann::json::parse(text->begin(), text->end());
      if (j.at("version").get<int>() != kManifestVersion) throw std::runtime_error("manifest version");
      auto id = gguf::ContentId::from_hex(j.at("content_id").get<std::string>());
      if (!id) throw std::runtime_error("content_id is not 32 hex digits");
      k.content_id = *id;
      k.name = j.at("name").get<std::string>();
      if (!is_valid_name(k.name)) throw std::runtime_error("name");
      k.owner_uid = j.at("owner_uid").get<uid_t>();
      k.owner_exempt = j.at("owner_exempt").get<bool>();
      // The same open file, but its contents may have changed meanwhile.
      auto st = sys::stat_of(k.gguf.get(), "kept file");
      if (!st) throw std::runtime_error(st.error().message);
      if (!S_ISREG(st->st_mode) || st->st_nlink == 0 || identity_of(*st) != j.at("file"))
        throw std::runtime_error("the file changed (or was deleted) since its region was filled");
      auto rs = sys::stat_of(k.region.get(), "kept region");
      if (!rs) throw std::runtime_error(rs.error().message);
      k.region_bytes = static_cast<uint64_t>(rs->st_size);
      if (k.region_bytes < static_cast<uint64_t>(st->st_size)) throw std::runtime_error("the region is too small");
      auto hashed = gguf::content_id_of_fd(k.region.get(), static_cast<uint64_t>(st->st_size));
      if (!hashed) throw std::runtime_error("reading the region: " + hashed.error().message);
      if (*hashed != k.content_id)
        throw std::runtime_error("the region's bytes are not the file's (content " + hashed->hex() + ", file " +
                                 k.content_id.hex() + ")");
      // Stat cannot prove content: a write through a shared mapping of a
      // tmpfs file moves neither time. A file that only root can write is
      // taken on its identity; any other is read and hashed again.
      if ((st->st_uid != 0 || (st->st_mode & (S_IWGRP | S_IWOTH)) != 0)) {
        auto now = gguf::content_id_of_fd(k.gguf.get(), static_cast<uint64_t>(st->st_size));
        if (!now) throw std::runtime_error("reading the file: " + now.error().message);
        if (*now != k.content_id)
          throw std::runtime_error("the file's bytes changed since its region was filled (uid " +
                                   std::to_string(st->st_uid) + " can write it; content now " + now->hex() + ")");
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!why.empty()) {
      drop(key, why);
      continue;
    }
    out.push_back(std::move(k));
  }
  return out;
}

void KeptModels::drop(const std::string& key, const std::string& why) {
  spdlog::warn("kept model {}: dropped, not served: {}", key, why);
  sys::fd_store_remove(kRegionPrefix + key);
  sys::fd_store_remove(kFilePrefix + key);
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove(dir_ + "/" + key + ".json", ec);
}

void KeptModels::keep(ModelEntry& m, int region_fd, int gguf_fd) {
  if (!enabled_ || !m.kept_as.empty() || !m.content_id) return;
  const std::string key = fmt::format("{}-{:x}", m.content_id->hex(), static_cast<uint64_t>(m.file.ino));
  const nlohmann::json j = {{"version", kManifestVersion},  {"file", identity_of(m.file_stat)},
                            {"content_id", m.content_id->hex()}, {"name", m.name},
                            {"owner_uid", m.owner_uid},        {"owner_exempt", m.owner_exempt}};
  // Manifest first: fds in the store without one are dropped at start.
  auto st = sys::write_file_atomic(dir_ + "/" + key + ".json", j.dump() + "\n", 0600);
  if (st) st = sys::fd_store(kFilePrefix + key, gguf_fd);
  if (st) st = sys::fd_store(kRegionPrefix + key, region_fd);
  if (!st) {
    spdlog::warn("model '{}': not kept across restarts: {}", m.name, st.error().message);
    sys::fd_store_remove(kFilePrefix + key);
    std::error_code ec;
    std::filesystem::remove(dir_ + "/" + key + ".json", ec);
    return;
  }
  m.kept_as = key;
  spdlog::info("model '{}': region kept by the service manager as {} (a restart adopts it)", m.name, key);
}

void KeptModels::forget(const ModelEntry& m) {
  if (m.kept_as.empty()) return;
  sys::fd_store_remove(kRegionPrefix + m.kept_as);
  sys::fd_store_remove(kFilePrefix + m.kept_as);
  std::error_code ec;
  std::filesystem::remove(dir_ + "/" + m.kept_as + ".json", ec);
}

}  // namespace airs::daemon
