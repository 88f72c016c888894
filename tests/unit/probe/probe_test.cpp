// SPDX-License-Identifier: Apache-2.0
// The platform probe against fake kernels: what it reads, the mode it
// chooses and the advice it prints, line for line.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fake_platform.hpp"
#include "probe/mode.hpp"
#include "probe/probe.hpp"
#include "sys/uffd.hpp"

namespace airs::probe {
namespace {

using testing::FakeKernel;
using testing::FakeTree;

constexpr uint64_t kFeatures618 = 0x1ffff;  // Linux 6.18: everything up to MOVE, POISON included
constexpr uint64_t kFeatures61 = 0x1fff;    // Linux 6.1 (Debian 12): up to WP_HUGETLBFS_SHMEM, no POISON

const char* const kPressure =
    "some avg10=0.00 avg60=0.00 avg300=0.02 total=17729450\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=9363849\n";

const char* const kRecipe = "(see docs/raspberry-pi-kernel.md; config/kernel/airs.config)";
const char* const kUdevAdvice =
    "userfaultfd needs privilege: install the udev rule (group airs on /dev/userfaultfd: "
    "KERNEL==\"userfaultfd\", GROUP=\"airs\", MODE=\"0660\" in /etc/udev/rules.d/60-airs-userfaultfd.rules) "
    "or set vm.unprivileged_userfaultfd=1; until then only root clients can map models lazily";
const char* const kPsiAdvice =
    "PSI is off: add psi=1 to /boot/firmware/cmdline.txt (Raspberry Pi OS) or the kernel command line";

// The CI machine: x86_64, Linux 6.18, hugetlbfs 2 MiB (512 reserved) + 1 GiB,
// cgroup v1 memory + cgroup2, PSI on, THP madvise, /dev/userfaultfd 0600.
void this_machine(FakeTree& t, FakeKernel& k) {
  t.write("proc/filesystems", "nodev\tsysfs\nnodev\ttmpfs\nnodev\tproc\nnodev\tcgroup\nnodev\tcgroup2\n"
                              "nodev\thugetlbfs\n\text4\n");
  t.write("proc/meminfo", "MemTotal:       16384000 kB\nHugePages_Total:     512\nHugepagesize:       2048 kB\n");
  t.write("proc/self/mountinfo",
          "23 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
          "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
          "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
          "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
          "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
          "217 24 0:59 / /dev/hugepages rw,relatime - hugetlbfs hugetlbfs rw,mode=1770,pagesize=2M\n");
  t.write("proc/cmdline", "console=ttyS0 quiet reboot=k panic=1 psi=1 nomodule\n");
  t.write("proc/pressure/memory", kPressure);
  t.write("proc/sys/kernel/osrelease", "6.18.44-fc-v857\n");
  t.write("proc/sys/vm/unprivileged_userfaultfd", "0\n");
  t.write("proc/sys/kernel/io_uring_disabled", "0\n");
  t.hugepage_size(2048, 512, 512);
  t.hugepage_size(1048576, 0, 0);
  t.write("sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n");
  t.write("sys/kernel/mm/transparent_hugepage/shmem_enabled", "always within_size advise [never] deny force\n");
  t.mkdir("sys/devices/system/node/node0");
  t.write("sys/devices/system/node/online", "0\n");
  t.write("sys/fs/cgroup/unified/cgroup.controllers", "\n");
  t.write("dev/userfaultfd", "");
  t.chmod("dev/userfaultfd", 0600);
  k.uffd_features = kFeatures618;
}

// Raspberry Pi OS on a Pi 5 (kernel_2712): 16 KiB pages, no userfaultfd, no
// hugetlbfs, no THP, PSI built in but off (the file is there, reads fail),
// cgroup2 with memory, eight emulated NUMA nodes.
void raspberry_pi_os_2712(FakeTree& t, FakeKernel& k) {
  t.write("proc/filesystems", "nodev\tsysfs\nnodev\ttmpfs\nnodev\tproc\nnodev\tcgroup\nnodev\tcgroup2\n"
                              "\text4\n\tvfat\n");
  t.write("proc/meminfo", "MemTotal:        8245344 kB\nMemFree:         7456032 kB\n");
  t.write("proc/self/mountinfo",
          "22 1 179:2 / / rw,noatime - ext4 /dev/mmcblk0p2 rw\n"
          "25 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate,"
          "memory_recursiveprot\n"
          "30 22 179:1 / /boot/firmware rw,relatime - vfat /dev/mmcblk0p1 rw,fmask=0022\n");
  t.write("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n");
  t.write("proc/cmdline",
          "reboot=w coherent_pool=1M 8250.nr_uarts=1 pci=pcie_bus_safe numa_policy=interleave "
          "numa=fake=8 system_heap.max_order=0 smsc95xx.macaddr=2C:CF:67:00:00:01 vc_mem.mem_base=0x3fc00000 "
          "vc_mem.mem_size=0x40000000  console=ttyAMA10,115200 console=tty1 root=PARTUUID=4e639091-02 "
          "rootfstype=ext4 fsck.repair=yes rootwait quiet splash\n");
  t.write("proc/pressure/memory", "");
  k.failing_reads[t.path("proc/pressure/memory")] = EOPNOTSUPP;
  t.write("proc/sys/kernel/osrelease", "6.12.25+rpt-rpi-2712\n");
  t.write("proc/sys/kernel/io_uring_disabled", "0\n");
  for (int n = 0; n < 8; ++n) t.mkdir("sys/devices/system/node/node" + std::to_string(n));
  t.write("sys/devices/system/node/online", "0-7\n");
  k.uffd_syscall_errno = ENOSYS;
  k.page_size = 16384;
}

// Debian 12 on arm64 (6.1): hugetlbfs with four sizes and nothing reserved,
// userfaultfd for root only (/dev/userfaultfd 0600, sysctl 0), no POISON.
void debian_arm64(FakeTree& t, FakeKernel& k) {
  t.write("proc/filesystems", "nodev\tsysfs\nnodev\ttmpfs\nnodev\tproc\nnodev\tcgroup2\nnodev\thugetlbfs\n\text4\n");
  t.write("proc/meminfo", "MemTotal:        8000000 kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\n");
  t.write("proc/self/mountinfo",
          "21 1 8:2 / / rw,relatime - ext4 /dev/sda2 rw,errors=remount-ro\n"
          "26 24 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
          "rw,nsdelegate,memory_recursiveprot\n"
          "35 23 0:30 / /dev/hugepages rw,relatime shared:13 - hugetlbfs hugetlbfs rw,pagesize=2M\n");
  t.write("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n");
  t.write("proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-arm64 root=UUID=0b1c ro quiet\n");
  t.write("proc/pressure/memory", kPressure);
  t.write("proc/sys/kernel/osrelease", "6.1.0-28-arm64\n");
  t.write("proc/sys/vm/unprivileged_userfaultfd", "0\n");
  for (uint64_t kb : {uint64_t{64}, uint64_t{2048}, uint64_t{32768}, uint64_t{1048576}}) t.hugepage_size(kb, 0, 0);
  t.write("sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n");
  t.write("sys/kernel/mm/transparent_hugepage/shmem_enabled", "always within_size advise [never] deny force\n");
  t.mkdir("sys/devices/system/node/node0");
  t.write("dev/userfaultfd", "");
  t.chmod("dev/userfaultfd", 0600);
  k.uffd_features = kFeatures61;
}

// A kernel with userfaultfd and shmem but without hugetlbfs (e.g. a custom
// build without CONFIG_HUGETLBFS): MINOR_HUGETLBFS is not offered.
void shmem_only(FakeTree& t, FakeKernel& k) {
  this_machine(t, k);
  t.write("proc/filesystems", "nodev\tsysfs\nnodev\ttmpfs\nnodev\tproc\nnodev\tcgroup\nnodev\tcgroup2\n\text4\n");
  t.write("proc/meminfo", "MemTotal:       16384000 kB\n");
  t.write("proc/self/mountinfo", "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n");
  std::filesystem::remove_all(t.path("sys/kernel/mm/hugepages"));
  t.write("proc/sys/vm/unprivileged_userfaultfd", "1\n");
  k.uffd_features = kFeatures618 & ~uint64_t{UFFD_FEATURE_MINOR_HUGETLBFS};
}

std::vector<std::string> texts(const std::vector<Advice>& a) {
  std::vector<std::string> out;
  for (const auto& x : a) out.push_back(x.topic + ": " + x.text);
  return out;
}

TEST(ProbeThisMachine, FakeTreeOfTheCiMachineChoosesFull) {
  FakeTree t;
  FakeKernel k;
  this_machine(t, k);
  const Capabilities c = probe(t.paths(), k.ops());
  EXPECT_TRUE(c.problems.empty()) << c.problems.front();
  EXPECT_EQ(c.kernel_release, "6.18.44-fc-v857");
  EXPECT_EQ(c.base_page_size, 4096u);
  ASSERT_EQ(c.hugetlbfs.sizes.size(), 2u);
  EXPECT_EQ(c.hugetlbfs.sizes[0].bytes, 2u << 20);
  EXPECT_EQ(c.hugetlbfs.sizes[0].nr, 512u);
  EXPECT_EQ(c.hugetlbfs.sizes[1].bytes, 1u << 30);
  EXPECT_EQ(c.hugetlbfs.default_size, 2u << 20);
  ASSERT_EQ(c.hugetlbfs.mounts.size(), 1u);
  EXPECT_EQ(c.hugetlbfs.mounts[0].path, "/dev/hugepages");
  EXPECT_EQ(c.hugetlbfs.mounts[0].page_size, 2u << 20);
  EXPECT_TRUE(c.uffd.syscall_ok);
  EXPECT_TRUE(c.uffd.device_exists);
  EXPECT_TRUE(c.uffd.device_ok);
  EXPECT_EQ(c.uffd.device_mode, 0600u);
  EXPECT_EQ(c.uffd.device_group, "root");
  EXPECT_EQ(c.uffd.unprivileged_sysctl, 0);
  EXPECT_EQ(c.uffd.features, kFeatures618);
  EXPECT_FALSE(c.uffd.open_to_clients());
  EXPECT_EQ(c.io_uring.disabled_sysctl, 0);
  EXPECT_TRUE(c.io_uring.setup_ok);
  EXPECT_TRUE(c.psi.available());
  EXPECT_EQ(c.psi.cmdline_psi, true);
  EXPECT_EQ(k.psi_trigger_calls, 1);
  EXPECT_EQ(c.memcg.v1_mount, "/sys/fs/cgroup/memory");
  EXPECT_EQ(c.memcg.v2_mount, "");  // cgroup2 is mounted but memory is bound to v1
  EXPECT_EQ(c.numa_nodes, 1);
  EXPECT_EQ(c.thp.enabled, "madvise");
  EXPECT_EQ(c.thp.shmem_enabled, "never");

  auto choice = choose_mode(c, "auto");
  ASSERT_TRUE(choice.ok()) << choice.error().message;
  EXPECT_EQ(choice->mode, Mode::Full);
  EXPECT_EQ(choice->reason, "full: hugetlbfs (2 MiB, 1 GiB pages) and userfaultfd with MINOR_HUGETLBFS");
  EXPECT_EQ(texts(choice->advice), std::vector<std::string>{std::string("userfaultfd: ") + kUdevAdvice});
}

TEST(ProbeRaspberryPiOs, Kernel2712ChoosesCooperativeAndSaysHowToGetMore) {
  FakeTree t;
  FakeKernel k;
  raspberry_pi_os_2712(t, k);
  const Capabilities c = probe(t.paths(), k.ops());
  EXPECT_TRUE(c.problems.empty()) << c.problems.front();
  EXPECT_EQ(c.base_page_size, 16384u);
  EXPECT_FALSE(c.hugetlbfs.in_filesystems);
  EXPECT_TRUE(c.hugetlbfs.sizes.empty());
  EXPECT_EQ(c.hugetlbfs.default_size, 0u);
  EXPECT_FALSE(c.uffd.usable());
  EXPECT_EQ(c.uffd.syscall_errno, ENOSYS);
  EXPECT_FALSE(c.uffd.device_exists);
  EXPECT_EQ(k.uffd_device_calls, 0);
  EXPECT_EQ(c.uffd.unprivileged_sysctl, std::nullopt);
  EXPECT_TRUE(c.psi.file_exists);
  EXPECT_FALSE(c.psi.readable);
  EXPECT_EQ(c.psi.read_errno, EOPNOTSUPP);
  EXPECT_EQ(k.psi_trigger_calls, 0);  // no trigger on a file that cannot even be read
  EXPECT_EQ(c.psi.cmdline_psi, std::nullopt);
  EXPECT_EQ(c.memcg.v2_mount, "/sys/fs/cgroup");
  EXPECT_FALSE(c.memcg.cmdline_disabled);
  EXPECT_TRUE(c.memcg.available());
  EXPECT_EQ(c.numa_nodes, 8);
  EXPECT_FALSE(c.thp.available());
  EXPECT_TRUE(c.io_uring.setup_ok);

  auto choice = choose_mode(c, "auto");
  ASSERT_TRUE(choice.ok()) << choice.error().message;
  EXPECT_EQ(choice->mode, Mode::Cooperative);
  EXPECT_EQ(choice->reason,
            "cooperative: lazy loading needs userfaultfd (userfaultfd(2): Function not implemented; "
            "no /dev/userfaultfd)");
  EXPECT_EQ(texts(choice->advice),
            (std::vector<std::string>{
                std::string("userfaultfd: no userfaultfd: build the kernel with CONFIG_USERFAULTFD=y ") + kRecipe,
                std::string("hugetlbfs: no hugetlbfs: build the kernel with CONFIG_HUGETLBFS=y and "
                            "CONFIG_HUGETLB_PAGE=y ") + kRecipe,
                std::string("psi: ") + kPsiAdvice,
                std::string("thp: no transparent huge pages: build the kernel with CONFIG_TRANSPARENT_HUGEPAGE=y ") +
                    kRecipe,
            }));
}

TEST(ProbeRaspberryPiOs, ReportAndStatusKeysNameEveryGap) {
  FakeTree t;
  FakeKernel k;
  raspberry_pi_os_2712(t, k);
  const Capabilities c = probe(t.paths(), k.ops());
  EXPECT_EQ(format_report(c),
            "kernel       6.12.25+rpt-rpi-2712, base page 16 KiB\n"
            "hugetlbfs    no: not in /proc/filesystems, 0 page sizes\n"
            "userfaultfd  no: userfaultfd(2): Function not implemented; no /dev/userfaultfd; "
            "vm.unprivileged_userfaultfd=absent; clients: privileged only\n"
            "io_uring     yes: io_uring_setup: ok; kernel.io_uring_disabled=0\n"
            "PSI          no: /proc/pressure/memory Operation not supported; triggers: not tried; cmdline psi=absent\n"
            "memcg        yes: cgroup2 at /sys/fs/cgroup\n"
            "NUMA         8 nodes\n"
            "THP          no");
  const auto kv = to_key_values(c);
  EXPECT_EQ(kv.at("page_size"), "16384");
  EXPECT_EQ(kv.at("hugetlbfs"), "no");
  EXPECT_EQ(kv.at("hugetlbfs.sizes"), "");
  EXPECT_EQ(kv.at("userfaultfd"), "no");
  EXPECT_EQ(kv.at("userfaultfd.features"), "0x0");
  EXPECT_EQ(kv.at("io_uring"), "yes");
  EXPECT_EQ(kv.at("psi"), "no");
  EXPECT_EQ(kv.at("numa.nodes"), "8");
  EXPECT_EQ(kv.at("thp"), "no");
  EXPECT_EQ(kv.at("odirect"), "not probed");

  auto choice = choose_mode(c, "auto");
  ASSERT_TRUE(choice.ok());
  const auto mkv = to_key_values(*choice);
  EXPECT_EQ(mkv.at("mode"), "cooperative");
  EXPECT_EQ(mkv.at("advice.psi"), kPsiAdvice);
  EXPECT_EQ(mkv.count("advice.io_uring"), 0u);
}

TEST(ProbeRaspberryPiOs, BootingWithPsi1IsSeenAndTheAdviceGoes) {
  FakeTree t;
  FakeKernel k;
  raspberry_pi_os_2712(t, k);
  t.write("proc/cmdline", "console=tty1 root=PARTUUID=4e639091-02 rootwait psi=1\n");
  t.write("proc/pressure/memory", kPressure);
  k.failing_reads.clear();
  const Capabilities c = probe(t.paths(), k.ops());
  EXPECT_EQ(c.psi.cmdline_psi, true);
  EXPECT_TRUE(c.psi.available());
  auto choice = choose_mode(c, "auto");
  ASSERT_TRUE(choice.ok());
  for (const auto& a : choice->advice) EXPECT_NE(a.topic, "psi") << a.text;
}

TEST(ProbeRaspberryPiOs, Psi1WithoutPressureFilesMeansTheKernelLacksPsi) {
  FakeTree t;
  FakeKernel k;
  raspberry_pi_os_2712(t, k);
  t.write("proc/cmdline", "rootwait psi=1\n");
  std::filesystem::remove_all(t.path("proc/pressure"));
  const Capabilities c = probe(t.paths(), k.ops());
  EXPECT_FALSE(c.psi.file_exists);
  EXPECT_EQ(c.psi.read_errno, ENOENT);
  const auto a = advise(c);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a[2].text, std::string("no PSI although psi=1 is set: build the kernel with CONFIG_PSI=y ") + kRecipe);
}

TEST(ProbeRaspberryPiOs, MemcgDisabledOnTheCommandLine) {
  FakeTree t;
  FakeKernel k;
  raspberry_pi_os_2712(t, k);
  t.write("proc/cmdline", "console=tty1 cgroup_disable=memory rootwait\n");
  t.write("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io pids\n");
  const Capabilities c = probe(t.paths(), k.ops());
  EXPECT_TRUE(c.memcg.cmdline_disabled);
  EXPECT_FALSE(c.memcg.available());
  const auto a = advise(c);
  ASSERT_EQ(a.size(), 5u);
  EXPECT_EQ(a[3].topic, "memcg");
  EXPECT_EQ(a[3].text,
            "no memory cgroup: remove cgroup_disable=memory from /boot/firmware/cmdline.txt (Raspberry Pi OS) or the "
            "kernel command line");
}

TEST(ProbeDebianArm64, RootOnlyUserfaultfdAsksForTheUdevRule) {
  FakeTree t;
  FakeKernel k;
  debian_arm64(t, k);
  const Capabilities c = probe(t.paths(), k.ops());
  EXPECT_TRUE(c.problems.empty()) << c.problems.front();
  ASSERT_EQ(c.hugetlbfs.sizes.size(), 4u);
  EXPECT_EQ(c.hugetlbfs.sizes[0].bytes, 64u << 10);
  EXPECT_EQ(c.hugetlbfs.sizes[3].bytes, 1u << 30);
  EXPECT_EQ(c.hugetlbfs.reserved_pages(), 0u);
  EXPECT_EQ(c.io_uring.disabled_sysctl, std::nullopt);  // 6.1 has no such sysctl
  EXPECT_EQ(c.memcg.v2_mount, "/sys/fs/cgroup");
  EXPECT_FALSE(c.uffd.open_to_clients());

  auto choice = choose_mode(c, "auto");
  ASSERT_TRUE(choice.ok()) << choice.error().message;
  EXPECT_EQ(choice->mode, Mode::Full);
  EXPECT_EQ(texts(choice->advice),
            (std::vector<std::string>{
                std::string("userfaultfd: ") + kUdevAdvice,
                "userfaultfd: userfaultfd lacks POISON: a failed model read cannot reach lazy clients as SIGBUS; "
                "use Linux 6.6 or later",
                "hugetlbfs: no huge pages reserved: vm.nr_hugepages=N or hugepages=N on the kernel command line "
                "(N = pool size / 2 MiB)",
            }));
}

TEST(ProbeDebianArm64, AGroupOnTheDeviceOpensItToClients) {
  FakeTree t;
  FakeKernel k;
  debian_arm64(t, k);
  t.chmod("dev/userfaultfd", 0660);
  t.chown_group("dev/userfaultfd", 4242);  // a group that is not root ("airs" on a real system)
  const Capabilities c = probe(t.paths(), k.ops());
  EXPECT_EQ(c.uffd.device_mode, 0660u);
  EXPECT_TRUE(c.uffd.open_to_clients());
  for (const auto& a : advise(c)) EXPECT_EQ(a.text.find("udev"), std::string::npos) << a.text;
}

TEST(ProbeDebianArm64, DaemonWithoutPrivilegeFallsBackToCooperative) {
  FakeTree t;
  FakeKernel k;
  debian_arm64(t, k);
  k.uffd_syscall_errno = EPERM;
  k.uffd_device_errno = EACCES;
  const Capabilities c = probe(t.paths(), k.ops());
  EXPECT_FALSE(c.uffd.usable());
  EXPECT_EQ(c.uffd.features, 0u);
  auto choice = choose_mode(c, "auto");
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->mode, Mode::Cooperative);
  ASSERT_FALSE(choice->advice.empty());
  EXPECT_EQ(choice->advice[0].text,
            "userfaultfd refused (userfaultfd(2): Operation not permitted; /dev/userfaultfd: Permission denied): "
            "run airs-memd as root, install the udev rule (group airs on /dev/userfaultfd) or set "
            "vm.unprivileged_userfaultfd=1");
}

