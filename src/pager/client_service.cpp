// SPDX-License-Identifier: Apache-2.0
#include "pager/client_service.hpp"

#include <linux/userfaultfd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include <spdlog/spdlog.h>

#include "sys/proc_handles.hpp"
#include "sys/uffd.hpp"
#include "util/units.hpp"
#include "sys/files.hpp"
#include "wire/hints.hpp"
#include "wire/opened.hpp"
#include "wire/requests.hpp"

namespace airs::pager {

struct ClientService::Lazy {
  ClientKey key = 0;
  pid_t pid = 0;
  sys::UniqueFd uffd;
  sys::UniqueFd pidfd;
  sys::UniqueFd notify;
  uint64_t addr = 0;
  uint64_t len = 0;
  // Told the model is resident: from then on it may drop its registration
  // (libairs does), and a CONTINUE that finds none is no sign it left.
  bool told_resident = false;
};

struct ClientService::Follower {
  sys::UniqueFd socket;
  sys::UniqueFd pidfd;
  sys::Mapping opened_map;  // the client's open-unit bits, read-only here
  wire::OpenedBits opened;
  std::set<uint32_t> asked;    // units asked to close, not answered yet
  std::set<uint32_t> refused;  // units it did not close in time
  std::set<uint32_t> waited;   // units it waited for and has not opened since
  HintLog hint_log;
};

// A lazy client's hint socket: it only sends (hints), the daemon only reads.
struct ClientService::Hinter {
  sys::UniqueFd socket;
  sys::UniqueFd pidfd;
  HintLog hint_log;
};

ClientService::ClientService(sys::EventLoop& loop, TouchListener& listener) : loop_(loop), listener_(listener) {}

ClientService::~ClientService() {
  for (auto& [id, s] : models_) {
    for (auto& [key, c] : s.lazy) {
      loop_.remove(c->uffd.get());
      loop_.remove(c->pidfd.get());
    }
    for (auto& [key, f] : s.followers) {
      loop_.remove(f->socket.get());
      loop_.remove(f->pidfd.get());
    }
    for (auto& [key, h] : s.hinters) {
      loop_.remove(h->socket.get());
      loop_.remove(h->pidfd.get());
    }
  }
}

ClientService::ClientSet* ClientService::find(ModelId id) {
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : &it->second;
}

const ClientService::ClientSet* ClientService::find(ModelId id) const {
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : &it->second;
}

void ClientService::add_model(ModelId id, ClientModelInfo info) { models_[id].info = std::move(info); }

void ClientService::remove_model(ModelId id) {
  ClientSet* s = find(id);
  if (s == nullptr) return;
  // Threads blocked in a fault of a lazy client (waiting for a unit that
  // will never be read now) retry once woken: past a truncated region's
  // end, SIGBUS.
  for (auto& [key, c] : s->lazy) (void)sys::uffd_wake(c->uffd.get(), c->addr, c->len);
  std::vector<ClientKey> keys;
  for (auto& [key, c] : s->lazy) keys.push_back(key);
  for (auto& [key, f] : s->followers) keys.push_back(key);
  for (auto& [key, h] : s->hinters) keys.push_back(key);
  for (ClientKey k : keys) drop(id, k, "model unloaded");
  models_.erase(id);
}

Status ClientService::attach(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd uffd, sys::UniqueFd notify,
                             uint64_t addr, uint64_t length,
                             const std::vector<std::pair<uint32_t, uint32_t>>& map_now, bool resident) {
  ClientSet* s = find(id);
  if (s == nullptr) return make_error(ENOENT, "attach: no model {}", id);
  const ClientModelInfo& m = s->info;
  if (!m.uffd_clients)
    return make_error(ENOTSUP, "model '{}': the daemon runs in cooperative mode (no userfaultfd); map the region "
                               "read-only and wait for each rank on the status page",
                      m.name);
  if (s->lazy.contains(key) || s->followers.contains(key) || s->hinters.contains(key))
    return make_error(EEXIST, "model '{}': client {} is already attached", m.name, key);
  // Units are counted from the client's base address; the kernel aligns a
  // hugetlbfs mapping to its page, a shmem one only to the base page (and
  // CONTINUE needs no more).
  // Below the top of the user address space, whole: a range that wraps
  // would make every later fault look inside it.
  constexpr uint64_t kUserTop = uint64_t{1} << 56;
  if (addr >= kUserTop || length > kUserTop - addr)
    return make_error(EINVAL, "model '{}': client {} registered [{:#x}, +{}), which is not a user address range",
                      m.name, key, addr, length);
  if (length != m.region_size || addr % m.mapping_page != 0)
    return make_error(EINVAL, "model '{}': client {} registered [{:#x}, +{}), expected the whole {}-byte region at a "
                              "{}-aligned address",
                      m.name, key, addr, length, m.region_size, format_bytes(m.mapping_page));
  if (!sys::is_userfaultfd(uffd.get()))
    return make_error(EBADF, "model '{}': client {} sent an fd that is not a userfaultfd", m.name, key);
  // Written with write(2) when the model is resident: an eventfd, never a
  // pipe or a socket (a pipe with no reader would raise SIGPIPE).
  if (notify && !sys::is_eventfd(notify.get()))
    return make_error(EINVAL, "model '{}': client {} sent a notify fd that is not an eventfd", m.name, key);
  if (sys::uffd_without_api(uffd.get()))
    return make_error(EINVAL,
                      "model '{}': client {} sent a userfaultfd that never had its UFFDIO_API handshake; create it "
                      "with the features OpenLazy named, register the region, then Attach",
                      m.name, key);
  AIRS_TRY(sys::set_nonblocking(uffd.get()));
  auto pidfd = sys::pidfd_open(pid);
  if (!pidfd)
    return make_error(ESRCH, "model '{}': client {} (pid {}) is gone: {}", m.name, key, pid, pidfd.error().message);
  auto c = std::make_unique<Lazy>();
  c->key = key;
  c->pid = pid;
  c->uffd = std::move(uffd);
  c->pidfd = std::move(pidfd).value();
  c->notify = std::move(notify);
  c->addr = addr;
  c->len = length;
  AIRS_TRY(map_units(*s, *c, map_now));
  const int ufd = c->uffd.get();
  const int pfd = c->pidfd.get();
  AIRS_TRY(loop_.add(ufd, EPOLLIN, [this, id, key](uint32_t ev) { on_uffd(id, key, ev); }));
  if (auto st = loop_.add(pfd, EPOLLIN, [this, id, key](uint32_t) { detach(id, key, "exited"); }); !st) {
    loop_.remove(ufd);
    return st;
  }
  if (resident && c->notify) {
    c->told_resident = true;
    (void)sys::eventfd_signal(c->notify.get());
  }
  s->lazy.emplace(key, std::move(c));
  // Faults raised before we watched the uffd are waiting in it.
  on_uffd(id, key, EPOLLIN);
  return {};
}

// Every range at once, one range CONTINUE each.
Status ClientService::map_units(ClientSet& s, Lazy& c, const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  for (const auto& [first, count] : ranges) {
    auto r = sys::uffd_continue(c.uffd.get(), c.addr + uint64_t{first} * s.info.unit, uint64_t{count} * s.info.unit,
                                s.info.unit);
    if (!r) return make_error(r.error().code, "model '{}': client {}: {}", s.info.name, c.key, r.error().message);
    if (r->owner_gone) return make_error(ESRCH, "model '{}': client {} (pid {}) is gone", s.info.name, c.key, c.pid);
  }
  return {};
}

Status ClientService::follow(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd requests, sys::UniqueFd opened) {
  ClientSet* s = find(id);
  if (s == nullptr) return make_error(ENOENT, "follow: no model {}", id);
  const std::string what = "model '" + s->info.name + "'";
  if (s->followers.contains(key) || s->lazy.contains(key) || s->hinters.contains(key))
    return make_error(EEXIST, "{}: client {} already follows it", what, key);
  AIRS_TRY(sys::check_message_socket(requests.get(), what + ": the request fd"));
  // Sealed against shrinking: the daemon reads it, and a client that
  // truncated it under us must not crash the daemon.
  auto bits = sys::map_sealed_read_only(opened.get(), wire::opened_bytes(s->info.units),
                                        what + ": the open-unit bits");
  if (!bits) return std::move(bits).error();
  auto pidfd = sys::pidfd_open(pid);
  if (!pidfd) return make_error(ESRCH, "{}: client {} (pid {}) is gone: {}", what, key, pid, pidfd.error().message);
  AIRS_TRY(sys::set_nonblocking(requests.get()));
  auto f = std::make_unique<Follower>();
  f->socket = std::move(requests);
  f->pidfd = std::move(pidfd).value();
  f->opened_map = std::move(bits).value();
  f->opened = wire::OpenedBits(f->opened_map.get(), s->info.units);
  const int sfd = f->socket.get();
  const int pfd = f->pidfd.get();
  AIRS_TRY(loop_.add(sfd, EPOLLIN, [this, id, key](uint32_t ev) { on_requests(id, key, ev); }));
  if (auto st = loop_.add(pfd, EPOLLIN, [this, id, key](uint32_t) { detach(id, key, "exited"); }); !st) {
    loop_.remove(sfd);
    return st;
  }
  s->followers.emplace(key, std::move(f));
  return {};
}

Status ClientService::hints(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd socket) {
  ClientSet* s = find(id);
  if (s == nullptr) return make_error(ENOENT, "hints: no model {}", id);
  const std::string what = "model '" + s->info.name + "'";
  if (s->followers.contains(key) || s->lazy.contains(key) || s->hinters.contains(key))
    return make_error(EEXIST, "{}: client {} is already attached", what, key);
  AIRS_TRY(sys::check_message_socket(socket.get(), what + ": the hint socket"));
  auto pidfd = sys::pidfd_open(pid);
  if (!pidfd) return make_error(ESRCH, "{}: client {} (pid {}) is gone: {}", what, key, pid, pidfd.error().message);
  AIRS_TRY(sys::set_nonblocking(socket.get()));
  auto h = std::make_unique<Hinter>();
  h->socket = std::move(socket);
  h->pidfd = std::move(pidfd).value();
  const int sfd = h->socket.get();
  const int pfd = h->pidfd.get();
  AIRS_TRY(loop_.add(sfd, EPOLLIN, [this, id, key](uint32_t ev) { on_hints(id, key, ev); }));
  if (auto st = loop_.add(pfd, EPOLLIN, [this, id, key](uint32_t) { detach(id, key, "exited"); }); !st) {
    loop_.remove(sfd);
    return st;
  }
  s->hinters.emplace(key, std::move(h));
  return {};
}

void ClientService::detach(ModelId id, ClientKey key, const char* why) {
  if (find(id) == nullptr) return;
  drop(id, key, why);
}

void ClientService::drop(ModelId id, ClientKey key, const char* why) {
  ClientSet* s = find(id);
  if (s == nullptr) return;
  if (auto f = s->followers.find(key); f != s->followers.end()) {
    loop_.remove(f->second->socket.get());
    loop_.remove(f->second->pidfd.get());
    spdlog::debug("model '{}': request socket {} {}", s->info.name, key, why);
    s->followers.erase(f);
    listener_.client_left(id, key);
    return;
  }
  if (auto h = s->hinters.find(key); h != s->hinters.end()) {
    loop_.remove(h->second->socket.get());
    loop_.remove(h->second->pidfd.get());
    spdlog::debug("model '{}': hint socket {} {}", s->info.name, key, why);
    s->hinters.erase(h);
    listener_.client_left(id, key);
    return;
  }
  auto it = s->lazy.find(key);
  if (it == s->lazy.end()) return;
  loop_.remove(it->second->uffd.get());
  loop_.remove(it->second->pidfd.get());
  for (auto w = s->waiting.begin(); w != s->waiting.end();) {
    auto& v = w->second;
    v.erase(std::remove_if(v.begin(), v.end(), [key](const Waiter& x) { return x.key == key; }), v.end());
    w = v.empty() ? s->waiting.erase(w) : std::next(w);
  }
  spdlog::debug("model '{}': client {} (pid {}) {}", s->info.name, key, it->second->pid, why);
  s->lazy.erase(it);
  listener_.client_left(id, key);
}

namespace {
// The socket of client `key` among `clients` (followers or hinters), -1 once it is gone.
template <typename Clients>
int socket_in(const Clients& clients, ClientKey key) {
  auto it = clients.find(key);
  return it == clients.end() ? -1 : it->second->socket.get();
}
}  // namespace

void ClientService::read_messages(ModelId id, ClientKey key, uint32_t events, const std::function<int()>& socket,
                                  const std::function<void(const std::byte*, size_t)>& take) {
  const char* gone = nullptr;
  int n_read = 0;
  for (; n_read < 256; ++n_read) {
    const int fd = socket();
    if (fd < 0) return;  // the last message's handling dropped the model or this client
    // A request word, or an expert hint (longer): one byte more than the
    // longest hint, so a message cut at the buffer's end is seen as too long.
    alignas(uint32_t) std::byte buf[wire::kMaxHintBytes + 4];
    const auto r = sys::read_message(fd, buf, sizeof buf);
    if (r.state == sys::MessageRead::Again) break;
    if (r.state == sys::MessageRead::Closed) {
      gone = "closed by the client";
      break;
    }
    if (r.state == sys::MessageRead::Failed) {
      gone = "failed";
      break;
    }
    take(buf, r.bytes);
  }
  if (gone == nullptr && n_read == 0 && (events & (EPOLLHUP | EPOLLERR)) != 0) gone = "hung up";
  if (gone != nullptr) drop(id, key, gone);
  listener_.touches_done();
}

// A cooperative client's request socket: one record per message
// (SOCK_SEQPACKET keeps the boundaries), a request word or an expert hint.
void ClientService::on_requests(ModelId id, ClientKey key, uint32_t events) {
  const auto t0 = Clock::now();
  const auto socket = [this, id, key] {
    const ClientSet* s = find(id);
    return s == nullptr ? -1 : socket_in(s->followers, key);
  };
  read_messages(id, key, events, socket, [&](const std::byte* msg, size_t len) {
    if (len != sizeof(uint32_t)) return take_hint(id, key, msg, len);
    ClientSet* s = find(id);
    if (s == nullptr) return;
    uint32_t word = 0;
    std::memcpy(&word, msg, sizeof word);
    const auto req = wire::decode_request(word);
    if (req.unit >= s->info.units) return;
    switch (req.kind) {
      case wire::RequestKind::Wait: {
        const auto f = s->followers.find(key);
        const bool again = f != s->followers.end() && !f->second->waited.insert(req.unit).second;
        listener_.touched(id, key, req.unit, again ? Touch::RequestAgain : Touch::Request, 0, t0);
        break;
      }
      case wire::RequestKind::Opened: {
        const auto f = s->followers.find(key);
        const bool waited = f != s->followers.end() && f->second->waited.erase(req.unit) != 0;
        listener_.touched(id, key, req.unit, waited ? Touch::Opened : Touch::OpenedIn, 0, t0);
        break;
      }
      case wire::RequestKind::Closed:
        if (auto f = s->followers.find(key); f != s->followers.end() && f->second->asked.erase(req.unit) != 0)
          listener_.closed(id, key, req.unit);
        break;
      case wire::RequestKind::Close:
        break;  // the daemon's own message kind: a client cannot send it
    }
  });
}

// A lazy client's hint socket: hints only (the rest wait in the socket,
// whose buffer bounds what a flood costs).
void ClientService::on_hints(ModelId id, ClientKey key, uint32_t events) {
  const auto socket = [this, id, key] {
    const ClientSet* s = find(id);
    return s == nullptr ? -1 : socket_in(s->hinters, key);
  };
  read_messages(id, key, events, socket, [&](const std::byte* msg, size_t len) { take_hint(id, key, msg, len); });
}

void ClientService::take_hint(ModelId id, ClientKey key, const std::byte* msg, size_t len) {
  const wire::DecodedHint h = wire::decode_hint(msg, len);
  if (h.error != nullptr) return refuse_hint(id, key, fmt::format("a malformed hint of {} bytes: {}", len, h.error));
  auto why = listener_.hinted(id, key, h.layer, std::span<const uint32_t>(h.experts, h.count), h.predicted);
  ClientSet* s = find(id);
  if (s == nullptr) return;
  if (why) return refuse_hint(id, key, *why);
  ++s->hints.taken;
  if (h.predicted) ++s->hints.predictions;
}

void ClientService::refuse_hint(ModelId id, ClientKey key, const std::string& why) {
  ClientSet* s = find(id);
  if (s == nullptr) return;
  ++s->hints.refused;
  HintLog* log = nullptr;
  if (auto f = s->followers.find(key); f != s->followers.end()) log = &f->second->hint_log;
  if (auto h = s->hinters.find(key); h != s->hinters.end()) log = &h->second->hint_log;
  if (log == nullptr) return;
  const auto now = Clock::now();
  if (now < log->next) {
    ++log->quiet;
    return;
  }
  if (log->quiet > 0)
    spdlog::warn("model '{}': client {}: expert hint ignored: {} ({} more ignored since the last line)", s->info.name,
                 key, why, log->quiet);
  else
    spdlog::warn("model '{}': client {}: expert hint ignored: {}", s->info.name, key, why);
  log->quiet = 0;
  log->next = now + kHintLogInterval;
}

HintStats ClientService::hint_stats(ModelId id) const {
  const ClientSet* s = find(id);
  return s == nullptr ? HintStats{} : s->hints;
}

void ClientService::on_uffd(ModelId id, ClientKey key, uint32_t events) {
  ClientSet* s = find(id);
  if (s == nullptr) return;
  auto it = s->lazy.find(key);
  if (it == s->lazy.end()) return;
  std::vector<uffd_msg> msgs;
  if (auto st = sys::uffd_read_events(it->second->uffd.get(), msgs); !st) {
    // A uffd that fails a read once fails it for ever (EPOLLERR would wake
    // the loop for ever): the client is dropped, with one line.
    spdlog::warn("model '{}': client {}: {}; detaching it", s->info.name, key, st.error().message);
    drop(id, key, "failed");
    return;
  }
  if (msgs.empty() && (events & EPOLLERR) != 0) {
    spdlog::warn("model '{}': client {}: its userfaultfd reports an error; detaching it", s->info.name, key);
    drop(id, key, "failed");
    return;
  }
  const auto t0 = Clock::now();
  for (const uffd_msg& msg : msgs) {
    if (msg.event != UFFD_EVENT_PAGEFAULT) continue;
    s = find(id);  // a previous fault may have dropped the model or the client
    if (s == nullptr) return;
    auto c = s->lazy.find(key);
    if (c == s->lazy.end()) break;
    const uint64_t address = msg.arg.pagefault.address;
    ++s->latency.faults;
    if (address < c->second->addr || address >= c->second->addr + c->second->len) continue;
    const auto unit = static_cast<uint32_t>((address - c->second->addr) / s->info.unit);
    if (unit >= s->info.units) continue;
    listener_.touched(id, key, unit, Touch::Fault, address, t0);
  }
  listener_.touches_done();
}

void ClientService::answer(ModelId id, ClientKey key, uint32_t unit, uint64_t fault, Clock::time_point t0) {
  ClientSet* s = find(id);
  if (s == nullptr) return;
  auto it = s->lazy.find(key);
  if (it == s->lazy.end()) return;
  if (!continue_range(*s, *it->second, unit, 1, fault)) return drop(id, key, "gone");
  s->latency.ready.add(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count()));
}

