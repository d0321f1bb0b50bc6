// NodeRegistry (daemon/peering/node_registry.h) against a real etcd: what
// the node's lease does when etcd goes away and comes back. A restarted
// etcd restores its leases, so the node keeps its lease and its keys (no
// other node sees it vanish); while the lease's fate is unknown nothing is
// written under it (lease_id() reads 0); a lease that did expire is
// replaced. A missing etcd binary fails the tests; it is never a skip.
#include "peering/node_registry.h"

#include <google/protobuf/util/json_util.h>
#include <signal.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "etcd/etcd_client.h"
#include "etcd/etcd_options.h"
#include "etcd_test_server.h"
#include "gtest/gtest.h"

namespace mooncake::daemon::peering {
namespace {

constexpr char kPrefix[] = "/mcnodes";

class NodeRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start().ok()) << server_.LogTail();
    etcd::EtcdOptions o;
    o.endpoints = {server_.client_url()};
    o.dial_timeout = absl::Seconds(1);
    o.request_timeout = absl::Seconds(2);
    absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> c = etcd::EtcdClient::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    etcd_ = *std::move(c);
    NodeRegistryOptions ro;
    ro.prefix = kPrefix;
    ro.lease_ttl = absl::Seconds(2);
    v1::NodeRecord self;
    self.set_node_id("node-a");
    self.set_instance_id("instance-1");
    absl::StatusOr<std::unique_ptr<NodeRegistry>> r =
        NodeRegistry::Start(etcd_.get(), ro, std::move(self));
    ASSERT_TRUE(r.ok()) << r.status();
    registry_ = *std::move(r);
  }
  void TearDown() override {
    if (registry_) registry_->Stop();
  }
  // Polls `ok` for up to `seconds`.
  static bool Eventually(const std::function<bool()>& ok, int seconds) {
    for (int i = 0; i < seconds * 100; ++i) {
      if (ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return ok();
  }
  int64_t NodeKeyLease() {
    absl::StatusOr<std::optional<etcd::KeyValue>> kv = etcd_->Get(NodeKey(kPrefix, "node-a"));
    return kv.ok() && kv->has_value() ? (*kv)->lease : 0;
  }

  etcd::testing::EtcdTestServer server_;
  std::unique_ptr<etcd::EtcdClient> etcd_;
  std::unique_ptr<NodeRegistry> registry_;
};

TEST_F(NodeRegistryTest, AfterAnEtcdRestartTheNodeKeepsItsLeaseAndItsKey) {
  const int64_t lease = registry_->lease_id();
  ASSERT_NE(lease, 0);
  ASSERT_EQ(NodeKeyLease(), lease);
  server_.Stop(SIGKILL);
  // Past the TTL without a refresh: the lease may have expired for all the
  // node knows, and nothing is written under it.
  ASSERT_TRUE(Eventually([&] { return registry_->lease_id() == 0; }, 6)) << registry_->state();
  EXPECT_NE(registry_->state(), "registered");
  ASSERT_TRUE(server_.Restart().ok()) << server_.LogTail();
  ASSERT_TRUE(Eventually([&] { return registry_->lease_id() != 0; }, 10)) << registry_->state();
  EXPECT_EQ(registry_->lease_id(), lease) << "a new lease: the old one's keys went for nothing";
  EXPECT_EQ(NodeKeyLease(), lease);
  EXPECT_EQ(registry_->state(), "registered");
  // And the kept lease is refreshed: the key outlives several TTLs.
  std::this_thread::sleep_for(std::chrono::seconds(5));
  EXPECT_EQ(NodeKeyLease(), lease);
}

TEST_F(NodeRegistryTest, ALeaseThatExpiredIsReplacedAndTheNodeRegistersAgain) {
  const int64_t lease = registry_->lease_id();
  ASSERT_NE(lease, 0);
  // etcd ends the lease (as if it expired while the node was cut off).
  ASSERT_TRUE(etcd_->RevokeLease(lease).ok());
  ASSERT_TRUE(
      Eventually([&] { return registry_->lease_id() != 0 && registry_->lease_id() != lease; }, 10))
      << registry_->state();
  EXPECT_EQ(NodeKeyLease(), registry_->lease_id());
  EXPECT_EQ(registry_->state(), "registered");
}

// Issue 23 item 2: anyone who can write the prefix could point this node's
// record elsewhere (the etcd redirection) or delete it. The node puts its
// own record back, under its own lease, and keeps its view of itself.
TEST_F(NodeRegistryTest, ItsOwnRecordRewrittenOrDeletedByAnotherIsRestored) {
  const std::string key = NodeKey(kPrefix, "node-a");
  absl::StatusOr<std::optional<etcd::KeyValue>> before = etcd_->Get(key);
  ASSERT_TRUE(before.ok() && before->has_value());
  const std::string original = (*before)->value;
  const int64_t lease = registry_->lease_id();
  ASSERT_NE(lease, 0);
  auto restored = [&] {
    absl::StatusOr<std::optional<etcd::KeyValue>> kv = etcd_->Get(key);
    return kv.ok() && kv->has_value() && (*kv)->value == original && (*kv)->lease == lease;
  };
  // Rewritten: another host, another instance, no lease.
  v1::NodeRecord forged;
  forged.set_node_id("node-a");
  forged.set_instance_id("forged");
  forged.set_peer_address("10.66.6.6:7450");
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(forged, &json).ok());
  ASSERT_TRUE(etcd_->Put(key, json).ok());
  EXPECT_TRUE(Eventually(restored, 5)) << "the rewritten record stayed";
  for (const v1::NodeRecord& n : registry_->Nodes()) {
    if (n.node_id() == "node-a") EXPECT_EQ(n.instance_id(), "instance-1");
  }
  // Deleted.
  ASSERT_TRUE(etcd_->Delete(key).ok());
  EXPECT_TRUE(Eventually(restored, 5)) << "the deleted record stayed away";
  EXPECT_EQ(registry_->lease_id(), lease);
}

}  // namespace
}  // namespace mooncake::daemon::peering
