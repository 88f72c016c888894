// SPDX-License-Identifier: Apache-2.0
// libairs: the C API over D-Bus (sdbus-c++ proxies), the lazy mapping and
// the fallback server. See include/airs/airs.h for the contract.
#include "airs/airs.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <sdbus-c++/sdbus-c++.h>

#include "client/kv_sampler.hpp"
#include "client/lazy_map.hpp"
#include "client/sampler.hpp"
#include "wire/hints.hpp"
#include "wire/notice_page.hpp"
#include "wire/opened.hpp"
#include "wire/requests.hpp"
#include "wire/status_page.hpp"
#include "client/touch_guard.hpp"
#include "dbus/names.hpp"
#include "dbus/proxies.hpp"
#include "dbus/variant.hpp"
#include "sys/fd.hpp"
#include "sys/files.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/proc_handles.hpp"
#include "sys/uffd.hpp"
#include "util/hash.hpp"

namespace {

thread_local std::string g_last_error;

int fail(int err, std::string msg) {
  g_last_error = std::move(msg);
  return -err;
}

int fail(const sdbus::Error& e) {
  g_last_error = e.getMessage();
  const std::string& n = e.getName();
  using namespace airs::dbus;
  if (n == kErrPoolExhausted) return -ENOMEM;
  if (n == kErrQuotaExceeded) return -EDQUOT;
  if (n == kErrNotFound) return -ENOENT;
  if (n == kErrAccessDenied) return -EACCES;
  if (n == kErrBadModel) return -EBADMSG;
  if (n == kErrInvalidArgument) return -EINVAL;
  if (n == kErrBusy) return -EBUSY;
  if (n == kErrUnsupported) return -ENOTSUP;
  return -EIO;
}

int fail(const airs::Error& e) { return fail(e.code, e.message); }

// A kept copy of a received fd (invalid if the dup failed: the caller's next use says so).
airs::sys::UniqueFd dup_cloexec(int fd) {
  auto r = airs::sys::dup_cloexec(fd);
  return r ? std::move(r).value() : airs::sys::UniqueFd();
}

// A read-only shared mapping of the whole of `fd` (status and notice pages).
airs::Result<airs::sys::Mapping> map_whole_readonly(int fd, const std::string& what) {
  auto st = airs::sys::stat_of(fd, what);
  if (!st) return std::move(st).error();
  return airs::sys::map_shared(fd, static_cast<uint64_t>(st->st_size), PROT_READ, 0, what);
}

}  // namespace

struct airs_client {
  std::unique_ptr<sdbus::IConnection> bus;
  std::unique_ptr<airs::dbus::ManagerCalls> manager;
  // KV access sampling (client/kv_sampler.hpp): the period, read from
  // AIRS_KV_SAMPLE_MS at the first session, and the thread, started with
  // it (none when the period is 0). Last declared, so it stops first.
  std::optional<std::chrono::milliseconds> kv_sample_period;
  std::unique_ptr<airs::client::KvSampler> kv_sampler;
};

struct airs_model {
  airs_client* client = nullptr;
  std::string object;
  std::unique_ptr<airs::dbus::ModelCalls> proxy;
  airs::sys::UniqueFd gguf;
  uint64_t file_size = 0;
  airs::sys::UniqueFd region;
  uint64_t region_size = 0;
  airs::sys::Mapping status_map;
  airs::wire::StatusPageView status;
  airs::sys::Mapping plain;                         // resident at open: a plain read-only mapping
  std::optional<airs::client::LazyMapping> lazy;    // otherwise: registered with our uffd
  airs::sys::UniqueFd notify;                       // eventfd the daemon signals
  airs::sys::UniqueFd daemon_pidfd;
  airs::sys::UniqueFd stop;                         // eventfd: tells the watcher to exit
  std::unique_ptr<airs::client::FallbackServer> fallback;
  std::unique_ptr<airs::client::CooperativeFallback> coop;  // cooperative mode
  // Cooperative mode with wait_on_touch: our end of the Follow socket,
  // the trace file (AIRS_TOUCH_TRACE) and the guard over `plain` (declared
  // after it: the guard goes first).
  airs::sys::UniqueFd requests;
  airs::sys::UniqueFd touch_trace;
  std::unique_ptr<airs::client::TouchGuard> guard;
  airs::sys::Mapping opened_map;  // a streamed model's open-unit bits (wire/opened.hpp)
  // Expert hints (a streamed mixture of experts): the socket they go on
  // (`requests` for the touch guard, `hint_socket` for a lazy mapping).
  airs::sys::UniqueFd hint_socket;
  int hint_fd = -1;
  bool expert_hints = false;  // the daemon takes them (Open's info)
  bool streamed = false;
  // A streamed mixture of experts: access sampling (client/sampler.hpp),
  // until the caller sends expert hints, which tell every use.
  std::optional<airs::client::Sampler> sampler;
  std::atomic<bool> hinted{false};
  std::atomic<bool> guard_stop{false};
  std::thread watcher;
  std::atomic<bool> in_fallback{false};
  bool quiet = false;
  bool released = false;
  std::string mode = "full";

  const std::byte* data() const { return lazy ? lazy->data() : plain.bytes(); }
  // A touch that found the daemon dead maps the file at once (guard); the
  // watcher records it (coop) a futex slice later: either one says so.
  bool serving_itself() const {
    return in_fallback.load() || (coop && coop->taken_over()) || (guard && guard->taken_over());
  }
  void watch();
  void watch_guard();
  void watch_streamed();
  void start_fallback(const char* why);
  [[nodiscard]] int sample_timeout_ms() const;
  void sample();
};

