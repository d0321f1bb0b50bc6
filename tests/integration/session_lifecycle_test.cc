// A real mooncaked process and real client processes: sessions, SIGKILL of a
// member, daemon shutdown and restart as clients see them.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "daemon_process.h"
#include "gtest/gtest.h"
#include "mooncake/client/client.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

using Clock = std::chrono::steady_clock;

TEST(SessionLifecycle, HelloReportsCallerAndInstance) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto c = Client::Connect({.socket_path = daemon.socket(), .client_name = "hello-test"});
  ASSERT_TRUE(c.ok()) << c.status();
  auto h = (*c)->hello();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->uid, ::getuid());
  EXPECT_EQ(h->pid, ::getpid());
  EXPECT_EQ(h->node_id, "testnode");
  EXPECT_EQ(h->instance_id.size(), 16u);
  EXPECT_EQ(h->instance_id, (*c)->instanceId());
  EXPECT_GT((*c)->sessionId(), 0u);
  v1::DaemonStatus st = GetStatus(daemon.socket());
  EXPECT_EQ(st.sessions(), 1u);
  EXPECT_EQ(st.instance_id(), h->instance_id);
}

TEST(SessionLifecycle, UnreachableDaemonFailsFastWithActionableMessage) {
  TempDir dir;
  auto t0 = Clock::now();
  auto c = Client::Connect({.socket_path = dir.path() + "/nothing.sock"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("cannot reach mooncaked at " + dir.path()), std::string::npos)
      << c.status();
  EXPECT_NE(c.status().message().find("is the service running?"), std::string::npos);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(1));
}

TEST(SessionLifecycle, SigkilledMemberIsReportedLostAndReleased) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  Child member = Child::Spawn({BinDir() + "/mc_test_client", "member", daemon.socket(), "g", "1",
                               "2", "--fd"});
  auto c = Client::Connect({.socket_path = daemon.socket()});
  ASSERT_TRUE(c.ok()) << c.status();
  auto view = (*c)->joinGroup({.group = "g", .rank = 0, .world_size = 2,
                               .timeout = absl::Seconds(20)});
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_FALSE(member.WaitForLine("JOINED", 10000).empty()) << member.output();
  EXPECT_EQ(GetStatus(daemon.socket()).sessions(), 2u);
  // The member fetched nothing from us (we sent no fd); we got its memfd ticket.
  ASSERT_EQ(view->members.size(), 2u);
  EXPECT_FALSE(view->members[1].fd_ticket.empty());

  auto t0 = Clock::now();
  member.Kill(SIGKILL);
  std::optional<SessionEvent> ev;
  while (Clock::now() - t0 < std::chrono::seconds(3)) {
    ev = (*c)->nextEvent(absl::Milliseconds(50));
    if (ev) break;
  }
  auto elapsed = Clock::now() - t0;
  ASSERT_TRUE(ev.has_value()) << "no LOST event within 3 s";
  EXPECT_EQ(ev->kind, SessionEvent::Kind::kLost);
  EXPECT_EQ(ev->group, "g");
  EXPECT_EQ(ev->rank, 1u);
  EXPECT_LT(elapsed, std::chrono::seconds(1)) << "LOST must arrive within one second";
  std::cerr << "LOST event after "
            << std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count() << " ms\n";

  // The dead member's session and its ticket are gone; the group shows it lost.
  EXPECT_EQ(GetStatus(daemon.socket()).sessions(), 1u);
  auto fds = (*c)->fetchFds(view->members[1].fd_ticket);
  EXPECT_FALSE(fds.ok());
  v1::ListGroupsResponse groups = ListGroups(daemon.socket());
  ASSERT_EQ(groups.groups_size(), 1);
  EXPECT_EQ(groups.groups(0).state(), "degraded");
  EXPECT_EQ(groups.groups(0).members(1).state(), "lost");
  // When the last member leaves, the group is freed.
  ASSERT_TRUE((*c)->leaveGroup("g", 0).ok());
  EXPECT_EQ(ListGroups(daemon.socket()).groups_size(), 0);
}