TEST(ProbeShmemOnly, UserfaultfdWithoutHugetlbfsChoosesSmallPages) {
  FakeTree t;
  FakeKernel k;
  shmem_only(t, k);
  const Capabilities c = probe(t.paths(), k.ops());
  EXPECT_TRUE(c.problems.empty()) << c.problems.front();
  EXPECT_FALSE(c.hugetlbfs.available());
  EXPECT_TRUE(c.uffd.open_to_clients());  // vm.unprivileged_userfaultfd=1
  auto choice = choose_mode(c, "auto");
  ASSERT_TRUE(choice.ok()) << choice.error().message;
  EXPECT_EQ(choice->mode, Mode::SmallPages);
  EXPECT_EQ(choice->reason,
            "small-pages: userfaultfd with MINOR_SHMEM; full needs userfaultfd features MINOR_HUGETLBFS (kernel "
            "offers MISSING_HUGETLBFS MISSING_SHMEM MINOR_SHMEM THREAD_ID EVENT_UNMAP POISON), hugetlbfs (not in "
            "/proc/filesystems)");
  EXPECT_EQ(texts(choice->advice),
            (std::vector<std::string>{std::string("hugetlbfs: no hugetlbfs: build the kernel with CONFIG_HUGETLBFS=y "
                                                  "and CONFIG_HUGETLB_PAGE=y ") + kRecipe}));
}

