// SessionRegistry: one session per connection, per-uid limits, token
// authentication, and the per-session event queue.
#include "session/session_registry.h"

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

PeerCred Cred(uint32_t uid, int pid = 100) { return PeerCred{pid, uid, uid}; }

v1::SessionEvent MemberEvent(const std::string& group, uint32_t rank) {
  v1::SessionEvent ev;
  ev.mutable_member()->set_group(group);
  ev.mutable_member()->set_rank(rank);
  ev.mutable_member()->set_kind(v1::MemberEvent::LEFT);
  return ev;
}

TEST(SessionRegistryTest, OpenFindClose) {
  SessionRegistry reg(16);
  absl::Time before = absl::Now();
  absl::StatusOr<SessionInfo> s = reg.Open(Cred(1000, 55), /*conn_fd=*/10, "trainer");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GT(s->id, 0u);
  EXPECT_EQ(s->token.size(), 16u);
  EXPECT_EQ(s->cred.uid, 1000u);
  EXPECT_EQ(s->cred.pid, 55);
  EXPECT_EQ(s->client_name, "trainer");
  EXPECT_EQ(s->connection_fd, 10);
  EXPECT_GE(s->opened, before);
  EXPECT_EQ(reg.size(), 1u);

  std::optional<SessionInfo> by_id = reg.Find(s->id);
  ASSERT_TRUE(by_id.has_value());
  EXPECT_EQ(by_id->token, s->token);
  std::optional<SessionInfo> by_conn = reg.FindByConnection(10);
  ASSERT_TRUE(by_conn.has_value());
  EXPECT_EQ(by_conn->id, s->id);
  EXPECT_FALSE(reg.FindByConnection(11).has_value());

  EXPECT_TRUE(reg.Close(s->id));
  EXPECT_FALSE(reg.Close(s->id)) << "second close reports the session was already gone";
  EXPECT_FALSE(reg.Find(s->id).has_value());
  EXPECT_FALSE(reg.FindByConnection(10).has_value());
  EXPECT_EQ(reg.size(), 0u);
}

TEST(SessionRegistryTest, IdsAndTokensAreUnique) {
  SessionRegistry reg(16);
  absl::StatusOr<SessionInfo> a = reg.Open(Cred(1000), 10, "a");
  absl::StatusOr<SessionInfo> b = reg.Open(Cred(1000), 11, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->id, b->id);
  EXPECT_NE(a->token, b->token);
  EXPECT_EQ(reg.List().size(), 2u);
}

// A longer client_name is refused, not cut (a cut could split a UTF-8
// character, which protobuf then refuses to carry to `mcctl sessions`).
TEST(SessionRegistryTest, LongClientNameIsRejected) {
  SessionRegistry reg(16);
  absl::StatusOr<SessionInfo> max = reg.Open(Cred(1000), 10, std::string(256, 'n'));
  ASSERT_TRUE(max.ok()) << max.status();
  EXPECT_EQ(max->client_name, std::string(256, 'n'));
  const std::string name = std::string(255, 'a') + "\xc3\xa9" + "tail";  // 261 bytes
  absl::StatusOr<SessionInfo> s = reg.Open(Cred(1000), 11, name);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_EQ(s.status().message(),
            "client_name is 261 bytes; the limit is 256: choose a shorter "
            "ClientOptions::client_name");
  EXPECT_EQ(reg.List().size(), 1u) << "a refused name opens no session";
}

TEST(SessionRegistryTest, OneSessionPerConnection) {
  SessionRegistry reg(16);
  absl::StatusOr<SessionInfo> first = reg.Open(Cred(1000), 10, "a");
  ASSERT_TRUE(first.ok());
  absl::StatusOr<SessionInfo> second = reg.Open(Cred(1000), 10, "b");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  EXPECT_NE(second.status().message().find(std::to_string(first->id)), absl::string_view::npos);
  // After closing, the connection (or a reused fd number) may open again.
  ASSERT_TRUE(reg.Close(first->id));
  EXPECT_TRUE(reg.Open(Cred(1000), 10, "c").ok());
}

TEST(SessionRegistryTest, PerUidLimit) {
  SessionRegistry reg(2);
  absl::StatusOr<SessionInfo> a = reg.Open(Cred(1000), 10, "");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(reg.Open(Cred(1000), 11, "").ok());
  absl::StatusOr<SessionInfo> third = reg.Open(Cred(1000), 12, "");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_NE(third.status().message().find("max_sessions_per_uid"), absl::string_view::npos);
  // Another uid has its own budget.
  EXPECT_TRUE(reg.Open(Cred(2000), 13, "").ok());
  // Closing frees a slot.
  ASSERT_TRUE(reg.Close(a->id));
  EXPECT_TRUE(reg.Open(Cred(1000), 12, "").ok());
}

