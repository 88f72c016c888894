// SPDX-License-Identifier: Apache-2.0
// airs_test_kv_client: a KV client process for the KV integration suite.
// Lines "word key=value ..." on stdout, commands on stdin.
//
//   share --bus ADDR --file MODEL --hashes H1,H2,.. --seed S
//       libairs: open the model, an interactive session, MatchPrefix(hashes);
//       check every matched block holds kv_pattern(S, index).
//   hold --bus ADDR --file MODEL --sessions N --blocks M
//       libairs: N sessions with M blocks each, written; "ready", then waits.
//   intruder --bus ADDR --as-uid UID [--file MODEL] --model OBJ --victim SESSION --seed S --blocks N
//       drops to UID before connecting; calls every Session method on the
//       victim (prints the D-Bus error of each), then makes its own session
//       on the model, reports its arena file and whether any of its N new
//       blocks shows the victim's bytes, writes its own, "holding", waits.
//   fill --bus ADDR --as-uid UID [--file MODEL] --model OBJ --priority P --blocks N
//       drops to UID; one session of priority P with N blocks; "ready
//       session=PATH", waits for a stdin line, then reports how many blocks
//       its notice page lists ("notices n=").
//   match --bus ADDR --as-uid UID [--file MODEL] --model OBJ --hashes H1,H2,..
//       drops to UID; one interactive session on the model over D-Bus;
//       MatchPrefix(hashes); "matched n=".
// With --as-uid, --file is opened before the uid is dropped and passed to
// LoadModel once connected: the proof of read access a session needs
// (SECURITY.md rule 5). Without it, CreateSession is refused.
// share also reports how many of the matched blocks the daemon restored
// from its spill tier ("matched ... restored=").
#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <sdbus-c++/sdbus-c++.h>

#include "airs/airs.h"
#include "dbus/variant.hpp"
#include "kv_pattern.hpp"

using airs::test::kv_check;
using airs::test::kv_fill;

namespace {

void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

bool wait_stdin_line() {
  char buf[256];
  return std::fgets(buf, sizeof buf, stdin) != nullptr;
}

std::vector<uint64_t> parse_list(const std::string& s) {
  std::vector<uint64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoull(item, nullptr, 0));
  return v;
}

struct Args {
  std::string cmd, bus, file, hashes, model, victim, priority = "background";
  uint64_t seed = 1;
  uint32_t sessions = 1, blocks = 1;
  long uid = -1;
};

int share(const Args& a) {
  airs_client* c = nullptr;
  if (airs_connect(a.bus.c_str(), &c) != 0) return 12;
  airs_model* m = nullptr;
  if (airs_model_open(c, a.file.c_str(), nullptr, &m) != 0) {
    std::fprintf(stderr, "model: %s\n", airs_last_error());
    return 13;
  }
  airs_session* s = nullptr;
  if (airs_session_create(c, m, AIRS_PRIORITY_INTERACTIVE, &s) != 0) {
    std::fprintf(stderr, "session: %s\n", airs_last_error());
    return 14;
  }
  airs_kv_geometry g{};
  airs_session_geometry(s, &g);
  const auto hashes = parse_list(a.hashes);
  std::vector<uint32_t> blocks(hashes.size());
  const int n = airs_session_match_prefix(s, hashes.data(), hashes.size(), blocks.data());
  if (n < 0) {
    say("match-failed rc=%d", n);
    return 15;
  }
  std::string ids;
  for (int i = 0; i < n; ++i) ids += (i ? "," : "") + std::to_string(blocks[static_cast<size_t>(i)]);
  say("matched n=%d blocks=%s restored=%" PRIu64, n, ids.c_str(), airs_session_restored_blocks(s));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const void* p = airs_session_block_ptr(s, blocks[static_cast<size_t>(i)]);
    const uint64_t at = kv_check(p, g.block_bytes, a.seed, static_cast<uint32_t>(i));
    if (at != g.block_bytes) {
      say("mismatch index=%d block=%u byte=%" PRIu64, i, blocks[static_cast<size_t>(i)], at);
      ++bad;
    }
  }
  say("checked bad=%d", bad);
  airs_session_close(s);
  airs_model_close(m);
  airs_disconnect(c);
  return bad == 0 ? 0 : 3;
}

