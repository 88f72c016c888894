// SPDX-License-Identifier: Apache-2.0
// The file and directory helpers of src/sys that the daemon's KV spill tier,
// state directory, GGUF reader and probe call instead of raw calls.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sys/files.hpp"

namespace airs::sys {
namespace {

class Files : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "airs-files-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  void write(const std::string& name, const std::string& bytes) const {
    auto fd = open_file(path(name), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(fd.ok()) << fd.error().message;
    ASSERT_TRUE(write_all(fd->get(), std::as_bytes(std::span(bytes.data(), bytes.size()))).ok());
  }
  std::string dir_;
};

// Both durabilities replace the file whole: a reader holding the old file
// keeps its bytes, a new reader sees all of the new ones, the mode is the
// one asked for (whatever the umask, or a stale temporary file's mode), and
// no temporary file stays. Durability::Readers differs only in skipping
// the fsyncs, which no reader can tell.
TEST_F(Files, WriteFileAtomicReplacesTheFileWholeWithItsMode) {
  for (auto durability : {Durability::Crash, Durability::Readers}) {
    const std::string p = path(durability == Durability::Crash ? "crash" : "readers");
    ASSERT_TRUE(write_file_atomic(p, "old bytes", 0600, durability).ok());
    auto old_reader = open_file(p, O_RDONLY);
    ASSERT_TRUE(old_reader.ok()) << old_reader.error().message;
    write((durability == Durability::Crash ? "crash" : "readers") + std::string(".tmp"), "stale");
    const mode_t umask_was = ::umask(077);
    const Status st = write_file_atomic(p, "the new bytes, all of them", 0644, durability);
    ::umask(umask_was);
    ASSERT_TRUE(st.ok()) << st.error().message;
    char buf[64] = {};
    ASSERT_EQ(::pread(old_reader->get(), buf, sizeof buf, 0), 9);
    EXPECT_EQ(std::string(buf, 9), "old bytes");
    auto now = read_small_file(p, 1024);
    ASSERT_TRUE(now.ok()) << now.error().message;
    EXPECT_EQ(std::string(now->begin(), now->end()), "the new bytes, all of them");
    struct stat sb {};
    ASSERT_EQ(::stat(p.c_str(), &sb), 0);
    EXPECT_EQ(sb.st_mode & 07777, 0644u);
    EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
  }
  const Status missing = write_file_atomic(path("no-dir/m.prom"), "x", 0644, Durability::Readers);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, path("no-dir/m.prom.tmp") + ": " + std::strerror(ENOENT));
}

// The fd quota's recount: every descriptor of a process that refers to one
// of the given files, dups and memfds included, and nothing else.
TEST_F(Files, CountFdsReferringToCountsEveryDescriptorOfTheGivenFiles) {
  write("a", "a");
  write("b", "b");
  auto a = open_file(path("a"), O_RDONLY);
  auto b = open_file(path("b"), O_RDONLY);
  ASSERT_TRUE(a.ok() && b.ok());
  UniqueFd mem(::memfd_create("airs-count", MFD_CLOEXEC));
  ASSERT_TRUE(mem) << std::strerror(errno);
  InodeSet ours;
  for (int fd : {a->get(), mem.get()}) {
    auto i = inode_of(fd);
    ASSERT_TRUE(i.ok()) << i.error().message;
    ours.insert(*i);
  }
  auto before = count_fds_referring_to(::getpid(), ours);
  ASSERT_TRUE(before.ok()) << before.error().message;
  EXPECT_EQ(*before, 2U);
  UniqueFd a2(::fcntl(a->get(), F_DUPFD_CLOEXEC, 3));
  UniqueFd m2(::fcntl(mem.get(), F_DUPFD_CLOEXEC, 3));
  auto again = open_file(path("a"), O_RDONLY);  // another open of the same file
  ASSERT_TRUE(a2 && m2 && again.ok());
  EXPECT_EQ(*count_fds_referring_to(::getpid(), ours), 5U);
  a2.reset();
  EXPECT_EQ(*count_fds_referring_to(::getpid(), ours), 4U);
  auto gone = count_fds_referring_to(999999999, ours);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code, ESRCH);
}

TEST_F(Files, ListDirLeavesOutDotEntries) {
  write("a", "1");
  write("b", "2");
  ASSERT_TRUE(make_dir(path("c"), 0700).ok());
  auto names = list_dir(dir_);
  ASSERT_TRUE(names.ok()) << names.error().message;
  std::sort(names->begin(), names->end());
  EXPECT_EQ(*names, (std::vector<std::string>{"a", "b", "c"}));
  auto gone = list_dir(path("nope"));
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code, ENOENT);
  EXPECT_EQ(gone.error().message, path("nope") + ": " + std::strerror(ENOENT));
}

