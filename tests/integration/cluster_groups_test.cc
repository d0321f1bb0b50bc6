// Groups across nodes (issue 9 item 3), end to end: a real etcd on
// 127.0.0.1 and real mooncaked processes as nodes; members join over raw
// sessions on each node's socket, as a client would.
//   - ranks spread over 2 and 3 nodes form one group; every rank gets the
//     whole view (remote members with their node and RDMA endpoint, never
//     P2P-reachable);
//   - a rank held on one node is refused on another (naming the holder),
//     and so is another world size;
//   - a rank that leaves or is lost on a live node, and a whole node
//     SIGKILLed, reach the members on the other nodes as LEFT / LOST (the
//     node within the lease TTL plus slack);
//   - etcd down: a group entirely on one node still forms; a cross-node
//     join waits and fails naming etcd; etcd back: cross-node joins resume;
//   - the two-rank example with --route rdma, its ranks on different
//     daemons, passes (softnic across nodes over the peer port: issue 9
//     item 5), for 2 and 4 ranks, and a watcher hears a killed node's rank.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cluster_fixture.h"
#include "etcd/etcd_client.h"
#include "etcd/etcd_options.h"
#include "etcd_reader.h"
#include "gtest/gtest.h"
#include "raw_session.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

using abuse::OpenRawSession;
using abuse::RawSession;
using Clock = std::chrono::steady_clock;

constexpr int kLeaseTtlS = kClusterLeaseTtlS;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct JoinResult {
  grpc::Status status;
  v1::JoinGroupResponse view;
};

// One member: a session on `socket` that joins and stays.
struct Member {
  std::unique_ptr<RawSession> session;
  std::future<JoinResult> join;

  // Next member event within `timeout_s` (none: KIND_UNSPECIFIED).
  v1::MemberEvent NextEvent(double timeout_s) {
    auto ev = std::async(std::launch::async, [this] {
      v1::SessionEvent e;
      while (session->events->Read(&e)) {
        if (e.has_member()) return e.member();
      }
      return v1::MemberEvent();
    });
    if (ev.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready) {
      session->ctx.TryCancel();  // ends the read; the session goes with it
      return v1::MemberEvent();
    }
    return ev.get();
  }
};

v1::JoinGroupRequest Request(const std::string& group, uint32_t rank, uint32_t world,
                             uint32_t timeout_ms = 20000) {
  v1::JoinGroupRequest r;
  r.set_group(group);
  r.set_rank(rank);
  r.set_world_size(world);
  r.set_timeout_ms(timeout_ms);
  r.mutable_handle()->set_kind("test");
  r.mutable_handle()->set_size(4096);
  // An RDMA endpoint, so the test sees it carried across nodes.
  v1::RdmaEndpoint* e = r.mutable_rdma();
  e->set_raddr(0x1000 + rank);
  e->set_rkey(100 + rank);
  e->set_qps_per_peer(1);
  for (uint32_t p = 0; p < world; ++p) e->add_qpns(p == rank ? 0 : 1000 * (rank + 1) + p);
  e->set_nic("softnic0");
  return r;
}

std::unique_ptr<Member> StartJoin(const std::string& socket, v1::JoinGroupRequest req) {
  auto m = std::make_unique<Member>();
  m->session = OpenRawSession(socket);
  if (!m->session) return nullptr;
  RawSession* s = m->session.get();
  m->join = std::async(std::launch::async, [s, req] {
    JoinResult r;
    grpc::ClientContext ctx;
    Deadline(&ctx, static_cast<int>(req.timeout_ms()) + 10000);
    r.status = s->stub->JoinGroup(&ctx, req, &r.view);
    return r;
  });
  return m;
}

class ClusterGroupsTest : public ClusterFixture {
 protected:
  ClusterGroupsTest() : ClusterFixture("/mcgroups") {}