struct airs_session {
  airs_client* client = nullptr;
  std::unique_ptr<airs::dbus::SessionCalls> proxy;
  airs::sys::Mapping arena;
  airs::sys::Mapping notices;
  airs::sys::UniqueFd notice_event;
  airs_kv_geometry geo{};
  std::string kv_type;  // the geometry's "kv_type"
  uint64_t blocks_per_chunk = 1;
  uint64_t chunk_bytes = 0;
  airs::wire::NoticeReader reader;
  std::unique_ptr<airs::client::KvSampling> sampling;  // on client->kv_sampler while the session is
};

const char* airs_last_error(void) { return g_last_error.c_str(); }

int airs_connect(const char* bus, airs_client** out) {
  if (out == nullptr) return fail(EINVAL, "airs_connect: out is NULL");
  auto c = std::make_unique<airs_client>();
  try {
    std::string b = bus == nullptr ? "system" : bus;
    if (b == "system") c->bus = sdbus::createSystemBusConnection();
    else if (b == "session") c->bus = sdbus::createSessionBusConnection();
    else c->bus = sdbus::createSessionBusConnectionWithAddress(b);
    c->manager = std::make_unique<airs::dbus::ManagerCalls>(*c->bus);
  } catch (const sdbus::Error& e) {
    return fail(ECONNREFUSED, "cannot connect to the D-Bus: " + e.getMessage());
  }
  *out = c.release();
  return 0;
}

void airs_disconnect(airs_client* client) { delete client; }

// ---- models ----

void airs_model::start_fallback(const char* why) {
  if (in_fallback.load()) return;
  if (streamed) {
    // A streamed model's units come and go: filling it here would take the
    // whole model's memory. The file itself takes the region's place (one
    // mmap over the range: the bytes read before and after are the same),
    // and the threads asleep in a fault the dead daemon never answered are
    // woken to touch it again, on the file.
    // `coop` was made before the watcher started (map_lazy): callers of
    // airs_model_in_fallback read it from their own threads.
    if (!coop) return;
    if (auto st = coop->take_over(); !st) {
      std::fprintf(stderr, "airs: model %s: %s\n", object.c_str(), st.error().message.c_str());
      return;
    }
    (void)airs::sys::uffd_wake(lazy->uffd(), lazy->address(), lazy->size());
    in_fallback.store(true);
    if (!quiet)
      std::fprintf(stderr, "airs: %s; mapping %s from the GGUF file in this process instead\n", why, object.c_str());
    return;
  }
  auto fb = airs::client::FallbackServer::create(*lazy, region.get(), gguf.get(), file_size, status);
  if (!fb) {
    std::fprintf(stderr, "airs: model %s: cannot serve the load myself: %s\n", object.c_str(), fb.error().message.c_str());
    return;
  }
  fallback = std::move(fb).value();
  if (auto s = fallback->takeover(); !s) {
    std::fprintf(stderr, "airs: model %s: fallback takeover: %s\n", object.c_str(), s.error().message.c_str());
    return;
  }
  in_fallback.store(true);
  if (!quiet)
    std::fprintf(stderr, "airs: %s; serving the remaining pages of %s from the GGUF file in this process\n", why,
                 object.c_str());
}

void airs_model::watch() {
  for (;;) {
    if (!in_fallback.load() && status.valid() && status.state() == airs::wire::ModelLoadState::Resident &&
        lazy->registered()) {
      // Every page is in the page cache now: plain faults map them, no
      // daemon involved; drop the registration so faults cost nothing.
      (void)lazy->unregister();
      return;
    }
    pollfd fds[4] = {{stop.get(), POLLIN, 0}, {notify.get(), POLLIN, 0}, {daemon_pidfd.get(), POLLIN, 0}, {-1, POLLIN, 0}};
    nfds_t n = 3;
    if (in_fallback.load() && fallback) {
      fds[3].fd = fallback->fd();
      n = 4;
    }
    if (auto r = airs::sys::poll_fds(fds, n, sample_timeout_ms()); !r) {
      if (r.error().code == EINTR) continue;
      return;
    }
    if (fds[0].revents != 0) return;
    sample();
    if (fds[1].revents & POLLIN) (void)airs::sys::eventfd_drain(notify.get());
    if ((fds[2].revents & POLLIN) && !in_fallback.load()) {
      start_fallback("airs-memd exited during the load");
      if (!in_fallback.load()) return;
    }
    if (in_fallback.load() && !fallback) return;  // the file took the region's place: nothing more to serve
    if (n == 4 && fds[3].revents != 0) (void)fallback->run_once(std::chrono::milliseconds(0));
  }
}

// Cooperative mode with a touch guard: make units readable as they become
// ready. If the daemon dies, the handler of the next touch of a unit that is
// not ready maps the GGUF file in place (on the touching thread: mapping it
// from here as well would race with readers of the units that are ready);
// this thread then records and announces it.
void airs_model::watch_guard() {
  if (guard->streamed()) return watch_streamed();
  for (;;) {
    if (guard_stop.load()) return;
    const uint32_t gen = status.generation();
    if (guard->open_ready()) return;
    if (guard->taken_over()) {
      coop->adopt();
      return;
    }
    const auto st = status.state();
    if (st == airs::wire::ModelLoadState::Failed || st == airs::wire::ModelLoadState::Unloaded) return;
    (void)airs::sys::futex_wait(status.generation_word(), gen, airs::client::TouchGuard::kSliceNs);
  }
}

