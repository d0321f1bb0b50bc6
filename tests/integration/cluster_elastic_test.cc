// Elastic groups across nodes (issue 10): 4 device_transport_example ranks
// in --mode elastic over two real mooncaked nodes and a real etcd, ranks 0
// and 1 on node-a, 2 and 3 on node-b. A rank is SIGKILLed (or its whole
// node is), the survivors go on among themselves, and a replacement joins
// the vacant rank on the same node, on another node of the group, or on a
// node new to the group; all 4 exchange again at epoch 2
// (docs/architecture.md, "Elastic groups").
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cluster_fixture.h"
#include "example_argv.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class ClusterElasticTest : public ClusterFixture {
 public:
  ClusterElasticTest() : ClusterFixture("/mooncake-elastic-test") {}

  // Rank `rank` of `group` (world size 4) on `node`, stdout and stderr.
  Child Rank(const DaemonProcess& node, const std::string& group, int rank,
             const std::vector<std::string>& extra) {
    std::vector<std::string> argv = WithStderr(ElasticRankArgv(node.socket(), group, rank, 30000));
    argv.insert(argv.end(), {"--rounds", "200"});
    argv.insert(argv.end(), extra.begin(), extra.end());
    return Child::Spawn(argv);
  }
};

bool Has(const Child& c, const std::string& needle) {
  return c.output().find(needle) != std::string::npos;
}

// The end of every scenario: the replacements exchanged with every other
// rank at epoch 2, the survivors admitted them, exchanged and passed, and
// no healthy peer was ever released.
void ExpectRecovered(std::vector<Child>* survivors, const std::vector<int>& survivor_ranks,
                     std::vector<Child>* replacements, const std::vector<int>& replaced) {
  for (size_t i = 0; i < replacements->size(); ++i) {
    Child& n = (*replacements)[i];
    EXPECT_EQ(n.Wait(60000), 0) << "replacement of rank " << replaced[i] << ": " << n.output();
    EXPECT_TRUE(Has(n, "START epoch 2")) << n.output();
    for (int r = 0; r < 4; ++r) {
      if (r == replaced[i]) continue;
      EXPECT_TRUE(Has(n, "EXCHANGED rank " + std::to_string(r) + " epoch 2")) << n.output();
    }
  }
  for (size_t i = 0; i < survivors->size(); ++i) {
    Child& s = (*survivors)[i];
    EXPECT_EQ(s.Wait(60000), 0) << "rank " << survivor_ranks[i] << ": " << s.output();
    for (int r : replaced) {
      EXPECT_TRUE(Has(s, "ADMITTED rank " + std::to_string(r) + " epoch 2")) << s.output();
      EXPECT_TRUE(Has(s, "EXCHANGED rank " + std::to_string(r) + " epoch 2")) << s.output();
    }
    EXPECT_TRUE(Has(s, "PASS")) << s.output();
    for (int other : survivor_ranks) {
      EXPECT_FALSE(Has(s, "LOST rank " + std::to_string(other))) << s.output();
    }
  }
}

// Rank 2 (node-b) is SIGKILLed; its replacement starts on `replacement_on`.
void KillRankTwoAndReplaceOn(ClusterElasticTest* t, DaemonProcess& a, DaemonProcess& b,
                             DaemonProcess& replacement_on, const std::string& group,
                             const std::vector<std::string>& route) {
  std::vector<std::string> first = route;
  first.insert(first.end(), {"--expect-rejoins", "1"});
  std::vector<Child> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(t->Rank(r < 2 ? a : b, group, r, first));
  for (int r = 0; r < 4; ++r) {
    ASSERT_FALSE(ranks[r].WaitForLine("START epoch 1", 30000).empty())
        << "rank " << r << ": " << ranks[r].output();
  }
  const auto killed = Clock::now();
  ranks[2].Kill(SIGKILL);
  EXPECT_EQ(ranks[2].Wait(5000), 128 + SIGKILL);
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(ranks[r].WaitForLine("RELEASED rank 2", 15000).empty()) << ranks[r].output();
    ASSERT_FALSE(ranks[r].WaitForLine("DEGRADED-OK active 0,1,3 rounds 20", 15000).empty())
        << ranks[r].output();
  }
  const double detected = Since(killed);
  std::vector<Child> replacement;
  replacement.push_back(t->Rank(replacement_on, group, 2, route));
  std::vector<Child> survivors;
  for (int r : {0, 1, 3}) survivors.push_back(std::move(ranks[r]));
  ExpectRecovered(&survivors, {0, 1, 3}, &replacement, {2});
  std::printf("[ figures ] %s: released by all survivors %.2f s after the SIGKILL\n", group.c_str(),
              detected);
}

