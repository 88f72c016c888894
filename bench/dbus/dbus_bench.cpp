// SPDX-License-Identifier: Apache-2.0
// dbus_bench [N]: p50/p90 of Session.Allocate(1) and Session.Free over the
// bus, next to an empty method call to the same daemon (Peer.Ping) in the
// same run, on a private dbus-daemon with a real airs-memd.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include <sdbus-c++/sdbus-c++.h>

#include "airs/airs.h"
#include "daemon_fixture.hpp"
#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"

namespace {
using Clock = std::chrono::steady_clock;
double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}
}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 5000;
  airs::gguf::ModelSpec spec;
  spec.n_layers = 4;
  auto plan = airs::gguf::plan_model(spec);
  const std::string path = (std::filesystem::temp_directory_path() / "airs-dbus-bench.gguf").string();
  if (!plan || !airs::gguf::write_model_file(*plan, path)) {
    std::fprintf(stderr, "cannot write the model\n");
    return 1;
  }
  airs::test::PrivateBus bus;
  airs::test::DaemonProcess d(bus.address(), "[pool]\nsize = \"256M\"\n[daemon]\nlog_level = \"warning\"\n");
  if (!d.started()) {
    std::fprintf(stderr, "daemon did not start:\n%s\n", d.log().c_str());
    return 1;
  }
  airs_client* c = nullptr;
  airs_model* m = nullptr;
  airs_session* s = nullptr;
  if (airs_connect(bus.address().c_str(), &c) < 0 || airs_model_open(c, path.c_str(), nullptr, &m) < 0 ||
      airs_session_create(c, m, AIRS_PRIORITY_INTERACTIVE, &s) < 0) {
    std::fprintf(stderr, "client: %s\n", airs_last_error());
    return 1;
  }
  auto conn = sdbus::createSessionBusConnectionWithAddress(bus.address());
  auto proxy = sdbus::createProxy(*conn, "org.aios.Airs1", "/org/aios/Airs1");
  std::vector<double> ping, alloc, freev;
  for (int i = 0; i < n + n / 10; ++i) {
    auto t0 = Clock::now();
    proxy->callMethod("Ping").onInterface("org.freedesktop.DBus.Peer");
    auto t1 = Clock::now();
    uint32_t b = 0;
    if (airs_session_allocate(s, 1, &b) < 0) {
      std::fprintf(stderr, "allocate: %s\n", airs_last_error());
      return 1;
    }
    auto t2 = Clock::now();
    if (airs_session_free(s, &b, 1) < 0) {
      std::fprintf(stderr, "free: %s\n", airs_last_error());
      return 1;
    }
    auto t3 = Clock::now();
    if (i < n / 10) continue;  // warm-up
    ping.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    alloc.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    freev.push_back(std::chrono::duration<double, std::micro>(t3 - t2).count());
  }
  const double p = pct(ping, 0.5);
  std::printf("D-Bus round trips to airs-memd, %d calls each, interleaved (µs)\n", n);
  std::printf("%-28s %8s %8s %8s\n", "call", "p50", "p90", "p50/ping");
  std::printf("%-28s %8.1f %8.1f %8.2f\n", "Peer.Ping (empty)", p, pct(ping, 0.9), 1.0);
  std::printf("%-28s %8.1f %8.1f %8.2f\n", "Session.Allocate(1)", pct(alloc, 0.5), pct(alloc, 0.9), pct(alloc, 0.5) / p);
  std::printf("%-28s %8.1f %8.1f %8.2f\n", "Session.Free(1)", pct(freev, 0.5), pct(freev, 0.9), pct(freev, 0.5) / p);
  airs_session_close(s);
  airs_model_close(m);
  airs_disconnect(c);
  std::filesystem::remove(path);
  return 0;
}