// A streamed model: close what the daemon asks to close (its units come and
// go), for as long as the model is open. A daemon that died or dropped us
// (our socket closed) is out of reach: the file takes the region's place.
void airs_model::watch_streamed() {
  for (;;) {
    if (guard_stop.load()) return;
    if (guard->taken_over()) {
      coop->adopt();
      return;
    }
    pollfd fds[2] = {{requests.get(), POLLIN, 0}, {daemon_pidfd.get(), POLLIN, 0}};
    int timeout = static_cast<int>(airs::client::TouchGuard::kSliceNs / 1'000'000);
    if (const int t = sample_timeout_ms(); t >= 0) timeout = std::min(timeout, t);
    auto r = airs::sys::poll_fds(fds, 2, timeout);
    if (!r && r.error().code != EINTR) return;
    sample();
    if (!r || *r == 0) continue;
    bool out_of_reach = (fds[1].revents & POLLIN) != 0;
    for (int i = 0; i < 256 && !out_of_reach; ++i) {
      uint32_t word = 0;
      const auto msg = airs::sys::read_message(requests.get(), &word, sizeof word);
      if (msg.state == airs::sys::MessageRead::Again) break;
      if (msg.state != airs::sys::MessageRead::Message) {
        out_of_reach = true;
        break;
      }
      const auto req = airs::wire::decode_request(word);
      if (msg.bytes == sizeof word && req.kind == airs::wire::RequestKind::Close) guard->close_unit(req.unit);
    }
    if (out_of_reach) {
      if (status.state() == airs::wire::ModelLoadState::Unloaded) return;  // revoked: SIGBUS is right
      guard->take_over_now();
      coop->adopt();
      return;
    }
  }
}

int airs_model::sample_timeout_ms() const {
  if (!sampler || hinted.load(std::memory_order_relaxed) || serving_itself()) return -1;
  return sampler->timeout_ms(airs::client::Sampler::Clock::now());
}

// A round of access sampling (client/sampler.hpp), from the watcher: a few
// units that are in leave this process's page tables (a lazy mapping:
// MADV_DONTNEED of a shared mapping keeps the page in the region, and the
// next touch is a minor fault the daemon answers at once) or close
// (cooperative: the next touch opens the unit again and says so). Never
// once the file has taken the region's place, nor once the caller hints.
void airs_model::sample() {
  if (sample_timeout_ms() != 0) return;
  const auto now = airs::client::Sampler::Clock::now();
  if (guard) {
    (void)sampler->round(now, [this](uint32_t u) { return status.unit_ready(u) && guard->sample_unit(u); });
    return;
  }
  if (!lazy) return;
  const uint64_t unit = status.unit_size();
  (void)sampler->round(now, [this, unit](uint32_t u) {
    const uint64_t at = uint64_t{u} * unit;
    if (!status.unit_ready(u) || at >= lazy->size() || in_fallback.load()) return false;
    // The system call itself: libairs-preload.so interposes madvise().
    return ::syscall(SYS_madvise, lazy->data() + at, std::min(unit, lazy->size() - at), MADV_DONTNEED) == 0;
  });
}

// A pidfd of the daemon that owns the bus name (to notice its death).
// Throws sdbus::Error if the bus cannot say.
static airs::Result<airs::sys::UniqueFd> daemon_pidfd(airs_client& client) {
  uint32_t dpid = 0;
  auto dbusp = sdbus::createProxy(*client.bus, "org.freedesktop.DBus", "/org/freedesktop/DBus");
  dbusp->callMethod("GetConnectionUnixProcessID")
      .onInterface("org.freedesktop.DBus")
      .withArguments(std::string(airs::dbus::kBusName))
      .storeResultsTo(dpid);
  auto fd = airs::sys::pidfd_open(static_cast<pid_t>(dpid));
  if (!fd)
    return airs::make_error(fd.error().code, "pidfd_open of airs-memd (pid {}): {}", dpid,
                            std::strerror(fd.error().code));
  return fd;
}

// The three ways a model is mapped, one function each (open_model picks).