TEST_F(ClusterElasticTest, ARankKilledOnItsNodeIsReplacedThere) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  // RDMA for every pair (softnic; across nodes over the peer port): the
  // Communicator's auto route maps only P2P-reachable peers.
  KillRankTwoAndReplaceOn(this, *a, *b, *b, "same-node", {"--route", "rdma"});
}

TEST_F(ClusterElasticTest, ARankKilledOnOneNodeIsReplacedOnAnotherOverRdma) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  KillRankTwoAndReplaceOn(this, *a, *b, *a, "moved", {"--route", "rdma"});
  // The group is whole again on both nodes, at epoch 2.
  for (const DaemonProcess* n : {a.get(), b.get()}) {
    for (int i = 0; i < 100 && ListGroups(n->socket()).groups_size() != 0; ++i) usleep(20000);
    EXPECT_EQ(ListGroups(n->socket()).groups_size(), 0) << "the group outlived its ranks";
  }
}

// A whole node dies (its daemon SIGKILLed, its ranks with it): the others
// hear it when its lease expires, and both its ranks are replaced on a node
// new to the group, in one re-formation.
TEST_F(ClusterElasticTest, ANodeThatDiesIsReplacedOnANewNode) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  auto c = Node("node-c");
  const std::vector<std::string> route = {"--route", "rdma"};
  std::vector<std::string> first = route;
  first.insert(first.end(), {"--expect-rejoins", "2"});
  std::vector<Child> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(Rank(r < 2 ? *a : *b, "node-loss", r, first));
  for (int r = 0; r < 4; ++r) {
    ASSERT_FALSE(ranks[r].WaitForLine("START epoch 1", 30000).empty())
        << "rank " << r << ": " << ranks[r].output();
  }
  const auto killed = Clock::now();
  b->Stop(SIGKILL);
  ranks[2].Kill(SIGKILL);
  ranks[3].Kill(SIGKILL);
  ranks[2].Wait(5000);
  ranks[3].Wait(5000);
  for (int r : {0, 1}) {
    for (int lost : {2, 3}) {
      ASSERT_FALSE(
          ranks[r]
              .WaitForLine("RELEASED rank " + std::to_string(lost), (kClusterLeaseTtlS + 10) * 1000)
              .empty())
          << ranks[r].output();
    }
  }
  const double detected = Since(killed);
  std::vector<Child> replacements;
  replacements.push_back(Rank(*c, "node-loss", 2, route));
  replacements.push_back(Rank(*c, "node-loss", 3, route));
  std::vector<Child> survivors;
  survivors.push_back(std::move(ranks[0]));
  survivors.push_back(std::move(ranks[1]));
  ExpectRecovered(&survivors, {0, 1}, &replacements, {2, 3});
  std::printf(
      "[ figures ] node loss at lease TTL %d s: both ranks released by the survivors %.2f s "
      "after the SIGKILL, recovered (all PASS) %.2f s after it\n",
      kClusterLeaseTtlS, detected, Since(killed));
}

// Two replacements for one vacant rank on two nodes: one wins the rank,
// the other is refused (AlreadyExists: exit 2) and the group re-forms once.
TEST_F(ClusterElasticTest, OfTwoReplacementsOnTwoNodesOneWins) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  std::vector<Child> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(
        Rank(r < 2 ? *a : *b, "contested", r, {"--route", "rdma", "--expect-rejoins", "1"}));
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_FALSE(ranks[r].WaitForLine("START epoch 1", 30000).empty()) << ranks[r].output();
  }
  ranks[2].Kill(SIGKILL);
  ranks[2].Wait(5000);
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(ranks[r].WaitForLine("RELEASED rank 2", 15000).empty()) << ranks[r].output();
  }
  Child on_a = Rank(*a, "contested", 2, {"--route", "rdma"});
  Child on_b = Rank(*b, "contested", 2, {"--route", "rdma"});
  const int ea = on_a.Wait(60000), eb = on_b.Wait(60000);
  EXPECT_TRUE((ea == 0 && eb == 2) || (ea == 2 && eb == 0))
      << "exits " << ea << " and " << eb << "\n"
      << on_a.output() << "\n"
      << on_b.output();
  const Child& loser = ea == 2 ? on_a : on_b;
  EXPECT_TRUE(Has(loser, "already taken")) << loser.output();
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(ranks[r].Wait(60000), 0) << ranks[r].output();
    EXPECT_TRUE(Has(ranks[r], "ADMITTED rank 2 epoch 2")) << ranks[r].output();
    EXPECT_FALSE(Has(ranks[r], "epoch 3")) << ranks[r].output();
  }
}

}  // namespace
}  // namespace mooncake::testing
