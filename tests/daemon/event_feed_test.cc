// EventFeed (daemon/server/event_feed.h): uid and tenant scoping, the watch limits,
// drop-oldest with a DROPPED notice, and Close().
#include "server/event_feed.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace mooncake::daemon {
namespace {

GroupEvent Joined(uint32_t uid, const std::string& group, uint32_t rank) {
  GroupEvent e;
  e.kind = GroupEvent::Kind::kJoined;
  e.uid = uid;
  e.group = group;
  e.rank = rank;
  e.world_size = 4;
  e.pid = 100 + static_cast<int>(rank);
  return e;
}

std::vector<v1::WatchEvent> Drain(EventFeed::Watcher& w) {
  std::vector<v1::WatchEvent> out;
  while (auto ev = w.Next()) out.push_back(*ev);
  return out;
}

TEST(EventFeedTest, WatchersSeeTheirUidAndRootSeesAll) {
  EventFeed feed;
  std::atomic<int> wakes{0};
  auto alice = feed.Subscribe(1000, [&] { ++wakes; });
  auto bob = feed.Subscribe(2000, [] {});
  auto root = feed.Subscribe(0, [] {});
  ASSERT_TRUE(alice.ok() && bob.ok() && root.ok());
  feed.OnGroupEvent(Joined(1000, "a", 0));
  feed.OnGroupEvent(Joined(2000, "b", 1));
  feed.OnGroupEvent(Joined(0, "r", 2));

  auto a = Drain(**alice);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].kind(), v1::WatchEvent::WATCHING);
  EXPECT_EQ(a[1].kind(), v1::WatchEvent::MEMBER_JOINED);
  EXPECT_EQ(a[1].group(), "a");
  EXPECT_EQ(a[1].pid(), 100);
  EXPECT_EQ(a[1].world_size(), 4u);
  EXPECT_GT(a[1].seq(), a[0].seq());
  EXPECT_GT(a[1].time_unix_ms(), 0u);
  EXPECT_EQ(wakes.load(), 1);

  auto b = Drain(**bob);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[1].group(), "b");

  auto r = Drain(**root);
  ASSERT_EQ(r.size(), 4u);  // WATCHING, a, b, r: root's own group once
  EXPECT_EQ(r[1].group(), "a");
  EXPECT_EQ(r[2].group(), "b");
  EXPECT_EQ(r[3].group(), "r");
  EXPECT_LT(r[2].seq(), r[3].seq());
}

TEST(EventFeedTest, WatchLimitsPerUidAndUnsubscribeGivesBack) {
  EventFeed feed;
  std::vector<std::shared_ptr<EventFeed::Watcher>> held;
  for (size_t i = 0; i < EventFeed::kMaxWatchersPerUid; ++i) {
    auto w = feed.Subscribe(1000, [] {});
    ASSERT_TRUE(w.ok()) << w.status();
    held.push_back(*w);
  }
  auto refused = feed.Subscribe(1000, [] {});
  ASSERT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("uid 1000"), std::string::npos);
  EXPECT_TRUE(feed.Subscribe(1001, [] {}).ok());  // another user is not affected
  feed.Unsubscribe(held.back());
  feed.Unsubscribe(held.back());  // idempotent
  EXPECT_EQ(feed.WatchersOf(Principal{1000}), EventFeed::kMaxWatchersPerUid - 1);
  EXPECT_TRUE(feed.Subscribe(1000, [] {}).ok());
}

TEST(EventFeedTest, TotalWatchLimit) {
  EventFeed feed;
  std::vector<std::shared_ptr<EventFeed::Watcher>> held;
  for (uint32_t uid = 1; held.size() < EventFeed::kMaxWatchers; ++uid) {
    auto w = feed.Subscribe(uid, [] {});
    ASSERT_TRUE(w.ok());
    held.push_back(*w);
  }
  EXPECT_TRUE(absl::IsResourceExhausted(feed.Subscribe(99999, [] {}).status()));
}

TEST(EventFeedTest, SlowWatcherLosesOldestAndIsToldHowMany) {
  EventFeed feed(/*queue_depth=*/4);
  auto w = feed.Subscribe(1000, [] {});
  ASSERT_TRUE(w.ok());
  for (uint32_t rank = 0; rank < 10; ++rank) feed.OnGroupEvent(Joined(1000, "g", rank));
  auto got = Drain(**w);
  // 11 queued (WATCHING + 10) into 4 slots: 7 dropped, the newest 4 kept.
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].kind(), v1::WatchEvent::DROPPED);
  EXPECT_EQ(got[0].dropped(), 7u);
  EXPECT_NE(got[0].detail().find("7 events dropped"), std::string::npos);
  EXPECT_EQ(got[1].rank(), 6u);
  EXPECT_EQ(got[4].rank(), 9u);
  EXPECT_FALSE((*w)->Next().has_value());  // the notice is given once
}