TEST(ForcedMode, EachModeTheKernelCanRunIsTaken) {
  FakeTree t;
  FakeKernel k;
  this_machine(t, k);
  const Capabilities c = probe(t.paths(), k.ops());
  auto full = choose_mode(c, "full");
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->mode, Mode::Full);
  EXPECT_EQ(full->reason, "full: forced by models.mode (auto agrees)");
  auto small = choose_mode(c, "small-pages");
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->mode, Mode::SmallPages);
  EXPECT_EQ(small->reason, "small-pages: forced by models.mode (auto would choose full)");
  auto coop = choose_mode(c, "cooperative");
  ASSERT_TRUE(coop.ok());
  EXPECT_EQ(coop->mode, Mode::Cooperative);
  EXPECT_EQ(coop->advice.size(), 1u);  // the advice does not depend on the mode
}

TEST(ForcedMode, FullWithoutHugetlbfsIsAnErrorNamingWhatIsMissing) {
  FakeTree t;
  FakeKernel k;
  shmem_only(t, k);
  const Capabilities c = probe(t.paths(), k.ops());
  EXPECT_EQ(missing_for(c, Mode::Full),
            (std::vector<std::string>{"userfaultfd features MINOR_HUGETLBFS (kernel offers MISSING_HUGETLBFS "
                                      "MISSING_SHMEM MINOR_SHMEM THREAD_ID EVENT_UNMAP POISON)",
                                      "hugetlbfs (not in /proc/filesystems)"}));
  auto r = choose_mode(c, "full");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EOPNOTSUPP);
  EXPECT_EQ(r.error().message,
            std::string("models.mode = full cannot run on this kernel: missing userfaultfd features MINOR_HUGETLBFS "
                        "(kernel offers MISSING_HUGETLBFS MISSING_SHMEM MINOR_SHMEM THREAD_ID EVENT_UNMAP POISON), "
                        "hugetlbfs (not in /proc/filesystems); no hugetlbfs: build the kernel with CONFIG_HUGETLBFS=y "
                        "and CONFIG_HUGETLB_PAGE=y ") +
                kRecipe + "; or set models.mode = auto (would choose small-pages)");
}

