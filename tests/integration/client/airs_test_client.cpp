// SPDX-License-Identifier: Apache-2.0
// airs_test_client: a real inference-like client process for the client
// integration suite. It opens a model through libairs (lazily, exactly as a
// user would) and checks the BYTES it reads against the GGUF file itself,
// tensor by tensor. It talks to the test over stdin/stdout in lines of
// "word key=value ..." so the test can stop it at a chosen point.
//
//   airs_test_client --bus ADDR --file MODEL.gguf [options]
//     --order seq|random:SEED|none   tensors to verify, in load order or shuffled
//     --wait-go          after opening, print "waiting" and wait for a stdin line
//     --fork-child       fork; the child touches the mapping (must get SIGSEGV)
//     --touch OFFSET     read the byte at OFFSET (SIGBUS → "sigbus", exit 7)
//     --wait-resident MS wait until the model is resident before verifying
//     --wait-layer RANK  airs_model_wait_layer(RANK) before verifying, with
//                        a minute's timeout ("layer rc=")
//     --hold             after verifying print "holding", wait for a stdin line
//     --recheck          after --hold's line, read every tensor again (a
//                        revoked mapping must give SIGBUS → exit 7, never zeros)
//     --uid N            drop to uid/gid N before anything (another user)
//     --mlockall         mlockall(MCL_CURRENT | MCL_FUTURE) before opening
//                        (the trap: locking fills a lazy mapping with zeros)
//     --on-touch         cooperative mode: airs_model_options.wait_on_touch
//                        (no waits of our own; touches wait in libairs)
//     --own-segv before|after  install a "runtime" SIGSEGV handler before or
//                        after opening (after: it chains to the previous one
//                        for faults not its own, as airs.h asks); at the end
//                        touch a PROT_NONE page of our own, which that
//                        handler must get ("own-segv handled=1 foreign=0")
//     --fork-child with --on-touch: the child reads the first and last bytes
//                        and compares them with the file ("child-read-ok")
//     --passes N         verify N times (a fresh random order each pass for
//                        random:SEED), as a runtime reads a model per token
//                        (a streamed model's units go and come back)
//     --pause P          half-way through pass P print "mid pass=P" and wait
//                        for a stdin line (the test acts mid-token); with
//                        --passes > 1 or --pause, SIGBUS ends it with
//                        "sigbus", exit 7
//     --sigbus-ok        SIGBUS during any verification ends the process with
//                        "sigbus" and exit 7 (a forced unload revokes the
//                        mapping: SIGBUS is then a right answer, zeros never)
//     --deadline S       the alarm that turns a hang into SIGALRM (default 90)
//
// The bytes are checked against the very file that was opened: the model is
// opened through libairs with the fd this process reads the file from, so a
// file replaced on disk meanwhile is judged by the version this client has.
//
// Exit codes: 0 bytes right; 3 wrong bytes; 4 the forked child read
// something; 7 SIGBUS on --touch; 10+ set-up errors (message on stderr).
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "airs/airs.h"
#include "gguf/file_io.hpp"
#include "gguf/gguf.hpp"
#include "support/same_bytes.hpp"

// This client ends from its SIGBUS handler (_exit(7)) while libairs's watcher
// thread, done once the model was resident, is not joined yet: TSan would
// call that a leaked thread and change the exit code the test checks. A
// hook only the TSan runtime reads; harmless in other builds.
extern "C" const char* __tsan_default_options() { return "report_thread_leaks=0"; }

namespace {

int count_uffd_fds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char link[256] = {};
    const std::string p = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t len = ::readlink(p.c_str(), link, sizeof link - 1);
    if (len > 0 && std::strcmp(link, "anon_inode:[userfaultfd]") == 0) ++n;
  }
  ::closedir(d);
  return n;
}

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

void write_str(const char* s) { (void)!::write(1, s, std::strlen(s)); }

void on_sigbus(int, siginfo_t* si, void*) {
  char msg[96];
  // snprintf is not async-signal-safe in theory; the process exits right after.
  const int n = std::snprintf(msg, sizeof msg, "sigbus addr=%p code=%d\n", si->si_addr, si->si_code);
  if (n > 0) (void)!::write(1, msg, static_cast<size_t>(n));
  ::_exit(7);
}

void child_on_segv(int, siginfo_t*, void*) {
  write_str("child-segv\n");
  ::_exit(9);
}

// The "runtime" handler of --own-segv: it owns one PROT_NONE page and makes
// it readable on a fault there; any other fault it is given is counted as
// foreign (the model's touches must never reach it) and passed on.
volatile uintptr_t g_own_page = 0;
size_t g_own_len = 0;
volatile sig_atomic_t g_own_handled = 0;
volatile sig_atomic_t g_own_foreign = 0;
struct sigaction g_own_prev {};
bool g_own_chains = false;

