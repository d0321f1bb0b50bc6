// Elastic groups and the cluster directory: a daemon with cluster_etcd
// claims every rank of its groups in etcd, and re-claiming a lost rank for
// a replacement is not built, so the re-join is refused with a clear error
// (docs/architecture.md, "Elastic groups") and the group stays as it was.
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cluster_fixture.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

class ClusterElasticTest : public ClusterFixture {
 protected:
  ClusterElasticTest() : ClusterFixture("/mooncake-elastic-test") {}
};

TEST_F(ClusterElasticTest, ARankOfAGroupInTheDirectoryIsNotReJoined) {
  std::unique_ptr<DaemonProcess> node = Node("node0");
  auto rank = [&](int r) {
    return Child::Spawn({BinDir() + "/device_transport_example", "--platform", "host", "--socket",
                         node->socket(), "--group", "claimed", "--rank", std::to_string(r),
                         "--world-size", "2", "--mode", "elastic", "--expect-rejoins", "1",
                         "--timeout-ms", "20000"});
  };
  Child r0 = rank(0), r1 = rank(1);
  ASSERT_FALSE(r0.WaitForLine("START epoch 1", 20000).empty()) << r0.output();
  ASSERT_FALSE(r1.WaitForLine("START epoch 1", 20000).empty()) << r1.output();
  r1.Kill(SIGKILL);
  ASSERT_FALSE(r0.WaitForLine("RELEASED rank 1", 10000).empty()) << r0.output();
  // The replacement is refused at once (exit 2: setup error; stderr says
  // "group 'claimed' is in the cluster directory (etcd) ... not re-joined
  // yet"), not left waiting.
  Child replacement = rank(1);
  EXPECT_EQ(replacement.Wait(10000), 2) << replacement.output();
  v1::ListGroupsResponse groups = ListGroups(node->socket());
  ASSERT_EQ(groups.groups_size(), 1);
  EXPECT_EQ(groups.groups(0).epoch(), 1u);
  EXPECT_EQ(groups.groups(0).state(), "degraded");
  r0.Kill(SIGKILL);
  r0.Wait(5000);
}

}  // namespace
}  // namespace mooncake::testing