TEST(ForcedMode, LazyModesOnStockRaspberryPiOsAreErrors) {
  FakeTree t;
  FakeKernel k;
  raspberry_pi_os_2712(t, k);
  const Capabilities c = probe(t.paths(), k.ops());
  auto full = choose_mode(c, "full");
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, EOPNOTSUPP);
  EXPECT_NE(full.error().message.find("missing userfaultfd (userfaultfd(2): Function not implemented; no "
                                      "/dev/userfaultfd), hugetlbfs (not in /proc/filesystems)"),
            std::string::npos)
      << full.error().message;
  EXPECT_NE(full.error().message.find("CONFIG_USERFAULTFD=y"), std::string::npos);
  EXPECT_NE(full.error().message.find("CONFIG_HUGETLBFS=y"), std::string::npos);
  EXPECT_EQ(full.error().message.find("psi=1"), std::string::npos);  // only what the mode needs
  auto small = choose_mode(c, "small-pages");
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.error().message,
            std::string("models.mode = small-pages cannot run on this kernel: missing userfaultfd (userfaultfd(2): "
                        "Function not implemented; no /dev/userfaultfd); no userfaultfd: build the kernel with "
                        "CONFIG_USERFAULTFD=y ") +
                kRecipe + "; or set models.mode = auto (would choose cooperative)");
  auto coop = choose_mode(c, "cooperative");
  ASSERT_TRUE(coop.ok());
  EXPECT_EQ(coop->reason, "cooperative: forced by models.mode (auto agrees)");
}

