// SPDX-License-Identifier: Apache-2.0
// A per-test temporary directory with helpers to (re)write fixture files.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "sys/procfs.hpp"

namespace airs::test {

class FixtureDir {
 public:
  explicit FixtureDir(const std::string& tag)
      : dir_(std::filesystem::temp_directory_path() / ("airs-" + tag + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~FixtureDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  FixtureDir(const FixtureDir&) = delete;
  FixtureDir& operator=(const FixtureDir&) = delete;

  [[nodiscard]] std::string path(const std::string& rel) const { return (dir_ / rel).string(); }
  [[nodiscard]] std::string root() const { return dir_.string(); }
  // Writes atomically (rename) so a reader never sees half a file.
  void write(const std::string& rel, const std::string& text) const {
    const auto p = dir_ / rel;
    std::filesystem::create_directories(p.parent_path());
    const auto tmp = p.string() + ".tmp";
    { std::ofstream(tmp) << text; }
    std::filesystem::rename(tmp, p);
  }
  [[nodiscard]] std::string read(const std::string& rel) const {
    auto t = sys::read_text_file((dir_ / rel).string());
    return t ? *t : "<unreadable: " + t.error().message + ">";
  }

 private:
  std::filesystem::path dir_;
};

inline std::string psi_text(uint64_t some_total, uint64_t full_total, double some_avg10 = 0, double full_avg10 = 0) {
  return "some avg10=" + std::to_string(some_avg10) + " avg60=0.00 avg300=0.00 total=" + std::to_string(some_total) +
         "\nfull avg10=" + std::to_string(full_avg10) + " avg60=0.00 avg300=0.00 total=" + std::to_string(full_total) +
         "\n";
}

}  // namespace airs::test
