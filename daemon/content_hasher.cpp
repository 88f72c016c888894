// SPDX-License-Identifier: Apache-2.0
#include "daemon/content_hasher.hpp"

#include <pthread.h>
#include <sys/epoll.h>

#include "sys/proc_handles.hpp"

namespace airs::daemon {

Result<std::unique_ptr<ContentHasher>> ContentHasher::create(sys::EventLoop& loop, Done done) {
  auto efd = sys::eventfd_create();
  if (!efd) return std::move(efd).error();
  std::unique_ptr<ContentHasher> h(new ContentHasher(loop, std::move(efd).value(), std::move(done)));
  AIRS_TRY(loop.add(h->efd_.get(), EPOLLIN, [p = h.get()](uint32_t) { p->on_ready(); }));
  h->worker_ = std::thread([p = h.get()] { p->work(); });
  return h;
}

ContentHasher::ContentHasher(sys::EventLoop& loop, sys::UniqueFd efd, Done done)
    : loop_(loop), efd_(std::move(efd)), done_(std::move(done)) {}

ContentHasher::~ContentHasher() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    cancel_running_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  loop_.remove(efd_.get());
}

void ContentHasher::submit(uint64_t key, sys::UniqueFd fd, uint64_t length) {
  {
    std::lock_guard lk(mu_);
    live_.insert(key);
    queue_.push_back(Job{key, std::move(fd), length});
  }
  cv_.notify_one();
}

void ContentHasher::cancel(uint64_t key) {
  std::lock_guard lk(mu_);
  live_.erase(key);
  std::erase_if(queue_, [key](const Job& j) { return j.key == key; });
  if (running_ == key) cancel_running_ = true;
  std::erase_if(results_, [key](const auto& r) { return r.first == key; });
}

bool ContentHasher::pending(uint64_t key) const {
  std::lock_guard lk(mu_);
  return live_.contains(key);
}

void ContentHasher::work() {
  ::pthread_setname_np(::pthread_self(), "airs-hash");
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    running_ = job.key;
    cancel_running_ = false;
    lk.unlock();
    auto id = gguf::content_id_of_fd(job.fd.get(), job.length, &cancel_running_);
    job.fd.reset();
    lk.lock();
    const bool wanted = running_ == job.key && !cancel_running_ && live_.contains(job.key);
    running_ = 0;
    if (wanted) {
      results_.emplace_back(job.key, std::move(id));
      (void)sys::eventfd_signal(efd_.get());  // EAGAIN only at a full counter: already signalled
    }
  }
}

void ContentHasher::on_ready() {
  sys::eventfd_drain(efd_.get());
  std::vector<std::pair<uint64_t, Result<gguf::ContentId>>> ready;
  {
    std::lock_guard lk(mu_);
    ready.swap(results_);
    for (auto& [key, r] : ready) live_.erase(key);
  }
  for (auto& [key, r] : ready) done_(key, std::move(r));
}

}  // namespace airs::daemon
