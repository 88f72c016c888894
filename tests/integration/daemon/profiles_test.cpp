// SPDX-License-Identifier: Apache-2.0
// Device profiles (pool.profile) end to end: a real airs-memd started with
// each one, and what the profile promises checked from a client: 2gb is
// cloud only (no pool; what needs one is refused naming the profile), 4gb
// and 8gb have a pool of 2 GiB and 4 GiB that serves models and KV.
// RUN_SERIAL: the 8gb daemon locks 4 GiB of memory while it runs.
#include <sys/sysinfo.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sdbus-c++/sdbus-c++.h>

#include "daemon_fixture.hpp"
#include "test_model.hpp"

using namespace airs::test;
namespace fs = std::filesystem;

namespace {

// A Manager method's error as "<name>: <message>", or "ok".
template <typename F>
std::string call_error(F&& call) {
  try {
    call();
    return "ok";
  } catch (const sdbus::Error& e) {
    return e.getName() + ": " + e.getMessage();
  }
}

}  // namespace

// 2gb: no local pool, cloud inference only. The daemon serves its status,
// and every call that needs the pool (load, KV session, eviction) is
// Unsupported and names the profile, so the user knows why.
TEST(Profiles, TwoGbIsCloudOnlyAndRefusesLoadsSessionsAndEvictionNamingTheProfile) {
  const auto tm = write_test_model("airs-profile-2gb", "cloud", 6, 1024);
  PrivateBus bus;
  DaemonProcess d(bus.address(), "[pool]\nprofile = \"2gb\"\n");
  ASSERT_TRUE(d.started()) << d.log();
  auto st = run_process({airsctl_path(), "--bus", bus.address(), "--json", "status"});
  ASSERT_EQ(st.exit_code, 0) << st.err;
  auto j = nlohmann::json::parse(st.out);
  EXPECT_EQ(j["profile"], "2gb");
  EXPECT_EQ(j["mode"], "cloud-only");
  EXPECT_FALSE(j["pool"].contains("total_bytes")) << "a pool on a cloud-only device: " << j["pool"].dump();
  EXPECT_EQ(j["pool"].value("target_bytes", uint64_t{1}), 0u) << j["pool"].dump();
  EXPECT_TRUE(j["models"].empty()) << j.dump();

  const std::string why = "no local model pool on this device (profile 2gb: cloud inference only)";
  auto load = run_process({airsctl_path(), "--bus", bus.address(), "load", tm.path});
  EXPECT_NE(load.exit_code, 0) << load.out;
  EXPECT_NE(load.err.find("org.aios.Airs1.Error.Unsupported"), std::string::npos) << load.err;
  EXPECT_NE(load.err.find(why), std::string::npos) << load.err;

  auto conn = sdbus::createSessionBusConnectionWithAddress(bus.address());
  auto mgr = sdbus::createProxy(*conn, "org.aios.Airs1", "/org/aios/Airs1");
  using Dict = std::map<std::string, sdbus::Variant>;
  const std::string session = call_error([&] {
    sdbus::ObjectPath s;
    sdbus::UnixFd arena, notice, event;
    Dict geometry;
    mgr->callMethod("CreateSession").onInterface("org.aios.Airs1.Manager")
        .withArguments(sdbus::ObjectPath("/org/aios/Airs1/model/1"), std::string("interactive"), Dict{})
        .storeResultsTo(s, arena, notice, event, geometry);
  });
  EXPECT_EQ(session, "org.aios.Airs1.Error.Unsupported: " + why + ": no KV sessions");
  const std::string evict = call_error([&] {
    Dict report;
    mgr->callMethod("Evict").onInterface("org.aios.Airs1.Manager").withArguments(Dict{}, true).storeResultsTo(report);
  });
  EXPECT_EQ(evict, "org.aios.Airs1.Error.Unsupported: Evict: " + why + ": nothing to evict");
  EXPECT_EQ(d.stop(), 0) << d.log();
  fs::remove_all(tm.dir);
}

// 4gb and 8gb: a pool of 2 GiB and 4 GiB, in which a client reads a model
// byte for byte and uses a KV session. The shmem backend (the pool's size is
// the profile's whatever the backend): the daemon reserves and locks the
// whole pool in ordinary memory, and leaves the huge pages that the tests
// beside this one reserve theirs from alone.
class ProfilePool : public ::testing::TestWithParam<std::pair<std::string, uint64_t>> {};

TEST_P(ProfilePool, HasThePoolItPromisesAndServesModelsAndSessions) {
  const auto [profile, gib] = GetParam();
  const uint64_t pool_bytes = gib << 30;
  struct sysinfo si {};
  ASSERT_EQ(::sysinfo(&si), 0);
  const uint64_t free_ram = uint64_t{si.freeram} * si.mem_unit;
  if (free_ram < pool_bytes + (uint64_t{2} << 30))
    GTEST_SKIP() << "the " << profile << " profile's pool (" << gib << " GiB, locked) and 2 GiB for the rest need "
                 << "more free memory than this machine has (" << (free_ram >> 20) << " MiB)";
  const auto tm = write_test_model("airs-profile-" + profile, "local", 6, 1024);
  PrivateBus bus;
  DaemonProcess d(bus.address(),
                  "[pool]\nprofile = \"" + profile + "\"\nbackend = \"shmem\"\n[pressure]\nresize_pool = false\n");
  if (!d.started() && d.log().find("MemTotal") != std::string::npos)
    GTEST_SKIP() << "this machine's memory is too small for the " << profile << " profile's pool:\n" << d.log();
  ASSERT_TRUE(d.started()) << d.log();
  auto demo = run_process({AIRS_DEMO_PATH, "--bus", bus.address(), tm.path}, std::chrono::seconds(120));
  EXPECT_EQ(demo.exit_code, 0) << demo.out << demo.err << d.log();
  EXPECT_NE(demo.out.find("match the file byte for byte"), std::string::npos) << demo.out << demo.err;
  EXPECT_NE(demo.out.find("written and read back"), std::string::npos) << demo.out << demo.err;
  auto st = run_process({airsctl_path(), "--bus", bus.address(), "--json", "status"});
  ASSERT_EQ(st.exit_code, 0) << st.err;
  auto j = nlohmann::json::parse(st.out);
  EXPECT_EQ(j["profile"], profile);
  EXPECT_EQ(j["pool"]["total_bytes"].get<uint64_t>(), pool_bytes) << j["pool"].dump();
  EXPECT_EQ(j["models"].size(), 1u) << j.dump();
  EXPECT_EQ(d.stop(), 0) << d.log();
  fs::remove_all(tm.dir);
}

INSTANTIATE_TEST_SUITE_P(Profiles, ProfilePool,
                         ::testing::Values(std::pair<std::string, uint64_t>{"4gb", 2}, std::pair<std::string, uint64_t>{"8gb", 4}),
                         [](const auto& p) { return "p" + p.param.first; });