void own_on_segv(int sig, siginfo_t* si, void* uc) {
  const auto a = reinterpret_cast<uintptr_t>(si->si_addr);
  if (a >= g_own_page && a < g_own_page + g_own_len) {
    ::mprotect(reinterpret_cast<void*>(g_own_page), g_own_len, PROT_READ);
    g_own_handled = g_own_handled + 1;
    return;
  }
  g_own_foreign = g_own_foreign + 1;
  if (g_own_chains && (g_own_prev.sa_flags & SA_SIGINFO) != 0 && g_own_prev.sa_sigaction != nullptr) {
    g_own_prev.sa_sigaction(sig, si, uc);
    return;
  }
  write_str("own-segv foreign fault, no one to chain to\n");
  ::_exit(5);
}

void install_own_segv(bool chains) {
  g_own_len = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* p = ::mmap(nullptr, g_own_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  g_own_page = reinterpret_cast<uintptr_t>(p);
  g_own_chains = chains;
  struct sigaction sa {};
  sa.sa_sigaction = own_on_segv;
  sa.sa_flags = SA_SIGINFO;
  ::sigaction(SIGSEGV, &sa, &g_own_prev);
}

struct Range {
  std::string name;
  uint64_t offset;
  uint64_t nbytes;
};

// The command line: the options in the comment at the top.
struct Options {
  std::string bus, file, order = "seq";
  bool wait_go = false, fork_child = false, hold = false, per_layer = false, recheck = false, on_touch = false;
  std::string own_segv;
  long as_uid = -1;
  bool mlock_all = false;
  long long touch = -1;
  int wait_resident_ms = -1;
  int wait_layer = -1;
  int passes = 1;
  int pause_pass = 0;
  bool sigbus_ok = false;
  unsigned deadline_s = 90;
};

// 0, or the exit code once the reason is printed.
int parse_args(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(10);
      }
      return argv[++i];
    };
    if (a == "--bus") o.bus = next();
    else if (a == "--file") o.file = next();
    else if (a == "--order") o.order = next();
    else if (a == "--wait-go") o.wait_go = true;
    else if (a == "--fork-child") o.fork_child = true;
    else if (a == "--hold") o.hold = true;
    else if (a == "--recheck") o.recheck = true;
    else if (a == "--uid") o.as_uid = std::stol(next());
    else if (a == "--mlockall") o.mlock_all = true;
    else if (a == "--per-layer") o.per_layer = true;  // cooperative mode: wait for each range before reading it
    else if (a == "--touch") o.touch = std::stoll(next());
    else if (a == "--on-touch") o.on_touch = true;
    else if (a == "--own-segv") o.own_segv = next();
    else if (a == "--wait-resident") o.wait_resident_ms = std::stoi(next());
    else if (a == "--wait-layer") o.wait_layer = std::stoi(next());
    else if (a == "--passes") o.passes = std::max(1, std::stoi(next()));
    else if (a == "--pause") o.pause_pass = std::stoi(next());
    else if (a == "--sigbus-ok") o.sigbus_ok = true;
    else if (a == "--deadline") o.deadline_s = static_cast<unsigned>(std::stoul(next()));
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 10;
    }
  }
  if (o.bus.empty() || o.file.empty()) {
    std::fprintf(stderr, "usage: airs_test_client --bus ADDR --file MODEL.gguf [options]\n");
    return 10;
  }
  return 0;
}

// From here on SIGBUS ends the process with "sigbus", exit 7.
void exit_on_sigbus() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  ::sigaction(SIGBUS, &sa, nullptr);
}

// The header, then every tensor in load order: 0, or the exit code.
int read_ranges(const airs::gguf::FdSource& src, const std::string& file, std::vector<Range>* ranges) {
  auto parsed = airs::gguf::parse(src);
  if (!parsed) {
    std::fprintf(stderr, "parse %s: %s\n", file.c_str(), parsed.error().message.c_str());
    return 11;
  }
  ranges->push_back({"<header>", 0, parsed->data_offset});
  for (uint32_t idx : parsed->load_order) {
    const auto& t = parsed->tensors[idx];
    ranges->push_back({t.name, t.offset, t.nbytes});
  }
  return 0;
}

// The model opened through libairs, and what its bytes are checked against.
struct Client {
  const Options& o;
  const airs::gguf::FdSource& src;
  std::vector<Range> ranges;
  airs_client* client = nullptr;
  airs_model* model = nullptr;
  const volatile unsigned char* data = nullptr;
};

