// SPDX-License-Identifier: Apache-2.0
// airsctl inspect as a library: JSON shape, one-line errors, nothing on
// stdout for a malformed file.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "airsctl/inspect.hpp"
#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"

namespace airs::cli {
namespace {

class TempFile {
 public:
  TempFile() {
    char tmpl[] = "/tmp/airs-inspect-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    if (fd >= 0) ::close(fd);
    path_ = tmpl;
  }
  ~TempFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string slurp(std::FILE* f) {
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}

struct Outcome {
  int rc;
  std::string out, err;
};

Outcome run(const std::string& path, bool json, InspectOptions opts = {}) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  const int rc = run_inspect(path, json, out, err, opts);
  Outcome r{rc, slurp(out), slurp(err)};
  std::fclose(out);
  std::fclose(err);
  return r;
}

TEST(Inspect, JsonHasTheContractedShape) {
  gguf::ModelSpec s;
  s.alignment = 64;
  auto plan = gguf::plan_model(s);
  ASSERT_TRUE(plan.ok());
  TempFile tmp;
  ASSERT_TRUE(gguf::write_model_file(*plan, tmp.path()).ok());
  const Outcome r = run(tmp.path(), true);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  ASSERT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["alignment"], 64);
  EXPECT_EQ(j["data_offset"], plan->data_offset);
  EXPECT_EQ(j["file_size"], plan->file_size);
  EXPECT_EQ(j["architecture"], "llama");
  ASSERT_EQ(j["tensors"].size(), plan->tensors.size());
  const auto& t0 = j["tensors"][0];
  EXPECT_EQ(t0["name"], "token_embd.weight");
  EXPECT_EQ(t0["type"], "q4_K");
  EXPECT_EQ(t0["dims"], (std::vector<uint64_t>{512, 1024}));
  EXPECT_EQ(t0["offset"], plan->data_offset);
  EXPECT_EQ(t0["nbytes"], plan->tensors[0].nbytes);
  EXPECT_EQ(t0["layer"], -1);
  EXPECT_EQ(j["tensors"][1]["layer"], 0);
  EXPECT_EQ(j["kv"]["f16"]["bytes_per_token"], 4096);
  EXPECT_EQ(j["kv"]["f16"]["block_bytes"], 4096 * 16);
  EXPECT_EQ(j["pool"]["huge_pages"], (plan->file_size + (2 << 20) - 1) / (2 << 20));
}

TEST(Inspect, HumanReportNamesTheEssentials) {
  gguf::ModelSpec s;
  auto plan = gguf::plan_model(s);
  ASSERT_TRUE(plan.ok());
  TempFile tmp;
  ASSERT_TRUE(gguf::write_model_file(*plan, tmp.path()).ok());
  const Outcome r = run(tmp.path(), false, InspectOptions{1 << 20, 32});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("architecture    llama"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers          4"), std::string::npos);
  EXPECT_NE(r.out.find("pool footprint  10 huge pages of 1 MiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("per block (32 tok)"), std::string::npos);
  EXPECT_NE(r.out.find("blk.3.ffn_down.weight"), std::string::npos);
}

TEST(Inspect, MalformedFileGivesOneLineAndNoStdout) {
  gguf::Builder b;
  b.header(3, 1, 0).tensor_info("t", std::vector<uint64_t>{32, 0}, 0, 0);
  b.pad_to(32).zeros(128);
  TempFile tmp;
  {
    std::ofstream o(tmp.path(), std::ios::binary);
    o.write(reinterpret_cast<const char*>(b.bytes().data()), static_cast<std::streamsize>(b.bytes().size()));
  }
  for (bool json : {false, true}) {
    const Outcome r = run(tmp.path(), json);
    EXPECT_EQ(r.rc, 1);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("tensor[0] 't' dims[1] at byte 45: dimension is 0"), std::string::npos) << r.err;
  }
  const Outcome missing = run("/nonexistent/x.gguf", true);
  EXPECT_EQ(missing.rc, 1);
  EXPECT_EQ(missing.out, "");
  EXPECT_NE(missing.err.find("cannot open '/nonexistent/x.gguf'"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace airs::cli