// Issue 23 item 7: a client that reads no events cannot grow its queue
// without end; the event past the bound drops the session, once, with a
// reason that names it, and frees what was queued.
TEST(SessionRegistryTest, AnOverflowingEventQueueDropsTheSession) {
  SessionRegistry reg(16);
  std::vector<std::string> reasons;
  reg.SetOverflowHandler([&](const SessionInfo& s, const std::string& reason) {
    EXPECT_EQ(s.connection_fd, 10);
    reasons.push_back(reason);
  });
  absl::StatusOr<SessionInfo> s = reg.Open(Cred(1000, 77), 10, "slow-reader");
  absl::StatusOr<SessionInfo> other = reg.Open(Cred(1000), 11, "reader");
  ASSERT_TRUE(s.ok() && other.ok());
  for (size_t i = 0; i < SessionRegistry::kMaxQueuedEvents; ++i)
    reg.Post(s->id, MemberEvent("g", 1));
  EXPECT_TRUE(reasons.empty());
  reg.Post(s->id, MemberEvent("g", 1));
  reg.Post(s->id, MemberEvent("g", 2));  // ignored: already dropped
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_NE(reasons[0].find("session " + std::to_string(s->id) + " of uid 1000"), std::string::npos)
      << reasons[0];
  EXPECT_NE(reasons[0].find("'slow-reader'"), std::string::npos) << reasons[0];
  EXPECT_NE(reasons[0].find("4096 events unread"), std::string::npos) << reasons[0];
  EXPECT_TRUE(reg.TakeEvents(s->id).empty()) << "the queue was freed";
  // Another session of the same user is untouched.
  reg.Post(other->id, MemberEvent("g", 3));
  EXPECT_EQ(reg.TakeEvents(other->id).size(), 1u);
}

// Issue 23 item 4: root on a tenant's socket is a tenant (refused past the
// limit), and the same uid of two tenants is two users.
TEST(SessionRegistryTest, RootOnATenantSocketIsLimitedPerTenant) {
  SessionRegistry reg(3);
  int fd = 10;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reg.Open(Cred(0), fd++, "", "team-a").ok());
  absl::StatusOr<SessionInfo> more = reg.Open(Cred(0), fd++, "", "team-a");
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted) << more.status();
  EXPECT_NE(more.status().message().find("uid 0 of tenant 'team-a'"), absl::string_view::npos)
      << more.status();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(reg.Open(Cred(0), fd++, "", "team-b").ok());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(reg.Open(Cred(1000), fd++, "", "team-a").ok());
  EXPECT_FALSE(reg.Open(Cred(1000), fd++, "", "team-a").ok());
  EXPECT_TRUE(reg.Open(Cred(1000), fd++, "").ok()) << "uid 1000 on the main socket is another user";
  EXPECT_TRUE(reg.Open(Cred(0), fd++, "").ok()) << "root on the main socket is never refused";
}

// Root and the daemon's own uid are counted but never refused (docs/limits.md),
// as by the other per-uid limits: an unprivileged flood cannot lock root out.
TEST(SessionRegistryTest, PrivilegedUidsAreNotRefused) {
  SessionRegistry reg(2);
  for (int fd = 10; fd < 15; ++fd) {
    EXPECT_TRUE(reg.Open(Cred(0), fd, "").ok()) << "root session on fd " << fd;
  }
  const uint32_t me = static_cast<uint32_t>(::geteuid());
  for (int fd = 20; fd < 25; ++fd) {
    EXPECT_TRUE(reg.Open(Cred(me), fd, "").ok()) << "the daemon's own uid, fd " << fd;
  }
}

