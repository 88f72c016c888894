// SPDX-License-Identifier: Apache-2.0
#include "daemon/header_reader.hpp"

#include <fcntl.h>
#include <sys/epoll.h>

#include <future>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "gguf/file_io.hpp"
#include "sys/proc_handles.hpp"

namespace airs::daemon {

Result<Header> read_header(int fd, const std::string& what, std::atomic<int64_t>* read_since, bool reopen_direct) {
  auto id = sys::readable_file_identity(fd, what + ": gguf_fd");
  if (!id) return std::move(id).error();
  auto st = sys::stat_of(fd, what + ": gguf_fd");
  if (!st) return std::move(st).error();
  auto parse_fd = sys::dup_cloexec(fd);
  if (!parse_fd) return make_error(parse_fd.error().code, "{}: {}", what, parse_fd.error().message);
  auto src = gguf::FdSource::adopt(std::move(parse_fd).value(), "the passed GGUF");
  if (!src) return make_error(src.error().code, "{}: {}", what, src.error().message);
  src->watch_reads(read_since);
  auto parsed = gguf::parse(*src);
  if (!parsed) return make_error(parsed.error().code, "{}: {}", what, parsed.error().message);
  Header h{*id, *st, std::move(parsed).value(), {}, std::nullopt};
  // Timed as a read is: a STATFS or an OPEN that never returns is a stall too.
  gguf::FdSource::mark_in_flight(read_since);
  const auto type = sys::fs_type_of(fd, what);
  gguf::FdSource::mark_done(read_since);
  h.reads_may_hang = !type || !sys::reads_end_by_themselves(*type);
  if (!reopen_direct) return h;
  gguf::FdSource::mark_in_flight(read_since);
  auto direct = sys::reopen(fd, O_RDONLY | O_DIRECT);
  gguf::FdSource::mark_done(read_since);
  if (direct) h.direct = std::move(direct).value();
  else h.direct_refused = std::move(direct).error();
  return h;
}

// What a reader thread shares with the loop. Held by the reader and by every
// thread still running, so a thread that returns after the reader is gone
// finds it closed, and posts nothing.
struct HeaderReader::Mailbox {
  std::mutex mu;
  sys::UniqueFd efd;  // signalled when something is posted
  std::vector<std::pair<uint64_t, Result<Header>>> posted;
  bool closed = false;
};

namespace {

// Runs `body` on a detached thread named airs-header, at a lower priority
// than the loop's. EAGAIN when there is no thread to be had.
template <class Body>
Status detach_thread(const std::string& what, Body body) {
  try {
    std::thread([body = std::move(body)]() mutable {
      sys::become_background_thread("airs-header");
      body();
    }).detach();
  } catch (const std::system_error& e) {
    return make_error(EAGAIN, "{}: no thread to read the GGUF header on: {}", what, e.what());
  }
  return {};
}

std::string stalled_message(const std::string& what, std::chrono::milliseconds limit, uid_t uid) {
  return fmt::format("{}: the GGUF header was not read: a read or open of the file has not returned within {} ms (a "
                     "stalled FUSE or network file system?); it is abandoned, and counts against uid {}'s {} header "
                     "reads at once until it returns",
                     what, limit.count(), uid, HeaderReader::kPerUid);
}

}  // namespace

Result<std::unique_ptr<HeaderReader>> HeaderReader::create(sys::EventLoop& loop, std::chrono::milliseconds stall_limit,
                                                          bool reopen_direct) {
  auto box = std::make_shared<Mailbox>();
  auto efd = sys::eventfd_create();
  if (!efd) return std::move(efd).error();
  box->efd = std::move(efd).value();
  auto timer = sys::OneShotTimer::create();
  if (!timer) return std::move(timer).error();
  std::unique_ptr<HeaderReader> r(new HeaderReader(loop, box, std::move(timer).value(), stall_limit, reopen_direct));
  AIRS_TRY(loop.add(box->efd.get(), EPOLLIN, [p = r.get()](uint32_t) { p->on_posted(); }));
  if (auto st = loop.add(r->timer_.fd(), EPOLLIN, [p = r.get()](uint32_t) {
        p->timer_.acknowledge();
        p->on_timer();
      });
      !st) {
    loop.remove(box->efd.get());
    return std::move(st).error();
  }
  return r;
}

HeaderReader::HeaderReader(sys::EventLoop& loop, std::shared_ptr<Mailbox> box, sys::OneShotTimer timer,
                           std::chrono::milliseconds stall_limit, bool reopen_direct)
    : loop_(loop), box_(std::move(box)), timer_(std::move(timer)), stall_limit_(stall_limit),
      reopen_direct_(reopen_direct) {}

HeaderReader::~HeaderReader() {
  loop_.remove(box_->efd.get());
  loop_.remove(timer_.fd());
  std::lock_guard lk(box_->mu);
  box_->closed = true;
  box_->posted.clear();
}

Status HeaderReader::check_bounds(const Request& r) const {
  if (r.exempt) return {};
  const auto it = per_uid_.find(r.uid);
  const uint32_t mine = it == per_uid_.end() ? 0 : it->second;
  if (mine >= kPerUid)
    return make_error(EDQUOT,
                      "{}: uid {} has {} GGUF headers being read already, its limit ({} at once); a read stalled on "
                      "an unresponsive file counts until it returns",
                      r.what, r.uid, mine, kPerUid);
  if (total_ >= kTotal)
    return make_error(EBUSY, "{}: {} GGUF headers are being read already, the daemon's limit ({} at once); try again",
                      r.what, total_, kTotal);
  return {};
}

Status HeaderReader::read(Request r, int fd, Done done) {
  AIRS_TRY(check_bounds(r));
  auto dup = sys::dup_cloexec(fd);
  if (!dup) return make_error(dup.error().code, "{}: {}", r.what, dup.error().message);
  const uint64_t ticket = next_ticket_++;
  auto since = std::make_shared<std::atomic<int64_t>>(0);
  AIRS_TRY(detach_thread(r.what, [box = box_, ticket, fd = std::move(dup).value(), what = r.what, since,
                                  direct = reopen_direct_]() mutable {
    auto h = read_header(fd.get(), what, since.get(), direct);
    fd.reset();
    std::lock_guard lk(box->mu);
    if (box->closed) return;
    box->posted.emplace_back(ticket, std::move(h));
    (void)sys::eventfd_signal(box->efd.get());  // EAGAIN only at a full counter: signalled already
  }));
  ++per_uid_[r.uid];
  ++total_;
  running_.emplace(ticket, Running{std::move(r), std::move(since), std::move(done)});
  arm();
  return {};
}

Result<Header> HeaderReader::read_now(int fd, const std::string& what) const {
  auto dup = sys::dup_cloexec(fd);
  if (!dup) return make_error(dup.error().code, "{}: {}", what, dup.error().message);
  auto promise = std::make_shared<std::promise<Result<Header>>>();
  auto future = promise->get_future();
  auto since = std::make_shared<std::atomic<int64_t>>(0);
  AIRS_TRY(detach_thread(what, [promise, fd = std::move(dup).value(), what, since, direct = reopen_direct_]() mutable {
    promise->set_value(read_header(fd.get(), what, since.get(), direct));
  }));
  for (;;) {
    const auto now = Clock::now();
    const auto until = deadline(since, now);
    if (future.wait_until(until) == std::future_status::ready) return future.get();
    if (Clock::now() >= deadline(since, Clock::now()))
      return make_error(ETIMEDOUT, "{}", stalled_message(what, stall_limit_, 0));
  }
}

void HeaderReader::returned(uid_t uid) {
  --total_;
  if (auto it = per_uid_.find(uid); it != per_uid_.end() && --it->second == 0) per_uid_.erase(it);
}

void HeaderReader::on_posted() {
  sys::eventfd_drain(box_->efd.get());
  std::vector<std::pair<uint64_t, Result<Header>>> posted;
  {
    std::lock_guard lk(box_->mu);
    posted.swap(box_->posted);
  }
  for (auto& [ticket, h] : posted) {
    auto it = running_.find(ticket);
    if (it == running_.end()) continue;
    Running r = std::move(it->second);
    running_.erase(it);
    returned(r.req.uid);
    if (!r.done) {
      spdlog::info("{}: an abandoned GGUF header read returned at last; uid {} has {} running", r.req.what, r.req.uid,
                   per_uid_.contains(r.req.uid) ? per_uid_[r.req.uid] : 0);
      continue;
    }
    if (h) r.done(std::make_shared<const Header>(std::move(h).value()));
    else r.done(std::move(h).error());
  }
  arm();
}

HeaderReader::Clock::time_point HeaderReader::deadline(const ReadSince& since, Clock::time_point now) const {
  const int64_t ns = since->load(std::memory_order_relaxed);
  if (ns == 0) return now + stall_limit_;
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns))) + stall_limit_;
}