// Cooperative: a read-only mapping the caller (or we) open unit by unit as
// the status page says they are ready: the touch guard (PROT_NONE, opened
// on touch, always for a streamed model), or the caller's own per-layer
// waits, or a wait for residency here.
static int map_cooperative(airs_model* m, bool resident, bool streamed, const airs_model_options* opt) {
  const bool guarded = !resident && (streamed || (opt != nullptr && opt->wait_on_touch != 0));
  const uint64_t size = m->region_size;
  auto ro = guarded ? airs::sys::map_shared(m->region.get(), size, PROT_NONE, 0, "model region (guarded)")
                    : airs::client::map_region_readonly(m->region.get(), size);
  if (!ro) return fail(ro.error());
  m->plain = std::move(ro).value();
  if (!resident) {
    // If the daemon dies before the fill ends, the waits swap in the GGUF
    // file itself (the region would never fill).
    if (auto pidfd = daemon_pidfd(*m->client); !pidfd) return fail(pidfd.error());
    else m->daemon_pidfd = std::move(pidfd).value();
    m->coop = std::make_unique<airs::client::CooperativeFallback>(
        m->plain.get(), size, m->gguf.get(), m->daemon_pidfd.get(), [m] {
          if (!m->quiet)
            std::fprintf(stderr, "airs: airs-memd is out of reach; mapping %s from the GGUF file in this process "
                                 "instead\n",
                         m->object.c_str());
        });
  }
  if (!guarded) {
    if (resident || (opt != nullptr && opt->wait_per_layer != 0 && m->mode == "cooperative")) return 0;
    if (auto w = airs::client::wait_resident(m->status, std::chrono::hours(24), m->coop.get()); !w)
      return fail(w.error());
    return 0;
  }
  // The daemon reads what a touch asks for next (Model.Follow) and, for a
  // streamed model, drops no unit this process has open (the open-unit
  // bits, wire/opened.hpp) without asking it to close it first.
  auto ch = airs::sys::message_channel();
  if (!ch) return fail(ch.error());
  airs::sys::UniqueFd theirs = std::move(ch->first);
  m->requests = std::move(ch->second);
  const uint32_t units = m->status.unit_count();
  auto bits = airs::sys::memfd_create_sealable("airs-opened", airs::wire::opened_bytes(units));
  if (!bits) return fail(bits.error());
  auto bmap = airs::sys::map_shared(bits->get(), airs::wire::opened_bytes(units), PROT_READ | PROT_WRITE, 0,
                                    "open-unit bits");
  if (!bmap) return fail(bmap.error());
  if (auto st = airs::sys::seal_size(bits->get(), "open-unit bits"); !st) return fail(st.error());
  m->opened_map = std::move(bmap).value();
  try {
    m->proxy->Follow(sdbus::UnixFd(theirs.get()), sdbus::UnixFd(bits->get()));
    if (m->expert_hints) m->hint_fd = m->requests.get();
  } catch (const sdbus::Error& e) {
    // A streamed model without it would be read as zeros where a unit went.
    if (streamed) return fail(e);
    m->requests.reset();
    if (!m->quiet) std::fprintf(stderr, "airs: %s: no read-ahead on touch (%s)\n", m->object.c_str(), e.getMessage().c_str());
  }
  if (const char* t = std::getenv("AIRS_TOUCH_TRACE"); t != nullptr && t[0] != '\0')
    if (auto f = airs::sys::open_file(t, O_WRONLY | O_CREAT | O_APPEND, 0644)) m->touch_trace = std::move(f).value();
  airs::client::TouchGuardSpec spec;
  spec.base = m->plain.get();
  spec.size = size;
  spec.status = m->status;
  spec.request_fd = m->requests.get();
  spec.daemon_pidfd = m->daemon_pidfd.get();
  spec.gguf_fd = m->gguf.get();
  spec.region_fd = m->region.get();
  spec.trace_fd = m->touch_trace.get();
  spec.opened = streamed ? m->opened_map.get() : nullptr;
  auto g = airs::client::TouchGuard::create(spec);
  if (!g) return fail(g.error());
  m->guard = std::move(g).value();
  if (!m->guard->open_ready()) {
    m->watcher = std::thread([m] { m->watch_guard(); });
    pthread_setname_np(m->watcher.native_handle(), "airs-touch");
  }
  return 0;
}

// A lazy mapping's expert hints: its uffd carries nothing the other way, so
// a socket of its own that only we send on (Model.Hints). Best effort: a
// daemon that refuses it (or does not know it) gets no hints.
static void open_hints(airs_model* m) {
  auto ch = airs::sys::message_channel();
  if (!ch) return;
  try {
    m->proxy->Hints(sdbus::UnixFd(ch->first.get()));
  } catch (const sdbus::Error& e) {
    if (!m->quiet) std::fprintf(stderr, "airs: %s: no expert hints (%s)\n", m->object.c_str(), e.getMessage().c_str());
    return;
  }
  // Never blocks: a full socket drops the hint (airs_model_hint_experts).
  if (!airs::sys::set_nonblocking(ch->second.get())) return;
  m->hint_socket = std::move(ch->second);
  m->hint_fd = m->hint_socket.get();
}

// Lazy: our own userfaultfd on a writable mapping; the daemon answers the
// faults (Attach), and the watcher serves them itself if the daemon dies.
static int map_lazy(airs_model* m, airs::sys::UniqueFd proof_uffd) {
  const uint64_t size = m->region_size;
  auto lm = airs::client::LazyMapping::create(
      m->region.get(), size,
      m->mode == "small-pages" ? airs::client::LazyBacking::Shmem : airs::client::LazyBacking::Hugetlbfs,
      std::move(proof_uffd));
  if (!lm) return fail(lm.error());
  m->lazy.emplace(std::move(lm).value());
  auto notify = airs::sys::eventfd_create();
  auto stop = airs::sys::eventfd_create();
  if (!notify) return fail(notify.error());
  if (!stop) return fail(stop.error());
  m->notify = std::move(notify).value();
  m->stop = std::move(stop).value();
  // The daemon's pid, to notice its death (a uffd never reports it).
  if (auto pidfd = daemon_pidfd(*m->client); !pidfd) return fail(pidfd.error());
  else m->daemon_pidfd = std::move(pidfd).value();
  // A streamed model's fallback maps the file in the region's place: made
  // here, before the watcher that may use it exists.
  if (m->streamed)
    m->coop = std::make_unique<airs::client::CooperativeFallback>(const_cast<std::byte*>(m->lazy->data()),
                                                                  m->lazy->size(), m->gguf.get(),
                                                                  m->daemon_pidfd.get(), nullptr);
  auto ufd = m->lazy->dup_uffd();
  if (!ufd) return fail(ufd.error());
  try {
    m->proxy->Attach(sdbus::UnixFd(m->notify.get()), sdbus::UnixFd(ufd->get()), m->lazy->address(), size);
  } catch (const sdbus::Error& e) {
    if (!airs::sys::pidfd_exited(m->daemon_pidfd.get())) throw;
    m->start_fallback("airs-memd exited before serving this model");
  }
  if (m->expert_hints && !m->in_fallback.load()) open_hints(m);
  m->watcher = std::thread([m] { m->watch(); });
  pthread_setname_np(m->watcher.native_handle(), "airs-watch");
  return 0;
}