int hold(const Args& a) {
  airs_client* c = nullptr;
  if (airs_connect(a.bus.c_str(), &c) != 0) return 12;
  airs_model* m = nullptr;
  if (airs_model_open(c, a.file.c_str(), nullptr, &m) != 0) {
    std::fprintf(stderr, "model: %s\n", airs_last_error());
    return 13;
  }
  std::vector<airs_session*> ss;
  for (uint32_t i = 0; i < a.sessions; ++i) {
    airs_session* s = nullptr;
    if (airs_session_create(c, m, AIRS_PRIORITY_BACKGROUND, &s) != 0) {
      std::fprintf(stderr, "session: %s\n", airs_last_error());
      return 14;
    }
    airs_kv_geometry g{};
    airs_session_geometry(s, &g);
    std::vector<uint32_t> blocks(a.blocks);
    if (airs_session_allocate(s, a.blocks, blocks.data()) != 0) {
      std::fprintf(stderr, "allocate: %s\n", airs_last_error());
      return 15;
    }
    for (uint32_t b = 0; b < a.blocks; ++b) kv_fill(airs_session_block_ptr(s, blocks[b]), g.block_bytes, a.seed + i, b);
    (void)airs_session_set_length(s, a.blocks * g.tokens_per_block);
    ss.push_back(s);
  }
  say("ready sessions=%u blocks=%u", a.sessions, a.blocks);
  (void)wait_stdin_line();
  for (auto* s : ss) airs_session_close(s);
  airs_model_close(m);
  airs_disconnect(c);
  say("closed");
  return 0;
}

int proof_fd = -1;  // --file, opened before drop_to

// Before any connection: the bus authenticates this process as `uid` (< 0: stay).
bool drop_to(long uid) {
  if (uid < 0) return true;
  const auto id = static_cast<uid_t>(uid);
  if (::setgroups(0, nullptr) != 0 || ::setgid(static_cast<gid_t>(id)) != 0 || ::setuid(id) != 0) {
    std::perror("dropping privileges");
    return false;
  }
  return true;
}

// LoadModel with the --file fd, if any, on `bus`: the daemon records this
// uid as one that can read the model's file.
void prove(sdbus::IConnection& bus) {
  if (proof_fd < 0) return;
  auto mgr = sdbus::createProxy(bus, "org.aios.Airs1", "/org/aios/Airs1");
  sdbus::ObjectPath obj;
  mgr->callMethod("LoadModel")
      .onInterface("org.aios.Airs1.Manager")
      .withArguments(sdbus::UnixFd(proof_fd), airs::dbus::Dict{})
      .storeResultsTo(obj);
  say("proved model=%s", std::string(obj).c_str());
}

