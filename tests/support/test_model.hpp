// SPDX-License-Identifier: Apache-2.0
// A synthetic llama-shaped GGUF from the project's writer, for tests: a
// fresh directory of its own and the model file in it. Header-only; the
// test links airs_gguf_io.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"

namespace airs::test {

struct TestModel {
  std::filesystem::path dir;  // <tmp>/<tag>-<pid>, created
  std::string path;           // dir/m.gguf
};

// Throws (failing the test) when the model cannot be planned or written.
inline TestModel write_test_model(const std::string& tag, const std::string& name, uint64_t n_layers, uint64_t n_embd,
                                  uint64_t n_ff = 1536) {
  TestModel t;
  t.dir = std::filesystem::temp_directory_path() / (tag + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(t.dir);
  gguf::ModelSpec spec;
  spec.name = name;
  spec.n_layers = n_layers;
  spec.n_embd = n_embd;
  spec.n_ff = n_ff;
  auto plan = gguf::plan_model(spec);
  if (!plan) throw std::runtime_error("plan_model: " + plan.error().message);
  t.path = (t.dir / "m.gguf").string();
  if (auto st = gguf::write_model_file(*plan, t.path); !st) throw std::runtime_error("write_model_file: " + st.error().message);
  return t;
}

}  // namespace airs::test
