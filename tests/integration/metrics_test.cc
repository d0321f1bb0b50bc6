// Prometheus metrics of a real mooncaked: with metrics_listen set in its
// config file, /metrics answers in the text format and counts what clients
// did (sessions, a group's joins, RPCs, a lost member); it listens on that
// address only; a port in use fails the start; without the key there is
// no TCP listener at all.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "daemon_process.h"
#include "gtest/gtest.h"
#include "mooncake/client/client.h"
#include "prometheus_text.h"

namespace mooncake::testing {
namespace {

// A TCP port free on 127.0.0.1 now (bound to port 0, then closed).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// The TCP sockets `pid` listens on, as "ADDR:PORT" in /proc/net/tcp{,6}
// hex ("0100007F:2328" is 127.0.0.1:9000).
std::set<std::string> ListeningTcp(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
  if (DIR* d = ::opendir(fd_dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      char target[128] = {};
      std::string link = fd_dir + "/" + e->d_name;
      if (::readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
          absl::StartsWith(target, "socket:[")) {
        std::string t(target);
        inodes.insert(t.substr(8, t.size() - 9));
      }
    }
    ::closedir(d);
  }
  std::set<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
      if (f.size() > 9 && f[3] == "0A" && inodes.count(f[9]) > 0) out.insert(f[1]);
    }
  }
  return out;
}

std::string LoopbackHex(int port) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0100007F:%04X", port);
  return buf;
}

