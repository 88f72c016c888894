// SPDX-License-Identifier: Apache-2.0
// The C++ wrapper as a user gets it: libairs and its headers installed (the
// `lib` and `dev` components, as in the libairs0 and libairs-dev packages)
// into a scratch root, a program built against them with only
// `pkg-config --cflags --libs airs`, run against a real airs-memd on a
// private bus: it reads the model through airs::Model byte for byte and
// writes and reads KV blocks through airs::Session.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "daemon_fixture.hpp"
#include "harness.hpp"

using namespace airs::test;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(CppWrapper, APkgConfigBuiltProgramReadsTheModelAndUsesASession) {
  if (run_process({"/bin/sh", "-c", "command -v pkg-config"}).exit_code != 0)
    GTEST_SKIP() << "pkg-config is not installed (scripts/deps.sh installs it)";
  TempDir dir;
  const std::string root = dir.path() + "/root";
  for (const char* component : {"lib", "dev"}) {
    auto r = run_process({"/usr/bin/env", "DESTDIR=" + root, AIRS_CMAKE, "--install", AIRS_BUILD_DIR, "--component",
                          component},
                         std::chrono::seconds(120));
    ASSERT_EQ(r.exit_code, 0) << "cmake --install --component " << component << ":\n" << r.out << r.err;
  }
  const std::string libdir = root + AIRS_INSTALL_FULL_LIBDIR;
  const std::string pc = "PKG_CONFIG_LIBDIR=" + libdir + "/pkgconfig";  // only the installed airs.pc
  const std::string sysroot = "PKG_CONFIG_SYSROOT_DIR=" + root;
  auto flags = run_process({"/usr/bin/env", pc, sysroot, "pkg-config", "--cflags", "--libs", "airs"});
  ASSERT_EQ(flags.exit_code, 0) << "pkg-config: " << flags.err;
  ASSERT_NE(flags.out.find("-L" + libdir), std::string::npos) << flags.out;

  const std::string program = dir.path() + "/consumer";
  auto cc = run_process({"/bin/sh", "-c",
                         "exec \"$0\" -std=c++20 -Wall -Wextra -Werror \"$1\" -o \"$2\" $(env \"$3\" \"$4\" pkg-config "
                         "--cflags --libs airs)",
                         AIRS_CXX, AIRS_CONSUMER_SRC, program, pc, sysroot},
                        std::chrono::seconds(300));
  ASSERT_EQ(cc.exit_code, 0) << "building the consumer with pkg-config's flags:\n" << cc.out << cc.err;

  if (auto why = hugepages_missing(64 * kMiB)) {
    ADD_FAILURE() << "huge pages missing: " << *why;
    return;
  }
  auto m = make_model(dir, "m.gguf", "wrapped", 16 * kMiB);
  PrivateBus bus;
  // resize_pool = false: memory pressure on a busy machine must not hand the
  // pool back to the kernel under the test.
  DaemonProcess d(bus.address(), "[pool]\nsize = \"64M\"\ngrow_nr_hugepages = false\n[pressure]\nresize_pool = false\n");
  ASSERT_TRUE(d.started()) << d.log();
  auto run = run_process({"/usr/bin/env", "LD_LIBRARY_PATH=" + libdir, program, bus.address(), m.path},
                         std::chrono::seconds(120));
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err << "\nairs-memd:\n" << d.log();
  EXPECT_NE(run.out.find("model bytes=" + std::to_string(m.size()) + " equal\n"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("session blocks=4 written"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("error code=-"), std::string::npos) << run.out;
  // The program ran on the installed library, not the build tree's.
  auto ldd = run_process({"/usr/bin/env", "LD_LIBRARY_PATH=" + libdir, "ldd", program});
  EXPECT_NE(ldd.out.find(libdir + "/libairs.so.0"), std::string::npos) << ldd.out;
  EXPECT_EQ(d.stop(), 0) << d.log();
}

}  // namespace