TEST(SessionRegistryTest, Authenticate) {
  SessionRegistry reg(16);
  absl::StatusOr<SessionInfo> s = reg.Open(Cred(1000), 10, "");
  ASSERT_TRUE(s.ok());
  absl::StatusOr<SessionInfo> ok = reg.Authenticate(s->id, s->token, 1000);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->id, s->id);

  std::string wrong = s->token;
  wrong[0] = static_cast<char>(wrong[0] ^ 0x80);
  EXPECT_EQ(reg.Authenticate(s->id, wrong, 1000).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(reg.Authenticate(s->id, "", 1000).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(reg.Authenticate(s->id, s->token.substr(0, 15), 1000).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(reg.Authenticate(s->id, s->token, 1001).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(reg.Authenticate(s->id + 100, s->token, 1000).status().code(),
            absl::StatusCode::kPermissionDenied);

  // "No such session" and "wrong token" read the same, so ids can't be probed.
  absl::Status bad_token = reg.Authenticate(s->id, wrong, 1000).status();
  ASSERT_TRUE(reg.Close(s->id));
  absl::Status closed = reg.Authenticate(s->id, s->token, 1000).status();
  EXPECT_EQ(closed.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(closed.message(), bad_token.message());
}

TEST(SessionRegistryTest, PostWaitKeepsOrder) {
  SessionRegistry reg(16);
  absl::StatusOr<SessionInfo> s = reg.Open(Cred(1000), 10, "");
  ASSERT_TRUE(s.ok());
  for (uint32_t i = 0; i < 5; ++i) reg.Post(s->id, MemberEvent("g", i));
  auto events = reg.Wait(s->id, absl::Seconds(1));
  ASSERT_TRUE(events.has_value());
  ASSERT_EQ(events->size(), 5u);
  for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ((*events)[i].member().rank(), i);
  // The queue was drained.
  auto empty = reg.Wait(s->id, absl::Milliseconds(20));
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->empty());
}

TEST(SessionRegistryTest, EventsGoOnlyToTheirSession) {
  SessionRegistry reg(16);
  absl::StatusOr<SessionInfo> a = reg.Open(Cred(1000), 10, "");
  absl::StatusOr<SessionInfo> b = reg.Open(Cred(1000), 11, "");
  ASSERT_TRUE(a.ok() && b.ok());
  reg.Post(a->id, MemberEvent("for-a", 0));
  auto got_b = reg.Wait(b->id, absl::Milliseconds(20));
  ASSERT_TRUE(got_b.has_value());
  EXPECT_TRUE(got_b->empty());
  auto got_a = reg.Wait(a->id, absl::Milliseconds(20));
  ASSERT_TRUE(got_a.has_value());
  ASSERT_EQ(got_a->size(), 1u);
  EXPECT_EQ((*got_a)[0].member().group(), "for-a");
}

TEST(SessionRegistryTest, WaitTimesOutEmpty) {
  SessionRegistry reg(16);
  absl::StatusOr<SessionInfo> s = reg.Open(Cred(1000), 10, "");
  ASSERT_TRUE(s.ok());
  absl::Time start = absl::Now();
  auto events = reg.Wait(s->id, absl::Milliseconds(100));
  absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(events.has_value());
  EXPECT_TRUE(events->empty());
  EXPECT_GE(took, absl::Milliseconds(90));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(SessionRegistryTest, WaitWakesOnPostFromAnotherThread) {
  SessionRegistry reg(16);
  absl::StatusOr<SessionInfo> s = reg.Open(Cred(1000), 10, "");
  ASSERT_TRUE(s.ok());
  std::thread poster([&] {
    absl::SleepFor(absl::Milliseconds(50));
    reg.Post(s->id, MemberEvent("late", 3));
  });
  absl::Time start = absl::Now();
  auto events = reg.Wait(s->id, absl::Seconds(10));
  absl::Duration took = absl::Now() - start;
  poster.join();
  ASSERT_TRUE(events.has_value());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].member().group(), "late");
  EXPECT_LT(took, absl::Seconds(5)) << "Wait must wake on Post, not sleep out its timeout";
}

TEST(SessionRegistryTest, WaitOnClosedOrUnknownSessionIsNullopt) {
  SessionRegistry reg(16);
  EXPECT_FALSE(reg.Wait(12345, absl::Milliseconds(10)).has_value());
  absl::StatusOr<SessionInfo> s = reg.Open(Cred(1000), 10, "");
  ASSERT_TRUE(s.ok());
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    reg.Close(s->id);
  });
  absl::Time start = absl::Now();
  auto events = reg.Wait(s->id, absl::Seconds(10));
  closer.join();
  EXPECT_FALSE(events.has_value());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "Close must wake the waiter";
}

TEST(SessionRegistryTest, PostToUnknownSessionIsIgnored) {
  SessionRegistry reg(16);
  reg.Post(777, MemberEvent("nobody", 0));
  EXPECT_EQ(reg.size(), 0u);
}

