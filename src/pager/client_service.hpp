// SPDX-License-Identifier: Apache-2.0
// The pager's clients: processes that map a model's region and must never
// read a byte the region does not hold yet.
//   - Lazy clients registered the region MISSING|MINOR on their own
//     userfaultfd and sent the daemon a copy (attach): their faults are read
//     here and handed to the pager (TouchListener::fault), which answers
//     each with a CONTINUE, a wait for the unit's read, or a poison.
//   - Cooperative clients map the region PROT_NONE and open each unit
//     themselves once the status page says it is ready (the touch guard);
//     they send what they touch on a request socket (follow): a unit they
//     wait for, or a streamed unit they just opened. For a streamed model
//     the daemon asks them on the same socket to close a unit again
//     (PROT_NONE) before it is dropped, and they answer when they have.
//   - Expert hints (wire/hints.hpp): a client of a streamed mixture of
//     experts says which experts of a layer it reads next. A cooperative
//     client sends them on its request socket; a lazy client, whose uffd
//     carries nothing the other way, on a hint socket of its own (hints():
//     one-way, SOCK_SEQPACKET). Each is checked here (its form) and by the
//     listener (its meaning); one that is wrong is ignored, with a log line
//     per client at most once a second, and counted.
// Faults and messages are read on the daemon's loop; a client that errs
// (a dead process, a broken socket, a uffd that fails) is dropped once.
//
// Each model's ClientSet is the one record of who maps it. Loop thread only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pager/fill_engine.hpp"
#include "pager/latency.hpp"
#include "sys/event_loop.hpp"
#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::pager {

using ClientKey = uint64_t;
using Clock = std::chrono::steady_clock;

// What a cooperative client's message says (the request socket's wire
// format: one 4-byte word per message, host order; the top two bits are
// the kind, the rest the unit).
enum class Touch : uint8_t {
  Fault,    // a lazy client's page fault (it waits for the unit)
  Request,  // a cooperative client waits for the unit
  // ... and asks for it again while it waits (the unit was read and dropped
  // before it opened it, or its first ask was lost): the unit is read if it
  // is gone and kept if it is going, but this is not another touch to count
  RequestAgain,
  Opened,   // a cooperative client opened a ready unit of a streamed model it had waited for
  OpenedIn, // ... one it had not waited for: it was in (a hit, which access sampling makes seen)
};

class TouchListener {
 public:
  virtual ~TouchListener() = default;
  // A client touched `unit` (a fault at `address`, 0 for cooperative
  // messages). Answer faults with ClientService::answer/wait/poison.
  virtual void touched(ModelId id, ClientKey key, uint32_t unit, Touch how, uint64_t address, Clock::time_point t0) = 0;
  // A cooperative client closed `unit` (PROT_NONE) as asked.
  virtual void closed(ModelId id, ClientKey key, uint32_t unit) = 0;
  // A client is gone (exited, detached, its socket or uffd failed).
  virtual void client_left(ModelId id, ClientKey key) = 0;
  // After a batch of touches (the pager issues reads here).
  virtual void touches_done() = 0;
  // Client `key` will read `experts` (distinct, as sent) of `layer` next
  // (an expert hint, well formed), or (`predicted`) guesses it may. Returns
  // nullopt when taken, else why it is refused (logged by the caller,
  // rate-limited).
  virtual std::optional<std::string> hinted(ModelId id, ClientKey key, uint32_t layer,
                                            std::span<const uint32_t> experts, bool predicted) = 0;
};

// Expert hints of one model's clients, since it was loaded.
struct HintStats {
  uint64_t taken = 0;
  uint64_t predictions = 0;  // of those taken, predictions (wire/hints.hpp)
  uint64_t refused = 0;  // malformed or meaningless (ignored)
};

struct ClientModelInfo {
  std::string name;
  uint64_t unit = 0;          // fill unit
  uint64_t mapping_page = 0;  // the page a client's mapping uses (huge page on hugetlbfs, base page on shmem)
  uint64_t region_size = 0;
  uint32_t units = 0;
  bool uffd_clients = true;  // false: cooperative mode (no attach)
};

class ClientService {
 public:
  ClientService(sys::EventLoop& loop, TouchListener& listener);
  ~ClientService();
  ClientService(const ClientService&) = delete;
  ClientService& operator=(const ClientService&) = delete;

  void add_model(ModelId id, ClientModelInfo info);
  // Wakes every lazy client's whole range (a truncated region then gives
  // them SIGBUS) and forgets every client of the model.
  void remove_model(ModelId id);

  // A lazy client: see Pager::attach. `map_now(first, count)` ranges of
  // units to CONTINUE at once (every ready unit that may be premapped).
  [[nodiscard]] Status attach(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd uffd, sys::UniqueFd notify,
                              uint64_t addr, uint64_t length,
                              const std::vector<std::pair<uint32_t, uint32_t>>& map_now, bool resident);
  // A cooperative client's request socket and open-unit bits: see Pager::follow.
  [[nodiscard]] Status follow(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd requests, sys::UniqueFd opened);
  // A lazy client's expert hints (see Pager::hints): `socket` is one end
  // of a SOCK_SEQPACKET pair the client made; it only sends. Goes with the
  // process, its socket or detach(key). Errors: ENOENT model, EBADF not a
  // connected SOCK_SEQPACKET socket, ESRCH process gone, EEXIST key.
  [[nodiscard]] Status hints(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd socket);
  void detach(ModelId id, ClientKey key, const char* why);