// What Model.OpenLazy or Model.Open answered.
struct OpenReply {
  sdbus::UnixFd region, status;
  uint64_t size = 0;
  airs::dbus::Dict info;
  airs::sys::UniqueFd proof_uffd;  // valid when opened lazily
};

// Lazy (a writable region, our own userfaultfd) where the daemon trusts us
// and we can make a userfaultfd; else the read-only region at once, opened
// unit by unit (map_cooperative). Under mlockall(MCL_FUTURE) a lazy mapping
// would be locked, so filled with zero pages, at mmap, before the daemon
// could fill it (LazyMapping::create refuses it): such a process takes the
// read-only path, which maps only filled units (or waits for residency) and
// so locks the model's bytes, never zeros. Throws sdbus::Error.
static OpenReply open_region(airs_model* m, const std::string& mode) {
  OpenReply r;
  if (mode != "cooperative" && airs::client::check_no_mlock_future()) {
    if (auto u = airs::sys::uffd_create()) {
      try {
        std::tie(r.region, r.size, r.status, r.info) =
            m->proxy->OpenLazy(sdbus::UnixFd(m->gguf.get()), sdbus::UnixFd(u->get()), airs::dbus::Dict{});
        r.proof_uffd = std::move(u).value();
        return r;
      } catch (const sdbus::Error& e) {
        if (e.getName() != airs::dbus::kErrAccessDenied) throw;
      }
    }
  }
  airs::dbus::Dict oopts;
  oopts["wait"] = sdbus::Variant(false);
  std::tie(r.region, r.size, r.status, r.info) = m->proxy->Open(sdbus::UnixFd(m->gguf.get()), oopts);
  return r;
}

// LoadModel holds no reference: under pressure the daemon may evict the
// model, unused, before our Open reaches it (its object is gone then).
// Load it again: a few times, not for ever. Throws sdbus::Error.
static OpenReply load_and_open(airs_model* m, const airs::dbus::Dict& opts, const std::string& mode) {
  for (int attempt = 1;; ++attempt) {
    try {
      m->object = m->client->manager->LoadModel(sdbus::UnixFd(m->gguf.get()), opts);
      m->proxy = std::make_unique<airs::dbus::ModelCalls>(*m->client->bus, m->object);
      return open_region(m, mode);
    } catch (const sdbus::Error& e) {
      if (attempt >= 3 || e.getName() != airs::dbus::kErrUnknownObject) throw;
      if (!m->quiet)
        std::fprintf(stderr, "airs: %s went before it was opened (evicted under pressure?); loading it again\n",
                     m->object.c_str());
    }
  }
}

// Maps what the daemon opened: lazily, plainly (resident), or unit by unit.
static int map_region(airs_model* m, OpenReply r, const std::string& mode, const airs_model_options* opt) {
  m->region = dup_cloexec(r.region.get());
  m->region_size = r.size;
  auto sp = map_whole_readonly(r.status.get(), "status page");
  if (!sp) return fail(sp.error());
  m->status_map = std::move(sp).value();
  m->status = airs::wire::StatusPageView(m->status_map.get(), m->status_map.size());
  const bool lazy = r.proof_uffd.get() >= 0;
  const bool resident = airs::dbus::get<bool>(r.info, "resident").value_or(false);
  const bool streamed = airs::dbus::get<bool>(r.info, "streamed").value_or(false);
  m->streamed = streamed;
  m->expert_hints = streamed && airs::dbus::get<bool>(r.info, "expert_hints").value_or(false);
  m->mode = airs::dbus::get<std::string>(r.info, "mode").value_or(mode);
  if (m->expert_hints) {
    // Sampling is on by default where a fault names the base page it
    // touched, and with it the expert (small-pages); a huge page or a
    // cooperative unit holds several experts, and sampling them made the
    // daemon's cache read more, not less (docs/streaming.md). AIRS_SAMPLE_MS
    // turns it on anywhere.
    const auto o = airs::client::sampler_options_from_env();
    if (o.from_env || (lazy && !resident && m->mode == "small-pages"))
      m->sampler.emplace(o, m->status.unit_count(), airs::client::Sampler::Clock::now());
  }
  if (lazy && !resident) return map_lazy(m, std::move(r.proof_uffd));
  if (!lazy && !resident) return map_cooperative(m, resident, streamed, opt);
  // Fully resident: a plain read-only mapping, no userfaultfd at all.
  auto p = airs::sys::map_shared(m->region.get(), r.size, PROT_READ, 0, "model");
  if (!p) return fail(p.error());
  m->plain = std::move(p).value();
  return 0;
}

static int open_model(airs_client* client, airs::sys::UniqueFd gguf, const airs_model_options* opt, airs_model** out) {
  if (client == nullptr || out == nullptr) return fail(EINVAL, "airs_model_open: NULL argument");
  auto m = std::make_unique<airs_model>();
  m->client = client;
  m->quiet = opt != nullptr && opt->quiet != 0;
  auto st = airs::sys::stat_of(gguf.get(), "GGUF");
  if (!st) return fail(st.error());
  m->file_size = static_cast<uint64_t>(st->st_size);
  m->gguf = std::move(gguf);
  try {
    airs::dbus::Dict opts;
    if (opt != nullptr && opt->name != nullptr) opts["name"] = sdbus::Variant(std::string(opt->name));
    const std::string mode = client->manager->Mode();
    if (int rc = map_region(m.get(), load_and_open(m.get(), opts, mode), mode, opt); rc != 0) return rc;
  } catch (const sdbus::Error& e) {
    return fail(e);
  }
  *out = m.release();
  return 0;
}