int intruder(const Args& a) {
  if (!drop_to(a.uid)) return 16;
  say("uid now=%u", ::getuid());
  auto bus = sdbus::createSessionBusConnectionWithAddress(a.bus);
  prove(*bus);
  auto victim = sdbus::createProxy(*bus, "org.aios.Airs1", a.victim);
  auto attempt = [&](const char* method, auto&& call) {
    try {
      call();
      say("victim method=%s error=none", method);
    } catch (const sdbus::Error& e) {
      say("victim method=%s error=%s", method, e.getName().c_str());
      std::fprintf(stderr, "%s: %s\n", method, e.getMessage().c_str());
    }
  };
  const char* kS = "org.aios.Airs1.Session";
  attempt("Allocate", [&] {
    std::vector<uint32_t> b;
    victim->callMethod("Allocate").onInterface(kS).withArguments(uint32_t{1}).storeResultsTo(b);
  });
  attempt("AllocateAt", [&] {
    uint32_t b = 0;
    victim->callMethod("AllocateAt").onInterface(kS).withArguments(uint32_t{0}).storeResultsTo(b);
  });
  attempt("Free", [&] { victim->callMethod("Free").onInterface(kS).withArguments(std::vector<uint32_t>{0}); });
  attempt("Commit", [&] {
    victim->callMethod("Commit").onInterface(kS).withArguments(std::vector<uint32_t>{0}, std::vector<uint64_t>{1});
  });
  attempt("MatchPrefix", [&] {
    std::vector<uint32_t> b;
    victim->callMethod("MatchPrefix").onInterface(kS).withArguments(std::vector<uint64_t>{1}).storeResultsTo(b);
  });
  attempt("PrepareWrite", [&] {
    uint32_t w = 0;
    victim->callMethod("PrepareWrite").onInterface(kS).withArguments(uint32_t{0}).storeResultsTo(w);
  });
  attempt("SetLength", [&] { victim->callMethod("SetLength").onInterface(kS).withArguments(uint32_t{1}); });
  attempt("Close", [&] { victim->callMethod("Close").onInterface(kS); });

  // Its own session on the same model: a different arena.
  auto mgr = sdbus::createProxy(*bus, "org.aios.Airs1", "/org/aios/Airs1");
  sdbus::ObjectPath path;
  sdbus::UnixFd arena, notice, event;
  airs::dbus::Dict geo;
  try {
    mgr->callMethod("CreateSession")
        .onInterface("org.aios.Airs1.Manager")
        .withArguments(sdbus::ObjectPath(a.model), std::string("interactive"), airs::dbus::Dict{})
        .storeResultsTo(path, arena, notice, event, geo);
  } catch (const sdbus::Error& e) {
    say("create-failed error=%s", e.getName().c_str());
    std::fprintf(stderr, "CreateSession: %s\n", e.getMessage().c_str());
    return 17;
  }
  struct stat st {};
  ::fstat(arena.get(), &st);
  say("arena dev=%" PRIu64 " ino=%" PRIu64 " session=%s", static_cast<uint64_t>(st.st_dev),
      static_cast<uint64_t>(st.st_ino), std::string(path).c_str());
  const uint64_t arena_bytes = airs::dbus::get<uint64_t>(geo, "arena_bytes").value_or(0);
  const uint64_t chunk = airs::dbus::get<uint64_t>(geo, "chunk_bytes").value_or(0);
  const uint32_t per_chunk = airs::dbus::get<uint32_t>(geo, "blocks_per_chunk").value_or(1);
  const uint32_t block_bytes = airs::dbus::get<uint32_t>(geo, "block_bytes").value_or(0);
  void* map = ::mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, arena.get(), 0);
  if (map == MAP_FAILED) {
    std::perror("mmap arena");
    return 18;
  }
  auto own = sdbus::createProxy(*bus, "org.aios.Airs1", path);
  std::vector<uint32_t> blocks;
  own->callMethod("Allocate").onInterface(kS).withArguments(a.blocks).storeResultsTo(blocks);
  uint32_t foreign = 0, nonzero = 0;
  for (uint32_t b : blocks) {
    auto* p = static_cast<uint8_t*>(map) + (b / per_chunk) * chunk + (b % per_chunk) * uint64_t{block_bytes};
    for (uint32_t i = 0; i < a.blocks; ++i)
      if (kv_check(p, block_bytes, a.seed, i) == block_bytes) ++foreign;
    for (uint64_t j = 0; j < block_bytes; ++j)
      if (p[j] != 0) {
        ++nonzero;
        break;
      }
  }
  std::string ids;
  for (size_t i = 0; i < blocks.size(); ++i) ids += (i ? "," : "") + std::to_string(blocks[i]);
  say("blocks n=%zu ids=%s foreign=%u nonzero=%u", blocks.size(), ids.c_str(), foreign, nonzero);
  // Our own bytes, with a seed the victim does not use.
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto* p = static_cast<uint8_t*>(map) + (blocks[i] / per_chunk) * chunk + (blocks[i] % per_chunk) * uint64_t{block_bytes};
    kv_fill(p, block_bytes, a.seed + 1000, static_cast<uint32_t>(i));
  }
  say("holding");
  (void)wait_stdin_line();
  own->callMethod("Close").onInterface(kS);
  ::munmap(map, arena_bytes);
  say("closed");
  return 0;
}