// Connects and opens the model (mlockall and the first own SIGSEGV handler
// before, as asked): 0, or the exit code.
int open_model(Client& c) {
  const Options& o = c.o;
  if (airs_connect(o.bus.c_str(), &c.client) != 0) {
    std::fprintf(stderr, "airs_connect: %s\n", airs_last_error());
    return 12;
  }
  if (o.mlock_all && ::mlockall(MCL_CURRENT | MCL_FUTURE) != 0) {
    std::fprintf(stderr, "mlockall: %s\n", std::strerror(errno));
    return 18;
  }
  if (o.own_segv == "before") install_own_segv(false);
  airs_model_options opt{nullptr, 0, o.per_layer ? 1 : 0, o.on_touch ? 1 : 0};
  if (o.sigbus_ok) exit_on_sigbus();
  // The fd the bytes are checked against, not the path again: a file
  // renamed over this one in between would be another version.
  if (int rc = airs_model_open_fd(c.client, c.src.fd(), &opt, &c.model); rc != 0) {
    say("open-failed rc=%d", rc);
    std::fprintf(stderr, "airs_model_open: %s\n", airs_last_error());
    airs_disconnect(c.client);
    return 13;
  }
  c.data = static_cast<const volatile unsigned char*>(airs_model_data(c.model));
  say("opened pid=%d resident=%d size=%" PRIu64 " object=%s uffd_fds=%d", ::getpid(), airs_model_is_resident(c.model),
      airs_model_size(c.model), airs_model_object(c.model), count_uffd_fds());
  return 0;
}

// --fork-child: the child must get SIGSEGV (or, with --on-touch, read the
// right bytes); 0 if it did, else 4.
int check_forked_child(const Client& c) {
  const pid_t child = ::fork();
  if (child == 0 && c.o.on_touch) {
    // The child inherits the guarded mapping and its handler: its touches
    // wait for their units like the parent's.
    const uint64_t last = airs_model_size(c.model) - 1;
    unsigned char want[2] = {};
    if (::pread(c.src.fd(), &want[0], 1, 0) != 1 || ::pread(c.src.fd(), &want[1], 1, static_cast<off_t>(last)) != 1)
      ::_exit(15);
    const bool ok = c.data[0] == want[0] && c.data[last] == want[1];
    write_str(ok ? "child-read-ok\n" : "child-read-wrong\n");
    ::_exit(ok ? 9 : 3);
  }
  if (child == 0) {
    struct sigaction sa {};
    sa.sa_sigaction = child_on_segv;
    sa.sa_flags = SA_SIGINFO;
    ::sigaction(SIGSEGV, &sa, nullptr);
    // MADV_DONTFORK: the child must not have the mapping at all. Touch the
    // last page (not yet loaded while the fill is slow) and the first.
    const uint64_t off = airs_model_size(c.model) - 1;
    const unsigned v = c.data[off];
    const unsigned w = c.data[0];
    char msg[80];
    const int n = std::snprintf(msg, sizeof msg, "child-read value=%u first=%u\n", v, w);
    if (n > 0) (void)!::write(1, msg, static_cast<size_t>(n));
    ::_exit(4);
  }
  int st = 0;
  ::waitpid(child, &st, 0);
  say("child exit=%d signal=%d", WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 9) return 4;
  return 0;
}

// Range `r` of the mapping against the file; 0, or the exit code.
int verify_range(const Client& c, const Range& r, std::vector<unsigned char>& want) {
  want.resize(r.nbytes);
  if (auto s = c.src.read(r.offset, want.data(), want.size()); !s) {
    std::fprintf(stderr, "pread %s: %s\n", r.name.c_str(), s.error().message.c_str());
    return 15;
  }
  if (c.o.per_layer) {
    if (int rc = airs_model_wait_range(c.model, r.offset, r.nbytes, 60000); rc != 0) {
      say("wait-failed tensor=%s rc=%d", r.name.c_str(), rc);
      std::fprintf(stderr, "airs_model_wait_range: %s\n", airs_last_error());
      return 16;
    }
  }
  const auto* got = const_cast<const unsigned char*>(c.data) + r.offset;
  if (!airs::test::same_bytes(got, want.data(), r.nbytes)) {
    uint64_t first = 0;
    while (first < r.nbytes && got[first] == want[first]) ++first;
    uint64_t zeros = 0;
    for (uint64_t k = 0; k < r.nbytes; ++k) zeros += got[k] == 0 ? 1 : 0;
    say("mismatch tensor=%s offset=%" PRIu64 " first_diff=%" PRIu64 " got=%u want=%u zero_bytes=%" PRIu64
        " of=%" PRIu64,
        r.name.c_str(), r.offset, r.offset + first, got[first], want[first], zeros, r.nbytes);
    return 3;
  }
  return 0;
}

