// SessionLifecycle: the one place a session ends. Ending it closes the
// session, frees its fds and tells its groups, in that order, once; an
// export racing the end never outlives it.
#include "server/session_lifecycle.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "mooncake/common/log.h"
#include "server/admin_service.h"

namespace mooncake::daemon {
namespace {

std::vector<UniqueFd> Memfd() {
  std::vector<UniqueFd> out;
  out.emplace_back(::memfd_create("session_lifecycle_test", MFD_CLOEXEC));
  return out;
}

v1::JoinGroupRequest Req(const std::string& group, uint32_t rank, uint32_t n) {
  v1::JoinGroupRequest r;
  r.set_group(group);
  r.set_rank(rank);
  r.set_world_size(n);
  r.set_timeout_ms(10000);
  return r;
}

class SessionLifecycleTest : public ::testing::Test {
 protected:
  ~SessionLifecycleTest() override { broker_.Shutdown(); }

  SessionInfo Open() {
    int conn = next_conn_++;
    absl::StatusOr<SessionInfo> s = lifecycle_.Open(PeerCred{conn + 10000, 1000, 1000}, conn, "t");
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }

  SessionRegistry sessions_{1000};
  FdBroker fds_{absl::Seconds(30), &sessions_};
  GroupBroker broker_{"node-a", v1::Topology(), BrokerLimits(), &sessions_, &fds_};
  SessionLifecycle lifecycle_{&sessions_, &fds_, /*rdma=*/nullptr, &broker_};
  int next_conn_ = 100;
};

TEST_F(SessionLifecycleTest, OpenIsOnePerConnection) {
  ASSERT_TRUE(lifecycle_.Open(PeerCred{1, 1000, 1000}, 7, "a").ok());
  EXPECT_EQ(lifecycle_.Open(PeerCred{1, 1000, 1000}, 7, "b").status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(SessionLifecycleTest, EndFreesEverythingAndTellsTheGroupOnce) {
  SessionInfo a = Open(), b = Open();
  // a holds an export, an unused incoming ticket, and rank 0 of a formed group.
  absl::StatusOr<std::string> t = fds_.AddIncoming(a, Memfd());
  ASSERT_TRUE(t.ok());
  absl::StatusOr<ExportRecord> e = fds_.Export(a, *t, "memfd", 1);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(fds_.AddIncoming(a, Memfd()).ok());
  auto never = [] { return false; };
  auto fa = std::async(std::launch::async,
                       [&] { return broker_.Join(a, Req("g", 0, 2), nullptr, never); });
  ASSERT_TRUE(broker_.Join(b, Req("g", 1, 2), nullptr, never).ok());
  ASSERT_TRUE(fa.get().ok());

  lifecycle_.End(a.id);
  EXPECT_FALSE(sessions_.Find(a.id).has_value());
  EXPECT_EQ(fds_.ExportsOf(a.id), 0u);
  EXPECT_EQ(fds_.TicketCount(), 0u);
  EXPECT_EQ(fds_.Import(b, e->id, e->secret).status().code(), absl::StatusCode::kNotFound);
  std::optional<std::vector<v1::SessionEvent>> ev = sessions_.Wait(b.id, absl::Seconds(1));
  ASSERT_TRUE(ev.has_value());
  ASSERT_EQ(ev->size(), 1u);
  EXPECT_EQ((*ev)[0].member().kind(), v1::MemberEvent::LOST);
  EXPECT_EQ((*ev)[0].member().rank(), 0u);

  lifecycle_.End(a.id);  // idempotent: nobody is told twice
  ev = sessions_.Wait(b.id, absl::Milliseconds(20));
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->empty());
}

// ExportFds against the client going away: either the export is refused or
// End frees it — never an export without a session.
TEST_F(SessionLifecycleTest, ExportRacingEndNeverLeaks) {
  for (int i = 0; i < 200; ++i) {
    SessionInfo s = Open();
    absl::StatusOr<std::string> t = fds_.AddIncoming(s, Memfd());
    ASSERT_TRUE(t.ok());
    std::atomic<bool> go{false};
    std::thread exporter([&] {
      while (!go.load()) {
      }
      (void)fds_.Export(s, *t, "memfd", 1);
    });
    std::thread ender([&] {
      while (!go.load()) {
      }
      lifecycle_.End(s.id);
    });
    go = true;
    exporter.join();
    ender.join();
    ASSERT_EQ(fds_.ExportsOf(s.id), 0u) << "iteration " << i;
    ASSERT_EQ(fds_.TicketCount(), 0u) << "iteration " << i;
  }
}

// The client picks its name; the log line must stay one line with no
// terminal controls in it.
TEST_F(SessionLifecycleTest, OpenLogsTheClientNameEscaped) {
  const LogLevel saved = GetLogLevel();
  SetLogLevel(LogLevel::kInfo);
  ::testing::internal::CaptureStderr();
  absl::StatusOr<SessionInfo> s = lifecycle_.Open(
      PeerCred{42, 1000, 1000}, 9, "x)\n00:00:00.000 INFO mooncake[1] forged\x1b[31m\a");
  const std::string log = ::testing::internal::GetCapturedStderr();
  SetLogLevel(saved);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
  EXPECT_EQ(log.find('\x1b'), std::string::npos) << log;
  EXPECT_EQ(log.find('\a'), std::string::npos) << log;
  EXPECT_NE(log.find("(x)\\n00:00:00.000 INFO mooncake[1] forged\\x1b[31m\\x07)"),
            std::string::npos)
      << log;
}

// GroupInfo.joined counts the ranks still in, as mcctl's joined_ranks does:
// a group of 2 whose rank 0 is lost says 1, not 2.
TEST_F(SessionLifecycleTest, LostRankIsNotCountedAsJoined) {
  SessionInfo a = Open(), b = Open();
  auto never = [] { return false; };
  auto fa = std::async(std::launch::async,
                       [&] { return broker_.Join(a, Req("dg", 0, 2), nullptr, never); });
  ASSERT_TRUE(broker_.Join(b, Req("dg", 1, 2), nullptr, never).ok());
  ASSERT_TRUE(fa.get().ok());
  lifecycle_.End(a.id);
  std::vector<GroupSummary> groups = broker_.List(1000, false);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].state, GroupState::kDegraded);
  EXPECT_EQ(JoinedCount(groups[0]), 1u);
  v1::GroupInfo info = ToGroupInfo(groups[0]);
  EXPECT_EQ(info.state(), "degraded");
  EXPECT_EQ(info.joined(), 1u);
  ASSERT_EQ(info.members_size(), 2);
  EXPECT_EQ(info.members(0).state(), "lost");
  EXPECT_EQ(info.members(1).state(), "joined");
}

}  // namespace
}  // namespace mooncake::daemon
