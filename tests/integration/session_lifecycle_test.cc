// A real mooncaked process and real client processes: sessions, SIGKILL of a
// member, daemon shutdown and restart as clients see them.
#include <grpcpp/generic/generic_stub.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "daemon_process.h"
#include "gtest/gtest.h"
#include "mooncake/client/client.h"
#include "mooncake/common/fd_passing.h"
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
  // Node info: this machine has no GPU or RDMA NIC, a normal state that is
  // explained rather than an error.
  auto node = (*c)->nodeInfo();
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->node_id, "testnode");
  EXPECT_EQ(node->instance_id, h->instance_id);
  if (node->gpus.empty()) EXPECT_FALSE(node->gpu_note.empty());
  if (node->nics.empty()) EXPECT_FALSE(node->nic_note.empty());
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
  Child member = Child::Spawn(
      {BinDir() + "/mc_test_client", "member", daemon.socket(), "g", "1", "2", "--fd"});
  auto c = Client::Connect({.socket_path = daemon.socket()});
  ASSERT_TRUE(c.ok()) << c.status();
  auto view =
      (*c)->joinGroup({.group = "g", .rank = 0, .world_size = 2, .timeout = absl::Seconds(20)});
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
  Child member =
      Child::Spawn({BinDir() + "/mc_test_client", "member", daemon.socket(), "g2", "0", "2"});
  Child other =
      Child::Spawn({BinDir() + "/mc_test_client", "member", daemon.socket(), "g2", "1", "2"});
  ASSERT_FALSE(member.WaitForLine("JOINED", 10000).empty()) << member.output();
  ASSERT_FALSE(other.WaitForLine("JOINED", 10000).empty()) << other.output();
  member.CloseStdin();  // leaves explicitly, then exits
  EXPECT_EQ(member.Wait(5000), 0);
  EXPECT_FALSE(other.WaitForLine("EVENT kind=left group=g2 rank=0", 3000).empty())
      << other.output();
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
    auto v = (*c)->joinGroup(
        {.group = "never", .rank = 0, .world_size = 2, .timeout = absl::Seconds(30)});
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

TEST(SessionLifecycle, TellsSystemdReadyAndStopping) {
  TempDir dir;
  const std::string notify = dir.path() + "/notify.sock";
  int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(s, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, notify.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  auto recv_msg = [&](int timeout_ms) {
    pollfd p{s, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return std::string();
    char buf[512];
    ssize_t n = ::recv(s, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  };
  const std::string sock = dir.path() + "/d.sock";
  Child d = Child::Spawn({BinDir() + "/mooncaked", "--socket", sock, "--log-level", "warning"}, -1,
                         {"NOTIFY_SOCKET=" + notify});
  std::string ready = recv_msg(20000);
  EXPECT_NE(ready.find("READY=1"), std::string::npos) << ready;
  // READY comes only once the socket answers.
  EXPECT_TRUE(ConnectUnix(sock).ok());
  d.Kill(SIGTERM);
  std::string stopping = recv_msg(10000);
  EXPECT_NE(stopping.find("STOPPING=1"), std::string::npos) << stopping;
  EXPECT_EQ(d.Wait(10000), 0);
  ::close(s);
}

TEST(SessionLifecycle, ServesGrpcHealthChecks) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto channel = UnixChannel(daemon.socket());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  Deadline(&ctx);
  // grpc.health.v1.HealthCheckRequest{} is the empty message.
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_all();
                 });
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done; }));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  // HealthCheckResponse{status: SERVING (1)} encodes as field 1, varint 1.
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
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
