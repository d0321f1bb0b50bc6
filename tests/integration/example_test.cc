// device_transport_example on the host platform through a real daemon:
// the upstream two-rank transfer, an n-rank all-to-all, and a timeout.
#include <signal.h>
#include <unistd.h>

#include "daemon_process.h"
#include "example_argv.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

std::vector<Child> StartRanks(const std::string& socket, const std::string& group, int n,
                              const std::vector<std::string>& extra = {}) {
  std::vector<Child> ranks;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv = ExampleArgv(socket, group, r, n);
    argv.insert(argv.end(), extra.begin(), extra.end());
    ranks.push_back(Child::Spawn(argv));
  }
  return ranks;
}

TEST(DeviceTransportExample, TwoRanksPairThroughDaemon) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto ranks = StartRanks(daemon.socket(), "pair", 2, {"--bytes", "1000003"});
  for (auto& r : ranks) {
    EXPECT_EQ(r.Wait(30000), 0) << r.output();
    EXPECT_NE(r.output().find("PASS"), std::string::npos) << r.output();
    EXPECT_NE(r.output().find("memfd"), std::string::npos) << r.output();
  }
  EXPECT_NE(ranks[1].output().find("1000003 bytes, all correct"), std::string::npos);
}

TEST(DeviceTransportExample, EightRanksAllToAll) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto ranks = StartRanks(daemon.socket(), "a2a", 8, {"--bytes", "65537"});
  for (auto& r : ranks) {
    EXPECT_EQ(r.Wait(60000), 0) << r.output();
    EXPECT_NE(r.output().find("received 7 messages of 65537 bytes, all correct"), std::string::npos)
        << r.output();
  }
}

TEST(DeviceTransportExample, MissingPeerTimesOutWithClearMessage) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto ranks = StartRanks(daemon.socket(), "alone", 1, {});
  // World size 2 but only rank 0 started.
  Child lonely = Child::Spawn({BinDir() + "/device_transport_example", "--platform", "host",
                               "--socket", daemon.socket(), "--group", "alone2", "--rank", "0",
                               "--world-size", "2", "--timeout-ms", "300"});
  EXPECT_EQ(lonely.Wait(10000), 3) << lonely.output();
  EXPECT_EQ(ranks[0].Wait(10000), 0) << ranks[0].output();
  EXPECT_EQ(ListGroups(daemon.socket()).groups_size(), 0);
}

TEST(DeviceTransportExample, WatchReportsASigkilledPeer) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto ranks =
      StartRanks(daemon.socket(), "watch", 2, {"--mode", "watch", "--timeout-ms", "20000"});
  ASSERT_FALSE(ranks[0].WaitForLine("READY", 20000).empty()) << ranks[0].output();
  ASSERT_FALSE(ranks[1].WaitForLine("READY", 20000).empty()) << ranks[1].output();
  ranks[1].Kill(SIGKILL);
  EXPECT_EQ(ranks[0].Wait(10000), 0) << ranks[0].output();
  EXPECT_NE(ranks[0].output().find("EVENT lost rank 1"), std::string::npos) << ranks[0].output();
  // The survivor exited too: the group is gone.
  for (int i = 0; i < 100 && ListGroups(daemon.socket()).groups_size() != 0; ++i) {
    usleep(20000);
  }
  EXPECT_EQ(ListGroups(daemon.socket()).groups_size(), 0);
}

// --timeout-ms bounds forming the group, not the watch: a watcher holds
// the group past it and still reports the peer killed later.
TEST(DeviceTransportExample, WatchOutlivesTheSetupTimeout) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto ranks =
      StartRanks(daemon.socket(), "long-watch", 2, {"--mode", "watch", "--timeout-ms", "2000"});
  ASSERT_FALSE(ranks[0].WaitForLine("READY", 20000).empty()) << ranks[0].output();
  ASSERT_FALSE(ranks[1].WaitForLine("READY", 20000).empty()) << ranks[1].output();
  // Twice the timeout: both still watching (Wait returns -1 on its timeout).
  EXPECT_EQ(ranks[0].Wait(4000), -1) << "the watch ended at its setup timeout\n"
                                     << ranks[0].output();
  EXPECT_EQ(ranks[1].Wait(0), -1) << ranks[1].output();
  EXPECT_EQ(ListGroups(daemon.socket()).groups_size(), 1);
  ranks[1].Kill(SIGKILL);
  EXPECT_EQ(ranks[0].Wait(10000), 0) << ranks[0].output();
  EXPECT_NE(ranks[0].output().find("EVENT lost rank 1"), std::string::npos) << ranks[0].output();
  EXPECT_NE(ranks[0].output().find("PASS"), std::string::npos) << ranks[0].output();
}

TEST(DeviceTransportExample, NoDaemonIsASetupError) {
  TempDir dir;
  Child c = Child::Spawn({BinDir() + "/device_transport_example", "--platform", "host", "--socket",
                          dir.path() + "/none.sock", "--rank", "0", "--world-size", "2"});
  EXPECT_EQ(c.Wait(10000), 2);
}

}  // namespace
}  // namespace mooncake::testing
