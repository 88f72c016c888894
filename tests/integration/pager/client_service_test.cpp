// SPDX-License-Identifier: Apache-2.0
// The client service against a real userfaultfd registered in this process
// (MINOR mode on a memfd, as a smallpages client maps its model): what a
// CONTINUE that finds no registration means depends on what the client was
// told. Told "resident", it may drop its registration (libairs does), and a
// fault it raised before that can still be read afterwards: it stays a
// client. Not told, nothing but a client that went away unregisters.
#include <gtest/gtest.h>
#include <linux/userfaultfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <span>

#include "pager/client_service.hpp"
#include "sys/event_loop.hpp"
#include "sys/proc_handles.hpp"
#include "sys/uffd.hpp"

namespace {

using airs::pager::ClientKey;
using airs::pager::ClientService;
using airs::pager::ModelId;

constexpr uint64_t kUnit = 2u << 20;
constexpr uint32_t kUnits = 2;
constexpr ModelId kModel = 1;
constexpr ClientKey kKey = 7;

struct CountingListener : airs::pager::TouchListener {
  void touched(ModelId, ClientKey, uint32_t, airs::pager::Touch, uint64_t, airs::pager::Clock::time_point) override {}
  void closed(ModelId, ClientKey, uint32_t) override {}
  void client_left(ModelId, ClientKey) override { ++left; }
  void touches_done() override {}
  std::optional<std::string> hinted(ModelId, ClientKey, uint32_t, std::span<const uint32_t>, bool) override {
    return std::nullopt;
  }
  int left = 0;
};

// A model's region (a memfd whose page cache holds its bytes) and a client
// mapping of it registered in MINOR mode.
class LazyClientInThisProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loop = airs::sys::EventLoop::create();
    ASSERT_TRUE(loop) << loop.error().message;
    loop_ = std::move(loop).value();
    svc_ = std::make_unique<ClientService>(*loop_, listener_);
    region_.reset(::memfd_create("client-service-test", MFD_CLOEXEC));
    ASSERT_TRUE(region_) << std::strerror(errno);
    ASSERT_EQ(::ftruncate(region_.get(), kUnit * kUnits), 0) << std::strerror(errno);
    // The daemon's side: the bytes in the page cache.
    void* w = ::mmap(nullptr, kUnit * kUnits, PROT_READ | PROT_WRITE, MAP_SHARED, region_.get(), 0);
    ASSERT_NE(w, MAP_FAILED) << std::strerror(errno);
    for (uint64_t i = 0; i < kUnit * kUnits; ++i) static_cast<unsigned char*>(w)[i] = byte_at(i);
    ::munmap(w, kUnit * kUnits);
    // The client's side.
    void* c = ::mmap(nullptr, kUnit * kUnits, PROT_READ, MAP_SHARED, region_.get(), 0);
    ASSERT_NE(c, MAP_FAILED) << std::strerror(errno);
    client_ = static_cast<const volatile unsigned char*>(c);
    auto u = airs::sys::uffd_create();
    if (!u) GTEST_SKIP() << "no userfaultfd for this process: " << u.error().message;
    uffd_ = std::move(u).value();
    auto api = airs::sys::uffd_api(uffd_.get(), UFFD_FEATURE_MINOR_SHMEM);
    if (!api) GTEST_SKIP() << "this kernel has no minor faults on shmem: " << api.error().message;
    auto reg = airs::sys::uffd_register(uffd_.get(), addr(), kUnit * kUnits, UFFDIO_REGISTER_MODE_MINOR);
    ASSERT_TRUE(reg) << reg.error().message;
    svc_->add_model(kModel, {.name = "m", .unit = kUnit, .mapping_page = static_cast<uint64_t>(::getpagesize()),
                             .region_size = kUnit * kUnits, .units = kUnits, .uffd_clients = true});
    airs::sys::UniqueFd dup(::fcntl(uffd_.get(), F_DUPFD_CLOEXEC, 0));
    auto notify = airs::sys::eventfd_create();
    ASSERT_TRUE(notify) << notify.error().message;
    auto st = svc_->attach(kModel, kKey, ::getpid(), std::move(dup), std::move(notify).value(), addr(),
                           kUnit * kUnits, {}, false);
    ASSERT_TRUE(st) << st.error().message;
    ASSERT_EQ(svc_->lazy_clients(kModel), 1u);
  }

  void TearDown() override {
    if (svc_) svc_->remove_model(kModel);
    if (client_ != nullptr) ::munmap(const_cast<unsigned char*>(client_), kUnit * kUnits);
  }

  static unsigned char byte_at(uint64_t i) { return static_cast<unsigned char>((i * 131 + i / 4096) & 0xff); }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(client_); }

  // What libairs does once the model is resident.
  void unregister() {
    auto st = airs::sys::uffd_unregister(uffd_.get(), addr(), kUnit * kUnits);
    ASSERT_TRUE(st) << st.error().message;
  }

  CountingListener listener_;
  std::unique_ptr<airs::sys::EventLoop> loop_;
  std::unique_ptr<ClientService> svc_;
  airs::sys::UniqueFd region_;
  airs::sys::UniqueFd uffd_;
  const volatile unsigned char* client_ = nullptr;
};

TEST_F(LazyClientInThisProcess, ToldResidentItStaysAClientWhenALateFaultFindsItsRegistrationGone) {
  svc_->notify_resident(kModel);
  unregister();
  // A fault message of unit 1 read only now, answered with a CONTINUE
  // that finds no registration.
  svc_->answer(kModel, kKey, 1, addr() + kUnit + 4096, airs::pager::Clock::now());
  EXPECT_EQ(svc_->lazy_clients(kModel), 1u) << "a client that holds the model was dropped";
  EXPECT_EQ(listener_.left, 0);
  // Its reads are plain page-cache faults now: the file's bytes.
  for (uint64_t i = 0; i < kUnit * kUnits; i += 4093) ASSERT_EQ(client_[i], byte_at(i)) << "at byte " << i;
  svc_->detach(kModel, kKey, "detached");
  EXPECT_EQ(svc_->lazy_clients(kModel), 0u);
  EXPECT_EQ(listener_.left, 1);
}

TEST_F(LazyClientInThisProcess, NotToldResidentARegistrationGoneMeansItLeft) {
  unregister();
  svc_->answer(kModel, kKey, 1, addr() + kUnit + 4096, airs::pager::Clock::now());
  EXPECT_EQ(svc_->lazy_clients(kModel), 0u);
  EXPECT_EQ(listener_.left, 1);
}

}  // namespace
