// `mcctl selftest rdma --across GROUP --rank R` between two nodes of a real
// etcd cluster (two mooncaked with mutual TLS on the peer port, softnic
// carrying the RDMA route across them): two mcctl processes, one per node,
// each printing the steps it ran toward the other and the reads it
// answered. And what a rank alone says.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cluster_fixture.h"
#include "gtest/gtest.h"

namespace mooncake::testing {
namespace {

constexpr char kSecretEnv[] = "MC_GROUP_SECRET=6a0f3c1d2e5b4a79880c1d2e3f405162";

class ClusterSelftestTest : public ClusterFixture {
 protected:
  ClusterSelftestTest() : ClusterFixture("/mcselftest") {}

  static Child Mcctl(const DaemonProcess& node, std::vector<std::string> args,
                     std::vector<std::string> env = {}) {
    std::vector<std::string> argv = {BinDir() + "/mcctl", "--socket", node.socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    env.push_back(kSecretEnv);
    return Child::Spawn(argv, -1, env);
  }

  // The line of `text` that starts with `step` ("" when none).
  static std::string Line(const std::string& text, const std::string& step) {
    const size_t at = text.find("\n" + step + " ");
    if (at == std::string::npos) return "";
    return text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  }
  // How many times `needle` appears in `text`.
  static int Count(const std::string& text, const std::string& needle) {
    int n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
      ++n;
    }
    return n;
  }
};

TEST_F(ClusterSelftestTest, TwoNodesRunEveryStepEachWayAndAnswerEachOthersReads) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  Child zero = Mcctl(*a, {"selftest", "rdma", "--across", "fabric-check", "--rank", "0"});
  Child one = Mcctl(*b, {"selftest", "rdma", "--across", "fabric-check", "--rank", "1"});
  ASSERT_EQ(zero.Wait(120000), 0) << zero.output() << "\n--- rank 1:\n" << one.output();
  ASSERT_EQ(one.Wait(30000), 0) << one.output();
  std::printf("[ figures ] node-a:\n%s[ figures ] node-b:\n%s", zero.output().c_str(),
              one.output().c_str());
  for (const Child* c : {&zero, &one}) {
    const std::string& out = c->output();
    EXPECT_NE(out.find("selftest rdma: all steps passed"), std::string::npos) << out;
    for (const char* step : {"write-inline", "write ", "fetch-add-8", "masked-fa-4", "ring-wrap"}) {
      EXPECT_EQ(Count(out, std::string("\n") + step), 1) << step << "\n" << out;
    }
    // The other rank's reads of this node's memory: the five steps' checks.
    EXPECT_NE(out.find("its 5 reads back while it ran its steps"), std::string::npos) << out;
    // Loopback is the single-node selftest's.
    EXPECT_EQ(out.find("loopback-atomic"), std::string::npos) << out;
  }
  EXPECT_NE(zero.output().find("rank 0 of group fabric-check on node node-a, to rank 1 on node "
                               "node-b"),
            std::string::npos)
      << zero.output();
  EXPECT_NE(one.output().find("rank 1 of group fabric-check on node node-b, to rank 0 on node "
                              "node-a"),
            std::string::npos)
      << one.output();
  // The forged key: rank 0's, refused by node-b's side by name.
  const std::string bad_key = Line(zero.output(), "bad-rkey");
  EXPECT_NE(bad_key.find(" pass "), std::string::npos) << zero.output();
  EXPECT_NE(bad_key.find("syndrome 0x13"), std::string::npos) << zero.output();
  EXPECT_EQ(one.output().find("bad-rkey"), std::string::npos) << one.output();

  // The same as JSON, a second time in the same group name: the first
  // pair's group is gone with its processes.
  Child zj = Mcctl(*a, {"--json", "selftest", "rdma", "--across", "fabric-check", "--rank", "0"});
  Child oj = Mcctl(*b, {"-j", "selftest", "rdma", "--across", "fabric-check", "--rank", "1"});
  ASSERT_EQ(zj.Wait(120000), 0) << zj.output() << "\n--- rank 1:\n" << oj.output();
  ASSERT_EQ(oj.Wait(30000), 0) << oj.output();
  EXPECT_NE(zj.output().find("\"ok\": true"), std::string::npos) << zj.output();
  EXPECT_NE(zj.output().find("to rank 1 on node node-b"), std::string::npos) << zj.output();
  EXPECT_NE(oj.output().find("\"name\": \"answer\""), std::string::npos) << oj.output();
}

// Rank 1 killed while the pair runs: rank 0 fails, naming the step, well
// before its 2-minute patience (the queue pair toward a session that is
// gone fails, and a reader that got no answer asks nothing more).
TEST_F(ClusterSelftestTest, AKilledPeerEndsTheOtherRankWithAFailureNotAHang) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  Child zero = Mcctl(*a, {"selftest", "rdma", "--across", "killed", "--rank", "0"});
  Child one = Mcctl(*b, {"selftest", "rdma", "--across", "killed", "--rank", "1"});
  // Both in the group and rank 0 into its steps (setup takes well under
  // a second here; the steps several).
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const auto start = std::chrono::steady_clock::now();
  one.Kill(SIGKILL);
  EXPECT_EQ(one.Wait(10000), 128 + SIGKILL);
  EXPECT_EQ(zero.Wait(100000), 1) << zero.output();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 30.0) << zero.output();  // not its 2-minute patience
  EXPECT_NE(zero.output().find("selftest rdma: FAILED"), std::string::npos) << zero.output();
  // Killed in rank 0's steps (the usual case here): the failed step says
  // the peer is gone, which explains it better than the link, and the
  // later steps are not run, saying why, instead of failing under hints
  // of their own.
  const std::string& out = zero.output();
  if (out.find("FAIL at setup") == std::string::npos) {
    EXPECT_TRUE(out.find("rank 1 was lost") != std::string::npos ||
                out.find("rank 1 left") != std::string::npos)
        << out;
    EXPECT_NE(out.find("check: the other rank stopped taking part"), std::string::npos) << out;
    if (Line(out, "ring-wrap").find(" pass ") == std::string::npos) {
      EXPECT_NE(Line(out, "ring-wrap").find("not run: "), std::string::npos) << out;
    }
    EXPECT_EQ(out.find("check: NIC atomics"), std::string::npos) << out;
  }
  std::printf("[ figures ] rank 0 reported %.1f s after rank 1 was killed\n%s", secs,
              zero.output().c_str());
}

