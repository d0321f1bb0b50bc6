// Group brokering through a real daemon: views, fd exchange, and every
// invalid join leaving the group consistent while the daemon keeps serving.
#include <sys/mman.h>
#include <unistd.h>

#include <thread>

#include "daemon_process.h"
#include "gtest/gtest.h"
#include "mooncake/client/client.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

class GroupRendezvous : public ::testing::Test {
 protected:
  void SetUp() override { daemon_ = std::make_unique<DaemonProcess>(dir_.path()); }
  std::unique_ptr<Client> Connect() {
    auto c = Client::Connect({.socket_path = daemon_->socket()});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  TempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

int MemfdWith(const std::string& text) {
  int fd = ::memfd_create("t", MFD_CLOEXEC);
  EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  return fd;
}

TEST_F(GroupRendezvous, FourRanksExchangeHandlesAndFds) {
  constexpr int kRanks = 4;
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < kRanks; ++r) clients.push_back(Connect());
  std::vector<absl::StatusOr<GroupView>> views(kRanks, absl::UnknownError("unset"));
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      int fd = MemfdWith("payload-" + std::to_string(r));
      views[r] = clients[r]->joinGroup({.group = "four",
                                        .rank = static_cast<uint32_t>(r),
                                        .world_size = kRanks,
                                        .timeout = absl::Seconds(10),
                                        .handle_kind = "memfd",
                                        .handle_data = "handle-" + std::to_string(r),
                                        .handle_size = 9,
                                        .fds = {fd}});
      ::close(fd);  // the daemon holds its own duplicate
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(views[r].ok()) << views[r].status();
    const GroupView& v = *views[r];
    EXPECT_EQ(v.rank, static_cast<uint32_t>(r));
    EXPECT_EQ(v.world_size, 4u);
    EXPECT_EQ(v.epoch, 1u);
    ASSERT_EQ(v.members.size(), 4u);
    for (int p = 0; p < kRanks; ++p) {
      const GroupMember& m = v.members[p];
      EXPECT_EQ(m.rank, static_cast<uint32_t>(p));
      EXPECT_EQ(m.handle_data, "handle-" + std::to_string(p));
      EXPECT_EQ(m.handle_kind, "memfd");
      EXPECT_EQ(m.node_id, "testnode");
      EXPECT_TRUE(m.same_node);
      EXPECT_TRUE(m.p2p_reachable);  // host platform: shared memory
      EXPECT_EQ(m.gpu_index, -1);
      ASSERT_EQ(m.fd_count, 1u);
      if (p == r) continue;  // one's own fds are not fetched
      auto fds = clients[r]->fetchFds(m.fd_ticket);
      ASSERT_TRUE(fds.ok()) << fds.status();
      ASSERT_EQ(fds->size(), 1u);
      char buf[32] = {};
      ASSERT_GT(::pread((*fds)[0].get(), buf, sizeof(buf) - 1, 0), 0);
      EXPECT_EQ(std::string(buf), "payload-" + std::to_string(p));
    }
  }
  // One ticket per member for the whole group, the same in every view,
  // good for world_size - 1 fetches: all used now.
  for (int p = 0; p < kRanks; ++p) {
    EXPECT_EQ(views[0]->members[p].fd_ticket, views[1]->members[p].fd_ticket);
    auto again = clients[0]->fetchFds(views[0]->members[p].fd_ticket);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << "rank " << p;
  }
  v1::ListGroupsResponse groups = ListGroups(daemon_->socket());
  ASSERT_EQ(groups.groups_size(), 1);
  EXPECT_EQ(groups.groups(0).name(), "four");
  EXPECT_EQ(groups.groups(0).joined(), 4u);
  EXPECT_EQ(groups.groups(0).state(), "formed");
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(clients[r]->reportReady("four", r, true).ok());
  }
  EXPECT_EQ(ListGroups(daemon_->socket()).groups(0).state(), "ready");
  auto ev = clients[2]->nextEvent(absl::Seconds(2));
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->kind, SessionEvent::Kind::kReady);
}

