// SPDX-License-Identifier: Apache-2.0
// The cross-policy cases of the one eviction order, on the core itself:
// KV against models, equal priorities across arenas, pinned models, and an
// eviction while a fill is in flight.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "daemon/drain_waits.hpp"
#include "daemon/evictor.hpp"
#include "daemon/kv_service.hpp"
#include "daemon/models.hpp"
#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"
#include "pager/pager.hpp"
#include "pool/pool.hpp"
#include "pool/shmem_backend.hpp"
#include "sys/event_loop.hpp"

namespace airs::daemon {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = uint64_t{1} << 20;

class Core : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("airs-core-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    evictor_.reset();
    kv_.reset();
    models_.reset();
    pager_.reset();
    pool_.reset();
    fs::remove_all(dir_);
  }

  void start(uint64_t pool_mib, std::vector<std::string> pinned = {}) {
    auto loop = sys::EventLoop::create();
    ASSERT_TRUE(loop) << loop.error().message;
    loop_ = std::move(loop).value();
    auto b = pool::ShmemBackend::create(pool::ShmemOptions{});
    ASSERT_TRUE(b) << b.error().message;
    auto p = pool::Pool::create(std::move(b).value(), {pool_mib * kMiB, false});
    ASSERT_TRUE(p) << p.error().message;
    pool_ = std::move(p).value();
    pager::PagerOptions po;
    auto pg = pager::Pager::create(*loop_, *pool_, po);
    ASSERT_TRUE(pg) << pg.error().message;
    pager_ = std::move(pg).value();
    config::ModelsConfig mc;
    mc.pinned = std::move(pinned);
    Models::Hooks h;
    h.dropped = [this](const ModelEntry& m, bool, const std::string&) {
      dropped_.push_back(m.name);
      kv_->close_model(m.id, "dropped");
    };
    models_ = std::make_unique<Models>(*pool_, *pager_, mc, false, std::move(h));
    config::KvConfig kc;
    kc.max_arena_bytes = 0;  // the pool
    kc.max_pool_bytes_per_uid = {0, 100};  // the cross-policy cases fill the pool; the share has its own test (kv_test)
    kv_ = std::make_unique<KvService>(*pool_, *models_, kc,
                                      [this](const KvSession& s, const std::vector<uint32_t>& blocks, uint64_t,
                                             const std::string&) { lost_[s.id] += blocks.size(); });
    policy::Config pc;
    evictor_ = std::make_unique<Evictor>(*pool_, *models_, *kv_, pc);
    models_->set_room_maker([this](uint64_t bytes, const std::string& why) {
      return evictor_->make_room(policy::Request::for_model_load(bytes), why);
    });
    kv_->set_room_maker([this](const policy::Request& r, const std::string& why) { return evictor_->make_room(r, why); });
  }

  // A llama-shaped model of about `mib` MiB.
  ModelEntry* load(const std::string& name, uint64_t mib, uint64_t seed = 1) {
    gguf::ModelSpec spec;
    spec.name = name;
    spec.seed = seed;
    auto sized = gguf::spec_for_size(spec, mib * kMiB);
    EXPECT_TRUE(sized) << sized.error().message;
    auto plan = gguf::plan_model(*sized);
    EXPECT_TRUE(plan);
    const std::string path = (dir_ / (name + ".gguf")).string();
    EXPECT_TRUE(gguf::write_model_file(*plan, path));
    sys::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    LoadRequest req;
    req.gguf_fd = fd.get();
    req.exempt = true;
    auto header = read_header(fd.get(), "LoadModel");
    EXPECT_TRUE(header) << header.error().message;
    if (!header) return nullptr;
    auto m = models_->load(req, *header);
    last_error_ = m ? std::string() : m.error().message;
    last_code_ = m ? 0 : m.error().code;
    return m ? *m : nullptr;
  }

  // Runs the loop until the pager has nothing in flight for `m`.
  void settle() {
    for (int i = 0; i < 200; ++i) (void)loop_->run_once(std::chrono::milliseconds(5));
  }

  dbus::Caller caller(uid_t uid, const std::string& name) {
    dbus::Caller c;
    c.uid = uid;
    c.name = name;
    c.pid = ::getpid();
    return c;
  }

  fs::path dir_;
  std::unique_ptr<sys::EventLoop> loop_;
  std::unique_ptr<pool::Pool> pool_;
  std::unique_ptr<pager::Pager> pager_;
  std::unique_ptr<Models> models_;
  std::unique_ptr<KvService> kv_;
  std::unique_ptr<Evictor> evictor_;
  std::vector<std::string> dropped_;
  std::map<uint64_t, size_t> lost_;
  std::string last_error_;
  int last_code_ = 0;
};