// Every range in c.ranges' order (pass `pass`: --pause stops half-way
// through it); 0, or the exit code.
int verify(const Client& c, int pass = 0) {
  say("verifying ranges=%zu", c.ranges.size());
  std::vector<unsigned char> want;
  uint64_t bytes = 0;
  for (size_t i = 0; i < c.ranges.size(); ++i) {
    if (pass != 0 && pass == c.o.pause_pass && i == c.ranges.size() / 2) {
      say("mid pass=%d", pass);
      if (!wait_stdin_line()) return 14;
    }
    if (int rc = verify_range(c, c.ranges[i], want); rc != 0) return rc;
    bytes += c.ranges[i].nbytes;
  }
  say("verified tensors=%zu bytes=%" PRIu64 " fallback=%d", c.ranges.size() - 1, bytes,
      airs_model_in_fallback(c.model));
  return 0;
}

// --order and --passes: every pass in load order or a fresh shuffle.
int verify_passes(Client& c) {
  const Options& o = c.o;
  if (o.order == "none") return 0;
  std::mt19937_64 rng(o.order.rfind("random:", 0) == 0 ? std::stoull(o.order.substr(7)) : 0);
  if (o.passes > 1 || o.pause_pass != 0) exit_on_sigbus();
  for (int pass = 0; pass < o.passes; ++pass) {
    if (o.order.rfind("random:", 0) == 0) std::shuffle(c.ranges.begin(), c.ranges.end(), rng);
    if (int rc = verify(c, pass + 1); rc != 0) return rc;
  }
  return 0;
}

// After the passes: the own handler's count, --hold, --recheck, then close.
int finish(Client& c) {
  const Options& o = c.o;
  say("state fallback=%d resident=%d uffd_fds=%d", airs_model_in_fallback(c.model), airs_model_is_resident(c.model),
      count_uffd_fds());
  if (!o.own_segv.empty()) {
    const unsigned v = *reinterpret_cast<const volatile unsigned char*>(g_own_page);
    say("own-segv handled=%d foreign=%d value=%u", static_cast<int>(g_own_handled), static_cast<int>(g_own_foreign), v);
  }
  if (o.hold) {
    say("holding");
    (void)wait_stdin_line();
  }
  if (o.recheck) {
    exit_on_sigbus();
    if (int rc = verify(c); rc != 0) return rc;
    say("reverified");
  }
  airs_model_close(c.model);
  airs_disconnect(c.client);
  say("closed");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int rc = parse_args(argc, argv, o); rc != 0) return rc;
  // A hang is a failure the test must see as one, not a stuck suite.
  ::alarm(o.deadline_s);
  if (o.as_uid >= 0) {
    const auto id = static_cast<uid_t>(o.as_uid);
    if (::setgroups(0, nullptr) != 0 || ::setgid(id) != 0 || ::setuid(id) != 0) {
      std::fprintf(stderr, "dropping to uid %ld: %s\n", o.as_uid, std::strerror(errno));
      return 17;
    }
  }
  auto src = airs::gguf::FdSource::open(o.file);
  if (!src) {
    std::fprintf(stderr, "open %s: %s\n", o.file.c_str(), src.error().message.c_str());
    return 11;
  }
  Client c{o, *src, {}};
  if (int rc = read_ranges(*src, o.file, &c.ranges); rc != 0) return rc;
  if (int rc = open_model(c); rc != 0) return rc;

  if (o.own_segv == "after") install_own_segv(true);
  if (o.wait_go) {
    say("waiting");
    if (!wait_stdin_line()) return 14;
  }
  if (o.fork_child) {
    if (int rc = check_forked_child(c); rc != 0) return rc;
  }
  if (o.touch >= 0) {
    exit_on_sigbus();
    say("touching offset=%lld addr=%p", o.touch,
        static_cast<const void*>(const_cast<const unsigned char*>(c.data) + o.touch));
    const unsigned v = c.data[o.touch];
    say("touched value=%u", v);
  }
  if (o.wait_resident_ms >= 0) {
    const int rc = airs_model_wait_resident(c.model, o.wait_resident_ms);
    say("resident rc=%d", rc);
  }
  if (o.wait_layer >= 0) {
    const int rc = airs_model_wait_layer(c.model, static_cast<uint32_t>(o.wait_layer), 60000);
    say("layer rc=%d", rc);
  }
  if (int rc = verify_passes(c); rc != 0) return rc;
  return finish(c);
}
