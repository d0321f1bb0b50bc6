// The RDMA route end to end on the host platform: real mooncaked (softnic
// provider), real example processes whose CPU threads write mlx5 WQEs and
// ring doorbell records, mcctl listings of the daemon's QPs and MRs, and
// cleanup when a rank with QPs is SIGKILLed. And what a daemon stop does to
// running ranks: RDMA queue pairs fail at once, P2P mappings keep working.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon_process.h"
#include "example_argv.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "mooncake/device/types_device.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

std::vector<Child> StartRanks(const std::string& socket, const std::string& group, int n,
                              const std::vector<std::vector<std::string>>& per_rank) {
  std::vector<Child> ranks;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv = WithStderr(ExampleArgv(socket, group, r, n));
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

// Whether `pid`'s fd count drops to `limit` or below within `within`
// (polled from /proc every 5 ms; on a loaded machine the daemon's threads
// may need a moment after the session ended to close what it held).
bool FdsWithin(pid_t pid, size_t limit, absl::Duration within) {
  const absl::Time deadline = absl::Now() + within;
  for (;;) {
    if (FdCount(pid) <= limit) return true;
    if (absl::Now() >= deadline) return false;
    usleep(5000);
  }
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

// Every rank ends in a setup error (exit 2) whose output says `why`.
void ExpectAllSetupErrors(std::vector<Child>& ranks, const std::string& why) {
  for (auto& r : ranks) {
    EXPECT_EQ(r.Wait(30000), 2) << r.output();
    EXPECT_NE(r.output().find(why), std::string::npos) << r.output();
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

// Ranks 0 and 1 talk over RDMA, every other pair over shared memory, and
// every rank bumps every other rank's arrival counter (mc_red_add): rank 0's
// counter takes a NIC atomic from rank 1 and SM atomics from ranks 2 and 3.
// softnic runs NIC atomics as a ConnectX does ("hca": read, add, write,
// with a window), so only the NIC atomics route keeps the counts.
std::string HcaDaemonConfig(const std::string& dir) {
  const std::string path = dir + "/mooncaked.conf";
  std::ofstream(path) << "softnic_atomics = hca\nsoftnic_hca_atomic_window_us = 2000\n";
  return path;
}

TEST(RdmaRoute, ForcedRdmaPairInsideAP2pGroupWithNicAtomics) {
  TempDir dir;
  DaemonProcess daemon(dir.path(), {"--config", HcaDaemonConfig(dir.path())});
  auto ranks = StartRanks(daemon.socket(), "mixed", 4,
                          {{"--rdma-peers", "1", "--bytes", "4099", "--atomics", "nic"},
                           {"--rdma-peers", "0", "--bytes", "4099", "--atomics", "nic"},
                           {"--bytes", "4099", "--atomics", "nic"},
                           {"--bytes", "4099", "--atomics", "nic"}});
  ExpectAllPass(ranks, 60000);
  for (auto& r : ranks) {
    EXPECT_NE(r.output().find("received 3 messages of 4099 bytes, all correct"), std::string::npos)
        << r.output();
  }
}

// auto: ranks 0 and 1 (RDMA peers) choose NIC atomics, ranks 2 and 3 (P2P
// only) do not. Every rank refuses the group, naming both sides and the fix.
TEST(RdmaRoute, RanksThatDisagreeOnTheAtomicsRouteAreASetupError) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto ranks = StartRanks(daemon.socket(), "mixed-auto", 4,
                          {{"--rdma-peers", "1", "--timeout-ms", "10000"},
                           {"--rdma-peers", "0", "--timeout-ms", "10000"},
                           {"--timeout-ms", "10000"},
                           {"--timeout-ms", "10000"}});
  ExpectAllSetupErrors(ranks,
                       "atomics route: ranks 0,1 send every mc_red_add through the target's NIC");
  for (auto& r : ranks) {
    EXPECT_NE(r.output().find("ranks 2,3 use SM/CPU atomics"), std::string::npos) << r.output();
    EXPECT_NE(r.output().find("--atomics"), std::string::npos) << r.output();
  }
}

// --nic (CommunicatorOptions::rdma_nics, upstream's factory filter) puts a
// rank's QPs on the NIC it names; a NIC the daemon does not serve is a
// setup error naming it and what is served.
TEST(RdmaRoute, ARankChoosesItsNicByName) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto ranks = StartRanks(daemon.socket(), "nic-by-name", 2,
                          {{"--route", "rdma", "--nic", "softnic0", "--bytes", "4099"}});
  ExpectAllPass(ranks, 60000);
  auto wrong = StartRanks(daemon.socket(), "nic-wrong", 2,
                          {{"--route", "rdma", "--nic", "mlx5_7", "--timeout-ms", "5000"}});
  ExpectAllSetupErrors(wrong,
                       "NIC \"mlx5_7\" is not served by mooncaked here (it serves softnic0)");
}

// Where the rings are: host ranks say "host"; asking host ranks for GPU
// rings is a setup error naming why (CUDA ranks: tests/gpu, where softnic
// refuses GPU rings and --rings auto stays on host memory).
TEST(RdmaRoute, RanksNameWhereTheirRingsAreAndHostRanksRefuseGpuRings) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto ranks =
      StartRanks(daemon.socket(), "rings-host", 2, {{"--route", "rdma", "--rings", "host"}});
  ExpectAllPass(ranks, 60000);
  for (auto& r : ranks) {
    EXPECT_NE(r.output().find("RDMA on softnic0, doorbells doorbell-record, rings in host memory"),
              std::string::npos)
        << r.output();
  }
  auto gpu = StartRanks(daemon.socket(), "rings-gpu", 2,
                        {{"--route", "rdma", "--rings", "gpu", "--timeout-ms", "5000"}});
  ExpectAllSetupErrors(gpu, "ring_memory kGpu needs the CUDA platform");
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
    const auto& f = n.struct_value().fields();
    if (f.at("provider").string_value() != "softnic") continue;
    softnic = true;
    // How softnic models NIC atomics (issue 24 item 2).
    ASSERT_EQ(f.count("atomics"), 1u);
    EXPECT_TRUE(absl::StartsWith(f.at("atomics").string_value(), "device model: fetch-add 8 B"))
        << f.at("atomics").string_value();
  }
  EXPECT_TRUE(softnic) << "mcctl nics --json lists no softnic provider";

  auto ranks = StartRanks(daemon.socket(), "rdma-watch", 2,
                          {{"--route", "rdma", "--mode", "watch", "--timeout-ms", "30000"}});
  ASSERT_FALSE(ranks[0].WaitForLine("READY", 30000).empty()) << ranks[0].output();
  ASSERT_FALSE(ranks[1].WaitForLine("READY", 30000).empty()) << ranks[1].output();
  // With both ranks' sessions (one connection each) and their objects.
  const size_t fds_live = FdCount(daemon.child().pid());
  ASSERT_GT(fds_live, fds_before);

  google::protobuf::ListValue qps = McctlJsonArray(daemon.socket(), "qps");
  // Per rank: one QP toward the other, and its loopback (RDMA peers make
  // atomics_route auto choose NIC atomics).
  ASSERT_EQ(qps.values_size(), 4);
  for (const auto& q : qps.values()) {
    const auto& f = q.struct_value().fields();
    EXPECT_GT(f.at("qpn").number_value(), 0);
    EXPECT_EQ(f.at("state").string_value(), "RTS");
    EXPECT_GT(f.at("session_id").number_value(), 0);
    // The acceptance key; the same number as session_id.
    ASSERT_EQ(f.count("session"), 1u) << "mcctl qps --json entry without \"session\"";
    EXPECT_EQ(f.at("session").number_value(), f.at("session_id").number_value());
    EXPECT_EQ(f.at("doorbell_mode").string_value(), "doorbell-record");
  }
  google::protobuf::ListValue mrs = McctlJsonArray(daemon.socket(), "mrs");
  ASSERT_EQ(mrs.values_size(), 4);  // per rank: the buffer and the control memory
  for (const auto& m : mrs.values()) {
    const auto& f = m.struct_value().fields();
    EXPECT_GT(f.at("size").number_value(), 0);
    EXPECT_GT(f.at("session_id").number_value(), 0);
    ASSERT_EQ(f.count("session"), 1u) << "mcctl mrs --json entry without \"session\"";
    EXPECT_EQ(f.at("session").number_value(), f.at("session_id").number_value());
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
  // Its session's fds (its connection at least) are released with them:
  // fewer fds than with both ranks within 1 s of its QPs disappearing. Read
  // from /proc only, so no connection of the test's inflates the count.
  EXPECT_TRUE(FdsWithin(daemon.child().pid(), fds_live - 1, absl::Seconds(1)))
      << "1 s after the killed rank's QPs went the daemon still holds "
      << FdCount(daemon.child().pid()) << " fds, as many as with both ranks (" << fds_live << ")";

  EXPECT_EQ(ranks[0].Wait(10000), 0) << ranks[0].output();
  EXPECT_NE(ranks[0].output().find("EVENT lost rank 1"), std::string::npos) << ranks[0].output();
  // With both ranks gone, so is everything; within 1 s of the last QP
  // disappearing the daemon holds no more fds than before the ranks came
  // (mappings keep no fds; connections were swept).
  bool none = false;
  for (int i = 0; i < 500 && !none; ++i) {
    none = ListQps(daemon.socket()).qps_size() == 0;
    if (!none) usleep(10000);
  }
  ASSERT_TRUE(none) << "the survivor's QPs were still listed 5 s after it exited";
  EXPECT_TRUE(FdsWithin(daemon.child().pid(), fds_before, absl::Seconds(1)))
      << "1 s after the last QP went the daemon holds " << FdCount(daemon.child().pid())
      << " fds, more than its baseline of " << fds_before;
  EXPECT_EQ(ListMrs(daemon.socket()).regions_size(), 0);
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

// What a rank still posting after the daemon went gets: its QPs were failed
// when the client learnt of it (one WR_FLUSH_ERR completion each), so
// mc_quiet returns kRdmaError at once instead of kTimedOut after the QPs'
// timeout (DaemonRdmaOptions::timeout_ns, 10 s), and closing does not hang.
TEST(RdmaRoute, DaemonStopFailsTheRanksQueuePairsAtOnce) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  std::vector<Child> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(Child::Spawn({BinDir() + "/mc_test_client", "rdma-after-daemon",
                                  daemon.socket(), "rdma-after", std::to_string(r), "2"}));
  }
  for (auto& r : ranks) ASSERT_FALSE(r.WaitForLine("READY", 30000).empty()) << r.output();
  EXPECT_EQ(daemon.Stop(), 0);
  for (auto& r : ranks) {
    EXPECT_EQ(r.Wait(30000), 0) << r.output();
    const std::string line = r.WaitForLine("AFTER DAEMON", 0);
    int put = -1, quiet = -1;
    long ms = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "AFTER DAEMON put=%d quiet=%d ms=%ld", &put, &quiet, &ms),
              3)
        << r.output();
    EXPECT_TRUE(put == static_cast<int>(device::McStatus::kOk) ||
                put == static_cast<int>(device::McStatus::kRdmaError))
        << r.output();
    EXPECT_EQ(quiet, static_cast<int>(device::McStatus::kRdmaError)) << r.output();
    EXPECT_LT(ms, 5000) << "mc_quiet waited for the QP timeout\n" << r.output();
    EXPECT_NE(r.output().find("CLOSED"), std::string::npos) << r.output();
  }
}