TEST_F(Core, AKvAllocationEvictsAnIdleModelButNeverAPinnedOne) {
  start(32, {"pinned"});
  ASSERT_NE(load("pinned", 12), nullptr) << last_error_;
  ModelEntry* idle = load("idle", 12, 2);
  ASSERT_NE(idle, nullptr) << last_error_;
  settle();
  const uint64_t idle_id = idle->id;
  ModelEntry* pinned = models_->find_by_name("pinned");
  auto s = kv_->create(*pinned, caller(0, ":1.1"), policy::Priority::Interactive, true);
  ASSERT_TRUE(s) << s.error().message;
  // More blocks than the free pool holds: the idle model goes, the pinned stays.
  auto info = kv_->allocator().arena_geometry(s->session->arena);
  ASSERT_TRUE(info);
  const uint32_t want = static_cast<uint32_t>((pool_->counts().free_bytes() / info->chunk_bytes + 1) *
                                              info->blocks_per_chunk);
  auto blocks = kv_->allocate(*s->session, want);
  ASSERT_TRUE(blocks) << blocks.error().message;
  EXPECT_EQ(models_->find(idle_id), nullptr) << "the idle model was not evicted for the KV allocation";
  EXPECT_NE(models_->find_by_name("pinned"), nullptr) << "a pinned model was evicted";
  EXPECT_EQ(dropped_, std::vector<std::string>{"idle"});
}

TEST_F(Core, AModelLoadTakesCachedKvAndIdleModelsButNeverLiveSessionKv) {
  start(32);
  ModelEntry* a = load("a", 8);
  ASSERT_NE(a, nullptr) << last_error_;
  settle();
  auto s = kv_->create(*a, caller(0, ":1.1"), policy::Priority::Background);
  ASSERT_TRUE(s) << s.error().message;
  auto geo = kv_->allocator().arena_geometry(s->session->arena);
  ASSERT_TRUE(geo);
  // A live background session holding most of the rest of the pool.
  const uint32_t chunks = static_cast<uint32_t>(pool_->counts().free_bytes() / geo->chunk_bytes) - 1;
  auto held = kv_->allocate(*s->session, chunks * geo->blocks_per_chunk);
  ASSERT_TRUE(held) << held.error().message;
  // A model that needs the session's memory: refused, and nothing was lost.
  EXPECT_EQ(load("b", 12, 3), nullptr);
  EXPECT_NE(last_error_.find("pool exhausted"), std::string::npos) << last_error_;
  EXPECT_TRUE(lost_.empty()) << "a live session lost KV to a model load";
  EXPECT_NE(models_->find_by_name("a"), nullptr) << "a model with a live session was evicted";
}

TEST_F(Core, EqualPrioritiesAcrossArenasNeverEvictEachOther) {
  start(24);
  ModelEntry* a = load("a", 4);
  ASSERT_NE(a, nullptr) << last_error_;
  settle();
  auto s1 = kv_->create(*a, caller(1000, ":1.1"), policy::Priority::System);
  auto s2 = kv_->create(*a, caller(1001, ":1.2"), policy::Priority::System);
  ASSERT_TRUE(s1 && s2);
  ASSERT_NE(s1->session->arena, s2->session->arena) << "two uids share an arena";
  auto geo = kv_->allocator().arena_geometry(s1->session->arena);
  const uint32_t all = static_cast<uint32_t>(pool_->counts().free_bytes() / geo->chunk_bytes) * geo->blocks_per_chunk;
  auto held = kv_->allocate(*s1->session, all);
  ASSERT_TRUE(held) << held.error().message;
  auto r = kv_->allocate(*s2->session, geo->blocks_per_chunk);
  EXPECT_FALSE(r) << "a system session took another uid's system KV";
  EXPECT_TRUE(lost_.empty());
}

TEST_F(Core, AnEvictionWhileTheFillIsInFlightGivesEveryPageBack) {
  start(32);
  const uint64_t total = pool_->counts().total_pages();
  ModelEntry* m = load("filling", 16);
  ASSERT_NE(m, nullptr) << last_error_;
  // Reads are queued (not yet reaped): drop it now.
  ASSERT_TRUE(models_->unload(*m, false, false, "test"));
  settle();
  EXPECT_EQ(pool_->counts().free_pages, total) << "pages were lost to an eviction during the fill";
  EXPECT_TRUE(models_->all().empty());
}