TEST(ForcedMode, AnUnknownModeIsRejected) {
  const Capabilities c;
  auto r = choose_mode(c, "fast");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EINVAL);
  EXPECT_EQ(r.error().message, "models.mode = 'fast' is not a mode: use auto, full, small-pages or cooperative");
}

TEST(ProbeAdvice, IoUringSysctlAndFailures) {
  FakeTree t;
  FakeKernel k;
  this_machine(t, k);
  t.write("proc/sys/kernel/io_uring_disabled", "2\n");
  k.io_uring_errno = EPERM;
  auto c = probe(t.paths(), k.ops());
  EXPECT_EQ(c.io_uring.disabled_sysctl, 2);
  EXPECT_EQ(c.io_uring.setup_errno, EPERM);
  auto a = advise(c);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[1].topic, "io_uring");
  EXPECT_EQ(a[1].text, "io_uring disabled by kernel.io_uring_disabled=2: set it to 0");

  t.write("proc/sys/kernel/io_uring_disabled", "1\n");
  c = probe(t.paths(), k.ops());
  a = advise(c);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[1].text,
            "io_uring restricted by kernel.io_uring_disabled=1: set it to 0 or put airs-memd's group in "
            "kernel.io_uring_group");
}

TEST(ProbeAdvice, RefusedPsiTriggerAndMissingMountAndODirect) {
  FakeTree t;
  FakeKernel k;
  this_machine(t, k);
  t.write("proc/self/mountinfo", "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n");
  k.psi_trigger_errno = EACCES;
  k.open_direct_errno = EINVAL;
  ProbePaths p = t.paths();
  p.odirect_path = "/srv/models";
  const auto c = probe(p, k.ops());
  EXPECT_TRUE(c.psi.readable);
  EXPECT_FALSE(c.psi.available());
  EXPECT_EQ(c.odirect.err, EINVAL);
  EXPECT_TRUE(c.problems.empty());  // EINVAL is the answer, not a failure of the probe
  EXPECT_EQ(texts(advise(c)),
            (std::vector<std::string>{
                std::string("userfaultfd: ") + kUdevAdvice,
                "hugetlbfs: no hugetlbfs mount: systemctl enable --now dev-hugepages.mount",
                "psi: PSI triggers refused on /proc/pressure/memory: Permission denied: run airs-memd as root",
                "odirect: no O_DIRECT on the file system of /srv/models: model reads go through the page cache; "
                "keep models on ext4, xfs or btrfs",
            }));
}

