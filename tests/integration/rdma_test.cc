// The RDMA route end to end on the host platform: real mooncaked (softnic
// provider), real example processes whose CPU threads write mlx5 WQEs and
// ring doorbell records, mcctl listings of the daemon's QPs and MRs, and
// cleanup when a rank with QPs is SIGKILLed.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "daemon_process.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

std::vector<Child> StartRanks(const std::string& socket, const std::string& group, int n,
                              const std::vector<std::vector<std::string>>& per_rank) {
  std::vector<Child> ranks;
  for (int r = 0; r < n; ++r) {
    // Through a shell so stderr (where setup errors go) is captured too.
    std::vector<std::string> argv = {"/bin/sh",
                                     "-c",
                                     "exec \"$0\" \"$@\" 2>&1",
                                     BinDir() + "/device_transport_example",
                                     "--platform",
                                     "host",
                                     "--socket",
                                     socket,
                                     "--group",
                                     group,
                                     "--rank",
                                     std::to_string(r),
                                     "--world-size",
                                     std::to_string(n)};
    const std::vector<std::string>& extra = per_rank[static_cast<size_t>(r) % per_rank.size()];
    argv.insert(argv.end(), extra.begin(), extra.end());
    ranks.push_back(Child::Spawn(argv));
  }
  return ranks;
}

size_t FdCount(pid_t pid) {
  size_t n = 0;
  if (DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

v1::ListQueuePairsResponse ListQps(const std::string& socket) {
  auto stub = v1::Admin::NewStub(UnixChannel(socket));
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::ListQueuePairsResponse r;
  EXPECT_TRUE(stub->ListQueuePairs(&ctx, {}, &r).ok());
  return r;
}

v1::ListMemoryRegionsResponse ListMrs(const std::string& socket) {
  auto stub = v1::Admin::NewStub(UnixChannel(socket));
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::ListMemoryRegionsResponse r;
  EXPECT_TRUE(stub->ListMemoryRegions(&ctx, {}, &r).ok());
  return r;
}

google::protobuf::ListValue McctlJsonArray(const std::string& socket, const std::string& cmd) {
  Child c = Child::Spawn({BinDir() + "/mcctl", "--socket", socket, "--json", cmd});
  EXPECT_EQ(c.Wait(10000), 0) << c.output();
  google::protobuf::Value v;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(c.output(), &v).ok()) << c.output();
  return v.list_value();
}

void ExpectAllPass(std::vector<Child>& ranks, int timeout_ms) {
  for (auto& r : ranks) {
    EXPECT_EQ(r.Wait(timeout_ms), 0) << r.output();
    EXPECT_NE(r.output().find("PASS"), std::string::npos) << r.output();
  }
}

TEST(RdmaRoute, TwoRanksPairThroughSoftnic) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto ranks =
      StartRanks(daemon.socket(), "rdma-pair", 2, {{"--route", "rdma", "--bytes", "1000003"}});
  ExpectAllPass(ranks, 60000);
  EXPECT_NE(ranks[1].output().find("1000003 bytes, all correct"), std::string::npos)
      << ranks[1].output();
  // Everything the ranks held is gone with their sessions.
  for (int i = 0; i < 100 && ListQps(daemon.socket()).qps_size() != 0; ++i) usleep(10000);
  EXPECT_EQ(ListQps(daemon.socket()).qps_size(), 0);
  EXPECT_EQ(ListMrs(daemon.socket()).regions_size(), 0);
}

TEST(RdmaRoute, FourRanksAllToAllWithTwoQpsPerPeer) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto ranks = StartRanks(daemon.socket(), "rdma-a2a", 4,
                          {{"--route", "rdma", "--bytes", "65537", "--qps-per-peer", "2"}});
  ExpectAllPass(ranks, 60000);
  for (auto& r : ranks) {
    EXPECT_NE(r.output().find("received 3 messages of 65537 bytes, all correct"), std::string::npos)
        << r.output();
  }
}

TEST(RdmaRoute, ForcedRdmaPairInsideAP2pGroup) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  // Ranks 0 and 1 talk over RDMA, every other pair over shared memory.
  auto ranks = StartRanks(daemon.socket(), "mixed", 4,
                          {{"--rdma-peers", "1", "--bytes", "4099"},
                           {"--rdma-peers", "0", "--bytes", "4099"},
                           {"--bytes", "4099"},
                           {"--bytes", "4099"}});
  ExpectAllPass(ranks, 60000);
}

TEST(RdmaRoute, OneSidedRdmaChoiceIsAClearSetupError) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto ranks =
      StartRanks(daemon.socket(), "one-sided", 2,
                 {{"--rdma-peers", "1", "--timeout-ms", "5000"}, {"--timeout-ms", "5000"}});
  EXPECT_EQ(ranks[0].Wait(30000), 2) << ranks[0].output();
  EXPECT_NE(ranks[0].output().find("rank 1 published no RDMA queue pair toward rank 0"),
            std::string::npos)
      << ranks[0].output();
  EXPECT_NE(ranks[1].Wait(30000), 0);
}