// A load that needs the pages of a model whose reads are still in flight
// (submitted, not reaped: the pager learns of completions only on the loop):
// the one executor evicts that model, which returns at once with its pages
// on their way back; the load does not wait for them inside the call
// (EINPROGRESS, nothing reserved), and run again from the drain event it
// gets them. Nothing else is evicted for the same need, no page is counted
// twice.
TEST_F(Core, ALoadThatNeedsADrainingModelsPagesGetsThemOnceItsReadsLanded) {
  start(24, {"pinned"});  // room for two of the ~10 MiB models, not three
  ModelEntry* pinned = load("pinned", 12);
  ASSERT_NE(pinned, nullptr) << last_error_;
  settle();
  const uint64_t pinned_pages = pool_->counts().model_pages;
  ModelEntry* filling = load("filling", 12, 2);
  ASSERT_NE(filling, nullptr) << last_error_;
  const uint64_t filling_pages = pool_->counts().model_pages - pinned_pages;
  ASSERT_TRUE(pager_->draining(filling->pager_id) || models_->stats(*filling)->units_in_flight > 0)
      << "no read in flight: nothing to drain";
  auto waits = DrainWaits::create(*loop_, std::chrono::minutes(10));
  ASSERT_TRUE(waits) << waits.error().message;
  std::vector<std::pair<pager::ModelId, pager::Pager::Drained>> drained;
  pager_->set_drain_listener([&](pager::ModelId id, pager::Pager::Drained how) {
    drained.emplace_back(id, how);
    (*waits)->pages_returned();
  });
  const pager::ModelId filling_pid = filling->pager_id;
  ModelEntry* next = load("next", 12, 3);
  ASSERT_EQ(next, nullptr) << "loaded before the pages it needs were back";
  ASSERT_EQ(last_code_, EINPROGRESS) << last_error_;
  EXPECT_EQ(dropped_, std::vector<std::string>{"filling"});
  EXPECT_TRUE(drained.empty()) << "the load waited for the drain inside the call";
  // The waiting load holds nothing: the pool is as the eviction left it.
  EXPECT_EQ(models_->all().size(), 1U);
  EXPECT_EQ(pool_->counts().model_pages, pinned_pages + filling_pages);
  EXPECT_EQ(models_->returning_pages(), filling_pages);
  // Parked as the daemon parks it, run again from the drain event.
  (*waits)->park(DrainWaits::Call{":1.1", "test load", [&] {
                                    next = load("next", 12, 3);
                                    return last_code_ != EINPROGRESS;
                                  },
                                  [](const Error& e) { ADD_FAILURE() << "refused: " << e.message; }});
  for (int i = 0; i < 2000 && (*waits)->size() > 0; ++i) (void)loop_->run_once(std::chrono::milliseconds(5));
  ASSERT_EQ((*waits)->size(), 0U) << "the drain event did not answer the waiting load";
  ASSERT_NE(next, nullptr) << last_error_;
  ASSERT_EQ(drained.size(), 1U);
  EXPECT_EQ(drained[0], std::make_pair(filling_pid, pager::Pager::Drained::Unloaded));
  EXPECT_EQ(models_->returning_pages(), 0U);
  EXPECT_EQ(dropped_, std::vector<std::string>{"filling"}) << "evicted more for the same need";
  settle();
  const uint64_t next_pages = pool_->counts().model_pages - pinned_pages;
  EXPECT_EQ(next_pages, filling_pages);
  EXPECT_EQ(pool_->counts().free_pages, pool_->counts().total_pages() - pinned_pages - next_pages);
  EXPECT_NE(models_->find_by_name("pinned"), nullptr);
}

// Pages on their way back count as free for every planner: while an
// unloaded model drains, a request they cover plans no eviction (the
// pressure loop and a load do not evict a second model for one need), and
// it is told to wait (EINPROGRESS) instead of waiting inside the call.
TEST_F(Core, PagesOnTheirWayBackAreNotPlannedForTwice) {
  start(24);
  ModelEntry* resident = load("resident", 8);
  ASSERT_NE(resident, nullptr) << last_error_;
  settle();
  ModelEntry* filling = load("filling", 8, 2);
  ASSERT_NE(filling, nullptr) << last_error_;
  const uint64_t ps = pool_->page_size();
  const uint64_t free_before = pool_->counts().free_pages;
  ASSERT_TRUE(models_->unload(*filling, false, false, "test"));
  const uint64_t returning = models_->returning_pages();
  ASSERT_GT(returning, 0U) << "its reads landed before the unload: nothing was proven";
  EXPECT_EQ(pool_->counts().free_pages, free_before) << "pages counted free while reads still write them";
  EXPECT_EQ(evictor_->snapshot().free_bytes, (free_before + returning) * ps);
  // A need the returning pages cover: evicts nothing, waits for them.
  auto room = evictor_->make_room(policy::Request::for_model_load(returning * ps), "test");
  ASSERT_FALSE(room) << "room before the pages were back";
  EXPECT_EQ(room.error().code, EINPROGRESS) << room.error().message;
  EXPECT_EQ(models_->returning_pages(), returning) << "the call waited for the drain";
  EXPECT_NE(models_->find_by_name("resident"), nullptr) << "evicted for pages that were on their way";
  settle();
  EXPECT_EQ(models_->returning_pages(), 0U);
  EXPECT_EQ(pool_->counts().free_pages, free_before + returning);
  EXPECT_NE(models_->find_by_name("resident"), nullptr);
  EXPECT_EQ(dropped_, std::vector<std::string>{"filling"});
}

