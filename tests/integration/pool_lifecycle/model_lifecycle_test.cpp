// SPDX-License-Identifier: Apache-2.0
// The model life cycle users ask for: models preloaded at start, idle models
// unloaded after keep_alive, and the pinned primary model's security floor,
// each seen in status and in what `airsctl status` prints.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include "daemon_fixture.hpp"
#include "harness.hpp"

using namespace airs::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(ModelLifecycle, PreloadKeepAliveAndTheSecurityFloor) {
  TempDir dir;
  auto primary = make_model(dir, "primary.gguf", "primary", 16 * kMiB, 8, 1);
  auto other = make_model(dir, "other.gguf", "other", 16 * kMiB, 8, 2);
  PrivateBus bus;
  DaemonProcess d(bus.address(), "[pool]\nsize = \"64M\"\ngrow_nr_hugepages = false\n[models]\npreload = [\"" +
                                     primary.path + "\"]\npinned = [\"primary\"]\nkeep_alive = \"2s\"\n");
  ASSERT_TRUE(d.started()) << d.log();
  BusClient c(bus.address());
  // Preloaded: listed (and filling) before any client asked for it.
  auto st = c.status();
  ASSERT_EQ(st["models"].size(), 1u) << st.dump(1);
  EXPECT_EQ(st["models"][0]["name"], "primary");
  EXPECT_TRUE(st["models"][0]["preloaded"].get<bool>());
  EXPECT_TRUE(st["models"][0]["pinned"].get<bool>());
  EXPECT_EQ(st["keep_alive_s"].get<uint64_t>(), 2u);
  // The floor is the pinned primary model's footprint.
  EXPECT_EQ(st["pressure"]["floor_bytes"].get<uint64_t>(), round_up_pages(primary.size())) << st["pressure"].dump();
  // An idle model that is not pinned goes after keep_alive and gives its pages back.
  std::string obj;
  ASSERT_TRUE(c.load_model(other.path, &obj).ok());
  EXPECT_FALSE(model_in(c.status(), obj).is_null());
  EXPECT_TRUE(wait_until([&] { return model_in(c.status(), obj).is_null(); }, 10000ms))
      << "an idle model outlived keep_alive:\n" << c.status().dump(1);
  st = c.status();
  EXPECT_EQ(st["models"].size(), 1u) << "the pinned primary model was unloaded by keep-alive";
  EXPECT_EQ(st["pool"]["model_bytes"].get<uint64_t>(), round_up_pages(primary.size())) << st["pool"].dump();
  auto out = run_process({airsctl_path(), "--bus", bus.address(), "status"});
  EXPECT_NE(out.out.find("keep-alive 2 s"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("pinned  preloaded"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("security floor"), std::string::npos) << out.out;
  EXPECT_EQ(d.stop(), 0) << d.log();
}

}  // namespace