TEST(EventFeedTest, UnsubscribedWatcherGetsNothingAndCloseDrains) {
  EventFeed feed;
  std::atomic<int> wakes{0};
  auto gone = feed.Subscribe(1000, [&] { ++wakes; });
  auto stays = feed.Subscribe(1000, [] {});
  ASSERT_TRUE(gone.ok() && stays.ok());
  feed.Unsubscribe(*gone);
  feed.OnGroupEvent(Joined(1000, "g", 0));
  EXPECT_EQ(wakes.load(), 0);
  EXPECT_EQ(Drain(**gone).size(), 1u);  // its WATCHING only

  EXPECT_FALSE((*stays)->Drained());
  feed.Close();
  EXPECT_FALSE((*stays)->Drained());  // still holds WATCHING and the join
  EXPECT_EQ(Drain(**stays).size(), 2u);
  EXPECT_TRUE((*stays)->Drained());
  EXPECT_TRUE(absl::IsFailedPrecondition(feed.Subscribe(1000, [] {}).status()));
  feed.OnGroupEvent(Joined(1000, "g", 1));  // after Close: nothing, no crash
}

// A user's main-socket watch does not see its uid's groups of a tenant
// socket, nor a tenant's root another tenant's; root on the main socket
// sees every tenant's (the Scope rules of ListGroups).
TEST(EventFeedTest, WatchersSeeOnlyTheirTenantsGroups) {
  EventFeed feed;
  auto main_user = feed.Subscribe(1000, [] {});
  auto a_user = feed.Subscribe(Scope{1000, "a", false, false}, [] {});
  auto a_root = feed.Subscribe(Scope{0, "a", true, false}, [] {});
  auto main_root = feed.Subscribe(0, [] {});
  ASSERT_TRUE(main_user.ok() && a_user.ok() && a_root.ok() && main_root.ok());
  GroupEvent in_a = Joined(1000, "g", 0);
  in_a.tenant = "a";
  GroupEvent in_b = Joined(1000, "g", 1);
  in_b.tenant = "b";
  feed.OnGroupEvent(in_a);
  feed.OnGroupEvent(in_b);
  feed.OnGroupEvent(Joined(1000, "g", 2));  // the main socket's

  auto ranks = [](EventFeed::Watcher& w) {
    std::vector<std::pair<uint32_t, std::string>> out;
    for (const v1::WatchEvent& e : Drain(w)) {
      if (e.kind() == v1::WatchEvent::MEMBER_JOINED) out.emplace_back(e.rank(), e.tenant());
    }
    return out;
  };
  using R = std::vector<std::pair<uint32_t, std::string>>;
  EXPECT_EQ(ranks(**main_user), (R{{2, ""}}));
  EXPECT_EQ(ranks(**a_user), (R{{0, "a"}}));
  EXPECT_EQ(ranks(**a_root), (R{{0, "a"}}));
  EXPECT_EQ(ranks(**main_root), (R{{0, "a"}, {1, "b"}, {2, ""}}));
}

// As every per-uid limit: root is counted but never refused, so users
// holding every watch cannot blind root's mcctl watch.
TEST(EventFeedTest, RootIsNeverRefusedAWatch) {
  EventFeed feed;
  std::vector<std::shared_ptr<EventFeed::Watcher>> held;
  for (uint32_t uid = 10000; held.size() < EventFeed::kMaxWatchers; ++uid) {
    auto w = feed.Subscribe(uid, [] {});
    ASSERT_TRUE(w.ok()) << w.status();
    held.push_back(*w);
  }
  EXPECT_TRUE(absl::IsResourceExhausted(feed.Subscribe(99999, [] {}).status()));
  for (size_t i = 0; i < EventFeed::kMaxWatchersPerUid + 1; ++i) {
    auto root = feed.Subscribe(0, [] {});
    ASSERT_TRUE(root.ok()) << root.status();
    held.push_back(*root);
  }
  // Root's watches do not take unprivileged users' room: one user leaving
  // makes room for one.
  feed.Unsubscribe(held.front());
  feed.Unsubscribe(held.back());
  EXPECT_TRUE(feed.Subscribe(99999, [] {}).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(feed.Subscribe(99998, [] {}).status()));
}

TEST(EventFeedTest, EveryBrokerKindHasAWireKind) {
  using K = GroupEvent::Kind;
  for (K k : {K::kJoined, K::kWithdrew, K::kFormed, K::kReady, K::kFailed, K::kGroupReady, K::kLeft,
              K::kLost, K::kReleased}) {
    EXPECT_NE(EventFeed::KindOf(k), v1::WatchEvent::KIND_UNSPECIFIED);
  }
}

}  // namespace
}  // namespace mooncake::daemon
