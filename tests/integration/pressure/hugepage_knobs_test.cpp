// SPDX-License-Identifier: Apache-2.0
// nr_hugepages on the real sysfs: grow by 2 pages of 2 MiB and give them
// back. Whatever happens, the pages this test added are given back at the
// end (a relative undo, so a concurrent writer's change is not clobbered).
#include "sys/hugepage_knobs.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include "sys/procfs.hpp"
#include "util/units.hpp"

using namespace airs;

namespace {
constexpr uint64_t k2M = 2 * kMiB;

class Undo {
 public:
  explicit Undo(sys::HugepageKnobs& k) : k_(k) {}
  ~Undo() {
    if (added_ == 0) return;
    auto r = k_.shrink(k2M, added_);
    if (!r || r->done != added_)
      ADD_FAILURE() << "could not give back " << added_ << " huge pages: " << (r ? r->note : r.error().message);
  }
  void added(uint64_t n) { added_ += n; }
  void removed(uint64_t n) { added_ -= std::min(added_, n); }

 private:
  sys::HugepageKnobs& k_;
  uint64_t added_ = 0;
};
}  // namespace

TEST(HugepageKnobsReal, GrowByTwoAndShrinkBack) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to write nr_hugepages";
  sys::HugepageKnobs k;
  auto before = k.read(k2M);
  ASSERT_TRUE(before) << before.error().message;
  Undo undo(k);

  auto g = k.grow(k2M, 2);
  ASSERT_TRUE(g) << g.error().message;
  undo.added(g->done);
  EXPECT_EQ(g->done, 2u) << g->note;
  EXPECT_EQ(g->after, g->before + 2);
  auto mid = k.read(k2M);
  ASSERT_TRUE(mid);
  EXPECT_EQ(mid->free, before->free + 2);
  auto mi = sys::read_meminfo();
  ASSERT_TRUE(mi);
  if (sys::read_u64_file("/proc/sys/vm/nr_hugepages").value() == mid->nr) {  // 2 MiB is the default size here
    EXPECT_EQ(mi->at("HugePages_Total"), mid->nr);
  }

  auto s = k.shrink(k2M, 2);
  ASSERT_TRUE(s) << s.error().message;
  undo.removed(s->done);
  EXPECT_EQ(s->done, 2u) << s->note;
  EXPECT_TRUE(s->note.empty()) << s->note;
  if (!mid->nodes.empty()) {
    uint64_t sum = 0;
    for (const auto& n : s->nodes) sum += n.done;
    EXPECT_EQ(sum, 2u);
  }
  auto after = k.read(k2M);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->nr, before->nr);
}