int airs_model_open(airs_client* client, const char* path, const airs_model_options* opt, airs_model** out) {
  if (path == nullptr) return fail(EINVAL, "airs_model_open: path is NULL");
  auto fd = airs::sys::open_file(path, O_RDONLY);
  if (!fd) return fail(fd.error());
  return open_model(client, std::move(fd).value(), opt, out);
}

int airs_model_open_fd(airs_client* client, int gguf_fd, const airs_model_options* opt, airs_model** out) {
  auto fd = airs::sys::dup_cloexec(gguf_fd);
  if (!fd) return fail(fd.error());
  return open_model(client, std::move(fd).value(), opt, out);
}

const void* airs_model_data(const airs_model* m) { return m == nullptr ? nullptr : m->data(); }
uint64_t airs_model_size(const airs_model* m) { return m == nullptr ? 0 : m->file_size; }
const char* airs_model_object(const airs_model* m) { return m == nullptr ? "" : m->object.c_str(); }
const char* airs_model_mode(const airs_model* m) { return m == nullptr ? "" : m->mode.c_str(); }

static std::chrono::nanoseconds timeout_of(int ms) {
  return ms < 0 ? std::chrono::nanoseconds(std::chrono::hours(24 * 365)) : std::chrono::nanoseconds(std::chrono::milliseconds(ms));
}

int airs_model_wait_layer(airs_model* m, uint32_t rank, int timeout_ms) {
  if (m == nullptr) return fail(EINVAL, "airs_model_wait_layer: NULL model");
  if (m->mode != "cooperative") return 0;
  // A streamed model keeps no layer: the daemon reads a unit when a client
  // touches it or asks for it, and ahead of its clients only near where
  // they are, so a layer nobody reads would never come and the wait would
  // last its whole timeout, or for ever. The status page cannot ask for a
  // layer (it does not say which units a rank has); a byte range can.
  if (m->streamed && !m->serving_itself())
    return fail(EFBIG, "airs_model_wait_layer: the model is bigger than its share of the pool and streams (its units "
                       "come as they are read and go again): wait for the bytes read next (airs_model_wait_range), "
                       "which asks the daemon for them, or just read them");
  if (auto r = airs::client::wait_rank(m->status, rank, timeout_of(timeout_ms), m->coop.get()); !r)
    return fail(r.error());
  return 0;
}

int airs_model_wait_range(airs_model* m, uint64_t offset, uint64_t len, int timeout_ms) {
  if (m == nullptr) return fail(EINVAL, "airs_model_wait_range: NULL model");
  if (m->mode != "cooperative") return 0;
  // A guarded region (a streamed model, or wait_on_touch) asks for the units
  // it waits for, as its touches would: a streamed model reads ahead only
  // near where its clients are, so bytes waited for elsewhere must be asked.
  std::function<void(uint32_t)> ask;
  if (m->guard) ask = [g = m->guard.get()](uint32_t u) { g->request(u); };
  if (auto r = airs::client::wait_range(m->status, offset, len, timeout_of(timeout_ms), m->coop.get(), ask); !r)
    return fail(r.error());
  return 0;
}

int airs_model_takes_hints(const airs_model* m) {
  return m != nullptr && m->hint_fd >= 0 && !m->serving_itself() ? 1 : 0;
}

namespace {

// A hint or a prediction (wire/hints.hpp), sent by `fn`.
int send_hint(const char* fn, airs_model* m, uint32_t layer, const uint32_t* experts, size_t n, bool predicted) {
  if (m == nullptr || (experts == nullptr && n > 0)) return fail(EINVAL, std::string(fn) + ": NULL argument");
  if (n == 0 || n > airs::wire::kMaxHintExperts)
    return fail(EINVAL, std::string(fn) + ": between 1 and 256 experts per hint");
  if (m->hint_fd < 0 || m->serving_itself())
    return fail(ENOTSUP,
                std::string(fn) + ": the model takes no expert hints (not a streamed mixture of experts on the daemon)");
  alignas(uint32_t) std::byte buf[airs::wire::kMaxHintBytes];
  const size_t len = airs::wire::encode_hint(layer, std::span<const uint32_t>(experts, n), buf, predicted);
  if (!predicted) m->hinted.store(true, std::memory_order_relaxed);  // its hints tell every use: no sampling
  // MSG_DONTWAIT: a full socket drops the hint, never blocks the caller.
  if (!airs::sys::send_message(m->hint_fd, buf, len))
    return fail(EAGAIN, std::string(fn) + ": the hint socket is full; the hint was dropped");
  return 0;
}

}  // namespace

int airs_model_hint_experts(airs_model* m, uint32_t layer, const uint32_t* experts, size_t n) {
  return send_hint("airs_model_hint_experts", m, layer, experts, n, false);
}

int airs_model_predict_experts(airs_model* m, uint32_t layer, const uint32_t* experts, size_t n) {
  return send_hint("airs_model_predict_experts", m, layer, experts, n, true);
}

int airs_model_in_fallback(const airs_model* m) { return m != nullptr && m->serving_itself() ? 1 : 0; }

int airs_model_is_resident(const airs_model* m) {
  if (m == nullptr) return 0;
  // Unloaded (forced, or evicted): the mapping is revoked, SIGBUS on access.
  if (m->status.valid() && m->status.state() == airs::wire::ModelLoadState::Unloaded && !m->serving_itself()) return 0;
  // Cooperative mode maps read-only from the start: resident only when the
  // status page says so (or the file took the region's place).
  if (m->mode == "cooperative")
    return m->serving_itself() ||
                   (m->status.valid() && m->status.state() == airs::wire::ModelLoadState::Resident)
               ? 1
               : 0;
  if (m->plain.valid()) return 1;
  return m->status.valid() && m->status.state() == airs::wire::ModelLoadState::Resident ? 1 : 0;
}