TEST_F(GroupRendezvous, InvalidJoinsGetPreciseErrors) {
  auto c = Connect();
  auto join = [&](JoinOptions o) { return c->joinGroup(o).status(); };
  absl::Status s = join({.group = "g", .rank = 2, .world_size = 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank 2 is out of range for world size 2"), std::string::npos) << s;
  s = join({.group = "g", .rank = 0, .world_size = 0});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("world size 0"), std::string::npos) << s;
  s = join({.group = "g", .rank = 0, .world_size = 4000000000u});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exceeds the limit"), std::string::npos) << s;
  s = join({.group = "bad name/with slash", .rank = 0, .world_size = 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = join({.group = "", .rank = 0, .world_size = 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = join({.group = "g", .rank = 0, .world_size = 2, .handle_data = std::string(5000, 'x')});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = join({.group = "g", .rank = 0, .world_size = 2, .gpu_uuid = "GPU-not-here"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("is not on this node"), std::string::npos) << s;
  EXPECT_EQ(ListGroups(daemon_->socket()).groups_size(), 0);

  // Deadline: names the missing ranks, leaves nothing behind.
  auto t0 = absl::Now();
  s = join({.group = "slow", .rank = 1, .world_size = 3, .timeout = absl::Milliseconds(300)});
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("missing ranks: 0,2"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  EXPECT_EQ(ListGroups(daemon_->socket()).groups_size(), 0);

  // Duplicate rank and world-size mismatch while rank 0 waits.
  auto holder = Connect();
  std::thread hold([&] {
    auto v = holder->joinGroup(
        {.group = "held", .rank = 0, .world_size = 2, .timeout = absl::Seconds(3)});
    EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  });
  for (int i = 0; i < 100 && ListGroups(daemon_->socket()).groups_size() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  s = join({.group = "held", .rank = 0, .world_size = 2, .timeout = absl::Milliseconds(200)});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_NE(s.message().find("already taken by pid"), std::string::npos) << s;
  s = join({.group = "held", .rank = 1, .world_size = 3, .timeout = absl::Milliseconds(200)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("has world size 2"), std::string::npos) << s;
  v1::ListGroupsResponse g = ListGroups(daemon_->socket());
  ASSERT_EQ(g.groups_size(), 1);
  EXPECT_EQ(g.groups(0).joined(), 1u);
  EXPECT_EQ(g.groups(0).state(), "forming");
  hold.join();
  EXPECT_EQ(ListGroups(daemon_->socket()).groups_size(), 0);
  // Still serving.
  EXPECT_TRUE(c->hello().ok());
}

// Elastic groups: a rank that left is taken again once the survivors
// released it (before that the replacement waits and times out naming
// them); the group re-forms at epoch 2 and the survivor hears JOINED.
TEST_F(GroupRendezvous, FormedGroupIsReenteredOnceTheSurvivorsReleasedTheRank) {
  auto a = Connect();
  auto b = Connect();
  std::thread t(
      [&] { EXPECT_TRUE(b->joinGroup({.group = "f", .rank = 1, .world_size = 2}).ok()); });
  ASSERT_TRUE(a->joinGroup({.group = "f", .rank = 0, .world_size = 2}).ok());
  t.join();
  ASSERT_TRUE(b->leaveGroup("f", 1).ok());
  auto ev = a->nextEvent(absl::Seconds(2));
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->kind, SessionEvent::Kind::kLeft);
  auto c = Connect();
  absl::Status s =
      c->joinGroup({.group = "f", .rank = 1, .world_size = 2, .timeout = absl::Milliseconds(200)})
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("not yet released by ranks 0"), std::string::npos) << s;
  EXPECT_EQ(b->leaveGroup("f", 1).code(), absl::StatusCode::kNotFound);
  // Only a vacant rank is released.
  EXPECT_EQ(a->releaseRank("f", 0, 0).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a->releaseRank("f", 0, 1).ok());
  absl::StatusOr<GroupView> view = c->joinGroup({.group = "f", .rank = 1, .world_size = 2});
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->epoch, 2u);
  ev = a->nextEvent(absl::Seconds(2));
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->kind, SessionEvent::Kind::kJoined);
  EXPECT_EQ(ev->rank, 1u);
  EXPECT_EQ(ev->epoch, 2u);
  ASSERT_TRUE(ev->member.has_value());
  EXPECT_EQ(ev->member->pid, getpid());
  ASSERT_TRUE(a->leaveGroup("f", 0).ok());
  ASSERT_TRUE(c->leaveGroup("f", 1).ok());
  EXPECT_EQ(ListGroups(daemon_->socket()).groups_size(), 0);
}

}  // namespace
}  // namespace mooncake::testing
