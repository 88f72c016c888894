// SPDX-License-Identifier: Apache-2.0
// `airs-memd --check-config` on configurations that only the host, or the
// file's kind, makes wrong: the exit status is 2 and stderr names the
// problem. Runs the built binary; needs no bus.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "daemon_fixture.hpp"

using namespace airs::test;
namespace fs = std::filesystem;

namespace {

class CheckConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("airs-check-config-" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "empty.d");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // --check-config on `path` with an empty drop-in directory.
  ProcessResult check(const std::string& path) {
    return run_process({airs_memd_path(), "--check-config", "--config", path, "--config-dir", (dir_ / "empty.d").string()},
                       std::chrono::seconds(10));
  }
  ProcessResult check_text(const std::string& toml) {
    const auto p = dir_ / "test.conf";
    std::ofstream(p) << toml;
    return check(p.string());
  }

  fs::path dir_;
};

}  // namespace

TEST_F(CheckConfig, ADirectoryIsAnErrorNamingIt) {
  auto r = check(dir_.string());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find(dir_.string() + " is a directory, not a regular file"), std::string::npos) << r.err;
}

// Reading /dev/zero as a config file would never end: an answer at all,
// naming the device, is the check.
TEST_F(CheckConfig, ADeviceIsAnErrorNotAHang) {
  auto r = check("/dev/zero");
  EXPECT_EQ(r.exit_code, 2) << "signal " << r.signal;
  EXPECT_NE(r.err.find("/dev/zero is a character device"), std::string::npos) << r.err;
}

TEST_F(CheckConfig, ANodeWithoutMemoryIsRefused) {
  auto r = check_text("[pool]\nnuma_policy = \"interleave\"\nnuma_nodes = [99]\n");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find("pool.numa_nodes: node 99 has no memory on this machine"), std::string::npos) << r.err;
}

TEST_F(CheckConfig, APoolLargerThanMemTotalIsRefused) {
  auto r = check_text("[pool]\nsize = \"1T\"\n");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find("pool size 1 TiB (1099511627776 bytes) is larger than MemTotal"), std::string::npos) << r.err;
}

TEST_F(CheckConfig, SizeZeroNeedsTheCloudOnlyProfile) {
  auto r = check_text("[pool]\nsize = 0\n");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find("pool.size = 0: use profile = \"2gb\" for cloud-only"), std::string::npos) << r.err;
  auto ok = check_text("[pool]\nprofile = \"2gb\"\nsize = 0\n");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST_F(CheckConfig, AMissingPreloadFileIsNamed) {
  const auto model = dir_ / "present.gguf";
  std::ofstream(model) << "GGUF";
  const auto missing = dir_ / "missing.gguf";
  auto r = check_text("[models]\npreload = [\"" + model.string() + "\", \"" + missing.string() + "\"]\n");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find("models.preload: " + missing.string()), std::string::npos) << r.err;
  auto ok = check_text("[models]\npreload = [\"" + model.string() + "\"]\n");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("preload = [\"" + model.string() + "\"]"), std::string::npos) << ok.out;
}

TEST_F(CheckConfig, NewKeysArePrintedBack) {
  auto r = check_text(
      "[daemon]\ntrusted_group = \"\"\n[models]\nmax_models_per_uid = 3\nmax_pool_bytes_per_uid = \"25%\"\n"
      "keep_alive = \"10m\"\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("trusted_group = \"\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max_models_per_uid = 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max_pool_bytes_per_uid = \"25%\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("keep_alive = \"600s\""), std::string::npos) << r.out;
}
