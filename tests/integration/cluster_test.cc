// Cluster membership in etcd (issue 9 item 2), end to end: a real etcd on
// 127.0.0.1 (Debian's etcd-server) and real mooncaked processes as nodes,
// each with its own node id, socket and peer port.
//   - every daemon lists every live node (mcctl peers' RPC, and mcctl itself);
//   - a SIGKILLed node vanishes from the others within the lease TTL, a
//     SIGTERMed one at once (it revokes its lease);
//   - a node id held by a live daemon stops a second one at start;
//   - etcd unreachable at start stops the daemon, naming the endpoint;
//   - etcd lost and back: the node registers again by itself;
//   - without etcd: the node alone, "etcd: off";
//   - etcd over TLS with client certificates (etcd --client-cert-auth): the
//     node registers with etcd_ca_file/etcd_cert_file/etcd_key_file; a CA
//     file missing or of another CA stops the start, saying why.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "cluster_fixture.h"
#include "etcd/etcd_client.h"
#include "etcd/etcd_options.h"
#include "etcd_reader.h"
#include "gtest/gtest.h"
#include "mooncake/v1/admin.grpc.pb.h"
#include "test_certs.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

using daemon::etcd::testing::PickFreePort;
using Clock = std::chrono::steady_clock;

constexpr int kLeaseTtlS = kClusterLeaseTtlS;