TEST(SessionRegistryTest, ShutdownDeliversEventThenNullopt) {
  SessionRegistry reg(16);
  absl::StatusOr<SessionInfo> a = reg.Open(Cred(1000), 10, "");
  absl::StatusOr<SessionInfo> b = reg.Open(Cred(2000), 11, "");
  ASSERT_TRUE(a.ok() && b.ok());
  reg.Post(a->id, MemberEvent("before", 1));

  // A waiter blocked before Shutdown is woken by it.
  std::optional<std::vector<v1::SessionEvent>> b_events;
  std::thread waiter([&] { b_events = reg.Wait(b->id, absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(50));
  absl::Time start = absl::Now();
  reg.Shutdown("maintenance");
  waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_TRUE(b_events.has_value());
  ASSERT_EQ(b_events->size(), 1u);
  EXPECT_TRUE((*b_events)[0].has_shutdown());
  EXPECT_EQ((*b_events)[0].shutdown().reason(), "maintenance");

  // Queued events come first, then the shutdown notice.
  auto a_events = reg.Wait(a->id, absl::Seconds(1));
  ASSERT_TRUE(a_events.has_value());
  ASSERT_EQ(a_events->size(), 2u);
  EXPECT_EQ((*a_events)[0].member().group(), "before");
  EXPECT_TRUE((*a_events)[1].has_shutdown());

  // Then the stream ends, promptly.
  start = absl::Now();
  EXPECT_FALSE(reg.Wait(a->id, absl::Seconds(10)).has_value());
  EXPECT_FALSE(reg.Wait(b->id, absl::Seconds(10)).has_value());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // No new sessions after shutdown.
  EXPECT_EQ(reg.Open(Cred(1000), 12, "").status().code(), absl::StatusCode::kUnavailable);
}

TEST(SessionRegistryTest, TakeEventsDrainsInOrderWithoutWaiting) {
  SessionRegistry reg(16);
  absl::StatusOr<SessionInfo> s = reg.Open(Cred(1000), 10, "");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(reg.TakeEvents(s->id).empty());
  EXPECT_TRUE(reg.TakeEvents(9999).empty()) << "unknown session: nothing, no error";
  for (uint32_t i = 0; i < 3; ++i) reg.Post(s->id, MemberEvent("t", i));
  std::vector<v1::SessionEvent> ev = reg.TakeEvents(s->id);
  ASSERT_EQ(ev.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(ev[i].member().rank(), i);
  EXPECT_TRUE(reg.TakeEvents(s->id).empty());
}

TEST(SessionRegistryTest, NotifierRunsAfterEachPostOutsideTheLock) {
  SessionRegistry reg(16);
  absl::StatusOr<SessionInfo> s = reg.Open(Cred(1000), 10, "");
  absl::StatusOr<SessionInfo> other = reg.Open(Cred(1000), 11, "");
  ASSERT_TRUE(s.ok() && other.ok());
  std::atomic<int> calls{0};
  std::atomic<bool> saw_event{false};
  std::atomic<bool> registry_was_locked{false};
  reg.SetNotifier(s->id, [&] {
    ++calls;
    // The stream handler drains from inside the notifier; that must not
    // need the lock the poster still holds. Probe from another thread so a
    // violation shows as a timeout instead of a self-deadlock.
    auto probe = std::async(std::launch::async, [&] { return reg.TakeEvents(s->id); });
    if (probe.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
      registry_was_locked = true;
    }
    if (!probe.get().empty()) saw_event = true;
  });
  reg.Post(s->id, MemberEvent("n", 1));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(saw_event.load()) << "the event is queued before the notifier runs";
  EXPECT_FALSE(registry_was_locked.load()) << "notifier ran under the registry lock";
  reg.Post(other->id, MemberEvent("n", 2));
  EXPECT_EQ(calls.load(), 1) << "another session's events do not wake this one";
  reg.Shutdown("bye");
  EXPECT_EQ(calls.load(), 2) << "Shutdown notifies too";
}

TEST(SessionRegistryTest, NotifierIsDroppedWithTheSession) {
  SessionRegistry reg(16);
  absl::StatusOr<SessionInfo> s = reg.Open(Cred(1000), 10, "");
  ASSERT_TRUE(s.ok());
  std::atomic<int> calls{0};
  reg.SetNotifier(s->id, [&] { ++calls; });
  ASSERT_TRUE(reg.Close(s->id));
  reg.Post(s->id, MemberEvent("gone", 0));
  EXPECT_EQ(calls.load(), 0);
  reg.SetNotifier(424242, [&] { ++calls; });  // unknown id: ignored
  reg.Post(424242, MemberEvent("gone", 0));
  EXPECT_EQ(calls.load(), 0);
}

TEST(SessionRegistryTest, ConcurrentOpenClose) {
  SessionRegistry reg(100000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&reg, t] {
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<SessionInfo> s = reg.Open(Cred(1000 + t % 2), t * 1000 + i, "");
        ASSERT_TRUE(s.ok()) << s.status();
        reg.Post(s->id, MemberEvent("x", 0));
        if (i % 2 == 0) ASSERT_TRUE(reg.Close(s->id));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(reg.size(), 8u * 100u);
}

TEST(RandomBytesTest, LengthAndHex) {
  std::string r = RandomBytes(16);
  EXPECT_EQ(r.size(), 16u);
  EXPECT_NE(r, RandomBytes(16));
  EXPECT_EQ(HexEncode(std::string("\x01\xab\xff", 3)), "01abff");
  EXPECT_EQ(HexEncode(r).size(), 32u);
}

}  // namespace
}  // namespace mooncake::daemon
