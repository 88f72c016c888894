// SPDX-License-Identifier: Apache-2.0
// airs-gguf-dump [--json] FILE: `airsctl inspect` without the daemon's CLI,
// for tests (the npm agreement test) and debugging. Not installed.
#include <cstdio>
#include <cstring>
#include <string>

#include "airsctl/inspect.hpp"

int main(int argc, char** argv) {
  bool json = false;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (path.empty()) {
      path = argv[i];
    } else {
      path.clear();
      break;
    }
  }
  if (path.empty()) {
    std::fprintf(stderr, "usage: airs-gguf-dump [--json] FILE.gguf\n");
    return 2;
  }
  return airs::cli::run_inspect(path, json, stdout, stderr);
}