v1::ListPeersResponse Peers(const std::string& socket) {
  auto stub = v1::Admin::NewStub(UnixChannel(socket));
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::ListPeersResponse resp;
  grpc::Status s = stub->ListPeers(&ctx, v1::ListPeersRequest(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

std::vector<std::string> NodeIds(const std::string& socket) {
  std::vector<std::string> ids;
  const v1::ListPeersResponse view = Peers(socket);  // the loop's range must outlive it
  for (const v1::NodeRecord& n : view.nodes()) ids.push_back(n.node_id());
  return ids;
}

// Waits until `socket`'s view is exactly `want`; returns the seconds it took
// (-1 on timeout).
double AwaitNodes(const std::string& socket, const std::vector<std::string>& want,
                  double timeout_s) {
  const auto start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() < timeout_s) {
    if (NodeIds(socket) == want) return std::chrono::duration<double>(Clock::now() - start).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

// mooncaked that is expected to fail at start, with <dir>/<conf> and
// `args`: its exit code and output.
std::pair<int, std::string> FailingStart(const std::string& dir, const std::string& conf,
                                         const std::string& args, int timeout_ms) {
  const std::string cmd =
      absl::StrCat(BinDir(), "/mooncaked --socket ", dir, "/failing.sock --config ", dir, "/", conf,
                   " ", args, " 2>&1");
  Child c = Child::Spawn({"/bin/sh", "-c", cmd});
  const int rc = c.Wait(timeout_ms);
  return {rc, c.output()};
}

class ClusterTest : public ClusterFixture {
 protected:
  ClusterTest() : ClusterFixture("/mctest") {}
  std::pair<int, std::string> FailingStart(const std::string& args, int timeout_ms) {
    return mooncake::testing::FailingStart(dir_.path(), "cluster.conf", args, timeout_ms);
  }
};

// Issue 23 item 2: whoever can write the prefix decides how much is there.
// 100 000 junk keys under it (node ids with no record, records that do not
// parse, keys that name no group) and the daemons still start within 10 s
// and ignore them. (Prefix reads are paged, 1000 keys a response at one
// revision, and stop past 10^6 keys: EtcdClient::ScanPrefix. The same run
// with one unpaged response also starts in about a second: the etcd client
// takes large messages, so paging bounds memory per response, not time.)
TEST_F(ClusterTest, HundredThousandJunkKeysUnderThePrefixAreIgnored) {
  absl::StatusOr<std::unique_ptr<daemon::etcd::EtcdClient>> etcd = ConnectEtcd(etcd_.client_url());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string filler(48, 'j');
  constexpr int kKeys = 100000;
  constexpr int kPerTxn = 100;  // etcd's default --max-txn-ops is 128
  for (int base = 0; base < kKeys; base += kPerTxn) {
    daemon::etcd::Txn txn;
    for (int i = base; i < base + kPerTxn; ++i) {
      const std::string key = i % 2 == 0
                                  ? absl::StrCat("/mctest/nodes/junk-", i)
                                  : absl::StrCat("/mctest/groups/", i % 7 == 0 ? "0" : "u1000",
                                                 "/g", i, i % 3 == 0 ? "/ranks/0" : "/meta");
      txn.ThenPut(key, i % 5 == 0 ? absl::StrCat("{\"nodeId\":\"x", i, "\"}") : filler);
    }
    absl::StatusOr<daemon::etcd::TxnResult> r = (*etcd)->Commit(txn);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  const auto start = Clock::now();
  auto a = Node("node-a");
  const double a_s = std::chrono::duration<double>(Clock::now() - start).count();
  auto b = Node("node-b");
  const double both_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "[ figures ] %d junk keys under the prefix: node-a serving after %.2f s, node-b "
      "after %.2f s\n",
      kKeys, a_s, both_s - a_s);
  EXPECT_LT(a_s, 10);
  EXPECT_LT(both_s - a_s, 10);
  for (const auto* d : {a.get(), b.get()}) {
    EXPECT_GE(AwaitNodes(d->socket(), {"node-a", "node-b"}, 10), 0)
        << "the junk shows in the view of " << d->socket();
  }
  EXPECT_TRUE(a->running() && b->running());
}

TEST_F(ClusterTest, EveryNodeSeesEveryLiveNodeAndLosesTheDeadOnes) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  auto c = Node("node-c");
  const std::vector<std::string> all = {"node-a", "node-b", "node-c"};
  for (const auto* d : {a.get(), b.get(), c.get()}) {
    EXPECT_GE(AwaitNodes(d->socket(), all, 5), 0) << d->socket();
  }
  v1::ListPeersResponse view = Peers(b->socket());
  EXPECT_EQ(view.self_node_id(), "node-b");
  EXPECT_EQ(view.etcd_state(), "registered");
  ASSERT_EQ(view.nodes_size(), 3);
  EXPECT_EQ(view.nodes(0).peer_address(), GetStatus(a->socket()).peer_listen());
  EXPECT_EQ(view.nodes(0).instance_id(), GetStatus(a->socket()).instance_id());
  EXPECT_EQ(view.nodes(2).rdma_provider(), "softnic");

  // mcctl shows it too, as a table and as JSON.
  Child table = Child::Spawn({BinDir() + "/mcctl", "--socket", a->socket(), "peers"});
  ASSERT_EQ(table.Wait(10000), 0) << table.output();
  EXPECT_NE(table.output().find("node-c"), std::string::npos) << table.output();
  Child json = Child::Spawn({BinDir() + "/mcctl", "--socket", a->socket(), "peers", "--json"});
  ASSERT_EQ(json.Wait(10000), 0) << json.output();
  EXPECT_NE(json.output().find("\"self_node_id\": \"node-a\""), std::string::npos) << json.output();

  // SIGKILL: its lease runs out; the others see it go within the TTL (and
  // the lease keeper's refresh period of slack).
  c->Stop(SIGKILL);
  const double killed = AwaitNodes(a->socket(), {"node-a", "node-b"}, kLeaseTtlS + 4);
  ASSERT_GE(killed, 0) << "node-c still listed after SIGKILL";
  EXPECT_LE(killed, kLeaseTtlS + 2.0);
  EXPECT_GE(AwaitNodes(b->socket(), {"node-a", "node-b"}, 2), 0);
  // SIGTERM: the lease is revoked on the way out; gone at once.
  EXPECT_EQ(b->Stop(SIGTERM), 0);
  const double left = AwaitNodes(a->socket(), {"node-a"}, 3);
  ASSERT_GE(left, 0) << "node-b still listed after SIGTERM";
  EXPECT_LT(left, 1.0);
  std::printf(
      "[ figures ] lease TTL %d s: SIGKILLed node gone after %.2f s, SIGTERMed after %.2f s\n",
      kLeaseTtlS, killed, left);
}

TEST_F(ClusterTest, ANodeIdHeldByALiveDaemonStopsTheSecond) {
  auto a = Node("twin");
  const auto [rc, out] =
      FailingStart(absl::StrCat("--node-id twin --etcd ", etcd_.client_url()), 20000);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("give every node its own node_id"), std::string::npos) << out;
  EXPECT_EQ(NodeIds(a->socket()), std::vector<std::string>{"twin"});
  EXPECT_EQ(Peers(a->socket()).nodes(0).instance_id(), GetStatus(a->socket()).instance_id());
}

TEST_F(ClusterTest, EtcdUnreachableAtStartStopsTheDaemonNamingTheEndpoint) {
  const std::string dead = absl::StrCat("127.0.0.1:", PickFreePort());
  const auto [rc, out] = FailingStart(absl::StrCat("--node-id lonely --etcd ", dead), 20000);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("cannot reach etcd"), std::string::npos) << out;
  EXPECT_NE(out.find(dead), std::string::npos) << out;
  const auto [rc2, out2] = FailingStart("--node-id lonely --etcd ftp://x:1", 20000);
  EXPECT_NE(rc2, 0) << out2;
  EXPECT_NE(out2.find("etcd_endpoints"), std::string::npos) << out2;
}

TEST_F(ClusterTest, ANodeRegistersAgainAfterEtcdComesBack) {
  auto a = Node("phoenix");
  ASSERT_GE(AwaitNodes(a->socket(), {"phoenix"}, 5), 0);
  etcd_.Stop(SIGKILL);
  // The lease cannot be refreshed: the daemon says so, and keeps serving.
  const auto start = Clock::now();
  std::string state;
  while (Clock::now() - start < std::chrono::seconds(kLeaseTtlS + 5)) {
    state = GetStatus(a->socket()).etcd_state();
    if (state != "registered") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(state, "registered");
  EXPECT_NE(state.find("registering again"), std::string::npos) << state;
  ASSERT_TRUE(etcd_.Restart().ok());
  const auto back = Clock::now();
  while (Clock::now() - back < std::chrono::seconds(15)) {
    state = GetStatus(a->socket()).etcd_state();
    if (state == "registered") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(state, "registered");
  EXPECT_GE(AwaitNodes(a->socket(), {"phoenix"}, 10), 0);
}

TEST(ClusterWithoutEtcd, TheNodeAloneAndEtcdOff) {
  TempDir dir;
  DaemonProcess d(dir.path());
  v1::ListPeersResponse view = Peers(d.socket());
  EXPECT_EQ(view.etcd_state(), "off");
  ASSERT_EQ(view.nodes_size(), 1);
  EXPECT_EQ(view.nodes(0).node_id(), "testnode");
  EXPECT_EQ(GetStatus(d.socket()).etcd_state(), "off");
}

TEST(ClusterOverTls, ANodeRegistersOverMutualTlsAndAMissingOrWrongCaStopsTheStart) {
  TempDir dir;
  absl::StatusOr<TestCertificates> certs = MakeTestCa(dir.path(), "etcd");
  ASSERT_TRUE(certs.ok()) << certs.status();
  absl::StatusOr<TestCertificates> rogue = MakeTestCa(dir.path(), "rogue");
  ASSERT_TRUE(rogue.ok()) << rogue.status();
  daemon::etcd::testing::EtcdTestServer etcd;
  etcd.UseTls({certs->ca_file, certs->cert_file, certs->key_file});
  absl::Status started = etcd.Start();
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_EQ(etcd.client_url().rfind("https://", 0), 0u) << etcd.client_url();
  auto conf = [&](const std::string& name, const std::string& ca_file) {
    std::ofstream(dir.path() + "/" + name) << "etcd_lease_ttl_s = " << kLeaseTtlS
                                           << "\netcd_prefix = /mctls\netcd_ca_file = " << ca_file
                                           << "\netcd_cert_file = " << certs->cert_file
                                           << "\netcd_key_file = " << certs->key_file << "\n";
  };
  conf("tls.conf", certs->ca_file);
  {
    const std::string sub = dir.path() + "/secure";
    ::mkdir(sub.c_str(), 0700);
    DaemonProcess d(sub,
                    {"--config", dir.path() + "/tls.conf", "--node-id", "secure", "--peer-listen",
                     absl::StrCat("127.0.0.1:", PickFreePort()), "--etcd", etcd.client_url()});
    EXPECT_GE(AwaitNodes(d.socket(), {"secure"}, 5), 0);
    EXPECT_EQ(GetStatus(d.socket()).etcd_state(), "registered");
    Child json = Child::Spawn({BinDir() + "/mcctl", "--socket", d.socket(), "peers", "--json"});
    ASSERT_EQ(json.Wait(10000), 0) << json.output();
    EXPECT_NE(json.output().find("\"node_id\": \"secure\""), std::string::npos) << json.output();
  }

  const std::string missing = dir.path() + "/no-such-ca.pem";
  conf("missing.conf", missing);
  auto [rc, out] = FailingStart(dir.path(), "missing.conf",
                                absl::StrCat("--node-id m --etcd ", etcd.client_url()), 20000);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find(missing), std::string::npos) << out;
  EXPECT_NE(out.find("etcd TLS ca_file"), std::string::npos) << out;

  conf("rogue.conf", rogue->ca_file);
  std::tie(rc, out) = FailingStart(dir.path(), "rogue.conf",
                                   absl::StrCat("--node-id r --etcd ", etcd.client_url()), 20000);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("cannot reach etcd"), std::string::npos) << out;
  EXPECT_NE(out.find("not signed by the CA in the etcd TLS ca_file '" + rogue->ca_file),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace mooncake::testing
