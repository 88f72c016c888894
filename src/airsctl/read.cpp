// SPDX-License-Identifier: Apache-2.0
// airsctl read MODEL.gguf TENSOR: the tensor's bytes, read through a lazily
// attached mapping of the pool (exactly what an inference process sees), to
// stdout — for integrity checks (`| sha256sum`). With --json: instead of the
// bytes, one document with the tensor's offset, size and the XXH64 of the
// bytes read through the pool.
#include <unistd.h>

#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "airs/airs.h"
#include "airsctl/subcommands.hpp"
#include "gguf/file_io.hpp"
#include "gguf/gguf.hpp"

namespace airs::cli {

void add_read(CLI::App& app, Globals& g) {
  struct Args {
    std::string path, tensor;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("read", "Write a tensor's bytes, read through the pool, to stdout");
  cmd->add_option("model", a->path, "GGUF model file (loaded into the pool if it is not yet)")->required();
  cmd->add_option("tensor", a->tensor, "Tensor name, e.g. blk.0.attn_q.weight")->required();
  cmd->callback([&g, a] {
    auto src = gguf::FdSource::open(a->path);
    if (!src) {
      std::fprintf(stderr, "airsctl: %s\n", src.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    auto f = gguf::parse(*src);
    if (!f) {
      std::fprintf(stderr, "airsctl: %s\n", f.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    auto idx = f->find_tensor(a->tensor);
    if (!idx) {
      std::fprintf(stderr, "airsctl: %s has no tensor '%s'\n", a->path.c_str(), a->tensor.c_str());
      throw CLI::RuntimeError(kExitNotFound);
    }
    const auto& t = f->tensors[*idx];
    airs_client* c = nullptr;
    airs_model* m = nullptr;
    if (airs_connect(g.bus.c_str(), &c) < 0 || airs_model_open(c, a->path.c_str(), nullptr, &m) < 0) {
      std::fprintf(stderr, "airsctl: %s\n", airs_last_error());
      airs_disconnect(c);
      throw CLI::RuntimeError(1);
    }
    // Copy out in user space first: writing straight from the mapping would
    // make the kernel touch the pages (fine when registered, but a copy also
    // keeps write(2) short-count handling simple).
    const auto* base = static_cast<const unsigned char*>(airs_model_data(m)) + t.offset;
    std::vector<unsigned char> buf(1 << 20);
    int rc = 0;
    XXH64_state_t* hash = g.json ? XXH64_createState() : nullptr;
    if (hash) XXH64_reset(hash, 0);
    for (uint64_t off = 0; off < t.nbytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), t.nbytes - off));
      std::memcpy(buf.data(), base + off, n);
      if (hash) {
        XXH64_update(hash, buf.data(), n);
        off += n;
        continue;
      }
      for (size_t w = 0; w < n;) {
        ssize_t r = ::write(STDOUT_FILENO, buf.data() + w, n - w);
        if (r < 0) {
          if (errno == EINTR) continue;
          std::fprintf(stderr, "airsctl: write: %s\n", std::strerror(errno));
          rc = 1;
          break;
        }
        w += static_cast<size_t>(r);
      }
      if (rc) break;
      off += n;
    }
    if (hash) {
      nlohmann::json j{{"schema", kJsonSchema},     {"model", a->path},    {"tensor", a->tensor},
                       {"offset", t.offset},        {"nbytes", t.nbytes},
                       {"xxh64", fmt::format("{:016x}", XXH64_digest(hash))}};
      XXH64_freeState(hash);
      std::puts(j.dump().c_str());
    }
    airs_model_close(m);
    airs_disconnect(c);
    if (rc) throw CLI::RuntimeError(rc);
  });
}

}  // namespace airs::cli