void ClientService::wait(ModelId id, ClientKey key, uint32_t unit, Clock::time_point t0) {
  ClientSet* s = find(id);
  if (s == nullptr) return;
  ++s->latency.faults_waited;
  if (!s->lazy.contains(key)) {
    ++s->latency.faults;  // a cooperative request: the client waits on the status page
    return;
  }
  auto& v = s->waiting[unit];
  // Duplicate events (signals replay faults, threads share a page): one
  // entry per client is enough, the CONTINUE wakes every thread.
  if (std::none_of(v.begin(), v.end(), [&](const Waiter& w) { return w.key == key; })) v.push_back({key, t0});
}

bool ClientService::anyone_waits(ModelId id) const {
  const ClientSet* s = find(id);
  return s != nullptr && !s->waiting.empty();
}

bool ClientService::waits_for(ModelId id, uint32_t unit) const {
  const ClientSet* s = find(id);
  return s != nullptr && s->waiting.contains(unit);
}

size_t ClientService::waiting_units(ModelId id) const {
  const ClientSet* s = find(id);
  return s == nullptr ? 0 : s->waiting.size();
}

uint32_t ClientService::release_waiters(ModelId id, uint32_t unit) {
  ClientSet* s = find(id);
  if (s == nullptr) return 0;
  auto it = s->waiting.find(unit);
  if (it == s->waiting.end()) return 0;
  const auto waiters = std::move(it->second);
  s->waiting.erase(it);
  const auto now = Clock::now();
  std::vector<ClientKey> gone;
  for (const Waiter& w : waiters) {
    s->latency.waited.add(
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(now - w.since).count()));
    auto c = s->lazy.find(w.key);
    if (c != s->lazy.end() && !continue_range(*s, *c->second, unit, 1)) gone.push_back(w.key);
  }
  for (ClientKey k : gone) drop(id, k, "gone");
  return static_cast<uint32_t>(waiters.size());
}

