// Elastic groups end to end: 4 device_transport_example processes in
// --mode elastic exchange puts and signals through a real mooncaked; rank 2
// is SIGKILLed, the survivors keep exchanging among themselves, a
// replacement process joins rank 2 and all four exchange again. Over P2P
// (memfd shared memory) and over RDMA (softnic).
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "daemon_process.h"
#include "example_argv.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

Child StartRank(const std::string& socket, const std::string& group, int rank,
                const std::vector<std::string>& extra) {
  std::vector<std::string> argv = ElasticRankArgv(socket, group, rank, 20000);
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Child::Spawn(argv);
}

bool Has(const Child& c, const std::string& needle) {
  return c.output().find(needle) != std::string::npos;
}

// The whole scenario; `route` adds --route (empty: auto, which is P2P here).
void KillAndReplaceRankTwo(const std::string& route) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  const std::string group = "elastic" + route;
  std::vector<std::string> extra = {"--expect-rejoins", "1", "--rounds", "200"};
  if (!route.empty()) extra.insert(extra.end(), {"--route", route});
  const std::string rdma_peers = route == "rdma" ? "rdma_peers 3" : "rdma_peers 0";
  std::vector<Child> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(StartRank(daemon.socket(), group, r, extra));
  for (int r = 0; r < 4; ++r) {
    std::string start = ranks[r].WaitForLine("START epoch 1", 20000);
    ASSERT_FALSE(start.empty()) << "rank " << r << ": " << ranks[r].output();
    EXPECT_NE(start.find(rdma_peers), std::string::npos) << start;
  }
  ranks[2].Kill(SIGKILL);
  EXPECT_EQ(ranks[2].Wait(5000), 128 + SIGKILL);
  // The survivors are told, release rank 2 and go on among themselves.
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(ranks[r].WaitForLine("LOST rank 2", 10000).empty()) << ranks[r].output();
    ASSERT_FALSE(ranks[r].WaitForLine("DEGRADED-OK active 0,1,3 rounds 20", 10000).empty())
        << ranks[r].output();
  }
  // Degraded: the group says so.
  v1::ListGroupsResponse during = ListGroups(daemon.socket());
  ASSERT_EQ(during.groups_size(), 1);
  EXPECT_EQ(during.groups(0).epoch(), 1u);

  std::vector<std::string> replacement_args = {"--rounds", "200"};
  if (!route.empty()) replacement_args.insert(replacement_args.end(), {"--route", route});
  Child replacement = StartRank(daemon.socket(), group, 2, replacement_args);
  EXPECT_EQ(replacement.Wait(30000), 0) << replacement.output();
  EXPECT_TRUE(Has(replacement, "START epoch 2")) << replacement.output();
  for (int r : {0, 1, 3}) {
    EXPECT_TRUE(Has(replacement, "EXCHANGED rank " + std::to_string(r) + " epoch 2"))
        << replacement.output();
  }
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(ranks[r].Wait(30000), 0) << "rank " << r << ": " << ranks[r].output();
    EXPECT_TRUE(Has(ranks[r], "ADMITTED rank 2 epoch 2")) << ranks[r].output();
    EXPECT_TRUE(Has(ranks[r], "EXCHANGED rank 2 epoch 2")) << ranks[r].output();
    EXPECT_TRUE(Has(ranks[r], "PASS")) << ranks[r].output();
    // Healthy peers were never released.
    for (int other : {0, 1, 3}) {
      if (other == r) continue;
      EXPECT_FALSE(Has(ranks[r], "LOST rank " + std::to_string(other))) << ranks[r].output();
    }
  }
  for (int i = 0; i < 100 && ListGroups(daemon.socket()).groups_size() != 0; ++i) usleep(20000);
  EXPECT_EQ(ListGroups(daemon.socket()).groups_size(), 0);
}

TEST(ElasticGroup, SigkilledRankIsReplacedOverP2p) { KillAndReplaceRankTwo(""); }

TEST(ElasticGroup, SigkilledRankIsReplacedOverSoftnicRdma) { KillAndReplaceRankTwo("rdma"); }

TEST(ElasticGroup, ARankStillHeldIsNotTakenAgain) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  std::vector<Child> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(StartRank(daemon.socket(), "held", r, {"--expect-rejoins", "1"}));
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_FALSE(ranks[r].WaitForLine("START epoch 1", 20000).empty()) << ranks[r].output();
  }
  Child intruder = StartRank(daemon.socket(), "held", 1, {});
  // Exit 2: a setup error ("rank 1 of group 'held' is already taken by pid
  // N" on stderr); the holder and the group are untouched.
  EXPECT_EQ(intruder.Wait(10000), 2) << intruder.output();
  for (int r = 0; r < 4; ++r) EXPECT_FALSE(Has(ranks[r], "LOST")) << ranks[r].output();
  v1::ListGroupsResponse groups = ListGroups(daemon.socket());
  ASSERT_EQ(groups.groups_size(), 1);
  EXPECT_EQ(groups.groups(0).epoch(), 1u);
  for (auto& r : ranks) r.Kill(SIGKILL);
  for (auto& r : ranks) r.Wait(5000);
}

}  // namespace
}  // namespace mooncake::testing
