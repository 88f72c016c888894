// SPDX-License-Identifier: Apache-2.0
// airs-demo MODEL.gguf [--bus ADDRESS]: what an inference process does with
// libairs — open a model lazily through airs-memd, walk it layer by layer
// (comparing every tensor's bytes with the file), then open a KV session,
// allocate blocks, write and read them back.
// --wait-go stops after the model is mapped (before any byte is read) until
// a line arrives on stdin, so a test can act while the load is under way
// (e.g. restart the bus); --no-session leaves out the KV part (it needs the
// bus connection the demo opened with).
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "airs/airs.hpp"
#include "gguf/file_io.hpp"
#include "gguf/gguf.hpp"

int main(int argc, char** argv) {
  // Progress lines, one at a time: a pipe would otherwise hold them until
  // exit, and a demo that is killed would say nothing of how far it got.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string bus = "system";
  std::string path;
  int hold_s = 0;
  bool wait_go = false;
  bool session_too = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--bus" && i + 1 < argc) bus = argv[++i];
    else if (a == "--hold" && i + 1 < argc) hold_s = std::atoi(argv[++i]);
    else if (a == "--wait-go") wait_go = true;
    else if (a == "--no-session") session_too = false;
    else if (a == "-h" || a == "--help") {
      std::puts("usage: airs-demo MODEL.gguf [--bus system|session|ADDRESS] [--hold SECONDS] [--wait-go] [--no-session]");
      return 0;
    } else path = a;
  }
  if (path.empty()) {
    std::fputs("usage: airs-demo MODEL.gguf [--bus ADDRESS]\n", stderr);
    return 2;
  }
  try {
    auto src = airs::gguf::FdSource::open(path);
    if (!src) throw std::runtime_error(src.error().message);
    auto file = airs::gguf::parse(*src);
    if (!file) throw std::runtime_error(file.error().message);

    airs::Client client(bus.c_str());
    auto t0 = std::chrono::steady_clock::now();
    airs::Model model(client, path, "demo");
    auto t1 = std::chrono::steady_clock::now();
    std::printf("demo: model mapped lazily in %.1f ms (%s)\n", std::chrono::duration<double, std::milli>(t1 - t0).count(),
                model.resident() ? "already resident" : "loading in the background");
    if (wait_go) {
      std::puts("demo: waiting for a line on stdin before reading");
      char line[64];
      if (std::fgets(line, sizeof line, stdin) == nullptr) {
        std::fputs("demo: stdin closed before the go line\n", stderr);
        return 1;
      }
    }
    // Walk the tensors in load order like a forward pass, checking bytes.
    std::vector<std::byte> want;
    uint64_t checked = 0;
    for (uint32_t idx : file->load_order) {
      const auto& t = file->tensors[idx];
      want.resize(t.nbytes);
      if (auto r = src->read(t.offset, want.data(), want.size()); !r) throw std::runtime_error(r.error().message);
      if (std::memcmp(model.bytes().data() + t.offset, want.data(), t.nbytes) != 0) {
        std::fprintf(stderr, "demo: tensor %s differs from the file!\n", t.name.c_str());
        return 1;
      }
      checked += t.nbytes;
    }
    auto t2 = std::chrono::steady_clock::now();
    std::printf("demo: %zu tensors (%.1f MiB) read through the pool match the file byte for byte (%.1f ms, %s)\n",
                file->tensors.size(), static_cast<double>(checked) / 1048576.0,
                std::chrono::duration<double, std::milli>(t2 - t1).count(),
                airs_model_in_fallback(model.get()) != 0 ? "read from the file by this process: airs-memd was gone"
                                                         : "served by airs-memd");
    if (!session_too) return 0;

    airs::Session session(client, model, AIRS_PRIORITY_INTERACTIVE);
    auto g = session.geometry();
    auto blocks = session.allocate(4);
    for (uint32_t b : blocks) std::memset(session.block(b), static_cast<int>(b & 0xff), g.block_bytes);
    session.set_length(4 * g.tokens_per_block - 3);
    for (uint32_t b : blocks) {
      auto* p = static_cast<unsigned char*>(session.block(b));
      if (p[0] != (b & 0xff) || p[g.block_bytes - 1] != (b & 0xff)) {
        std::fprintf(stderr, "demo: KV block %u lost its bytes\n", b);
        return 1;
      }
    }
    std::printf("demo: KV session with %zu blocks of %u tokens (%u bytes each) written and read back\n", blocks.size(),
                g.tokens_per_block, g.block_bytes);
    if (hold_s > 0) {
      std::printf("demo: holding the model and the session for %d s (they are released when this process exits)\n", hold_s);
      std::fflush(stdout);
      ::sleep(static_cast<unsigned>(hold_s));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "demo: %s\n", e.what());
    return 1;
  }
  return 0;
}