int airs_model_wait_resident(airs_model* m, int timeout_ms) {
  if (m == nullptr) return fail(EINVAL, "airs_model_wait_resident: NULL model");
  if (airs_model_is_resident(m)) return 0;
  // The status page's futex word changes on every fill and state change.
  if (auto r = airs::client::wait_resident(m->status, timeout_of(timeout_ms), m->coop.get()); !r)
    return fail(r.error());
  return 0;
}

void airs_model_close(airs_model* m) {
  if (m == nullptr) return;
  if (m->watcher.joinable()) {
    m->guard_stop.store(true);
    if (m->stop) (void)airs::sys::eventfd_signal(m->stop.get());
    m->watcher.join();
  }
  // A take-over the watcher had no time to record (closed right after the
  // touch): recorded and announced now, once.
  if (m->guard && m->coop && m->guard->taken_over()) m->coop->adopt();
  m->guard.reset();
  if (!m->serving_itself()) {
    try {
      m->proxy->Release();
    } catch (const sdbus::Error&) {
      // The daemon is gone or dropped us already; leaving the bus releases too.
    }
  }
  delete m;
}

// ---- KV sessions ----

int airs_session_create(airs_client* client, airs_model* model, airs_priority priority, airs_session** out) {
  if (client == nullptr || model == nullptr || out == nullptr) return fail(EINVAL, "airs_session_create: NULL argument");
  static const char* kNames[] = {"interactive", "system", "background"};
  if (priority < AIRS_PRIORITY_INTERACTIVE || priority > AIRS_PRIORITY_BACKGROUND)
    return fail(EINVAL, "airs_session_create: unknown priority");
  auto s = std::make_unique<airs_session>();
  s->client = client;
  try {
    auto [path, arena, notice, event, geo] =
        client->manager->CreateSession(sdbus::ObjectPath(model->object), std::string(kNames[priority]), airs::dbus::Dict{});
    s->proxy = std::make_unique<airs::dbus::SessionCalls>(*client->bus, path);
    s->geo.block_bytes = airs::dbus::get<uint32_t>(geo, "block_bytes").value_or(0);
    s->geo.tokens_per_block = airs::dbus::get<uint32_t>(geo, "tokens_per_block").value_or(0);
    s->geo.bytes_per_token = airs::dbus::get<uint64_t>(geo, "bytes_per_token").value_or(0);
    s->geo.arena_bytes = airs::dbus::get<uint64_t>(geo, "arena_bytes").value_or(0);
    s->chunk_bytes = airs::dbus::get<uint64_t>(geo, "chunk_bytes").value_or(0);
    s->blocks_per_chunk = airs::dbus::get<uint32_t>(geo, "blocks_per_chunk").value_or(1);
    s->kv_type = airs::dbus::get<std::string>(geo, "kv_type").value_or("");
    // Mapped once; only blocks the daemon handed out are touched. NORESERVE:
    // the arena is mostly holes, pages exist only where chunks are committed.
    auto a = airs::sys::map_shared(arena.get(), s->geo.arena_bytes, PROT_READ | PROT_WRITE, MAP_NORESERVE, "KV arena");
    if (!a) return fail(a.error());
    s->arena = std::move(a).value();
    auto n = map_whole_readonly(notice.get(), "notice page");
    if (!n) return fail(n.error());
    s->notices = std::move(n).value();
    s->notice_event = dup_cloexec(event.get());
    s->reader = airs::wire::NoticeReader(s->notices.get());
    if (!s->reader.valid()) return fail(EPROTO, "the daemon's notice page is not valid (version mismatch?)");
  } catch (const sdbus::Error& e) {
    return fail(e);
  }
  if (!client->kv_sample_period) client->kv_sample_period = airs::client::kv_sample_period_from_env();
  if (client->kv_sample_period->count() > 0 && s->chunk_bytes > 0 && s->notice_event) {
    if (!client->kv_sampler) client->kv_sampler = std::make_unique<airs::client::KvSampler>(*client->kv_sample_period);
    s->sampling = std::make_unique<airs::client::KvSampling>(s->arena.bytes(), s->arena.size(), s->chunk_bytes,
                                                             s->blocks_per_chunk);
    if (!client->kv_sampler->add(s->sampling.get(), s->notice_event.get())) s->sampling.reset();
  }
  *out = s.release();
  return 0;
}

int airs_session_geometry(const airs_session* s, airs_kv_geometry* out) {
  if (s == nullptr || out == nullptr) return fail(EINVAL, "airs_session_geometry: NULL argument");
  *out = s->geo;
  return 0;
}

const char* airs_session_kv_type(const airs_session* s) { return s == nullptr ? "" : s->kv_type.c_str(); }

int airs_session_allocate(airs_session* s, uint32_t n, uint32_t* blocks_out) {
  if (s == nullptr || (blocks_out == nullptr && n > 0)) return fail(EINVAL, "airs_session_allocate: NULL argument");
  try {
    const std::vector<uint32_t> blocks = s->proxy->Allocate(n);
    if (blocks.size() != n) return fail(EIO, "Allocate returned a different number of blocks");
    std::copy(blocks.begin(), blocks.end(), blocks_out);
    if (s->sampling) s->sampling->held(blocks);
    return 0;
  } catch (const sdbus::Error& e) {
    return fail(e);
  }
}

