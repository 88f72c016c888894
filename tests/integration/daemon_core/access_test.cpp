// SPDX-License-Identifier: Apache-2.0
// Who is admin and who is trusted: the group names of the configuration are
// looked up at start and on SIGHUP, never on a call (a lookup may ask a
// directory server, and the daemon's loop would wait for it); SIGHUP's on
// a thread of its own, so a lookup that hangs holds no call.
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>

#include <gtest/gtest.h>

#include "daemon/access.hpp"

namespace airs::daemon {
namespace {

// The bus's UnixGroupIDs: the effective gid and the supplementary groups.
dbus::Caller a_caller(uid_t uid, gid_t gid, std::vector<gid_t> groups = {}) {
  dbus::Caller c;
  c.name = ":1.7";
  c.uid = uid;
  c.groups = std::move(groups);
  c.groups.push_back(gid);
  return c;
}

// A group database the test controls, counting the lookups; `down`: the
// lookup fails (a directory server that does not answer).
struct GroupDb {
  std::map<std::string, gid_t> known;
  bool down = false;
  int lookups = 0;
  Access::GroupLookup fn() {
    return [this](const std::string& name) -> Result<std::optional<gid_t>> {
      ++lookups;
      if (down) return make_error(ETIMEDOUT, "the group lookup failed: {}", std::strerror(ETIMEDOUT));
      auto it = known.find(name);
      if (it == known.end()) return std::optional<gid_t>();
      return std::optional<gid_t>(it->second);
    };
  }
};

TEST(Access, GroupNamesAreLookedUpAtTheStartNeverOnACall) {
  GroupDb db;
  db.known = {{"airs-admin", 2001}, {"airs", 2002}};
  Access a("airs-admin", "airs", db.fn());
  EXPECT_EQ(db.lookups, 2);
  const auto admin = a_caller(1000, 1000, {2001});
  const auto trusted = a_caller(1001, 1001, {5, 2002});
  const auto other = a_caller(1002, 1002, {5, 6});
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(a.is_admin(admin));
    EXPECT_TRUE(a.is_trusted(admin)) << "an admin is trusted";
    EXPECT_FALSE(a.is_admin(trusted));
    EXPECT_TRUE(a.is_trusted(trusted));
    EXPECT_FALSE(a.is_admin(other));
    EXPECT_FALSE(a.is_trusted(other));
    EXPECT_TRUE(a.require_admin(admin, "Evict"));
    auto refused = a.require_admin(other, "Evict");
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().message, "Evict is an admin method: uid 1002 is not root nor in group airs-admin");
  }
  EXPECT_EQ(db.lookups, 2) << "a bus call looked a group up";
}

TEST(Access, APrimaryGroupCountsAndRootIsAlwaysAdmin) {
  GroupDb db;
  db.known = {{"airs", 2002}};
  Access a("", "airs", db.fn());
  EXPECT_EQ(db.lookups, 1) << "an empty name is not looked up";
  EXPECT_TRUE(a.is_trusted(a_caller(1001, 2002)));
  EXPECT_FALSE(a.is_admin(a_caller(1001, 2002)));
  EXPECT_TRUE(a.is_admin(a_caller(0, 0)));
  auto refused = a.require_admin(a_caller(1001, 2002), "Unload");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().message, "Unload is an admin method: uid 1001 is not root");
}

TEST(Access, AGroupMadeAfterTheStartAdmitsFromTheNextResolve) {
  GroupDb db;
  Access a("ops", "airs", db.fn());
  const auto member = a_caller(1001, 1001, {2002, 2003});
  EXPECT_FALSE(a.is_trusted(member)) << "a group that does not exist admits nobody";
  EXPECT_FALSE(a.is_admin(member));
  db.known = {{"airs", 2002}, {"ops", 2003}};
  EXPECT_FALSE(a.is_trusted(member)) << "looked up again before a resolve";
  a.resolve();
  EXPECT_EQ(db.lookups, 4);
  EXPECT_TRUE(a.is_trusted(member));
  EXPECT_TRUE(a.is_admin(member));
  db.known = {{"airs", 3002}, {"ops", 3003}};
  a.resolve();
  EXPECT_FALSE(a.is_trusted(member)) << "a renumbered group keeps no old gid";
  EXPECT_FALSE(a.is_admin(member));
}

// A lookup that fails (not "no such group": the directory did not answer)
// keeps what the name meant; a name that never resolved admits nobody.
TEST(Access, AFailedLookupKeepsTheGidTheNameHad) {
  GroupDb db;
  db.known = {{"airs", 2002}};
  Access a("ops", "airs", db.fn());
  const auto member = a_caller(1001, 1001, {2002, 2003});
  EXPECT_TRUE(a.is_trusted(member));
  EXPECT_FALSE(a.is_admin(member));
  db.down = true;
  db.known = {{"airs", 2002}, {"ops", 2003}};
  a.resolve();
  EXPECT_TRUE(a.is_trusted(member)) << "a failed lookup dropped the trusted group's members";
  EXPECT_FALSE(a.is_admin(member)) << "a failed lookup admitted someone";
  db.down = false;
  a.resolve();
  EXPECT_TRUE(a.is_admin(member));
}

