// SPDX-License-Identifier: Apache-2.0
// Every loading mode forced on this machine: the daemon says which one it
// runs, and a client reads every tensor byte for byte (airs-demo compares
// each tensor with the file) and uses a KV session.
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon_fixture.hpp"
#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"
#include "test_model.hpp"

using namespace airs::test;
namespace fs = std::filesystem;

class ForcedMode : public ::testing::TestWithParam<std::string> {};

TEST_P(ForcedMode, GivesTheFileBytesAndSaysWhichModeItRuns) {
  const std::string mode = GetParam();
  const auto tm = write_test_model("airs-mode-" + mode, "mode-model", 6, 1024);
  const auto& dir = tm.dir;
  const auto& model = tm.path;

  PrivateBus bus;
  DaemonProcess d(bus.address(), "[pool]\nsize = \"128M\"\n[models]\nmode = \"" + mode + "\"\n");
  ASSERT_TRUE(d.started()) << d.log();

  auto demo = run_process({AIRS_DEMO_PATH, "--bus", bus.address(), model}, std::chrono::seconds(120));
  EXPECT_EQ(demo.exit_code, 0) << demo.out << demo.err << d.log();
  EXPECT_NE(demo.out.find("match the file byte for byte"), std::string::npos) << demo.out << demo.err;
  EXPECT_NE(demo.out.find("written and read back"), std::string::npos) << demo.out << demo.err;

  auto st = run_process({airsctl_path(), "--bus", bus.address(), "--json", "status"});
  ASSERT_EQ(st.exit_code, 0) << st.err;
  auto j = nlohmann::json::parse(st.out);
  EXPECT_EQ(j["mode"], mode);
  EXPECT_FALSE(j["mode_reason"].get<std::string>().empty());
  EXPECT_EQ(j["pool"]["backend"], mode == "full" ? "hugetlbfs" : "shmem");
  // The start-up line claims hugetlb's pinning only for hugetlb pages.
  EXPECT_EQ(d.log().find("pinned: hugetlb pages") != std::string::npos, mode == "full") << d.log();
  EXPECT_EQ(j["pool"]["numa"], "local");
  EXPECT_EQ(d.stop(), 0) << d.log();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Modes, ForcedMode, ::testing::Values("full", "small-pages", "cooperative"),
                         [](const auto& p) {
                           std::string n = p.param;
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });
