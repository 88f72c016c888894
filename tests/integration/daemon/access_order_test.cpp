// SPDX-License-Identifier: Apache-2.0
// The recorded access order: recorded from a real lazy client the
// first time a model is used, stored under its content id in
// <state_dir>/order/, replayed as the warm-up's order by a restarted daemon
// (shown by the daemon's "first reads" debug line: the units in the order
// their reads were issued), and a truncated, corrupted or foreign recording
// is rejected with a log line and the warm-up runs in layer order.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <thread>

#include <gtest/gtest.h>

#include "daemon_fixture.hpp"
#include "test_model.hpp"
#include "gguf/content_id.hpp"
#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"
#include "pager/access_order.hpp"
#include "sys/files.hpp"

using namespace airs::test;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kUnit = 2ULL << 20;  // full mode: the 2 MiB huge page

std::string join(const std::vector<uint32_t>& v) {
  std::string s;
  for (uint32_t u : v) s += (s.empty() ? "" : " ") + std::to_string(u);
  return s;
}

// The daemon's "first reads" line for the model, once it is there (30 s).
std::string first_reads(const DaemonProcess& d) {
  const std::string key = "first reads (units in issue order): ";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string log = d.log();
    if (auto p = log.find(key); p != std::string::npos) {
      const auto b = p + key.size();
      return log.substr(b, log.find('\n', b) - b);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "no first-reads line:\n" << d.log();
  return {};
}

bool log_has(const DaemonProcess& d, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (d.log().find(what) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

std::vector<uint8_t> file_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
void put_bytes(const std::string& p, const std::vector<uint8_t>& b) {
  ASSERT_TRUE(airs::sys::write_file_atomic(p, std::string_view(reinterpret_cast<const char*>(b.data()), b.size())));
}

}  // namespace

TEST(AccessOrder, RecordedOnFirstUseReplayedAfterRestartAndABadRecordingFallsBackToLayerOrder) {
  const auto tm = write_test_model("airs-access-order", "order-model", 8, 1024, 2048);
  const auto& dir = tm.dir;
  const auto& model = tm.path;
  const uint64_t size = fs::file_size(model);
  const auto units = static_cast<uint32_t>((size + kUnit - 1) / kUnit);
  ASSERT_GE(units, 6U) << "the test model is too small to show an order";
  ASSERT_LE(units, 64U) << "the first-reads line shows 64 units";
  const int fd = ::open(model.c_str(), O_RDONLY | O_CLOEXEC);
  auto cid = airs::gguf::content_id_of_fd(fd, size);
  ::close(fd);
  ASSERT_TRUE(cid);
  const std::string state = (dir / "state").string();
  const std::string order_file = state + "/order/" + cid->hex();
  const std::string conf =
      "[daemon]\nstate_dir = \"" + state + "\"\n[pool]\nsize = \"160M\"\ngrow_nr_hugepages = false\n[models]\n"
      "mode = \"full\"\n";
  std::vector<uint32_t> layer_order(units);
  std::iota(layer_order.begin(), layer_order.end(), 0U);

  PrivateBus bus;
  std::vector<uint32_t> recorded;
  {
    // First use: the warm-up off (1 byte/s), so the client's faults read
    // every unit it needs, in its own (shuffled) tensor order.
    DaemonProcess d(bus.address(), conf + "warmup_rate = 1\n");
    ASSERT_TRUE(d.started()) << d.log();
    auto load = run_process({airsctl_path(), "--bus", bus.address(), "load", "--no-wait", model});
    ASSERT_EQ(load.exit_code, 0) << load.out << load.err << d.log();
    auto client = run_process({AIRS_TEST_CLIENT_PATH, "--bus", bus.address(), "--file", model, "--order", "random:3"});
    ASSERT_EQ(client.exit_code, 0) << client.out << client.err << d.log();
    ASSERT_TRUE(log_has(d, "stored as " + order_file)) << d.log();
    struct stat st {};
    ASSERT_EQ(::stat(order_file.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600U);
    const auto bytes = file_bytes(order_file);
    auto parsed = airs::pager::parse_access_order(bytes.data(), bytes.size(), kUnit, units);
    ASSERT_TRUE(parsed) << parsed.error().message;
    recorded = *parsed;
    ASSERT_FALSE(recorded.empty());
    EXPECT_FALSE(std::is_sorted(recorded.begin(), recorded.end()))
        << "a shuffled client recorded in layer order: " << join(recorded);
    EXPECT_EQ(d.stop(), 0) << d.log();
  }
  {
    // A cold load after the restart: the warm-up reads the recording first,
    // then the rest in layer order.
    DaemonProcess d(bus.address(), conf);
    ASSERT_TRUE(d.started()) << d.log();
    auto load = run_process({airsctl_path(), "--bus", bus.address(), "load", model});
    ASSERT_EQ(load.exit_code, 0) << load.out << load.err << d.log();
    std::vector<uint32_t> want = recorded;
    for (uint32_t u : layer_order)
      if (std::find(recorded.begin(), recorded.end(), u) == recorded.end()) want.push_back(u);
    EXPECT_EQ(first_reads(d), join(want)) << d.log();
    EXPECT_NE(d.log().find("warm-up follows the recorded access order (" + std::to_string(recorded.size()) + " of " +
                           std::to_string(units) + " units first)"),
              std::string::npos)
        << d.log();
    EXPECT_EQ(d.stop(), 0) << d.log();
  }
  const auto good = file_bytes(order_file);
  auto truncated = good;
  truncated.resize(good.size() - 5);
  auto flipped = good;
  flipped[airs::pager::kAccessOrderHeaderBytes + 1] ^= 0x10;
  const auto foreign = airs::pager::encode_access_order(kUnit, units + 1, recorded);
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> bad{
      {"truncated", truncated}, {"checksum mismatch", flipped}, {"made for " + std::to_string(units + 1), foreign}};
  for (const auto& [why, bytes] : bad) {
    SCOPED_TRACE(why);
    put_bytes(order_file, bytes);
    DaemonProcess d(bus.address(), conf);
    ASSERT_TRUE(d.started()) << d.log();
    auto load = run_process({airsctl_path(), "--bus", bus.address(), "load", model});
    ASSERT_EQ(load.exit_code, 0) << load.out << load.err << d.log();
    EXPECT_EQ(first_reads(d), join(layer_order)) << d.log();
    const std::string log = d.log();
    const auto line = log.find("recorded access order " + order_file + " rejected: ");
    ASSERT_NE(line, std::string::npos) << log;
    const std::string text = log.substr(line, log.find('\n', line) - line);
    EXPECT_NE(text.find(why), std::string::npos) << text;
    EXPECT_NE(text.find("warm-up in layer order"), std::string::npos) << text;
    EXPECT_EQ(log.find("warm-up follows the recorded access order"), std::string::npos) << log;
    EXPECT_EQ(d.stop(), 0) << d.log();
  }
  fs::remove_all(dir);
}

// Cooperative mode: the daemon sees a client's first wait on each unit
// (its touch guard's request, Model.Follow), and records that order.
TEST(AccessOrder, CooperativeTouchesAreRecorded) {
  const auto tm = write_test_model("airs-access-order-coop", "order-coop", 8, 1024, 2048);
  const uint64_t size = fs::file_size(tm.path);
  const auto units = static_cast<uint32_t>((size + kUnit - 1) / kUnit);
  const int fd = ::open(tm.path.c_str(), O_RDONLY | O_CLOEXEC);
  auto cid = airs::gguf::content_id_of_fd(fd, size);
  ::close(fd);
  ASSERT_TRUE(cid);
  const std::string state = (tm.dir / "state").string();
  const std::string order_file = state + "/order/" + cid->hex();
  PrivateBus bus;
  // The warm-up off (1 byte/s): every unit is read because a touch asked.
  DaemonProcess d(bus.address(), "[daemon]\nstate_dir = \"" + state +
                                     "\"\n[pool]\nsize = \"160M\"\ngrow_nr_hugepages = false\n[models]\n"
                                     "mode = \"cooperative\"\nwarmup_rate = 1\n");
  ASSERT_TRUE(d.started()) << d.log();
  auto load = run_process({airsctl_path(), "--bus", bus.address(), "load", "--no-wait", tm.path});
  ASSERT_EQ(load.exit_code, 0) << load.out << load.err << d.log();
  auto client = run_process(
      {AIRS_TEST_CLIENT_PATH, "--bus", bus.address(), "--file", tm.path, "--on-touch", "--order", "random:3"},
      std::chrono::seconds(120));
  ASSERT_EQ(client.exit_code, 0) << client.out << client.err << d.log();
  ASSERT_TRUE(log_has(d, "stored as " + order_file)) << d.log();
  const auto bytes = file_bytes(order_file);
  auto parsed = airs::pager::parse_access_order(bytes.data(), bytes.size(), kUnit, units);
  ASSERT_TRUE(parsed) << parsed.error().message;
  ASSERT_FALSE(parsed->empty());
  EXPECT_FALSE(std::is_sorted(parsed->begin(), parsed->end()))
      << "a shuffled cooperative client recorded in layer order: " << join(*parsed);
  EXPECT_EQ(d.stop(), 0) << d.log();
  fs::remove_all(tm.dir);
}