TEST(SessionLifecycle, ClientProcessExitReleasesGroupAndTellsOthers) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  Child member = Child::Spawn({BinDir() + "/mc_test_client", "member", daemon.socket(), "g2", "0", "2"});
  Child other = Child::Spawn({BinDir() + "/mc_test_client", "member", daemon.socket(), "g2", "1", "2"});
  ASSERT_FALSE(member.WaitForLine("JOINED", 10000).empty()) << member.output();
  ASSERT_FALSE(other.WaitForLine("JOINED", 10000).empty()) << other.output();
  member.CloseStdin();  // leaves explicitly, then exits
  EXPECT_EQ(member.Wait(5000), 0);
  EXPECT_FALSE(other.WaitForLine("EVENT kind=left group=g2 rank=0", 3000).empty()) << other.output();
  other.Kill(SIGKILL);
  other.Wait(5000);
  for (int i = 0; i < 100 && ListGroups(daemon.socket()).groups_size() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(ListGroups(daemon.socket()).groups_size(), 0);
  EXPECT_EQ(GetStatus(daemon.socket()).sessions(), 0u);
}

TEST(SessionLifecycle, DaemonSigtermGivesClientsAClearError) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto c = Client::Connect({.socket_path = daemon.socket()});
  ASSERT_TRUE(c.ok()) << c.status();
  // A rendezvous blocked in the daemon when it stops must not hang.
  std::thread joiner([&] {
    auto v = (*c)->joinGroup({.group = "never", .rank = 0, .world_size = 2,
                              .timeout = absl::Seconds(30)});
    EXPECT_FALSE(v.ok());
    EXPECT_TRUE(v.status().code() == absl::StatusCode::kUnavailable) << v.status();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto t0 = Clock::now();
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
  joiner.join();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  // The session stream told us why.
  bool saw_shutdown = false;
  for (int i = 0; i < 20 && !saw_shutdown; ++i) {
    auto ev = (*c)->nextEvent(absl::Milliseconds(100));
    saw_shutdown = ev && ev->kind == SessionEvent::Kind::kDaemonShutdown;
  }
  EXPECT_TRUE(saw_shutdown);
  EXPECT_FALSE((*c)->connected());
  // The socket is gone and calls fail fast with the actionable message.
  EXPECT_FALSE(std::filesystem::exists(daemon.socket()));
  auto h = (*c)->hello();
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(h.status().message().find("is the service running?"), std::string::npos) << h.status();
}

TEST(SessionLifecycle, ClientNoticesRestartedDaemon) {
  TempDir dir;
  std::string old_instance;
  std::unique_ptr<Client> c;
  {
    DaemonProcess first(dir.path());
    auto cc = Client::Connect({.socket_path = first.socket()});
    ASSERT_TRUE(cc.ok()) << cc.status();
    c = std::move(*cc);
    old_instance = c->instanceId();
    first.Stop(SIGKILL);  // crash: no goodbye, stale socket file left behind
  }
  DaemonProcess second(dir.path());
  auto h = c->hello();
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << h.status();
  EXPECT_NE(h.status().message().find("restarted (instance " + old_instance + " -> "),
            std::string::npos)
      << h.status();
  EXPECT_NE(c->instanceId(), old_instance);
  auto h2 = c->hello();
  ASSERT_TRUE(h2.ok()) << h2.status();
  EXPECT_EQ(h2->instance_id, c->instanceId());
}

TEST(SessionLifecycle, SecondDaemonOnTheSameSocketRefuses) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  Child second = Child::Spawn({BinDir() + "/mooncaked", "--socket", daemon.socket()});
  EXPECT_EQ(second.Wait(10000), 1);
  EXPECT_TRUE(daemon.running());
}

}  // namespace
}  // namespace mooncake::testing