int airs_session_allocate_at(airs_session* s, uint32_t index, uint32_t* block_out) {
  if (s == nullptr || block_out == nullptr) return fail(EINVAL, "airs_session_allocate_at: NULL argument");
  try {
    *block_out = s->proxy->AllocateAt(index);
    if (s->sampling) s->sampling->held({block_out, 1});
    return 0;
  } catch (const sdbus::Error& e) {
    return fail(e);
  }
}

int airs_session_free(airs_session* s, const uint32_t* blocks, size_t n) {
  if (s == nullptr) return fail(EINVAL, "airs_session_free: NULL session");
  try {
    s->proxy->Free(std::vector<uint32_t>(blocks, blocks + n));
    if (s->sampling && n > 0) s->sampling->dropped({blocks, n});
    return 0;
  } catch (const sdbus::Error& e) {
    return fail(e);
  }
}

int airs_session_commit(airs_session* s, const uint32_t* blocks, const uint64_t* hashes, size_t n) {
  if (s == nullptr) return fail(EINVAL, "airs_session_commit: NULL session");
  try {
    s->proxy->Commit(std::vector<uint32_t>(blocks, blocks + n), std::vector<uint64_t>(hashes, hashes + n));
    return 0;
  } catch (const sdbus::Error& e) {
    return fail(e);
  }
}

int airs_session_match_prefix(airs_session* s, const uint64_t* hashes, size_t n, uint32_t* blocks_out) {
  if (s == nullptr) return fail(EINVAL, "airs_session_match_prefix: NULL session");
  try {
    const std::vector<uint32_t> blocks = s->proxy->MatchPrefix(std::vector<uint64_t>(hashes, hashes + n));
    std::copy(blocks.begin(), blocks.end(), blocks_out);
    if (s->sampling) s->sampling->held(blocks);
    return static_cast<int>(blocks.size());
  } catch (const sdbus::Error& e) {
    return fail(e);
  }
}

int airs_session_prepare_write(airs_session* s, uint32_t block, uint32_t* writable) {
  if (s == nullptr || writable == nullptr) return fail(EINVAL, "airs_session_prepare_write: NULL argument");
  try {
    *writable = s->proxy->PrepareWrite(block);
    if (s->sampling && *writable != block) {
      // A copy: the session holds it instead of the shared block.
      s->sampling->held({writable, 1});
      s->sampling->dropped({&block, 1});
    }
    return 0;
  } catch (const sdbus::Error& e) {
    return fail(e);
  }
}

int airs_session_post_length(airs_session* s, uint32_t tokens) {
  if (s == nullptr) return fail(EINVAL, "airs_session_post_length: NULL session");
  try {
    s->proxy->PostSetLength(tokens);
    return 0;
  } catch (const sdbus::Error& e) {
    return fail(e);
  }
}

int airs_session_set_length(airs_session* s, uint32_t tokens) {
  if (s == nullptr) return fail(EINVAL, "airs_session_set_length: NULL session");
  try {
    s->proxy->SetLength(tokens);
    return 0;
  } catch (const sdbus::Error& e) {
    return fail(e);
  }
}

void* airs_session_block_ptr(airs_session* s, uint32_t block) {
  if (s == nullptr || s->blocks_per_chunk == 0) return nullptr;
  const uint64_t off =
      (block / s->blocks_per_chunk) * s->chunk_bytes + (block % s->blocks_per_chunk) * uint64_t{s->geo.block_bytes};
  if (off + s->geo.block_bytes > s->arena.size()) return nullptr;
  return s->arena.bytes() + off;
}

int airs_session_notice_fd(const airs_session* s) { return s == nullptr ? -1 : s->notice_event.get(); }

int airs_session_read_notices(airs_session* s, uint32_t* blocks_out, size_t cap) {
  return airs_session_read_notices_spilled(s, blocks_out, nullptr, cap);
}

int airs_session_read_notices_spilled(airs_session* s, uint32_t* blocks_out, uint8_t* spilled_out, size_t cap) {
  if (s == nullptr) return fail(EINVAL, "airs_session_read_notices: NULL session");
  (void)airs::sys::drain_wakeups(s->notice_event.get());  // never blocks, whatever its flags
  const int64_t n = s->reader.read(blocks_out, cap, spilled_out);
  if (n < 0) {
    if (s->sampling) s->sampling->dropped_all();
    return fail(EOVERFLOW, "more blocks were evicted than the notice ring holds: treat every block as lost");
  }
  if (s->sampling && n > 0) s->sampling->dropped({blocks_out, static_cast<size_t>(n)});
  return static_cast<int>(n);
}

uint64_t airs_session_restored_blocks(const airs_session* s) { return s == nullptr ? 0 : s->reader.restored_blocks(); }

void airs_session_close(airs_session* s) {
  if (s == nullptr) return;
  if (s->sampling) s->client->kv_sampler->remove(s->sampling.get());  // before the arena is unmapped
  try {
    s->proxy->Close();
  } catch (const sdbus::Error&) {
    // Gone already (daemon restarted, or we left the bus): nothing to close.
  }
  delete s;
}

uint64_t airs_kv_chain_hash(uint64_t parent, const int32_t* tokens, size_t n) {
  // hash(parent || tokens) with a fixed seed: every process must agree.
  std::vector<std::byte> buf(sizeof parent + n * sizeof(int32_t));
  std::memcpy(buf.data(), &parent, sizeof parent);
  if (n > 0) std::memcpy(buf.data() + sizeof parent, tokens, n * sizeof(int32_t));
  return airs::hash_bytes(buf.data(), buf.size(), 0);
}