TEST(ProbeReaders, EscapedMountPointsAndPagesizeOptions) {
  FakeTree t;
  FakeKernel k;
  this_machine(t, k);
  t.write("proc/self/mountinfo",
          "217 24 0:59 / /dev/hugepages rw,relatime - hugetlbfs hugetlbfs rw,mode=1770\n"
          "218 24 0:60 / /mnt/huge\\0401G rw,relatime shared:9 - hugetlbfs none rw,pagesize=1024M\n");
  const auto c = probe(t.paths(), k.ops());
  ASSERT_EQ(c.hugetlbfs.mounts.size(), 2u);
  EXPECT_EQ(c.hugetlbfs.mounts[0].page_size, 2u << 20);  // no pagesize=: the default size
  EXPECT_EQ(c.hugetlbfs.mounts[1].path, "/mnt/huge 1G");
  EXPECT_EQ(c.hugetlbfs.mounts[1].page_size, 1u << 30);
}

TEST(ProbeReaders, UnreadableFilesAreReportedNotHidden) {
  FakeTree t;
  FakeKernel k;
  this_machine(t, k);
  k.failing_reads[t.path("proc/meminfo")] = EACCES;
  t.write("proc/sys/vm/unprivileged_userfaultfd", "yes\n");
  const auto c = probe(t.paths(), k.ops());
  ASSERT_EQ(c.problems.size(), 2u);
  EXPECT_EQ(c.problems[0], "fake read " + t.path("proc/meminfo"));
  EXPECT_EQ(c.problems[1], t.path("proc/sys/vm/unprivileged_userfaultfd") + ": expected an integer, got 'yes\n'");
  EXPECT_EQ(c.hugetlbfs.default_size, 0u);
  EXPECT_EQ(c.uffd.unprivileged_sysctl, std::nullopt);
  EXPECT_NE(format_report(c).find("\nproblem      fake read " + t.path("proc/meminfo")), std::string::npos);
}

}  // namespace
}  // namespace airs::probe