// A directory server that answers only when the test says so: every
// lookup waits for open(), on the lookup's own thread.
struct HeldGroupDb {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, gid_t> known;
  bool open = true;
  int lookups = 0;
  int waiting = 0;
  Access::GroupLookup fn() {
    return [this](const std::string& name) -> Result<std::optional<gid_t>> {
      std::unique_lock lk(mu);
      ++lookups;
      ++waiting;
      cv.notify_all();
      cv.wait(lk, [this] { return open; });
      --waiting;
      auto it = known.find(name);
      if (it == known.end()) return std::optional<gid_t>();
      return std::optional<gid_t>(it->second);
    };
  }
  void set(bool is_open) {
    std::lock_guard lk(mu);
    open = is_open;
    cv.notify_all();
  }
  // Until a lookup is waiting for open() (the thread got that far).
  bool wait_for_a_waiting_lookup() {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(20), [this] { return waiting > 0; });
  }
};

// SIGHUP's lookups run on a thread: while the directory does not answer,
// the loop goes on and the old gids hold; a second SIGHUP starts no second
// thread, but one more lookup after the first (its answer may predate the
// change the SIGHUP is for); every answer is taken on the loop.
TEST(Access, AResolveInTheBackgroundNeverHoldsTheLoop) {
  HeldGroupDb db;
  db.known = {{"airs", 2002}};
  auto loop = sys::EventLoop::create();  // before the Access, which unregisters from it when it goes
  ASSERT_TRUE(loop.ok()) << loop.error().message;
  Access a("ops", "airs", db.fn());
  EXPECT_EQ(db.lookups, 2);
  const auto settle = [&] {  // the directory answers; the loop takes every answer
    db.set(true);
    for (int i = 0; i < 1000 && a.resolving(); ++i) (void)(*loop)->run_once(std::chrono::milliseconds(20));
  };
  // Whatever fails below, no lookup thread is left waiting on `db`.
  struct Guard {
    const std::function<void()>& f;
    ~Guard() { f(); }
  };
  const std::function<void()> settle_fn = settle;
  Guard guard{settle_fn};
  const auto member = a_caller(1001, 1001, {2002});
  const auto renumbered = a_caller(1002, 1002, {3002});
  const auto op = a_caller(1003, 1003, {2003});

  db.set(false);
  {
    std::lock_guard lk(db.mu);
    db.known = {{"airs", 3002}, {"ops", 2003}};
  }
  ASSERT_TRUE(a.resolve_in_background(**loop));  // returns with the lookup waiting on its thread
  ASSERT_TRUE(db.wait_for_a_waiting_lookup()) << "no lookup thread started";
  EXPECT_TRUE(a.resolving());
  EXPECT_TRUE(a.resolve_in_background(**loop)) << "a second SIGHUP while one hangs";
  EXPECT_TRUE(a.resolve_in_background(**loop)) << "a third";
  auto ran = (*loop)->run_once(std::chrono::milliseconds(0));
  ASSERT_TRUE(ran.ok());
  EXPECT_TRUE(a.is_trusted(member)) << "the old gid holds while the lookup hangs";
  EXPECT_FALSE(a.is_trusted(renumbered));
  EXPECT_FALSE(a.is_admin(op));
  {
    std::lock_guard lk(db.mu);
    EXPECT_EQ(db.lookups, 3) << "a second thread looked up beside the one that hangs";
  }

  settle();
  EXPECT_FALSE(a.resolving());
  {
    std::lock_guard lk(db.mu);
    EXPECT_EQ(db.lookups, 6) << "the first lookup, then one more for the SIGHUPs that came meanwhile";
  }
  EXPECT_FALSE(a.is_trusted(member)) << "the renumbered group keeps no old gid";
  EXPECT_TRUE(a.is_trusted(renumbered));
  EXPECT_TRUE(a.is_admin(op)) << "the group made meanwhile admits from the answer on";
  EXPECT_TRUE(a.resolve_in_background(**loop)) << "a later SIGHUP looks up again";
  settle();
  std::lock_guard lk(db.mu);
  EXPECT_EQ(db.lookups, 8);
}

// The real lookup, on groups every Debian system has (base-passwd).
TEST(Access, TheSystemLookupFindsAGroupAndNamesAMissingOne) {
  for (auto [name, gid] : {std::pair{"root", gid_t{0}}, std::pair{"nogroup", gid_t{65534}}}) {
    auto r = Access::lookup_group(name);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(*r, std::optional<gid_t>(gid)) << name;
  }
  auto none = Access::lookup_group("airs-no-such-group-here");
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_EQ(*none, std::nullopt);
  Access a("root", "", Access::lookup_group);
  EXPECT_TRUE(a.is_admin(a_caller(1001, 1001, {0})));
  EXPECT_FALSE(a.is_admin(a_caller(1001, 1001, {65534})));
}

}  // namespace
}  // namespace airs::daemon
