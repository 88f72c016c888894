// SPDX-License-Identifier: Apache-2.0
// Test helper: a GGUF file read into memory and the engine's views of it.
#pragma once

#include <cstddef>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf/gguf.hpp"
#include "infer/model.hpp"
#include "infer/tokenizer.hpp"

namespace airs::test {

struct LoadedModel {
  std::vector<std::byte> bytes;
  gguf::File file;
  infer::Model model;
  std::optional<infer::Tokenizer> tokenizer;
};

// Throws std::runtime_error with the reason on any failure.
inline std::unique_ptr<LoadedModel> load_model_file(const std::string& path) {
  auto m = std::make_unique<LoadedModel>();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  in.seekg(0, std::ios::end);
  m->bytes.resize(static_cast<size_t>(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(m->bytes.data()), static_cast<std::streamsize>(m->bytes.size()));
  const gguf::MemorySource src(m->bytes);
  auto f = gguf::parse(src);
  if (!f) throw std::runtime_error(f.error().message);
  m->file = std::move(*f);
  auto model = infer::load_model(m->file, m->bytes);
  if (!model) throw std::runtime_error(model.error().message);
  m->model = std::move(*model);
  auto tok = infer::Tokenizer::from_gguf(m->file, m->bytes);
  if (!tok) throw std::runtime_error(tok.error().message);
  m->tokenizer.emplace(std::move(*tok));
  return m;
}

}  // namespace airs::test