// The other half of the restart contract: P2P mappings are the processes'
// own (memfds each rank mapped), so ranks keep exchanging data through them
// after the daemon is gone, and closing the Communicator then does not hang.
TEST(DaemonRestart, P2pMappingsKeepWorkingAfterTheDaemonStops) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  std::vector<Child> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(Child::Spawn({BinDir() + "/mc_test_client", "p2p-after-daemon", daemon.socket(),
                                  "p2p-survives", std::to_string(r), "2"}));
  }
  for (auto& r : ranks) {
    ASSERT_NE(r.WaitForLine("READY", 30000).find("handle=memfd"), std::string::npos) << r.output();
  }
  EXPECT_EQ(daemon.Stop(), 0);
  EXPECT_FALSE(daemon.running());
  for (auto& r : ranks) {
    EXPECT_EQ(r.Wait(30000), 0) << r.output();
    const std::string& out = r.output();
    // The exchange happened after the daemon was gone, and worked.
    const size_t gone_at = out.find("DAEMON GONE");
    const size_t done_at = out.find("EXCHANGED 1 messages of 1000 bytes, all correct");
    EXPECT_NE(gone_at, std::string::npos) << out;
    EXPECT_NE(done_at, std::string::npos) << out;
    EXPECT_LT(gone_at, done_at) << out;
    EXPECT_NE(out.find("CLOSED"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace mooncake::testing