  // --- answers (loop thread, from TouchListener::touched or a read's end) ---
  // CONTINUE units [first, first+count) into every lazy client (or only
  // `key`), waking waiters; `fault`: the faulting address when answering
  // one fault (its page is mapped by itself too when the unit was partly
  // mapped). Clients that are gone are dropped.
  void map(ModelId id, uint32_t first, uint32_t count);
  void answer(ModelId id, ClientKey key, uint32_t unit, uint64_t fault, Clock::time_point t0);
  // The client waits for `unit` (a fault on a unit not ready yet).
  void wait(ModelId id, ClientKey key, uint32_t unit, Clock::time_point t0);
  // Every lazy client waiting for `unit` is answered (CONTINUE), each only
  // once; returns how many clients waited.
  uint32_t release_waiters(ModelId id, uint32_t unit);
  // Every client waiting for `unit`, and `key` if given, gets SIGBUS.
  void poison(ModelId id, uint32_t unit, ClientKey key = 0);
  [[nodiscard]] bool anyone_waits(ModelId id) const;
  [[nodiscard]] bool waits_for(ModelId id, uint32_t unit) const;
  [[nodiscard]] size_t waiting_units(ModelId id) const;
  // The model is resident: every lazy client may unregister.
  void notify_resident(ModelId id);
  // Streamed models, once `unit`'s READY bit is clear: the cooperative
  // clients that have it open (wire/opened.hpp) are asked to close it and
  // answer. Returns those (empty: nobody can read it any more).
  std::set<ClientKey> ask_to_close(ModelId id, uint32_t unit);
  // True while client `key` has `unit` open.
  [[nodiscard]] bool holds_open(ModelId id, ClientKey key, uint32_t unit) const;
  // Client `key` did not close `unit` in time. Past `quota` such units it is
  // cut off: its process gets SIGBUS (it may read nothing the daemon drops
  // later, and nothing else it is told could stop it) and it is dropped.
  void refused(ModelId id, ClientKey key, uint32_t unit, uint32_t quota);
  // Wakes the whole range of every lazy client (a fault left asleep on a
  // unit that was dropped retries).
  void wake_all(ModelId id);

  // The bytes of the region a fault of lazy client `key` at `address` may
  // be in: its faulting page (the kernel reports the page, not the byte),
  // as [first, end) offsets. nullopt for an unknown client or address.
  [[nodiscard]] std::optional<std::pair<uint64_t, uint64_t>> fault_bytes(ModelId id, ClientKey key,
                                                                         uint64_t address) const;

  [[nodiscard]] uint32_t lazy_clients(ModelId id) const;
  [[nodiscard]] uint32_t cooperative_clients(ModelId id) const;
  [[nodiscard]] LatencyStats latency(ModelId id) const;
  [[nodiscard]] HintStats hint_stats(ModelId id) const;

  // At most one refused-hint line per client and this interval.
  static constexpr std::chrono::seconds kHintLogInterval{1};

 private:
  struct Lazy;
  struct Follower;
  struct Hinter;
  // A client's refused hints, for its rate-limited log line.
  struct HintLog {
    Clock::time_point next{};
    uint64_t quiet = 0;  // refused since the last line
  };
  struct Waiter {
    ClientKey key;
    Clock::time_point since;
  };
  struct ClientSet {
    ClientModelInfo info;
    std::map<ClientKey, std::unique_ptr<Lazy>> lazy;
    std::map<ClientKey, std::unique_ptr<Follower>> followers;
    std::map<ClientKey, std::unique_ptr<Hinter>> hinters;
    std::map<uint32_t, std::vector<Waiter>> waiting;
    LatencyStats latency;
    HintStats hints;
  };
  ClientSet* find(ModelId id);
  const ClientSet* find(ModelId id) const;
  void on_uffd(ModelId id, ClientKey key, uint32_t events);
  void on_requests(ModelId id, ClientKey key, uint32_t events);
  void on_hints(ModelId id, ClientKey key, uint32_t events);
  // What both client sockets share: up to 256 messages per wake-up (one
  // client cannot hold the loop), each handed to `take`. `socket` finds the
  // client's socket before each read (-1: the model or the client went,
  // then this returns at once). Anything but a message or "nothing now"
  // (EOF, a reset or unconnected socket, an error event) ends the client:
  // the loop never spins on a dead socket.
  void read_messages(ModelId id, ClientKey key, uint32_t events, const std::function<int()>& socket,
                     const std::function<void(const std::byte* msg, size_t len)>& take);
  // One message that is not a request word: decoded, checked, handed to
  // the listener; a refusal is counted and logged (rate-limited). Callers
  // look the model and the client up again after it.
  void take_hint(ModelId id, ClientKey key, const std::byte* msg, size_t len);
  void refuse_hint(ModelId id, ClientKey key, const std::string& why);
  bool continue_range(ClientSet& s, Lazy& c, uint32_t first, uint32_t count, uint64_t fault = 0);
  void poison_one(ClientSet& s, Lazy& c, uint32_t unit);
  Status map_units(ClientSet& s, Lazy& c, const std::vector<std::pair<uint32_t, uint32_t>>& ranges);
  void drop(ModelId id, ClientKey key, const char* why);

  sys::EventLoop& loop_;
  TouchListener& listener_;
  std::map<ModelId, ClientSet> models_;
};

}  // namespace airs::pager
