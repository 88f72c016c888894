// SPDX-License-Identifier: Apache-2.0
#include "sys/psi.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>


#include "fixture.hpp"

using namespace airs;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

namespace {
bool has_cap_sys_resource() {
  auto text = sys::read_text_file("/proc/self/status");
  if (!text) return false;
  auto pos = text->find("CapEff:");
  if (pos == std::string::npos) return false;
  return ((std::stoull(text->substr(pos + 7), nullptr, 16) >> 24) & 1) != 0;  // CAP_SYS_RESOURCE = 24
}
}  // namespace

TEST(Psi, ParsesSomeAndFull) {
  auto st = sys::parse_psi(
      "some avg10=1.50 avg60=0.25 avg300=0.05 total=123456789\n"
      "full avg10=0.75 avg60=0.10 avg300=0.00 total=42\n",
      "fixture");
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_DOUBLE_EQ(st->some.avg10, 1.50);
  EXPECT_DOUBLE_EQ(st->some.avg60, 0.25);
  EXPECT_DOUBLE_EQ(st->some.avg300, 0.05);
  EXPECT_EQ(st->some.total_us, 123456789u);
  EXPECT_TRUE(st->has_full);
  EXPECT_DOUBLE_EQ(st->full.avg10, 0.75);
  EXPECT_EQ(st->full.total_us, 42u);
}

TEST(Psi, SomeOnlyFileHasNoFull) {  // /proc/pressure/cpu before 5.13
  auto st = sys::parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n", "cpu");
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_FALSE(st->has_full);
  EXPECT_EQ(st->some.total_us, 7u);
}

TEST(Psi, RejectsMalformedNamingTheFile) {
  for (const char* bad : {"", "some avg10=1 avg60=2 avg300=3\n", "some avg10=x avg60=0 avg300=0 total=1\n",
                          "MemTotal: 1 kB\n", "some avg10=0 avg60=0 avg300=0 total=-1\n"}) {
    auto st = sys::parse_psi(bad, "/fixture/memory");
    ASSERT_FALSE(st) << "accepted: " << bad;
    EXPECT_EQ(st.error().code, EINVAL);
    EXPECT_THAT(st.error().message, HasSubstr("/fixture/memory"));
  }
}

TEST(Psi, ReadsTheRealFile) {
  auto st = sys::read_psi("/proc/pressure/memory");
  ASSERT_TRUE(st) << st.error().message;  // this machine has PSI
  EXPECT_TRUE(st->has_full);
}

TEST(Psi, MissingFileSaysBootWithPsi1) {
  test::FixtureDir d("psi-missing");
  auto st = sys::read_psi(d.path("pressure/memory"));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ENOENT);
  EXPECT_THAT(st.error().message, HasSubstr("psi=1"));
  auto t = sys::PsiTrigger::create(d.path("pressure/memory"), {});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.error().message, HasSubstr("boot with psi=1 on the kernel command line (cmdline.txt on Raspberry Pi OS)"));
}

TEST(Psi, TriggerOnOrdinaryFileIsRefused) {
  test::FixtureDir d("psi-regular");
  d.write("memory", test::psi_text(0, 0));
  auto t = sys::PsiTrigger::create(d.path("memory"), {});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, EINVAL);
  EXPECT_THAT(t.error().message, HasSubstr("not a kernel pressure file"));
  EXPECT_EQ(d.read("memory"), test::psi_text(0, 0));  // nothing written into it
}

TEST(Psi, RealTriggerWithTwoSecondWindow) {
  auto t = sys::PsiTrigger::create("/proc/pressure/memory", {sys::PsiKind::Some, 150ms, 2s});
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_GE(t->fd(), 0);
  EXPECT_EQ(sys::describe(t->spec()), "some 150ms/2s");
  auto f = sys::PsiTrigger::create("/proc/pressure/memory", {sys::PsiKind::Full, 100ms, 4s});
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(sys::describe(f->spec()), "full 100ms/4s");
}

TEST(Psi, OneSecondWindowNeedsCapSysResource) {
  auto t = sys::PsiTrigger::create("/proc/pressure/memory", {sys::PsiKind::Some, 150ms, 1s});
  if (has_cap_sys_resource()) {
    EXPECT_TRUE(t.ok()) << t.error().message;
  } else {
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().code, EINVAL);
    EXPECT_THAT(t.error().message, HasSubstr("without CAP_SYS_RESOURCE the window must be a multiple of 2 s"));
    EXPECT_THAT(t.error().message, HasSubstr("some 150ms/1s"));
  }
}

TEST(Psi, OutOfRangeWindowAndThreshold) {
  for (sys::PsiTriggerSpec s : {sys::PsiTriggerSpec{sys::PsiKind::Some, 150ms, 12s},
                                sys::PsiTriggerSpec{sys::PsiKind::Some, 3s, 2s},
                                sys::PsiTriggerSpec{sys::PsiKind::Full, 0ms, 2s}}) {
    auto t = sys::PsiTrigger::create("/proc/pressure/memory", s);
    ASSERT_FALSE(t.ok()) << sys::describe(s);
    EXPECT_EQ(t.error().code, EINVAL);
    EXPECT_THAT(t.error().message, HasSubstr("threshold must be > 0 and <= window, window 500 ms..10 s"));
  }
}

TEST(Psi, Describe) {
  EXPECT_EQ(sys::describe({sys::PsiKind::Full, 1500us, 2s}), "full 1500us/2s");
  EXPECT_EQ(sys::describe({sys::PsiKind::Some, 1s, 10s}), "some 1s/10s");
}