TEST_F(Files, EnsurePrivateDirMakesOrFixesAndRefusesWhatIsNoDirectory) {
  const std::string d = path("private");
  ASSERT_TRUE(ensure_private_dir(d).ok());
  EXPECT_EQ(stat_path(d)->st_mode & 07777, 0700u);
  ASSERT_EQ(::chmod(d.c_str(), 0755), 0);
  ASSERT_TRUE(ensure_private_dir(d).ok());
  EXPECT_EQ(stat_path(d)->st_mode & 07777, 0700u);

  write("file", "x");
  auto f = ensure_private_dir(path("file"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code, ENOTDIR);
  EXPECT_EQ(f.error().message, path("file") + ": not a directory");
  // A symlink to a directory is not the directory itself.
  ASSERT_EQ(::symlink(d.c_str(), path("link").c_str()), 0);
  EXPECT_EQ(ensure_private_dir(path("link")).error().code, ENOTDIR);
  EXPECT_TRUE(S_ISLNK(lstat_path(path("link"))->st_mode));
  EXPECT_TRUE(S_ISDIR(stat_path(path("link"))->st_mode));
}

TEST_F(Files, RemoveAndRenameNameThePath) {
  write("a", "1");
  ASSERT_TRUE(rename_file(path("a"), path("b")).ok());
  EXPECT_EQ(lstat_path(path("a")).error().code, ENOENT);
  ASSERT_TRUE(lstat_path(path("b")).ok());
  auto r = rename_file(path("a"), path("c"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "rename " + path("a") + ": " + std::strerror(ENOENT));
  ASSERT_TRUE(remove_file(path("b")).ok());
  EXPECT_TRUE(remove_file(path("b")).ok()) << "a file already gone is no error";
  ASSERT_TRUE(make_dir(path("d"), 0700).ok());
  EXPECT_EQ(remove_file(path("d")).error().code, EISDIR);
  EXPECT_TRUE(sync_dir(dir_).ok());
  EXPECT_EQ(sync_dir(path("nope")).error().code, ENOENT);
}

TEST_F(Files, ReadAtIsOneReadThatMayBeShortAtTheEnd) {
  write("f", "0123456789");
  auto fd = open_file(path("f"), O_RDONLY);
  ASSERT_TRUE(fd.ok());
  char buf[8] = {};
  auto n = read_at(fd->get(), buf, 4, 3);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 4u);
  EXPECT_EQ(std::string(buf, 4), "3456");
  n = read_at(fd->get(), buf, sizeof buf, 6);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 4u);  // the end of the file
  char head[2] = {}, rest[3] = {};
  const iovec iov[2] = {{head, sizeof head}, {rest, sizeof rest}};
  n = read_at(fd->get(), iov, 1);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 5u);
  EXPECT_EQ(std::string(head, 2) + std::string(rest, 3), "12345");
  EXPECT_EQ(read_at(-1, buf, 1, 0).error().code, EBADF);
}

TEST_F(Files, CloseAndMtime) {
  write("f", "abc");
  auto fd = open_file(path("f"), O_RDONLY);
  ASSERT_TRUE(fd.ok());
  const timespec t{1'700'000'000, 123'000'000};
  ASSERT_TRUE(set_mtime(fd->get(), path("f"), t).ok());
  EXPECT_EQ(stat_path(path("f"))->st_mtim.tv_sec, t.tv_sec);
  const timespec u{1'700'000'100, 0};
  ASSERT_TRUE(set_mtime(-1, path("f"), u).ok());
  EXPECT_EQ(stat_path(path("f"))->st_mtim.tv_sec, u.tv_sec);
  EXPECT_TRUE(close_file(std::move(fd).value()).ok());
  EXPECT_EQ(set_mtime(-1, path("nope"), u).error().code, ENOENT);
}

TEST_F(Files, CheckReadableFileSaysWhatIsWrong) {
  write("f", "abc");
  EXPECT_TRUE(check_readable_file(path("f")).ok());
  auto d = check_readable_file(dir_);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().message, dir_ + " is not a regular file");
  EXPECT_EQ(check_readable_file(path("nope")).error().code, ENOENT);
}

// Where a fill's read may start in the submitting thread: a file in memory
// (a memfd is tmpfs's) yes; /proc (no disk and no memory file system, as
// FUSE and NFS are not) no; the magic numbers of FUSE and NFS no.
TEST_F(Files, ReadsEndByThemselvesOnlyOnLocalFileSystems) {
  const int m = ::memfd_create("airs-fs-type", MFD_CLOEXEC);
  ASSERT_GE(m, 0);
  const auto mem = fs_type_of(m, "memfd");
  ::close(m);
  ASSERT_TRUE(mem) << mem.error().message;
  EXPECT_TRUE(reads_end_by_themselves(*mem));
  const int p = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(p, 0);
  const auto proc = fs_type_of(p, "/proc/self/status");
  ::close(p);
  ASSERT_TRUE(proc) << proc.error().message;
  EXPECT_FALSE(reads_end_by_themselves(*proc));
  EXPECT_FALSE(reads_end_by_themselves(0x65735546));  // FUSE
  EXPECT_FALSE(reads_end_by_themselves(0x6969));      // NFS
  EXPECT_FALSE(reads_end_by_themselves(0x794c7630));  // overlayfs
  EXPECT_TRUE(reads_end_by_themselves(0xEF53));       // ext4
}

}  // namespace
}  // namespace airs::sys