// Rank 0 killed while rank 1 answers its reads: rank 1 learns from its
// session's events that rank 0 is gone and says so at once, not after its
// 2-minute patience.
TEST_F(ClusterSelftestTest, TheAnsweringRankHearsThatTheOtherIsGone) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  Child zero = Mcctl(*a, {"selftest", "rdma", "--across", "gone", "--rank", "0"});
  Child one = Mcctl(*b, {"selftest", "rdma", "--across", "gone", "--rank", "1"});
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const auto start = std::chrono::steady_clock::now();
  zero.Kill(SIGKILL);
  EXPECT_EQ(zero.Wait(10000), 128 + SIGKILL);
  EXPECT_EQ(one.Wait(100000), 1) << one.output();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 30.0) << one.output();  // not its 2-minute patience
  EXPECT_NE(one.output().find("selftest rdma: FAILED"), std::string::npos) << one.output();
  // Killed in its steps (the usual case here): the answer step names why.
  if (one.output().find("FAIL at setup") == std::string::npos) {
    EXPECT_NE(Line(one.output(), "answer").find("rank 0 "), std::string::npos) << one.output();
    EXPECT_TRUE(one.output().find("rank 0 left") != std::string::npos ||
                one.output().find("rank 0 was lost") != std::string::npos)
        << one.output();
  }
  std::printf("[ figures ] rank 1 reported %.1f s after rank 0 was killed\n%s", secs,
              one.output().c_str());
}

// Rank 1 stopped (SIGSTOP: alive, its session too, so no event says
// anything) while rank 0 runs its steps: rank 0's read gets no answer
// within the patience (3 s here), it asks nothing more, and the later
// steps are not run, saying why. Resumed, rank 1 hears that rank 0 is
// gone once rank 0 exits.
TEST_F(ClusterSelftestTest, AStalledPeerIsReportedAfterThePatienceAndNothingMoreIsAsked) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  const std::vector<std::string> patience = {"MOONCAKE_SELFTEST_PATIENCE_MS=3000"};
  Child zero = Mcctl(*a, {"selftest", "rdma", "--across", "stalled", "--rank", "0"}, patience);
  Child one = Mcctl(*b, {"selftest", "rdma", "--across", "stalled", "--rank", "1"}, patience);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  one.Kill(SIGSTOP);
  EXPECT_EQ(zero.Wait(90000), 1) << zero.output();
  one.Kill(SIGCONT);
  EXPECT_EQ(one.Wait(60000), 1) << one.output();
  const std::string& out = zero.output();
  EXPECT_NE(out.find("selftest rdma: FAILED"), std::string::npos) << out;
  if (out.find("FAIL at setup") == std::string::npos) {
    EXPECT_NE(out.find("did not send its memory back within 3s"), std::string::npos) << out;
    if (Line(out, "ring-wrap").find("did not send") == std::string::npos) {
      EXPECT_NE(Line(out, "ring-wrap").find("not run: rank 1 stopped answering in"),
                std::string::npos)
          << out;
    }
    // No hand-over after a read that got no answer.
    EXPECT_EQ(out.find("hand-over"), std::string::npos) << out;
    // Resumed, rank 1 learns that rank 0 is gone, whichever way it finds
    // out first (its WRITE back failing, or the session's event).
    EXPECT_TRUE(one.output().find("rank 0 was lost") != std::string::npos ||
                one.output().find("rank 0 left") != std::string::npos)
        << one.output();
  }
  std::printf("[ figures ] a stalled rank 1:\n%s--- rank 1, resumed:\n%s", out.c_str(),
              one.output().c_str());
}

// Two ranks through one daemon would loop back through its NIC: refused,
// saying so, on both.
TEST_F(ClusterSelftestTest, BothRanksOnOneNodeAreRefusedAtSetup) {
  auto a = Node("node-a");
  Child zero = Mcctl(*a, {"selftest", "rdma", "--across", "one-node", "--rank", "0"});
  Child one = Mcctl(*a, {"selftest", "rdma", "--across", "one-node", "--rank", "1"});
  for (Child* c : {&zero, &one}) {
    EXPECT_EQ(c->Wait(90000), 1) << c->output();
    EXPECT_NE(c->output().find("FAIL at setup: both ranks are on node node-a"), std::string::npos)
        << c->output();
    EXPECT_EQ(c->output().find("write-inline"), std::string::npos) << c->output();
  }
}

TEST_F(ClusterSelftestTest, ARankAloneFailsAtSetupSayingWhatToStartWhere) {
  auto a = Node("node-a");
  Child alone = Mcctl(
      *a, {"--timeout-ms", "3000", "selftest", "rdma", "--across", "nobody-else", "--rank", "0"});
  EXPECT_EQ(alone.Wait(60000), 1) << alone.output();
  EXPECT_NE(alone.output().find("FAIL at setup"), std::string::npos) << alone.output();
  EXPECT_NE(alone.output().find("(R 0 on one, 1 on the other)"), std::string::npos)
      << alone.output();
}

}  // namespace
}  // namespace mooncake::testing
