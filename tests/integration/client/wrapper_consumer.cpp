// SPDX-License-Identifier: Apache-2.0
// A program of a libairs user, written against the installed C++ wrapper
// only (<airs/airs.hpp>: RAII airs::Client, Model, Session) and built by
// wrapper_test.cpp with nothing but `pkg-config --cflags --libs airs`, as
// the README tells users to. It is not built by CMake.
//
//   wrapper_consumer BUS_ADDRESS MODEL.gguf
//
// Prints "model bytes=N equal", "session blocks=N written", "error code=..."
// lines; exit 0 only when every check held.
#include <airs/airs.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string bus = argv[1], path = argv[2];
  std::ifstream f(path, std::ios::binary);
  const std::vector<char> file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  try {
    airs::Client c(bus.c_str());
    {
      airs::Model m(c, path);
      m.wait_resident();
      const auto b = m.bytes();
      const bool equal = b.size() == file.size() && std::memcmp(b.data(), file.data(), file.size()) == 0;
      std::printf("model bytes=%zu %s\n", b.size(), equal ? "equal" : "DIFFER");
      if (!equal) return 3;
      airs::Session s(c, m, AIRS_PRIORITY_INTERACTIVE);
      const auto g = s.geometry();
      const auto blocks = s.allocate(4);
      for (size_t i = 0; i < blocks.size(); ++i) std::memset(s.block(blocks[i]), 0x40 + static_cast<int>(i), g.block_bytes);
      for (size_t i = 0; i < blocks.size(); ++i) {
        const auto* p = static_cast<const unsigned char*>(s.block(blocks[i]));
        for (uint32_t k = 0; k < g.block_bytes; ++k)
          if (p[k] != 0x40 + i) {
            std::printf("session block=%u byte=%u DIFFER\n", blocks[i], k);
            return 4;
          }
      }
      s.free(blocks);
      std::printf("session blocks=%zu written block_bytes=%u\n", blocks.size(), g.block_bytes);
    }  // Session, then Model, closed here; Client at the end
    // Errors are exceptions carrying the negative errno.
    try {
      airs::Model missing(c, path + ".missing");
      std::printf("error NONE\n");
      return 5;
    } catch (const airs::ClientError& e) {
      std::printf("error code=%d\n", e.code());
      if (e.code() >= 0) return 5;
    }
  } catch (const airs::ClientError& e) {
    std::printf("failed code=%d: %s\n", e.code(), e.what());
    return 6;
  }
  return 0;
}