// A session of `priority` on the model over D-Bus; its notice page fd in `notice`.
std::unique_ptr<sdbus::IProxy> bus_session(sdbus::IConnection& bus, const std::string& model, const std::string& priority,
                                           sdbus::ObjectPath& path, sdbus::UnixFd& notice) {
  auto mgr = sdbus::createProxy(bus, "org.aios.Airs1", "/org/aios/Airs1");
  sdbus::UnixFd arena, event;
  airs::dbus::Dict geo;
  mgr->callMethod("CreateSession")
      .onInterface("org.aios.Airs1.Manager")
      .withArguments(sdbus::ObjectPath(model), priority, airs::dbus::Dict{})
      .storeResultsTo(path, arena, notice, event, geo);
  return sdbus::createProxy(bus, "org.aios.Airs1", path);
}

int match(const Args& a) {
  if (!drop_to(a.uid)) return 16;
  auto bus = sdbus::createSessionBusConnectionWithAddress(a.bus);
  prove(*bus);
  sdbus::ObjectPath path;
  sdbus::UnixFd notice;
  auto own = bus_session(*bus, a.model, "interactive", path, notice);
  std::vector<uint32_t> blocks;
  own->callMethod("MatchPrefix").onInterface("org.aios.Airs1.Session").withArguments(parse_list(a.hashes)).storeResultsTo(blocks);
  say("matched n=%zu", blocks.size());
  own->callMethod("Close").onInterface("org.aios.Airs1.Session");
  return 0;
}

int fill(const Args& a) {
  if (!drop_to(a.uid)) return 16;
  auto bus = sdbus::createSessionBusConnectionWithAddress(a.bus);
  prove(*bus);
  sdbus::ObjectPath path;
  sdbus::UnixFd notice;
  auto own = bus_session(*bus, a.model, a.priority, path, notice);
  std::vector<uint32_t> blocks;
  own->callMethod("Allocate").onInterface("org.aios.Airs1.Session").withArguments(a.blocks).storeResultsTo(blocks);
  say("ready session=%s blocks=%zu", std::string(path).c_str(), blocks.size());
  (void)wait_stdin_line();
  struct stat st {};
  ::fstat(notice.get(), &st);
  void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, notice.get(), 0);
  uint64_t head = 0;
  if (p != MAP_FAILED) head = __atomic_load_n(reinterpret_cast<const uint64_t*>(static_cast<const char*>(p) + 16), __ATOMIC_ACQUIRE);
  say("notices n=%" PRIu64, head);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 10;
  Args a;
  a.cmd = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", k.c_str());
      return 10;
    }
    std::string v = argv[++i];
    if (k == "--bus") a.bus = v;
    else if (k == "--file") a.file = v;
    else if (k == "--hashes") a.hashes = v;
    else if (k == "--model") a.model = v;
    else if (k == "--victim") a.victim = v;
    else if (k == "--seed") a.seed = std::stoull(v);
    else if (k == "--sessions") a.sessions = static_cast<uint32_t>(std::stoul(v));
    else if (k == "--blocks") a.blocks = static_cast<uint32_t>(std::stoul(v));
    else if (k == "--as-uid") a.uid = std::stol(v);
    else if (k == "--priority") a.priority = v;
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 10;
    }
  }
  ::alarm(60);
  if (a.uid >= 0 && !a.file.empty() && (proof_fd = ::open(a.file.c_str(), O_RDONLY | O_CLOEXEC)) < 0) {
    std::perror(a.file.c_str());
    return 10;
  }
  try {
    if (a.cmd == "share") return share(a);
    if (a.cmd == "hold") return hold(a);
    if (a.cmd == "intruder") return intruder(a);
    if (a.cmd == "fill") return fill(a);
    if (a.cmd == "match") return match(a);
  } catch (const sdbus::Error& e) {
    std::fprintf(stderr, "D-Bus: %s: %s\n", e.getName().c_str(), e.getMessage().c_str());
    return 19;
  }
  std::fprintf(stderr, "unknown command %s\n", a.cmd.c_str());
  return 10;
}
