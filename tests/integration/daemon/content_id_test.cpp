// SPDX-License-Identifier: Apache-2.0
// A model's content id: the daemon finds it from the filled region, it is
// the XXH3-128 of the file's bytes, it is remembered in daemon.state_dir so
// a restarted daemon knows it before reading anything, and a changed file
// gets a new one.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon_fixture.hpp"
#include "gguf/content_id.hpp"
#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"
#include "test_model.hpp"

using namespace airs::test;
namespace fs = std::filesystem;

namespace {

std::string file_content_id(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  auto id = airs::gguf::content_id_of_fd(fd, fs::file_size(path));
  ::close(fd);
  EXPECT_TRUE(id);
  return id ? id->hex() : std::string();
}

nlohmann::json status(const PrivateBus& bus) {
  auto st = run_process({airsctl_path(), "--bus", bus.address(), "--json", "status"});
  EXPECT_EQ(st.exit_code, 0) << st.err;
  return nlohmann::json::parse(st.out);
}

// The first model's status once `pred` holds for it (30 s bound).
nlohmann::json model_when(const PrivateBus& bus, const std::function<bool(const nlohmann::json&)>& pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  nlohmann::json m;
  while (std::chrono::steady_clock::now() < deadline) {
    auto j = status(bus);
    if (!j["models"].empty()) {
      m = j["models"][0];
      if (pred(m)) return m;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "the model never reached the expected state: " << m.dump();
  return m;
}

}  // namespace

TEST(ContentId, FoundFromTheRegionRememberedAcrossRestartsAndNewForAChangedFile) {
  const auto tm = write_test_model("airs-content-id", "id-model", 4, 512);
  const auto& dir = tm.dir;
  const auto& model = tm.path;
  const std::string want = file_content_id(model);
  const std::string state = (dir / "state").string();
  const std::string conf = "[daemon]\nstate_dir = \"" + state + "\"\n[pool]\nsize = \"64M\"\n[models]\nmode = \"full\"\n";
  PrivateBus bus;
  {
    DaemonProcess d(bus.address(), conf);
    ASSERT_TRUE(d.started()) << d.log();
    auto load = run_process({airsctl_path(), "--bus", bus.address(), "load", model});
    ASSERT_EQ(load.exit_code, 0) << load.out << load.err << d.log();
    auto m = model_when(bus, [](const nlohmann::json& x) { return !x["content_id"].get<std::string>().empty(); });
    EXPECT_EQ(m["content_id"], want) << d.log();
    EXPECT_EQ(fs::status(state).permissions() & fs::perms::all, fs::perms::owner_all);
    EXPECT_EQ(d.stop(), 0) << d.log();
  }
  {
    // Known at once after a restart: with the warm-up at 1 byte/s the model
    // is nowhere near resident, so nothing was hashed.
    DaemonProcess d(bus.address(), conf + "warmup_rate = 1\n");
    ASSERT_TRUE(d.started()) << d.log();
    auto load = run_process({airsctl_path(), "--bus", bus.address(), "load", "--no-wait", model});
    ASSERT_EQ(load.exit_code, 0) << load.out << load.err << d.log();
    auto j = status(bus);
    ASSERT_EQ(j["models"].size(), 1u) << j.dump();
    EXPECT_NE(j["models"][0]["state"], "resident");
    EXPECT_EQ(j["models"][0]["content_id"], want) << d.log();
    EXPECT_EQ(d.log().find("content id " + want), std::string::npos) << "hashed again: " << d.log();
    EXPECT_EQ(d.stop(), 0) << d.log();
  }
  // One byte of the last tensor changed in place: same path, same inode,
  // same size, so only the content tells it apart.
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  const std::string changed = file_content_id(model);
  ASSERT_NE(changed, want);
  {
    DaemonProcess d(bus.address(), conf);
    ASSERT_TRUE(d.started()) << d.log();
    auto load = run_process({airsctl_path(), "--bus", bus.address(), "load", model});
    ASSERT_EQ(load.exit_code, 0) << load.out << load.err << d.log();
    auto m = model_when(bus, [](const nlohmann::json& x) { return !x["content_id"].get<std::string>().empty(); });
    EXPECT_EQ(m["content_id"], changed) << d.log();
    EXPECT_EQ(d.stop(), 0) << d.log();
  }
  fs::remove_all(dir);
}