// A KV allocation whose room is in the pages of an unloaded model still
// draining: EINPROGRESS (no block allocated, nothing else evicted), and the
// same allocation once the drain ended gets them.
TEST_F(Core, AKvAllocationThatNeedsDrainingPagesWaitsForThemOutsideTheCall) {
  start(32, {"pinned"});
  ASSERT_NE(load("pinned", 12), nullptr) << last_error_;
  settle();
  ModelEntry* filling = load("filling", 12, 2);
  ASSERT_NE(filling, nullptr) << last_error_;
  ModelEntry* pinned = models_->find_by_name("pinned");
  auto s = kv_->create(*pinned, caller(0, ":1.1"), policy::Priority::Interactive, true);
  ASSERT_TRUE(s) << s.error().message;
  ASSERT_TRUE(models_->unload(*filling, false, false, "test"));
  const uint64_t returning = models_->returning_pages();
  ASSERT_GT(returning, 0U) << "its reads landed before the unload: nothing was proven";
  auto info = kv_->allocator().arena_geometry(s->session->arena);
  ASSERT_TRUE(info);
  // One chunk more than the free pool holds: within what is on its way.
  const uint32_t want = static_cast<uint32_t>((pool_->counts().free_bytes() / info->chunk_bytes + 1) *
                                              info->blocks_per_chunk);
  ASSERT_LE(uint64_t{want} / info->blocks_per_chunk * info->chunk_bytes,
            pool_->counts().free_bytes() + returning * pool_->page_size());
  const uint64_t free_before = pool_->counts().free_pages;
  auto early = kv_->allocate(*s->session, want);
  ASSERT_FALSE(early) << "allocated before the pages were back";
  EXPECT_EQ(early.error().code, EINPROGRESS) << early.error().message;
  EXPECT_EQ(kv_->info(s->session->path)->blocks, 0U);
  EXPECT_EQ(pool_->counts().free_pages, free_before) << "the waiting allocation holds pages";
  EXPECT_EQ(models_->returning_pages(), returning) << "the call waited for the drain";
  settle();
  EXPECT_EQ(models_->returning_pages(), 0U);
  auto blocks = kv_->allocate(*s->session, want);
  ASSERT_TRUE(blocks) << blocks.error().message;
  EXPECT_EQ(blocks->size(), want);
  EXPECT_NE(models_->find_by_name("pinned"), nullptr);
  EXPECT_EQ(dropped_, std::vector<std::string>{"filling"}) << "evicted more for the same need";
}

// A parked call whose pages never come back is refused by the loop's timer
// with the reason, and one whose caller left the bus is dropped unanswered;
// calls of other callers stay parked.
TEST_F(Core, AWaitingCallIsRefusedAfterItsLimitOrDroppedWithItsCaller) {
  start(8);
  auto waits = DrainWaits::create(*loop_, std::chrono::milliseconds(20));
  ASSERT_TRUE(waits) << waits.error().message;
  std::vector<std::string> refused;
  int runs = 0;
  auto call = [&](const std::string& caller) {
    return DrainWaits::Call{caller, "call of " + caller, [&] {
                              ++runs;
                              return false;
                            },
                            [&refused](const Error& e) {
                              EXPECT_EQ(e.code, ENOMEM);
                              refused.push_back(e.message);
                            }};
  };
  (*waits)->park(call(":1.1"));
  (*waits)->park(call(":1.2"));
  (*waits)->caller_left(":1.2");
  EXPECT_EQ((*waits)->size(), 1U);
  (*waits)->pages_returned();  // a drain that did not bring enough: it stays
  EXPECT_EQ(runs, 1);
  EXPECT_EQ((*waits)->size(), 1U);
  for (int i = 0; i < 2000 && refused.empty(); ++i) (void)loop_->run_once(std::chrono::milliseconds(5));
  ASSERT_EQ(refused.size(), 1U);
  EXPECT_NE(refused[0].find("call of :1.1: pool exhausted"), std::string::npos) << refused[0];
  EXPECT_NE(refused[0].find("reads were still in flight after 20 ms"), std::string::npos) << refused[0];
  EXPECT_EQ((*waits)->size(), 0U);
}

}  // namespace
}  // namespace airs::daemon