void ClientService::map(ModelId id, uint32_t first, uint32_t count) {
  ClientSet* s = find(id);
  if (s == nullptr) return;
  std::vector<ClientKey> gone;
  for (auto& [key, c] : s->lazy)
    if (!continue_range(*s, *c, first, count)) gone.push_back(key);
  for (ClientKey k : gone) drop(id, k, "gone");
  // Their waits are answered by the CONTINUE above (it wakes the range).
  s = find(id);
  if (s == nullptr) return;
  const auto now = Clock::now();
  for (uint32_t u = first; u < first + count; ++u) {
    auto it = s->waiting.find(u);
    if (it == s->waiting.end()) continue;
    for (const Waiter& w : it->second)
      s->latency.waited.add(
          static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(now - w.since).count()));
    s->waiting.erase(it);
  }
}

void ClientService::poison(ModelId id, uint32_t unit, ClientKey key) {
  ClientSet* s = find(id);
  if (s == nullptr) return;
  std::vector<ClientKey> keys;
  if (auto it = s->waiting.find(unit); it != s->waiting.end()) {
    for (const Waiter& w : it->second) keys.push_back(w.key);
    s->waiting.erase(it);
  }
  if (key != 0 && std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  for (ClientKey k : keys)
    if (auto c = s->lazy.find(k); c != s->lazy.end()) poison_one(*s, *c->second, unit);
}

void ClientService::poison_one(ClientSet& s, Lazy& c, uint32_t unit) {
  auto r = sys::uffd_poison_or_sigbus(c.uffd.get(), c.pidfd.get(), c.addr + uint64_t{unit} * s.info.unit,
                                      s.info.unit, s.info.unit);
  if (!r) spdlog::warn("model '{}': client {}: {}", s.info.name, c.key, r.error().message);
  else if (*r == sys::PoisonHow::Signalled)
    spdlog::warn("model '{}': no UFFDIO_POISON in this kernel (before 6.6): SIGBUS sent to client {} (pid {}) "
                 "as a whole",
                 s.info.name, c.key, c.pid);
}

void ClientService::notify_resident(ModelId id) {
  ClientSet* s = find(id);
  if (s == nullptr) return;
  for (auto& [key, c] : s->lazy) {
    c->told_resident = true;
    if (c->notify) (void)sys::eventfd_signal(c->notify.get());
  }
}

std::set<ClientKey> ClientService::ask_to_close(ModelId id, uint32_t unit) {
  std::set<ClientKey> asked;
  ClientSet* s = find(id);
  if (s == nullptr) return asked;
  // The caller cleared the unit's READY bit: from here on a client that
  // sets its open bit sees that and backs off (wire/opened.hpp).
  wire::OpenedBits::fence();
  const uint32_t word = wire::encode_request({wire::RequestKind::Close, unit});
  std::vector<ClientKey> gone;
  for (auto& [key, f] : s->followers) {
    if (!f->opened.test(unit)) continue;
    // A full socket (a client that stopped reading) or a dead one: that
    // client is dropped; its touch guard then maps the file in place of
    // the region (a daemon it cannot reach is a dead daemon to it).
    if (!sys::send_message(f->socket.get(), &word, sizeof word)) {
      gone.push_back(key);
      continue;
    }
    f->asked.insert(unit);
    asked.insert(key);
  }
  for (ClientKey k : gone) {
    asked.erase(k);
    drop(id, k, "does not take messages");
  }
  return asked;
}

bool ClientService::holds_open(ModelId id, ClientKey key, uint32_t unit) const {
  const ClientSet* s = find(id);
  if (s == nullptr) return false;
  auto it = s->followers.find(key);
  return it != s->followers.end() && it->second->opened.test(unit);
}

void ClientService::refused(ModelId id, ClientKey key, uint32_t unit, uint32_t quota) {
  ClientSet* s = find(id);
  if (s == nullptr) return;
  auto it = s->followers.find(key);
  if (it == s->followers.end()) return;
  Follower& f = *it->second;
  f.asked.erase(unit);
  f.refused.insert(unit);
  // Units it closed later are off its count.
  for (auto r = f.refused.begin(); r != f.refused.end();) r = f.opened.test(*r) ? std::next(r) : f.refused.erase(r);
  if (f.refused.size() <= quota) return;
  spdlog::warn("model '{}': client {} kept {} units open after being asked to close them (quota {}); it gets SIGBUS "
               "and is cut off",
               s->info.name, key, f.refused.size(), quota);
  if (auto st = sys::pidfd_signal(f.pidfd.get(), SIGBUS); !st)
    spdlog::warn("model '{}': client {}: {}", s->info.name, key, st.error().message);
  drop(id, key, "cut off");
}

void ClientService::wake_all(ModelId id) {
  ClientSet* s = find(id);
  if (s == nullptr) return;
  for (auto& [key, c] : s->lazy) (void)sys::uffd_wake(c->uffd.get(), c->addr, c->len);
}

std::optional<std::pair<uint64_t, uint64_t>> ClientService::fault_bytes(ModelId id, ClientKey key,
                                                                        uint64_t address) const {
  const ClientSet* s = find(id);
  if (s == nullptr) return std::nullopt;
  auto c = s->lazy.find(key);
  if (c == s->lazy.end() || address < c->second->addr || address >= c->second->addr + c->second->len)
    return std::nullopt;
  const uint64_t page = std::max<uint64_t>(s->info.mapping_page, 1);
  const uint64_t first = (address - c->second->addr) / page * page;
  return std::make_pair(first, first + page);
}

uint32_t ClientService::lazy_clients(ModelId id) const {
  const ClientSet* s = find(id);
  return s == nullptr ? 0 : static_cast<uint32_t>(s->lazy.size());
}

uint32_t ClientService::cooperative_clients(ModelId id) const {
  const ClientSet* s = find(id);
  return s == nullptr ? 0 : static_cast<uint32_t>(s->followers.size());
}

LatencyStats ClientService::latency(ModelId id) const {
  const ClientSet* s = find(id);
  return s == nullptr ? LatencyStats{} : s->latency;
}

bool ClientService::continue_range(ClientSet& s, Lazy& c, uint32_t first, uint32_t count, uint64_t fault) {
  const uint64_t addr = c.addr + uint64_t{first} * s.info.unit;
  const uint64_t len = uint64_t{count} * s.info.unit;
  // A fault on a unit that is ready: usually a duplicate (two threads, a
  // replayed signal), but on shmem the unit may be partly mapped (the
  // client dropped part of its entries): then its faulting page is mapped
  // by itself too, or the client would fault on it for ever.
  auto r = fault != 0 && count == 1 ? sys::uffd_continue_fault(c.uffd.get(), addr, len, fault, s.info.mapping_page)
                                    : sys::uffd_continue(c.uffd.get(), addr, len, s.info.unit);
  if (!r) {
    // ENOENT/EINVAL: the client unmapped or unregistered the range; it no
    // longer takes our answers (once the model is resident, that is
    // libairs dropping its registration). The thread that raised this
    // fault may still sleep on it: the kernel's unregistration can miss a
    // fault queued under the per-VMA lock (6.6+), and a client whose range
    // was replaced is not woken at all. The wake needs no registration;
    // the thread then faults again, on whatever maps the range now
    // (docs/kernel-facts.md).
    (void)sys::uffd_wake(c.uffd.get(), addr, len);
    // Once told "resident" it unregisters as it was told it may, and a
    // fault it raised before that can still be read here afterwards (a
    // thread woken before it went to sleep takes its message off the queue
    // only once it runs again): it still maps the model and holds its
    // reference, so it stays counted and watched until it detaches or exits.
    if (r.error().code == ENOENT && c.told_resident) {
      spdlog::debug("model '{}': client {} (pid {}) dropped its registration after \"resident\"", s.info.name, c.key,
                    c.pid);
      return true;
    }
    if (r.error().code == ENOENT)
      spdlog::debug("model '{}': client {} (pid {}) unregistered; detaching it", s.info.name, c.key, c.pid);
    else
      spdlog::warn("model '{}': client {} (pid {}): {}; detaching it", s.info.name, c.key, c.pid, r.error().message);
    return false;
  }
  if (r->owner_gone) return false;
  // Already mapped (a duplicate fault, or two threads): a thread may still
  // sleep on the fault, so wake the range; harmless if none does.
  if (r->already_mapped_bytes > 0) (void)sys::uffd_wake(c.uffd.get(), addr, len);
  return true;
}

}  // namespace airs::pager
