// mooncaked under a stand-in for systemd: a datagram socket as
// $NOTIFY_SOCKET, and $WATCHDOG_USEC. The real daemon must say READY=1 once
// it serves, ping WATCHDOG=1 at half the interval while its self-check
// (Admin/GetStatus through its own socket) passes, stop pinging when that
// check fails, and say STOPPING=1 on SIGTERM.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "daemon_process.h"
#include "gtest/gtest.h"

namespace mooncake::testing {
namespace {

// The receiving end of sd_notify: one datagram per message.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~NotifySocket() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool bound() const { return bound_; }

  // The next datagram, or nullopt after `timeout_ms`.
  std::optional<std::string> Receive(int timeout_ms) {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n < 0) return std::nullopt;
    return std::string(buf, static_cast<size_t>(n));
  }

  // Waits up to `timeout_ms` for a message containing `needle`.
  bool WaitFor(const std::string& needle, int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) return false;
      std::optional<std::string> m = Receive(static_cast<int>(left));
      if (m && m->find(needle) != std::string::npos) return true;
    }
  }

  // How many messages equal to `message` arrive within `ms`.
  int Count(const std::string& message, int ms) {
    int n = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) return n;
      std::optional<std::string> m = Receive(static_cast<int>(left));
      if (m && *m == message) ++n;
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

class SystemdNotifyTest : public ::testing::Test {
 protected:
  Child StartDaemon(std::vector<std::string> env) {
    env.push_back("NOTIFY_SOCKET=" + notify_path_);
    return Child::Spawn({BinDir() + "/mooncaked", "--socket", socket_, "--node-id", "testnode",
                         "--log-level", "warning"},
                        -1, env);
  }

  TempDir dir_;
  const std::string socket_ = dir_.path() + "/mooncaked.sock";
  const std::string notify_path_ = dir_.path() + "/notify.sock";
  NotifySocket notify_{notify_path_};
};

TEST_F(SystemdNotifyTest, PingsWatchdogWhileTheSelfCheckPasses) {
  ASSERT_TRUE(notify_.bound());
  // 400 ms: a ping every 200 ms.
  Child daemon = StartDaemon({"WATCHDOG_USEC=400000"});
  ASSERT_TRUE(notify_.WaitFor("READY=1", 20000)) << "no READY=1 from mooncaked";
  const int pings = notify_.Count("WATCHDOG=1", 2000);
  EXPECT_GE(pings, 5) << "about 10 pings expected in 2 s at a 400 ms watchdog";
  EXPECT_LE(pings, 14);

  // The socket is gone: no client can reach the daemon, and neither can its
  // self-check. It must stop pinging, so systemd restarts it.
  ASSERT_EQ(::unlink(socket_.c_str()), 0);
  notify_.Count("WATCHDOG=1", 600);  // a check already under way may still ping
  EXPECT_EQ(notify_.Count("WATCHDOG=1", 1500), 0)
      << "the daemon kept pinging although its socket is unreachable";

  daemon.Kill(SIGTERM);
  EXPECT_TRUE(notify_.WaitFor("STOPPING=1", 10000));
  EXPECT_EQ(daemon.Wait(10000), 0);
}

TEST_F(SystemdNotifyTest, NoPingsWhenTheWatchdogIsForAnotherProcess) {
  ASSERT_TRUE(notify_.bound());
  // As a child of the service's main process would inherit it.
  Child daemon = StartDaemon({"WATCHDOG_USEC=400000", "WATCHDOG_PID=1"});
  ASSERT_TRUE(notify_.WaitFor("READY=1", 20000));
  EXPECT_EQ(notify_.Count("WATCHDOG=1", 1000), 0);
  daemon.Kill(SIGTERM);
  EXPECT_EQ(daemon.Wait(10000), 0);
}

TEST_F(SystemdNotifyTest, NoPingsWithoutWatchdogUsec) {
  ASSERT_TRUE(notify_.bound());
  Child daemon = StartDaemon({});
  ASSERT_TRUE(notify_.WaitFor("READY=1", 20000));
  EXPECT_EQ(notify_.Count("WATCHDOG=1", 1000), 0);
  daemon.Kill(SIGTERM);
  EXPECT_TRUE(notify_.WaitFor("STOPPING=1", 10000));
  EXPECT_EQ(daemon.Wait(10000), 0);
}

}  // namespace
}  // namespace mooncake::testing