TEST(RdmaRoute, McctlShowsSoftnicQpsAndMrsAndSigkillReleasesThem) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  const size_t fds_before = FdCount(daemon.child().pid());

  google::protobuf::ListValue nics = McctlJsonArray(daemon.socket(), "nics");
  bool softnic = false;
  for (const auto& n : nics.values()) {
    softnic = softnic || n.struct_value().fields().at("provider").string_value() == "softnic";
  }
  EXPECT_TRUE(softnic) << "mcctl nics --json lists no softnic provider";

  auto ranks = StartRanks(daemon.socket(), "rdma-watch", 2,
                          {{"--route", "rdma", "--mode", "watch", "--timeout-ms", "30000"}});
  ASSERT_FALSE(ranks[0].WaitForLine("READY", 30000).empty()) << ranks[0].output();
  ASSERT_FALSE(ranks[1].WaitForLine("READY", 30000).empty()) << ranks[1].output();

  google::protobuf::ListValue qps = McctlJsonArray(daemon.socket(), "qps");
  ASSERT_EQ(qps.values_size(), 2);  // one QP per rank toward the other
  for (const auto& q : qps.values()) {
    const auto& f = q.struct_value().fields();
    EXPECT_GT(f.at("qpn").number_value(), 0);
    EXPECT_EQ(f.at("state").string_value(), "RTS");
    EXPECT_GT(f.at("session_id").number_value(), 0);
    EXPECT_EQ(f.at("doorbell_mode").string_value(), "doorbell-record");
  }
  google::protobuf::ListValue mrs = McctlJsonArray(daemon.socket(), "mrs");
  ASSERT_EQ(mrs.values_size(), 4);  // per rank: the buffer and the control memory
  for (const auto& m : mrs.values()) {
    const auto& f = m.struct_value().fields();
    EXPECT_GT(f.at("size").number_value(), 0);
    EXPECT_GT(f.at("session_id").number_value(), 0);
    EXPECT_EQ(f.count("lkey"), 0u) << "keys must not be listed";
  }

  const int victim_pid = ranks[1].pid();
  ranks[1].Kill(SIGKILL);
  // Its QPs and MRs are gone within a second.
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = true;
    const v1::ListQueuePairsResponse qps_now = ListQps(daemon.socket());
    const v1::ListMemoryRegionsResponse mrs_now = ListMrs(daemon.socket());
    for (const auto& q : qps_now.qps()) gone = gone && q.pid() != victim_pid;
    for (const auto& m : mrs_now.regions()) gone = gone && m.pid() != victim_pid;
    if (!gone) usleep(10000);
  }
  EXPECT_TRUE(gone) << "the killed rank's QPs/MRs were still listed after 1 s";

  EXPECT_EQ(ranks[0].Wait(10000), 0) << ranks[0].output();
  EXPECT_NE(ranks[0].output().find("EVENT lost rank 1"), std::string::npos) << ranks[0].output();
  // With both ranks gone, so is everything, and the daemon holds no more fds
  // than before (mappings keep no fds; connections were swept).
  size_t fds_after = 0;
  for (int i = 0; i < 300; ++i) {
    fds_after = FdCount(daemon.child().pid());
    if (fds_after <= fds_before && ListQps(daemon.socket()).qps_size() == 0) break;
    usleep(10000);
  }
  EXPECT_EQ(ListQps(daemon.socket()).qps_size(), 0);
  EXPECT_EQ(ListMrs(daemon.socket()).regions_size(), 0);
  EXPECT_LE(fds_after, fds_before);
}

// A daemon restart tears down the RDMA resources it owned (softnic runs in
// it): ranks holding QPs are told at once and exit with a clear error
// instead of hanging (their posts would time out, kTimedOut, not hang).
TEST(RdmaRoute, DaemonStopIsReportedToRanksHoldingQps) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto ranks = StartRanks(daemon.socket(), "rdma-restart", 2,
                          {{"--route", "rdma", "--mode", "watch", "--timeout-ms", "30000"}});
  ASSERT_FALSE(ranks[0].WaitForLine("READY", 30000).empty()) << ranks[0].output();
  ASSERT_FALSE(ranks[1].WaitForLine("READY", 30000).empty()) << ranks[1].output();
  EXPECT_EQ(daemon.Stop(), 0);
  for (auto& r : ranks) {
    EXPECT_EQ(r.Wait(10000), 2) << r.output();
    EXPECT_NE(r.output().find("lost the daemon"), std::string::npos) << r.output();
  }
}

}  // namespace
}  // namespace mooncake::testing