  // Whether `key` appears in etcd within 10 s.
  bool AwaitKey(const std::string& key) {
    absl::StatusOr<std::unique_ptr<daemon::etcd::EtcdClient>> etcd =
        ConnectEtcd(etcd_.client_url());
    if (!etcd.ok()) return false;
    for (const auto start = Clock::now(); Since(start) < 10;) {
      absl::StatusOr<std::optional<daemon::etcd::KeyValue>> kv = (*etcd)->Get(key);
      if (kv.ok() && kv->has_value()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

TEST_F(ClusterGroupsTest, RanksOnTwoAndThreeNodesFormOneGroupWithTheWholeView) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  auto c = Node("node-c");
  const std::vector<const DaemonProcess*> nodes = {a.get(), b.get(), c.get()};
  for (uint32_t world : {2u, 4u, 8u}) {
    const std::string group = absl::StrCat("spread", world);
    const size_t spread = world == 2 ? 2 : 3;
    const auto start = Clock::now();
    std::vector<std::unique_ptr<Member>> members;
    for (uint32_t r = 0; r < world; ++r) {
      members.push_back(StartJoin(nodes[r % spread]->socket(), Request(group, r, world)));
      ASSERT_NE(members.back(), nullptr);
    }
    for (uint32_t r = 0; r < world; ++r) {
      JoinResult j = members[r]->join.get();
      ASSERT_TRUE(j.status.ok()) << "rank " << r << ": " << j.status.error_message();
      ASSERT_EQ(j.view.members_size(), static_cast<int>(world));
      EXPECT_EQ(j.view.rank(), r);
      for (uint32_t p = 0; p < world; ++p) {
        const v1::MemberView& v = j.view.members(static_cast<int>(p));
        EXPECT_EQ(v.rank(), p);
        const std::string want_node = absl::StrCat("node-", std::string(1, 'a' + p % spread));
        EXPECT_EQ(v.node_id(), want_node) << "rank " << r << " sees rank " << p;
        const bool same = p % spread == r % spread;
        EXPECT_EQ(v.same_node(), same);
        if (!same) EXPECT_FALSE(v.p2p_reachable());
        EXPECT_EQ(v.rdma().rkey(), 100 + p);
        ASSERT_EQ(v.rdma().qpns_size(), static_cast<int>(world));
        EXPECT_EQ(v.rdma().qpns(static_cast<int>(r)), r == p ? 0 : 1000 * (p + 1) + r);
        EXPECT_EQ(v.handle_kind(), "test");
      }
    }
    std::printf("[ figures ] %u ranks over %zu nodes formed in %.1f ms\n", world, spread,
                Since(start) * 1e3);
    // The listing of one node shows the whole group, other nodes' ranks
    // with their node.
    const v1::ListGroupsResponse listed = ListGroups(a->socket());
    const v1::GroupInfo* info = nullptr;
    for (const v1::GroupInfo& g : listed.groups()) {
      if (g.name() == group) info = &g;
    }
    ASSERT_NE(info, nullptr) << group;
    ASSERT_EQ(info->members_size(), static_cast<int>(world));
    for (const v1::GroupMemberInfo& mi : info->members()) {
      EXPECT_EQ(mi.node_id(),
                mi.rank() % spread == 0
                    ? ""
                    : absl::StrCat("node-", std::string(1, 'a' + mi.rank() % spread)));
    }
  }
}

TEST_F(ClusterGroupsTest, ARankHeldOnOneNodeIsRefusedOnAnotherAndSoIsAnotherWorldSize) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  auto first = StartJoin(a->socket(), Request("clash", 0, 2, 8000));
  ASSERT_NE(first, nullptr);
  // Wait until a's claim is in etcd: the duplicate on b is then refused.
  ASSERT_TRUE(AwaitKey("/mcgroups/groups/" + std::to_string(::getuid()) + "/clash/ranks/0"));
  auto twin = StartJoin(b->socket(), Request("clash", 0, 2, 8000));
  JoinResult t = twin->join.get();
  EXPECT_EQ(t.status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << t.status.error_message();
  EXPECT_NE(t.status.error_message().find("node-a"), std::string::npos) << t.status.error_message();
  auto wrong = StartJoin(b->socket(), Request("clash", 1, 3, 8000));
  JoinResult w = wrong->join.get();
  EXPECT_EQ(w.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << w.status.error_message();
  EXPECT_NE(w.status.error_message().find("world size"), std::string::npos);
  // The refused ranks left nothing behind: the right rank 1 completes it.
  auto right = StartJoin(b->socket(), Request("clash", 1, 2, 8000));
  JoinResult r = right->join.get();
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_TRUE(first->join.get().status.ok());
}

TEST_F(ClusterGroupsTest, LeftAndLostRanksAndALostNodeReachTheOtherNodes) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  auto c = Node("node-c");
  std::vector<std::unique_ptr<Member>> m;
  m.push_back(StartJoin(a->socket(), Request("fate", 0, 4)));
  m.push_back(StartJoin(b->socket(), Request("fate", 1, 4)));
  m.push_back(StartJoin(c->socket(), Request("fate", 2, 4)));
  m.push_back(StartJoin(c->socket(), Request("fate", 3, 4)));
  for (auto& x : m) {
    ASSERT_NE(x, nullptr);
    JoinResult j = x->join.get();
    ASSERT_TRUE(j.status.ok()) << j.status.error_message();
  }
  // Rank 3 leaves on node-c: rank 0 on node-a hears LEFT.
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::LeaveGroupRequest req;
    req.set_group("fate");
    req.set_rank(3);
    v1::LeaveGroupResponse resp;
    ASSERT_TRUE(m[3]->session->stub->LeaveGroup(&ctx, req, &resp).ok());
  }
  v1::MemberEvent e = m[0]->NextEvent(5);
  EXPECT_EQ(e.kind(), v1::MemberEvent::LEFT);
  EXPECT_EQ(e.rank(), 3u);
  // Rank 1's session ends on node-b, which lives on: LOST on node-a.
  auto t0 = Clock::now();
  m[1]->session->ctx.TryCancel();
  e = m[0]->NextEvent(5);
  EXPECT_EQ(e.kind(), v1::MemberEvent::LOST);
  EXPECT_EQ(e.rank(), 1u);
  EXPECT_NE(e.detail().find("node-b"), std::string::npos) << e.detail();
  const double rank_lost = Since(t0);
  // node-c dies (SIGKILL): its rank 2 is LOST on node-a when its lease ends.
  t0 = Clock::now();
  c->Stop(SIGKILL);
  e = m[0]->NextEvent(kLeaseTtlS + 4);
  const double node_lost = Since(t0);
  EXPECT_EQ(e.kind(), v1::MemberEvent::LOST);
  EXPECT_EQ(e.rank(), 2u);
  EXPECT_NE(e.detail().find("node-c"), std::string::npos) << e.detail();
  EXPECT_LE(node_lost, kLeaseTtlS + 1.0 + 0.5);
  std::printf(
      "[ figures ] lease TTL %d s: a rank lost on a live node reported after %.3f s, a "
      "SIGKILLed node's rank after %.2f s\n",
      kLeaseTtlS, rank_lost, node_lost);
}

TEST_F(ClusterGroupsTest, WithEtcdDownLocalGroupsFormAndCrossNodeJoinsWaitThenResume) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  etcd_.Stop(SIGKILL);
  // All ranks on node-a: forms without etcd.
  auto l0 = StartJoin(a->socket(), Request("local", 0, 2, 10000));
  auto l1 = StartJoin(a->socket(), Request("local", 1, 2, 10000));
  JoinResult j0 = l0->join.get();
  EXPECT_TRUE(j0.status.ok()) << j0.status.error_message();
  EXPECT_TRUE(l1->join.get().status.ok());
  // Across nodes: waits, and the timeout names etcd.
  auto x0 = StartJoin(a->socket(), Request("cross", 0, 2, 2000));
  auto x1 = StartJoin(b->socket(), Request("cross", 1, 2, 2000));
  JoinResult f = x0->join.get();
  EXPECT_EQ(f.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << f.status.error_message();
  EXPECT_NE(f.status.error_message().find("etcd"), std::string::npos) << f.status.error_message();
  (void)x1->join.get();
  ASSERT_TRUE(etcd_.Restart().ok());
  // Back: cross-node joins go through again (once the nodes registered).
  auto y0 = StartJoin(a->socket(), Request("cross2", 0, 2, 20000));
  auto y1 = StartJoin(b->socket(), Request("cross2", 1, 2, 20000));
  JoinResult y = y0->join.get();
  EXPECT_TRUE(y.status.ok()) << y.status.error_message();
  JoinResult y_1 = y1->join.get();
  EXPECT_TRUE(y_1.status.ok()) << y_1.status.error_message();
  ASSERT_EQ(y.view.members_size(), 2);
  EXPECT_EQ(y.view.members(1).node_id(), "node-b");
}

TEST_F(ClusterGroupsTest, AGroupGoneFromEveryNodeCanFormAgainWithAnotherWorldSize) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  const std::string ranks_prefix =
      "/mcgroups/groups/" + std::to_string(::getuid()) + "/again/ranks/";
  auto count = [&](const std::string& prefix) -> int {
    absl::StatusOr<std::unique_ptr<daemon::etcd::EtcdClient>> etcd =
        ConnectEtcd(etcd_.client_url());
    if (!etcd.ok()) return -1;
    absl::StatusOr<daemon::etcd::RangeResult> r = (*etcd)->GetPrefix(prefix);
    return r.ok() ? static_cast<int>(r->kvs.size()) : -1;
  };
  auto await_count = [&](const std::string& prefix, int want) {
    for (const auto start = Clock::now(); Since(start) < 10;) {
      if (count(prefix) == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  auto leave = [](Member& m, uint32_t rank) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::LeaveGroupRequest req;
    req.set_group("again");
    req.set_rank(rank);
    v1::LeaveGroupResponse resp;
    return m.session->stub->LeaveGroup(&ctx, req, &resp).ok();
  };
  // node-a creates the world size (its claim is first), and its rank goes
  // first: the last rank out is node-b's, which did not create it.
  auto m0 = StartJoin(a->socket(), Request("again", 0, 2));
  ASSERT_NE(m0, nullptr);
  ASSERT_TRUE(AwaitKey(ranks_prefix + "0"));
  auto m1 = StartJoin(b->socket(), Request("again", 1, 2));
  ASSERT_NE(m1, nullptr);
  ASSERT_TRUE(m0->join.get().status.ok());
  ASSERT_TRUE(m1->join.get().status.ok());
  ASSERT_TRUE(leave(*m0, 0));
  ASSERT_TRUE(await_count(ranks_prefix, 1));
  ASSERT_TRUE(leave(*m1, 1));
  // Nothing of the group is left in etcd, its world size included ...
  EXPECT_TRUE(await_count("/mcgroups/groups/" + std::to_string(::getuid()) + "/again/", 0))
      << count("/mcgroups/groups/" + std::to_string(::getuid()) + "/again/") << " keys left";
  // ... so the name forms again, over both nodes, with another world size.
  std::vector<std::unique_ptr<Member>> again;
  for (uint32_t r = 0; r < 3; ++r) {
    again.push_back(StartJoin((r % 2 == 0 ? a : b)->socket(), Request("again", r, 3, 8000)));
    ASSERT_NE(again.back(), nullptr);
  }
  for (uint32_t r = 0; r < 3; ++r) {
    JoinResult j = again[r]->join.get();
    EXPECT_TRUE(j.status.ok()) << "rank " << r << ": " << j.status.error_message();
    EXPECT_EQ(j.view.members_size(), 3);
  }
}

// device_transport_example ranks, rank r on nodes[r % nodes.size()].
// The group secret a launcher gives every rank (issue 23 item 3): the
// examples across nodes run with one.
constexpr char kGroupSecretEnv[] = "MC_GROUP_SECRET=4f1c0e55a6b2d9e8c7f30a1b2c3d4e5f";

std::vector<Child> ExampleRanks(const std::vector<const DaemonProcess*>& nodes,
                                const std::string& group, int n,
                                const std::vector<std::string>& extra,
                                const std::vector<std::string>& secrets = {kGroupSecretEnv}) {
  std::vector<Child> ranks;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv = {BinDir() + "/device_transport_example",
                                     "--platform",
                                     "host",
                                     "--socket",
                                     nodes[static_cast<size_t>(r) % nodes.size()]->socket(),
                                     "--group",
                                     group,
                                     "--rank",
                                     std::to_string(r),
                                     "--world-size",
                                     std::to_string(n)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    // secrets[r % size]: "" runs a rank without one.
    const std::string& secret =
        secrets.empty() ? "" : secrets[static_cast<size_t>(r) % secrets.size()];
    ranks.push_back(Child::Spawn(
        argv, -1, secret.empty() ? std::vector<std::string>{} : std::vector<std::string>{secret}));
  }
  return ranks;
}

TEST_F(ClusterGroupsTest, TheExampleOverRdmaPassesWithRanksOnDifferentNodes) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  auto c = Node("node-c");
  // 2 ranks over 2 nodes; 4 over 3 (ranks 0 and 3 share node-a: one pair
  // on the node, the others across).
  for (const auto& [n, nodes] : std::vector<std::pair<int, std::vector<const DaemonProcess*>>>{
           {2, {a.get(), b.get()}}, {4, {a.get(), b.get(), c.get()}}}) {
    const auto start = Clock::now();
    auto ranks =
        ExampleRanks(nodes, absl::StrCat("rdma", n), n, {"--route", "rdma", "--bytes", "3000017"});
    for (auto& r : ranks) {
      EXPECT_EQ(r.Wait(60000), 0) << r.output();
      EXPECT_NE(r.output().find("PASS"), std::string::npos) << r.output();
    }
    std::printf(
        "[ figures ] --route rdma, %d ranks over %zu nodes (softnic over the peer port): "
        "PASS in %.2f s\n",
        n, nodes.size(), Since(start));
  }
}

// Issue 23 item 3: the same uid on two nodes is not the same person. A
// rank on node-b that does not know the group's secret (another one, or
// none) is not counted by node-a's ranks, which time out rather than form
// with it, and node-a logs why; with the secret the same pair forms.
TEST_F(ClusterGroupsTest, ARankWithoutTheGroupSecretIsRefusedAcrossNodes) {
  auto a = Node("node-a", /*log_to_output=*/true);
  auto b = Node("node-b");
  for (const std::string& other :
       {std::string("MC_GROUP_SECRET=00000000000000000000000000000000"), std::string()}) {
    const std::string group = other.empty() ? "secret-none" : "secret-other";
    auto ranks =
        ExampleRanks({a.get(), b.get()}, group, 2, {"--route", "rdma", "--timeout-ms", "4000"},
                     {kGroupSecretEnv, other});
    EXPECT_NE(ranks[0].Wait(30000), 0) << ranks[0].output();
    EXPECT_EQ(ranks[0].output().find("PASS"), std::string::npos) << ranks[0].output();
    ranks[1].Wait(30000);
  }
  // One refusal line per period (10 s): whichever of the two came first
  // ("does not prove the group secret" / "joined without the group secret").
  EXPECT_NE(a->child().WaitForLine("the group secret; it is not counted", 5000), "");
  auto ranks = ExampleRanks({a.get(), b.get()}, "secret-same", 2, {"--route", "rdma"});
  for (auto& r : ranks) {
    EXPECT_EQ(r.Wait(60000), 0) << r.output();
    EXPECT_NE(r.output().find("PASS"), std::string::npos) << r.output();
  }
}

// Issue 23 item 3, the operator's way: a tenant span policy
// (tenant_policy_file) on node-a lets the main socket's groups span node-a
// and node-c only. A rank on node-b is not counted on node-a (logged), and
// node-a serves node-b none of its ranks' endpoints, so neither side
// forms. The policy rewritten to name node-b and re-read on SIGHUP, the
// same pair passes, with no restart.
TEST_F(ClusterGroupsTest, ATenantPolicyKeepsGroupsOffNodesItDoesNotName) {
  const std::string policy = dir_.path() + "/tenants.policy";
  std::ofstream(policy) << "# tenant  nodes\n@main node-a node-c\n";
  ASSERT_EQ(::chmod(policy.c_str(), 0600), 0);
  auto a = Node("node-a", /*log_to_output=*/true, "tenant_policy_file = " + policy + "\n");
  auto b = Node("node-b");
  auto ranks_off = ExampleRanks({a.get(), b.get()}, "policy-off", 2,
                                {"--route", "rdma", "--timeout-ms", "4000"});
  for (auto& r : ranks_off) {
    EXPECT_NE(r.Wait(30000), 0) << r.output();
    EXPECT_EQ(r.output().find("PASS"), std::string::npos) << r.output();
  }
  EXPECT_NE(a->child().WaitForLine("does not let @main span that node", 5000), "");

  // A malformed rewrite is refused and the policy in force stays.
  std::ofstream(policy) << "@main node-a\n@main node-b\n";
  a->child().Kill(SIGHUP);
  EXPECT_NE(a->child().WaitForLine("the tenant policy in force stays", 5000), "");
  std::ofstream(policy) << "@main node-a node-b\n";
  a->child().Kill(SIGHUP);
  ASSERT_NE(a->child().WaitForLine("tenant span policy reloaded: 1 tenant lines", 5000), "");
  auto ranks = ExampleRanks({a.get(), b.get()}, "policy-on", 2, {"--route", "rdma"});
  for (auto& r : ranks) {
    EXPECT_EQ(r.Wait(60000), 0) << r.output();
    EXPECT_NE(r.output().find("PASS"), std::string::npos) << r.output();
  }
}

TEST_F(ClusterGroupsTest, AWatcherHearsTheRankOfAKilledNode) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  auto ranks =
      ExampleRanks({a.get(), b.get()}, "watched", 2, {"--route", "rdma", "--mode", "watch"});
  for (auto& r : ranks) ASSERT_FALSE(r.WaitForLine("READY", 30000).empty()) << r.output();
  const auto t0 = Clock::now();
  b->Stop(SIGKILL);
  EXPECT_EQ(ranks[0].Wait((kLeaseTtlS + 5) * 1000), 0) << ranks[0].output();
  EXPECT_NE(ranks[0].output().find("EVENT lost rank 1"), std::string::npos) << ranks[0].output();
  EXPECT_NE(ranks[0].output().find("PASS"), std::string::npos) << ranks[0].output();
  std::printf(
      "[ figures ] lease TTL %d s: the watcher on node-a printed the lost rank after "
      "%.2f s\n",
      kLeaseTtlS, Since(t0));
}

}  // namespace
}  // namespace mooncake::testing
