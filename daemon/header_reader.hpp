// SPDX-License-Identifier: Apache-2.0
// GGUF headers read off the event loop. A header can be hundreds of MiB that
// take seconds to parse (a million tensors), or never arrive at all (a file
// on a FUSE or NFS mount whose read never returns): each is read on a thread
// of its own and its result posted back to the loop through an eventfd, so
// the loop never waits for one. A header whose read of the file has not
// returned within the stall limit is answered with an error naming the
// stall (a long parse is not a stall: only the time a read is in flight
// counts), and its thread is abandoned:
// the thread owns all it touches (its fd, the mailbox it posts to), so when
// its read returns, if ever, it touches nothing freed. A read cannot be
// cancelled, so every thread counts against its uid until it returns: at
// most kPerUid at once per uid and kTotal in all (callers exempt from quotas,
// admins and the daemon itself, are counted but never refused).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "gguf/gguf.hpp"
#include "sys/event_loop.hpp"
#include "sys/files.hpp"
#include "util/result.hpp"

namespace airs::daemon {

// What a load needs of the file before it touches the pool: its identity
// (the proof of read access and the key of a model already loaded), its
// stat (the content-id cache's key) and its parsed header.
struct Header {
  sys::FileId id;
  struct stat st {};
  gguf::File file;
  // The file reopened O_DIRECT for the fill's reads, or why that failed
  // (a file system that refuses O_DIRECT). Made with the header, off the
  // loop: an open through /proc/self/fd is an OPEN of the file system, which
  // a FUSE server may take forever to answer.
  sys::UniqueFd direct;
  std::optional<Error> direct_refused;
  // The file is not on a local file system (sys::reads_end_by_themselves):
  // a FUSE server or a network may hold its reads for ever, so the fill
  // never starts one in the loop's thread (ModelSpec::async_reads). Asked
  // of the file system with the header, off the loop, for the same reason.
  bool reads_may_hang = true;
};

// Reads `fd`'s identity and header here, blocking, and reopens it O_DIRECT
// if `reopen_direct` (models.direct_io is not off). Errors start with
// `what` ("LoadModel: gguf_fd"): EINVAL not a readable regular file,
// EBADMSG or ENOTSUP the header's defect. `read_since`, if given, holds when
// the read or open in flight started (FdSource::watch_reads).
[[nodiscard]] Result<Header> read_header(int fd, const std::string& what,
                                         std::atomic<int64_t>* read_since = nullptr, bool reopen_direct = true);

class HeaderReader {
 public:
  static constexpr uint32_t kPerUid = 2;
  static constexpr uint32_t kTotal = 16;
  using Done = std::function<void(Result<std::shared_ptr<const Header>>)>;
  struct Request {
    uid_t uid = 0;
    bool exempt = false;  // counted, never refused
    std::string caller;   // bus unique name; "" for the daemon's own
    std::string what;     // "LoadModel by uid 1000 (:1.42)": errors start with it
  };

  // `reopen_direct`: each read also reopens the file O_DIRECT (read_header).
  static Result<std::unique_ptr<HeaderReader>> create(sys::EventLoop& loop, std::chrono::milliseconds stall_limit,
                                                      bool reopen_direct = true);
  ~HeaderReader();
  HeaderReader(const HeaderReader&) = delete;
  HeaderReader& operator=(const HeaderReader&) = delete;

  // Starts reading the header of `fd` (duplicated) on a thread; `done` runs
  // on the loop once, with the header or the error (the file's, or ETIMEDOUT
  // after the stall limit). Errors at once, and `done` never runs: EDQUOT
  // the uid has kPerUid reads running, EBUSY kTotal run in all, EAGAIN no
  // thread. Loop thread.
  [[nodiscard]] Status read(Request r, int fd, Done done);
  // The same, waited for here at most the stall limit: for start-up, before
  // the loop serves anyone.
  [[nodiscard]] Result<Header> read_now(int fd, const std::string& what) const;
  // `name` left the bus: its reads are never answered (their threads still
  // count until they return).
  void caller_left(const std::string& name);
  // Every read of a bus caller is answered with `why` (ECANCELED) now: the
  // connection its reply would go on is going.
  void refuse_bus_calls(const std::string& why);
  [[nodiscard]] uint32_t running() const { return total_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Mailbox;
  // When a read of the file started and has not returned; 0 for none.
  using ReadSince = std::shared_ptr<std::atomic<int64_t>>;
  struct Running {
    Request req;
    ReadSince read_since;
    Done done;  // empty once answered (stalled, refused) or forgotten
  };
  // When `since`'s read counts as stalled; with no read in flight, when to
  // look again (`now` plus the limit: no read can stall before that).
  [[nodiscard]] Clock::time_point deadline(const ReadSince& since, Clock::time_point now) const;
  HeaderReader(sys::EventLoop& loop, std::shared_ptr<Mailbox> box, sys::OneShotTimer timer,
               std::chrono::milliseconds stall_limit, bool reopen_direct);
  [[nodiscard]] Status check_bounds(const Request& r) const;
  void on_posted();
  void on_timer();
  void arm();
  void returned(uid_t uid);

  sys::EventLoop& loop_;
  std::shared_ptr<Mailbox> box_;
  sys::OneShotTimer timer_;
  std::chrono::milliseconds stall_limit_;
  bool reopen_direct_;
  std::map<uint64_t, Running> running_;
  std::map<uid_t, uint32_t> per_uid_;
  uint32_t total_ = 0;
  uint64_t next_ticket_ = 1;
};

}  // namespace airs::daemon