class MetricsTest : public ::testing::Test {
 protected:
  // Starts mooncaked with a config file that sets metrics_listen.
  int StartWithMetrics() {
    const int port = FreePort();
    EXPECT_GT(port, 0);
    const std::string conf = dir_.path() + "/mooncaked.conf";
    std::ofstream(conf) << "# metrics on loopback only\nmetrics_listen = 127.0.0.1:" << port
                        << "\nrdma_provider = off\n";
    daemon_ =
        std::make_unique<DaemonProcess>(dir_.path(), std::vector<std::string>{"--config", conf});
    return port;
  }
  std::map<std::string, double> Scrape(int port) {
    std::string resp = HttpGet(port, "/metrics");
    EXPECT_TRUE(absl::StartsWith(resp, "HTTP/1.1 200")) << resp;
    const std::string text = Body(resp);
    std::vector<std::string> bad = BadExpositionLines(text);
    EXPECT_TRUE(bad.empty()) << ::testing::PrintToString(bad) << "\n" << text;
    return ParseSamples(text);
  }
  TempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(MetricsTest, ScrapeReflectsSessionsJoinsAndRpcs) {
  const int port = StartWithMetrics();
  // Only the configured address: one TCP listener, 127.0.0.1:port.
  EXPECT_EQ(ListeningTcp(daemon_->child().pid()), std::set<std::string>{LoopbackHex(port)});

  std::map<std::string, double> before = Scrape(port);
  EXPECT_EQ(before["mooncake_sessions"], 0);
  EXPECT_EQ(before["mooncake_joins_total{result=\"formed\"}"], 0);
  EXPECT_EQ(before.count("mooncake_rdma_qps"), 0u) << "rdma_provider = off: no RDMA gauges";

  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < 2; ++r) {
    auto c = Client::Connect({.socket_path = daemon_->socket()});
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  std::vector<absl::StatusOr<GroupView>> views(2, absl::UnknownError("unset"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      views[r] = clients[r]->joinGroup({.group = "metrics-group",
                                        .rank = static_cast<uint32_t>(r),
                                        .world_size = 2,
                                        .timeout = absl::Seconds(10)});
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(views[r].ok()) << views[r].status();
  // A join that fails validation: counted as a JoinGroup error.
  EXPECT_FALSE(clients[0]->joinGroup({.group = "g", .rank = 5, .world_size = 2}).ok());

  const std::string text = Body(HttpGet(port, "/metrics"));
  std::map<std::string, double> v = Scrape(port);
  EXPECT_EQ(v["mooncake_sessions"], 2);
  EXPECT_EQ(v["mooncake_groups{state=\"formed\"}"], 1);
  EXPECT_EQ(v["mooncake_joins_total{result=\"formed\"}"], 2);
  EXPECT_EQ(v["mooncake_join_latency_seconds_count"], 2);
  EXPECT_EQ(v["mooncake_join_latency_seconds_bucket{le=\"+Inf\"}"], 2);
  EXPECT_GE(v["mooncake_join_latency_seconds_bucket{le=\"60\"}"], 2);
  EXPECT_EQ(v["mooncake_rpcs_total{code=\"OK\",method=\"mooncake.v1.Local/JoinGroup\"}"], 2);
  EXPECT_EQ(
      v["mooncake_rpcs_total{code=\"INVALID_ARGUMENT\",method=\"mooncake.v1.Local/JoinGroup\"}"],
      1);
  EXPECT_EQ(v["mooncake_rpc_errors_total{method=\"mooncake.v1.Local/JoinGroup\"}"], 1);
  EXPECT_GE(v["mooncake_rpcs_total{code=\"OK\",method=\"mooncake.v1.Local/Hello\"}"], 2);
  EXPECT_FALSE(absl::StrContains(text, "metrics-group")) << "no group names";

  // One member's process goes: the other is told LOST, and it is counted.
  clients[1].reset();
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  do {
    v = Scrape(port);
  } while (v["mooncake_lost_events_total"] < 1 && absl::Now() < deadline);
  EXPECT_EQ(v["mooncake_lost_events_total"], 1);
  EXPECT_EQ(v["mooncake_sessions"], 1);
  EXPECT_EQ(v["mooncake_groups{state=\"degraded\"}"], 1);
}

// Issue 23 item 7: connections that never send a request (a slowloris)
// cannot hold the endpoint's two threads: each is closed after the request
// timeout (3 s), so a scrape behind two of them (both threads held)
// answers within about one timeout, well inside the client's 10 s, and the
// idle ones see EOF.
TEST_F(MetricsTest, IdleConnectionsAreClosedAndScrapesStillAnswer) {
  const int port = StartWithMetrics();
  ASSERT_FALSE(Scrape(port).empty());
  std::vector<int> idle;
  for (int i = 0; i < 2; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      idle.push_back(fd);
    } else {
      ::close(fd);
    }
  }
  ASSERT_FALSE(idle.empty());
  const absl::Time start = absl::Now();
  const std::string resp = HttpGet(port, "/metrics");
  EXPECT_TRUE(absl::StartsWith(resp, "HTTP/1.1 200")) << resp;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // The first idle connection was closed by the server: a read sees EOF.
  timeval tv{20, 0};
  ::setsockopt(idle.front(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  EXPECT_EQ(::recv(idle.front(), &c, 1, 0), 0) << "the idle connection is still open";
  for (int fd : idle) ::close(fd);
  EXPECT_TRUE(daemon_->running());
}

TEST_F(MetricsTest, OffByDefault) {
  daemon_ = std::make_unique<DaemonProcess>(dir_.path());
  EXPECT_TRUE(ListeningTcp(daemon_->child().pid()).empty())
      << "no metrics_listen: mooncaked listens on no TCP port";
}

TEST_F(MetricsTest, PortInUseFailsTheStart) {
  int holder = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(holder, 1), 0);
  ASSERT_EQ(::getsockname(holder, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string taken = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  Child d = Child::Spawn(
      {"/bin/sh", "-c",
       absl::StrCat("exec '", BinDir(), "/mooncaked' --socket '", dir_.path(),
                    "/mooncaked.sock' --log-level warning --metrics-listen ", taken, " 2>&1")});
  EXPECT_NE(d.WaitForLine("cannot serve metrics on " + taken, 20000), "") << d.output();
  EXPECT_EQ(d.Wait(20000), 1) << d.output();
  EXPECT_TRUE(absl::StrContains(d.output(), "metrics_listen")) << d.output();
  ::close(holder);
}

}  // namespace
}  // namespace mooncake::testing
