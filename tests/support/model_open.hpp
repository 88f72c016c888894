// SPDX-License-Identifier: Apache-2.0
// Model.Open over the bus as a test client calls it: for the fds and the
// reference, not the pages.
#pragma once

#include <fcntl.h>

#include <cstdint>
#include <map>
#include <string>

#include <sdbus-c++/sdbus-c++.h>

namespace airs::test {

// What Model.Open replies; the fds stay open while it lives.
struct OpenReply {
  sdbus::UnixFd region;
  sdbus::UnixFd status;
  uint64_t size = 0;
  std::map<std::string, sdbus::Variant> info;
};

// Model.Open on `model` (a model's object) with `gguf_path` opened as the
// proof fd and wait=false: it replies at once, resident or not. Throws
// sdbus::Error when the daemon refuses.
inline OpenReply open_without_wait(sdbus::IProxy& model, const std::string& gguf_path) {
  OpenReply r;
  sdbus::UnixFd proof(::open(gguf_path.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd);
  model.callMethod("Open").onInterface("org.aios.Airs1.Model")
      .withArguments(proof, std::map<std::string, sdbus::Variant>{{"wait", sdbus::Variant(false)}})
      .storeResultsTo(r.region, r.size, r.status, r.info);
  return r;
}

}  // namespace airs::test