void HeaderReader::on_timer() {
  const auto now = Clock::now();
  std::vector<std::pair<Done, Error>> late;
  for (auto& [ticket, r] : running_) {
    if (!r.done || deadline(r.read_since, now) > now) continue;
    spdlog::warn("{}: GGUF header read of uid {} stalled for {} ms; answered, its thread abandoned", r.req.what,
                 r.req.uid, stall_limit_.count());
    late.emplace_back(std::move(r.done), make_error(ETIMEDOUT, "{}", stalled_message(r.req.what, stall_limit_, r.req.uid)));
    r.done = nullptr;
  }
  for (auto& [done, e] : late) done(std::move(e));
  arm();
}

void HeaderReader::arm() {
  const auto now = Clock::now();
  std::optional<Clock::time_point> first;
  for (const auto& [ticket, r] : running_) {
    if (!r.done) continue;
    const auto at = deadline(r.read_since, now);
    if (!first || at < *first) first = at;
  }
  if (!first) return;  // a stale expiry finds nothing late
  const auto delay = std::max<Clock::duration>(*first - Clock::now(), std::chrono::milliseconds(1));
  if (auto st = timer_.arm(delay); !st) spdlog::error("header reader: {}", st.error().message);
}

void HeaderReader::caller_left(const std::string& name) {
  for (auto& [ticket, r] : running_)
    if (!r.req.caller.empty() && r.req.caller == name) r.done = nullptr;
}

void HeaderReader::refuse_bus_calls(const std::string& why) {
  std::vector<std::pair<Done, Error>> refused;
  for (auto& [ticket, r] : running_) {
    if (r.req.caller.empty() || !r.done) continue;
    refused.emplace_back(std::move(r.done), make_error(ECANCELED, "{}: {}", r.req.what, why));
    r.done = nullptr;
  }
  for (auto& [done, e] : refused) done(std::move(e));
}

}  // namespace airs::daemon
