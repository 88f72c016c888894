// SPDX-License-Identifier: Apache-2.0
// Content ids: the hash of every byte (a one-byte change anywhere is another
// model), the fd reader agrees with the in-memory hash, and the stat cache
// keeps an id only while the file is unchanged and rejects malformed entries.
#include "gguf/content_id.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace airs::gguf {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/airs-content-id-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

void write_file(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

struct stat stat_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  return st;
}

TEST(ContentId, HexRoundTripsAndRejectsMalformed) {
  const ContentId id{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  EXPECT_EQ(id.hex(), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(ContentId::from_hex(id.hex()), id);
  EXPECT_EQ(ContentId::from_hex("0123456789ABCDEFFEDCBA9876543210"), id);
  EXPECT_FALSE(ContentId::from_hex("0123456789abcdeffedcba987654321"));    // 31 digits
  EXPECT_FALSE(ContentId::from_hex("0123456789abcdeffedcba98765432100"));  // 33
  EXPECT_FALSE(ContentId::from_hex("0123456789abcdeffedcba987654321g"));
  EXPECT_FALSE(ContentId::from_hex(""));
}

TEST(ContentId, EveryByteCounts) {
  auto bytes = random_bytes(10 << 20, 1);
  const ContentId a = content_id_of(bytes.data(), bytes.size());
  for (size_t at : {size_t{0}, bytes.size() / 2, bytes.size() - 1}) {
    bytes[at] ^= 1;
    EXPECT_NE(content_id_of(bytes.data(), bytes.size()), a) << "a flipped bit at " << at << " kept the id";
    bytes[at] ^= 1;
  }
  EXPECT_EQ(content_id_of(bytes.data(), bytes.size()), a);
  EXPECT_NE(content_id_of(bytes.data(), bytes.size() - 1), a);
}

TEST(ContentId, FdReaderMatchesMemoryAcrossChunks) {
  TempDir dir;
  const std::string path = dir.path() + "/m.gguf";
  // Not a multiple of the reader's 4 MiB chunk.
  const auto bytes = random_bytes((9 << 20) + 12345, 2);
  write_file(path, bytes);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto id = content_id_of_fd(fd, bytes.size());
  ASSERT_TRUE(id) << id.error().message;
  EXPECT_EQ(*id, content_id_of(bytes.data(), bytes.size()));
  // A prefix is a prefix's hash; a length past the end is an error.
  auto prefix = content_id_of_fd(fd, 1000);
  ASSERT_TRUE(prefix);
  EXPECT_EQ(*prefix, content_id_of(bytes.data(), 1000));
  auto past = content_id_of_fd(fd, bytes.size() + 1);
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code, EBADMSG);
  std::atomic<bool> cancel{true};
  auto cancelled = content_id_of_fd(fd, bytes.size(), &cancel);
  ASSERT_FALSE(cancelled);
  EXPECT_EQ(cancelled.error().code, ECANCELED);
  ::close(fd);
}

TEST(ContentIdCache, KeepsTheIdWhileTheFileIsUnchanged) {
  TempDir dir;
  const std::string path = dir.path() + "/m.gguf";
  write_file(path, random_bytes(4096, 3));
  const ContentIdCache cache(dir.path() + "/ids");
  const ContentId id{1, 2};
  EXPECT_FALSE(cache.lookup(stat_of(path)));
  ASSERT_TRUE(cache.store(stat_of(path), id));
  EXPECT_EQ(cache.lookup(stat_of(path)), id);
  struct stat dst = stat_of(cache.dir());
  EXPECT_EQ(dst.st_mode & 0777, 0700u);
  // Rewritten in place (same inode, same size): ctime moves, the id is gone.
  write_file(path, random_bytes(4096, 4));
  EXPECT_FALSE(cache.lookup(stat_of(path)));
  // Even with mtime set back to what it was.
  struct stat before = stat_of(path);
  ASSERT_TRUE(cache.store(before, id));
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_FALSE(cache.lookup(stat_of(path))) << "utimensat changes ctime";
}

TEST(ContentIdCache, MalformedEntriesMissAndEmptyDirKeepsNothing) {
  TempDir dir;
  const std::string path = dir.path() + "/m.gguf";
  write_file(path, random_bytes(100, 5));
  const ContentIdCache cache(dir.path() + "/ids");
  const auto st = stat_of(path);
  ASSERT_TRUE(cache.store(st, ContentId{7, 8}));
  std::string entry;
  for (const auto& e : std::filesystem::directory_iterator(cache.dir())) entry = e.path();
  ASSERT_FALSE(entry.empty());
  for (const std::string& bad : std::vector<std::string>{"", "zz", std::string(32, 'g') + "\n", std::string(32, 'a') + "\nextra",
                                std::string(32, 'a')}) {
    std::ofstream(entry, std::ios::trunc) << bad;
    EXPECT_FALSE(cache.lookup(st)) << "served a malformed entry: '" << bad << "'";
  }
  const ContentIdCache none("");
  ASSERT_TRUE(none.store(st, ContentId{1, 1}));
  EXPECT_FALSE(none.lookup(st));
}

}  // namespace
}  // namespace airs::gguf
