// SPDX-License-Identifier: Apache-2.0
// ShmemBackend on the real kernel: memfd or huge-folio tmpfs pages, mlock,
// punch; /proc/meminfo read from a fixture file for the kernel view.
#include <fcntl.h>
#include <linux/capability.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pool/pool.hpp"
#include "pool/shmem_backend.hpp"
#include "util/sanitizers.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/own_devices.hpp"
#include "sys/procfs.hpp"
#include "sys/shmem.hpp"
#include "util/units.hpp"

namespace airs {
namespace {

#if defined(AIRS_ASAN) || defined(AIRS_TSAN)
#define AIRS_SANITIZED_BUILD 1
constexpr bool kMlockWorks = false;  // ASan and TSan make mlock/munlock no-ops
#else
#define AIRS_SANITIZED_BUILD 0
constexpr bool kMlockWorks = true;
#endif

uint64_t locked_bytes() {
  auto t = sys::read_text_file("/proc/self/status");
  if (!t) return UINT64_MAX;
  const auto pos = t->find("VmLck:");
  return pos == std::string::npos ? UINT64_MAX : std::stoull(t->substr(pos + 6)) * 1024;
}

// Sum of `field` (kB) over the /proc/self/smaps entries starting at `addr`.
uint64_t smaps_field_kb(const void* addr, const std::string& field) {
  auto t = sys::read_text_file("/proc/self/smaps", 64 << 20);
  if (!t) return 0;
  char start[32];
  std::snprintf(start, sizeof start, "%lx-", reinterpret_cast<unsigned long>(addr));
  const auto at = t->find("\n" + std::string(start));
  if (at == std::string::npos) return 0;
  const auto f = t->find("\n" + field, at);
  const auto next = t->find("VmFlags:", at);
  if (f == std::string::npos || f > next) return 0;
  return std::stoull(t->substr(f + 1 + field.size()));
}

// The VmFlags line of the /proc/self/smaps entry starting at `addr`.
std::string smaps_vmflags(const void* addr) {
  auto t = sys::read_text_file("/proc/self/smaps", 64 << 20);
  if (!t) return {};
  char start[32];
  std::snprintf(start, sizeof start, "%lx-", reinterpret_cast<unsigned long>(addr));
  const auto at = t->find("\n" + std::string(start));
  if (at == std::string::npos) return {};
  const auto f = t->find("\nVmFlags:", at);
  if (f == std::string::npos) return {};
  return t->substr(f + 1, t->find('\n', f + 1) - f - 1);
}

std::string fd_link(int fd) {
  char buf[256] = {};
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

TEST(ShmemBackend, HugeFoliosHoldEachUnitWhereTheKernelAllows) {
  auto b = pool::ShmemBackend::create({});
  ASSERT_TRUE(b.ok()) << b.error().message;
  if (!(*b)->huge_folios())
    GTEST_SKIP() << "no huge-folio tmpfs on this machine (the memfd path is what runs): " << (*b)->huge_folios_note();
  const uint64_t u = (*b)->page_size();
  const uint64_t pmd = sys::thp_pmd_size();
  auto fd = (*b)->create_file("airs-model:huge-test", 4 * u, pool::FileSize::Fixed);
  ASSERT_TRUE(fd.ok()) << fd.error().message;
  EXPECT_EQ(fd_link(fd->get()), "/airs-model:huge-test (deleted)");
  auto map = (*b)->map_region(fd->get(), 4 * u, "test");
  ASSERT_TRUE(map.ok()) << map.error().message;
  std::memset(map->bytes() + u, 0xa5, u);
  // The unit is held by PMD-sized folios, mapped whole in the writer.
  EXPECT_EQ(smaps_field_kb(map->get(), "ShmemPmdMapped:") * 1024, u) << "PMD size " << pmd;
  EXPECT_EQ(*sys::allocated_bytes(fd->get()), u);
  // The bytes, through the file: the written unit, zeros on either side.
  std::vector<unsigned char> got(3 * u);
  ASSERT_EQ(::pread(fd->get(), got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
  for (uint64_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], i >= u && i < 2 * u ? 0xa5 : 0) << "byte " << i;
  // Released (the pool drops its mapping first): every page goes back.
  *map = sys::Mapping();
  ASSERT_TRUE((*b)->release(fd->get(), u, u, "test"));
  EXPECT_EQ(*sys::allocated_bytes(fd->get()), 0U);
}

TEST(ShmemBackend, HugeFoliosOffOrAUnitSmallerThanAHugePageMakeMemfds) {
  pool::ShmemOptions off;
  off.huge_folios = false;
  auto b = pool::ShmemBackend::create(off);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE((*b)->huge_folios());
  EXPECT_NE((*b)->huge_folios_note().find("off"), std::string::npos) << (*b)->huge_folios_note();
  auto fd = (*b)->create_file("airs-model:memfd-test", (*b)->page_size(), pool::FileSize::Fixed);
  ASSERT_TRUE(fd.ok());
  EXPECT_EQ(fd_link(fd->get()).rfind("/memfd:airs-model:memfd-test", 0), 0U) << fd_link(fd->get());
  const uint64_t pmd = sys::thp_pmd_size();
  if (pmd <= sys::base_page_size()) GTEST_SKIP() << "no transparent huge pages: no unit smaller than one";
  pool::ShmemOptions small;
  small.unit = pmd / 2;
  auto s = pool::ShmemBackend::create(small);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE((*s)->huge_folios());
  EXPECT_NE((*s)->huge_folios_note().find("not a multiple"), std::string::npos) << (*s)->huge_folios_note();
}

// The pager's copy fill writes into a model region from io-wq workers, and an
// unload truncates the region without waiting for them: a write that lands
// after the truncation must fail instead of growing the file back (which
// would leave zero-filled holes below it for every mapping to read). Model
// regions on memfds are sealed against growth; the reserve, which the pool
// grows, is not; and nobody can add a seal later (a client's F_SEAL_SHRINK
// would stop an unload's truncation).
TEST(ShmemBackend, AModelRegionOnAMemfdNeverGrowsBackAfterItsTruncation) {
  pool::ShmemOptions off;
  off.huge_folios = false;
  auto b = pool::ShmemBackend::create(off);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE((*b)->fills_by_copy());
  const uint64_t u = (*b)->page_size();
  auto fd = (*b)->create_file("airs-model:sealed", 4 * u, pool::FileSize::Fixed);
  ASSERT_TRUE(fd.ok()) << fd.error().message;
  EXPECT_TRUE(sys::sealed_against_growth(fd->get()));
  std::vector<char> bytes(8192, 'x');
  ASSERT_EQ(::pwrite(fd->get(), bytes.data(), bytes.size(), static_cast<off_t>(u)), 8192) << "a write inside the file";
  ASSERT_EQ(::ftruncate(fd->get(), 0), 0) << std::strerror(errno);
  errno = 0;
  EXPECT_EQ(::pwrite(fd->get(), bytes.data(), bytes.size(), static_cast<off_t>(u)), -1);
  EXPECT_EQ(errno, EPERM);
  struct stat st {};
  ASSERT_EQ(::fstat(fd->get(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
  EXPECT_EQ(st.st_blocks, 0);
  EXPECT_NE(::fcntl(fd->get(), F_ADD_SEALS, F_SEAL_SHRINK), 0) << "a seal could still be added";
  auto grows = (*b)->create_file("airs-pool-reserve", u, pool::FileSize::MayGrow);
  ASSERT_TRUE(grows.ok());
  EXPECT_FALSE(sys::sealed_against_growth(grows->get()));
  EXPECT_TRUE(sys::resize_file(grows->get(), 2 * u, "reserve"));
  EXPECT_NE(::fcntl(grows->get(), F_ADD_SEALS, F_SEAL_SHRINK), 0) << "a seal could still be added";
}

// A tmpfs mounted at a fresh directory with `options` (root only); unmounted
// and removed at the end.
class TmpfsAt {
 public:
  explicit TmpfsAt(const std::string& options) {
    char tmpl[] = "/var/tmp/airs-huge-dir-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return;
    path_ = tmpl;
    mounted_ = ::mount("tmpfs", path_.c_str(), "tmpfs", 0, options.c_str()) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~TmpfsAt() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
    if (!path_.empty()) ::rmdir(path_.c_str());
  }
  TmpfsAt(const TmpfsAt&) = delete;
  TmpfsAt& operator=(const TmpfsAt&) = delete;
  [[nodiscard]] bool mounted() const { return mounted_; }
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] const std::string& error() const { return error_; }

 private:
  std::string path_;
  std::string error_ = "no directory";
  bool mounted_ = false;
};

uint64_t device_of_fd(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_dev) : 0;
}

uint64_t device_of_path(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_dev) : 0;
}

TEST(ShmemBackend, AHugeDirIsUsedWhenItGivesHugeFoliosAndNamedWhenNot) {
  const uint64_t pmd = sys::thp_pmd_size();
  if (pmd == 0 || 2 * kMiB % pmd != 0) GTEST_SKIP() << "no transparent huge pages of at most 2 MiB here";
  {
    TmpfsAt huge("huge=within_size,size=0,mode=0700");
    if (!huge.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << huge.error() << ")";
    pool::ShmemOptions o;
    o.huge_dir = huge.path();
    auto b = pool::ShmemBackend::create(o);
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE((*b)->huge_folios()) << (*b)->huge_folios_note();
    EXPECT_NE((*b)->huge_folios_note().find(huge.path()), std::string::npos) << (*b)->huge_folios_note();
    auto fd = (*b)->create_file("airs-model:in-dir", (*b)->page_size(), pool::FileSize::Fixed);
    ASSERT_TRUE(fd.ok()) << fd.error().message;
    EXPECT_EQ(device_of_fd(fd->get()), device_of_path(huge.path())) << "the file is not on the directory's tmpfs";
  }
  TmpfsAt small("huge=never,size=0,mode=0700");
  ASSERT_TRUE(small.mounted()) << small.error();
  char plain[] = "/var/tmp/airs-plain-dir-XXXXXX";
  ASSERT_NE(::mkdtemp(plain), nullptr);
  for (const std::string& dir : {small.path(), std::string(plain)}) {
    pool::ShmemOptions o;
    o.huge_dir = dir;
    auto b = pool::ShmemBackend::create(o);
    ASSERT_TRUE(b.ok());
    const std::string note = (*b)->huge_folios_note();
    // Named with what is wrong with it; the files go elsewhere (a private
    // mount where this process may mount, which it may: it mounted above).
    EXPECT_NE(note.find(dir + (dir == plain ? " is not a tmpfs" : ": base pages only")), std::string::npos) << note;
    EXPECT_TRUE((*b)->huge_folios()) << note;
    auto fd = (*b)->create_file("airs-model:elsewhere", (*b)->page_size(), pool::FileSize::Fixed);
    ASSERT_TRUE(fd.ok());
    EXPECT_NE(device_of_fd(fd->get()), device_of_path(dir));
  }
  ::rmdir(plain);
}

TEST(ShmemBackend, ATakenNameGetsASuffixAndTheOtherFileIsLeftAlone) {
  char dir[] = "/var/tmp/airs-names-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  sys::UniqueFd d(::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(d.valid());
  // Another creator's file, still linked under the name.
  sys::UniqueFd other(::openat(d.get(), "airs-model:m", O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  ASSERT_TRUE(other.valid());
  ASSERT_EQ(::write(other.get(), "x", 1), 1);
  auto fd = sys::create_tmpfs_file(d.get(), "airs-model:m");
  ASSERT_TRUE(fd.ok()) << fd.error().message;
  EXPECT_EQ(fd_link(fd->get()), std::string(dir) + "/airs-model:m.1 (deleted)");
  struct stat st {};
  ASSERT_EQ(::fstatat(d.get(), "airs-model:m", &st, 0), 0) << "the other file must stay";
  EXPECT_EQ(st.st_size, 1);
  EXPECT_NE(::fstatat(d.get(), "airs-model:m.1", &st, 0), 0) << "ours is unlinked at once";
  ::unlinkat(d.get(), "airs-model:m", 0);
  ::rmdir(dir);
}

TEST(ShmemBackend, UnitIsAMultipleOfTheBasePage) {
  const uint64_t base = sys::base_page_size();
  auto def = pool::ShmemBackend::create({});
  ASSERT_TRUE(def.ok()) << def.error().message;
  EXPECT_EQ((*def)->page_size() % base, 0U);
  EXPECT_GE((*def)->page_size(), 2 * kMiB);
  EXPECT_LT((*def)->page_size(), 2 * kMiB + base);
  pool::ShmemOptions o;
  o.unit = base + base / 2;
  auto bad = pool::ShmemBackend::create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, EINVAL);
  EXPECT_NE(bad.error().message.find(std::to_string(base)), std::string::npos) << bad.error().message;
  o.unit = 3 * base;  // not a power of two: allowed
  EXPECT_TRUE(pool::ShmemBackend::create(o).ok());
}

TEST(ShmemBackend, PopulateAllocatesAndLocksReleaseFreesAndUnlocks) {
  auto b = pool::ShmemBackend::create({});
  ASSERT_TRUE(b.ok());
  const uint64_t u = (*b)->page_size();
  auto fd = (*b)->create_file("shmem-test", 4 * u, pool::FileSize::MayGrow);
  ASSERT_TRUE(fd.ok()) << fd.error().message;
  EXPECT_EQ(*sys::allocated_bytes(fd->get()), 0U);
  const uint64_t lck0 = locked_bytes();
  ASSERT_TRUE((*b)->populate(fd->get(), u, 2 * u, "test"));
  EXPECT_EQ(*sys::allocated_bytes(fd->get()), 2 * u);
  if (kMlockWorks) {
    EXPECT_EQ(locked_bytes(), lck0 + 2 * u);
  }
  ASSERT_TRUE((*b)->release(fd->get(), u, u, "test"));
  EXPECT_EQ(*sys::allocated_bytes(fd->get()), u);
  if (kMlockWorks) {
    EXPECT_EQ(locked_bytes(), lck0 + u);
  }
  (*b)->forget_file(fd->get());
  if (kMlockWorks) {
    EXPECT_EQ(locked_bytes(), lck0) << "forget_file must drop the pin mapping";
  }
}

TEST(ShmemBackend, KernelViewAndNoKernelPool) {
  char path[] = "/tmp/airs-meminfo-XXXXXX";
  const int f = ::mkstemp(path);
  ASSERT_GE(f, 0);
  const std::string text =
      "MemTotal:        8000000 kB\nMemAvailable:    4096000 kB\nShmem:            204800 kB\n"
      "Mlocked:          102400 kB\nUnevictable:      110000 kB\nHugepagesize:       2048 kB\n";
  ASSERT_EQ(::write(f, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(f);
  pool::ShmemOptions o;
  o.unit = 4 * kMiB;
  o.meminfo = path;
  auto b = pool::ShmemBackend::create(o);
  ASSERT_TRUE(b.ok());
  auto v = (*b)->kernel_view();
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->page_size, 4 * kMiB);
  EXPECT_EQ(v->total, 8000000ULL * 1024 / (4 * kMiB));
  EXPECT_EQ(v->free, 4096000ULL * 1024 / (4 * kMiB));
  EXPECT_EQ(v->shmem_bytes, 204800ULL * 1024);
  EXPECT_EQ(v->mlocked_bytes, 102400ULL * 1024);
  EXPECT_EQ(v->unevictable_bytes, 110000ULL * 1024);
  EXPECT_EQ(*(*b)->kernel_available_pages(), 4096000ULL * 1024 / (4 * kMiB));
  EXPECT_EQ(*(*b)->adjust_kernel_pages(10), 0);
  EXPECT_EQ(*(*b)->adjust_kernel_pages(-10), 0);
  EXPECT_TRUE((*b)->release_frees_memory());
  EXPECT_NE((*b)->advice(3).find("LimitMEMLOCK=infinity"), std::string::npos) << (*b)->advice(3);
  ::unlink(path);
}

TEST(ShmemBackend, PoolShrinkHandsPagesStraightBack) {
  auto b = pool::ShmemBackend::create({});
  ASSERT_TRUE(b.ok());
  const uint64_t u = (*b)->page_size();
  auto p = pool::Pool::create(std::move(b).value(), {8 * u, false});
  ASSERT_TRUE(p.ok()) << p.error().message;
  auto kv = (*p)->kernel_view();
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->files_pages, 8U);
  auto took = (*p)->shrink(3);
  ASSERT_TRUE(took.ok()) << took.error().message;
  EXPECT_EQ(*took, 3U);
  EXPECT_EQ((*p)->counts().free_pages, 5U);
  EXPECT_EQ((*p)->kernel_view()->files_pages, 5U);
  auto grew = (*p)->grow(2);
  ASSERT_TRUE(grew.ok());
  EXPECT_EQ(*grew, 2U);
  EXPECT_EQ((*p)->kernel_view()->files_pages, 7U);
}

TEST(ShmemBackend, ModelPagesAreHandedOverUnitByUnitAndTheMemoryStaysThePoolsSize) {
  auto b = pool::ShmemBackend::create({});
  ASSERT_TRUE(b.ok());
  const uint64_t u = (*b)->page_size();
  auto p = pool::Pool::create(std::move(b).value(), {8 * u, false});
  ASSERT_TRUE(p.ok()) << p.error().message;
  pool::Pool& pool = **p;
  auto files = [&] { return pool.kernel_view()->files_pages; };
  auto r = pool.create_model_region("m", 5 * u);
  ASSERT_TRUE(r.ok()) << r.error().message;
  // Charged at once (nothing else can take them), still held by the reserve.
  EXPECT_EQ(pool.counts().free_pages, 3U);
  EXPECT_EQ(pool.counts().model_pages, 5U);
  EXPECT_EQ(files(), 8U);
  // A KV chunk cannot take the region's pages: only the 3 free ones.
  auto kv = pool.create_kv_region("kv", 4 * u);
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(pool.alloc_pages(**kv, {0, 4}).error().code, ENOSPC);
  // Unit 2 filled: the reserve gives one page up first, the write takes one.
  ASSERT_TRUE(pool.claim(**r, 2));
  EXPECT_EQ(files(), 7U);
  std::memset((*r)->data() + 2 * u, 0x5a, u);
  EXPECT_EQ(files(), 8U);
  ASSERT_TRUE(pool.claim(**r, 2));  // again: nothing more
  EXPECT_EQ(files(), 8U);
  EXPECT_EQ(pool.claim(**r, 5).error().code, EINVAL);
  // Evict: the filled page comes back through the reserve, the 4 never
  // handed over are free where they are.
  ASSERT_TRUE(pool.release_region(**r));
  EXPECT_EQ(pool.counts().free_pages, 8U);
  EXPECT_EQ(pool.counts().model_pages, 0U);
  EXPECT_EQ(files(), 8U);
  // Refill after eviction, then destroy with two units handed over.
  ASSERT_TRUE(pool.reserve_region(**r));
  for (uint64_t page : {0U, 4U}) {
    ASSERT_TRUE(pool.claim(**r, page));
    std::memset((*r)->data() + page * u, 1, u);
  }
  EXPECT_EQ(files(), 8U);
  EXPECT_EQ(pool.counts().free_pages, 3U);
  r->reset();
  EXPECT_EQ(pool.counts().free_pages, 8U);
  EXPECT_EQ(files(), 8U);
  // All 8 free again: the KV chunk fits now.
  EXPECT_TRUE(pool.alloc_pages(**kv, {0, 4}));
}

// A streamed region cut in quarter pages (a mixture of experts on shmem):
// the reserve gives a page up for every four units claimed and takes it
// back once the units left fill a page fewer, so the pool's memory never
// exceeds its size and the region never holds more than its budget. The
// region is whole units of base pages (a memfd: a huge folio would hold
// units the pool has not handed over).
TEST(ShmemBackend, AStreamedRegionOfSmallUnitsTakesAPageForEveryFourUnits) {
  auto b = pool::ShmemBackend::create({});
  ASSERT_TRUE(b.ok());
  const uint64_t u = (*b)->page_size();
  const uint64_t q = u / 4;
  auto p = pool::Pool::create(std::move(b).value(), {8 * u, false});
  ASSERT_TRUE(p.ok()) << p.error().message;
  pool::Pool& pool = **p;
  auto files = [&] { return pool.kernel_view()->files_pages; };
  auto allocated = [](int fd) {
    struct stat st {};
    return ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : UINT64_MAX;
  };
  const uint64_t base = sys::base_page_size();
  auto odd = pool.create_streamed_region("odd", 20 * u, 3, 3 * base);
  ASSERT_FALSE(odd.ok()) << "a unit that does not divide the page";
  EXPECT_EQ(odd.error().code, EINVAL);
  EXPECT_NE(odd.error().message.find("divide the page"), std::string::npos) << odd.error().message;
  EXPECT_EQ(pool.create_streamed_region("tiny", 20 * u, 3, base / 2).error().code, EINVAL);
  EXPECT_EQ(pool.counts().free_pages, 8U) << "a refused region took pages";

  auto r = pool.create_streamed_region("s", 10 * u + 123, 3, q);
  ASSERT_TRUE(r.ok()) << r.error().message;
  pool::Region& reg = **r;
  EXPECT_EQ(reg.unit_size(), q);
  EXPECT_EQ(reg.size(), 41 * q) << "whole units, not whole pages";
  EXPECT_NE(fd_link(reg.fd()).find("/memfd:"), std::string::npos) << fd_link(reg.fd());
  // No huge folio through the daemon's mapping either (shmem_enabled may
  // give memfds one), on a kernel that has them at all.
  if (::access("/sys/kernel/mm/transparent_hugepage", F_OK) == 0) {
    EXPECT_NE(smaps_vmflags(reg.data()).find(" nh"), std::string::npos) << smaps_vmflags(reg.data());
  }
  EXPECT_EQ(pool.counts().free_pages, 5U);
  EXPECT_EQ(pool.counts().model_pages, 3U);
  // Five units: two pages handed over, five units' bytes in the file.
  for (uint64_t unit : {0U, 7U, 13U, 22U, 40U}) {
    ASSERT_TRUE(pool.claim(reg, unit)) << unit;
    std::memset(reg.data() + unit * q, 0x5a, q);
  }
  EXPECT_EQ(reg.held_pages(), 2U);
  EXPECT_EQ(allocated(reg.fd()), 5 * q);
  EXPECT_EQ(files(), 7U) << "the reserve's 6 pages and 1.25 pages of units";
  // Twelve units fill the budget's three pages; a thirteenth has none.
  for (uint64_t unit : {1U, 2U, 3U, 4U, 5U, 6U, 8U}) {
    ASSERT_TRUE(pool.claim(reg, unit)) << unit;
    std::memset(reg.data() + unit * q, 0x5a, q);
  }
  EXPECT_EQ(reg.held_pages(), 3U);
  auto full = pool.claim(reg, 30);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, ENOSPC) << full.error().message;
  EXPECT_EQ(files(), 8U);
  // One unit goes: the eleven left still need three pages.
  ASSERT_TRUE(pool.release_unit(reg, 0));
  EXPECT_EQ(reg.held_pages(), 3U);
  EXPECT_EQ(allocated(reg.fd()), 11 * q);
  EXPECT_EQ(std::memcmp(reg.data() + 7 * q, std::string(q, '\x5a').data(), q), 0) << "a neighbour lost its bytes";
  // Three more: eight fill two pages, and the reserve has the third back,
  // still charged to the region.
  for (uint64_t unit : {1U, 13U, 40U}) ASSERT_TRUE(pool.release_unit(reg, unit));
  EXPECT_EQ(reg.held_pages(), 2U);
  EXPECT_EQ(allocated(reg.fd()), 8 * q);
  EXPECT_EQ(files(), 8U);
  EXPECT_EQ(pool.counts().free_pages, 5U);
  EXPECT_EQ(pool.counts().model_pages, 3U);
  // The budget cannot fall below the pages the units fill.
  EXPECT_EQ(pool.set_budget(reg, 1).error().code, EBUSY);
  ASSERT_TRUE(pool.set_budget(reg, 2));
  EXPECT_EQ(pool.counts().free_pages, 6U);
  // The region goes: every page back in the reserve.
  r->reset();
  EXPECT_EQ(pool.counts().free_pages, 8U);
  EXPECT_EQ(pool.counts().model_pages, 0U);
  EXPECT_EQ(files(), 8U);
}

// Built without sanitizers only: ASan and TSan make mlock a no-op, so it
// cannot be refused there (the plain build runs this).
#if !AIRS_SANITIZED_BUILD
TEST(ShmemBackend, MlockRefusedNamesTheFix) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Without CAP_IPC_LOCK and with a tiny RLIMIT_MEMLOCK, as an unprivileged
    // daemon without LimitMEMLOCK would run.
    __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct d[2]{};
    if (::syscall(SYS_capget, &h, d) != 0) _exit(10);
    d[CAP_IPC_LOCK / 32].effective &= ~(1U << (CAP_IPC_LOCK % 32));
    if (::syscall(SYS_capset, &h, d) != 0) _exit(11);
    rlimit rl{64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_MEMLOCK, &rl) != 0) _exit(12);
    auto b = pool::ShmemBackend::create({});
    if (!b) _exit(13);
    const uint64_t unit = (*b)->page_size();
    auto p = pool::Pool::create(std::move(b).value(), {4 * unit, false});
    if (p) _exit(14);
    const bool named = p.error().message.find("LimitMEMLOCK=infinity") != std::string::npos &&
                       p.error().message.find("RLIMIT_MEMLOCK") != std::string::npos;
    if (!named) std::fprintf(stderr, "message: %s\n", p.error().message.c_str());
    _exit(named ? 0 : 15);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
}
#endif

// The internal mounts of the daemon's memfds are noted as its own: its
// close() never hands their closes to a closer thread, as it does for a
// caller's tmpfs or FUSE mount it cannot see. A tmpfs is not its own.
TEST(OwnDevices, TheDaemonsMemfdsAreItsOwnAndATmpfsIsNot) {
  auto dev_of = [](int fd) {
    struct stat st {};
    EXPECT_EQ(::fstat(fd, &st), 0) << std::strerror(errno);
    return static_cast<uint64_t>(st.st_dev);
  };
  auto memfd = sys::create_shmem_file("own-devices", 4096, true);
  ASSERT_TRUE(memfd) << memfd.error().message;
  EXPECT_TRUE(sys::is_own_device(dev_of(memfd->get())));
  // A tmpfs, mounted and detached here as a caller's would be.
  sys::UniqueFd other(static_cast<int>(::syscall(SYS_fsopen, "tmpfs", 1)));
  ASSERT_TRUE(other) << std::strerror(errno);
  ASSERT_EQ(::syscall(SYS_fsconfig, other.get(), 6, nullptr, nullptr, 0), 0) << std::strerror(errno);
  sys::UniqueFd other_mnt(static_cast<int>(::syscall(SYS_fsmount, other.get(), 1, 0)));
  ASSERT_TRUE(other_mnt) << std::strerror(errno);
  const uint64_t other_dev = dev_of(other_mnt.get());
  EXPECT_NE(other_dev, dev_of(memfd->get()));
  EXPECT_FALSE(sys::is_own_device(other_dev));
}

}  // namespace
}  // namespace airs
