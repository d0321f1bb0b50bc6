#include "discovery/discovery.h"

#include <memory>

#include "fake_cuda_driver.h"
#include "fake_sysfs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

using test_support::BuildTwoSocketNode;
using test_support::FakeSysfs;
using ::testing::HasSubstr;

TEST(DiscoverTopologyTest, NoDriverMeansNoGpusAndANote) {
  FakeSysfs sys;
  BuildTwoSocketNode(sys);
  v1::Topology topo = DiscoverTopology(
      {.sysfs_root = sys.root(), .cuda_library = "libdoesnotexist.so", .use_verbs = false});
  EXPECT_EQ(topo.gpus_size(), 0);
  EXPECT_EQ(topo.gpu_pairs_size(), 0);
  EXPECT_EQ(topo.cuda_driver_version(), 0);
  EXPECT_THAT(topo.gpu_discovery_note(), HasSubstr("libdoesnotexist.so not found"));
  // NICs are still found, and with no GPU there is nothing to pair them with.
  EXPECT_EQ(topo.nics_size(), 4);
  EXPECT_EQ(topo.nic_discovery_note(), "");
  EXPECT_EQ(topo.affinity_size(), 0);
}

TEST(DiscoverTopologyTest, MissingSysfsRootIsANote) {
  v1::Topology topo = DiscoverTopology({.sysfs_root = "/nonexistent/mooncake-sysfs",
                                        .cuda_library = "libdoesnotexist.so",
                                        .use_verbs = false});
  EXPECT_EQ(topo.nics_size(), 0);
  EXPECT_THAT(topo.nic_discovery_note(), HasSubstr("does not exist"));
  EXPECT_FALSE(topo.gpu_discovery_note().empty());
}

TEST(DiscoverTopologyTest, RealMachineDoesNotCrashAndExplainsEmptyLists) {
  v1::Topology topo = DiscoverTopology({});
  if (topo.gpus_size() == 0) {
    EXPECT_FALSE(topo.gpu_discovery_note().empty());
  } else {
    EXPECT_GT(topo.cuda_driver_version(), 0);
    EXPECT_EQ(topo.gpu_pairs_size(), topo.gpus_size() * (topo.gpus_size() - 1));
  }
  if (topo.nics_size() == 0) EXPECT_FALSE(topo.nic_discovery_note().empty());
  EXPECT_EQ(topo.affinity_size(), topo.gpus_size() * topo.nics_size());
  // The whole answer goes to the log: on a GPU node it is the thing to
  // compare with nvidia-smi -q / nvidia-smi topo -m.
  std::cout << "this machine: " << topo.gpus_size() << " GPU(s), " << topo.nics_size()
            << " NIC(s)\n"
            << topo.DebugString();
}

TEST(DiscoverTopologyTest, GpusAndNicsFromFakeDriverAndSysfs) {
  FakeSysfs sys;
  BuildTwoSocketNode(sys);
  auto cu = std::make_shared<drivers::FakeCudaDriver>();
  for (int i = 0; i < 2; ++i) cu->addGpu(drivers::FakeGpu::Hopper(i));
  cu->gpu(0).pci_bus_id = "0000:03:00.0";
  cu->gpu(1).pci_bus_id = "0000:82:00.0";
  v1::Topology topo =
      DiscoverTopology({.sysfs_root = sys.root(), .use_verbs = false, .cuda_driver = cu});

  EXPECT_EQ(topo.gpu_discovery_note(), "");
  EXPECT_EQ(topo.nic_discovery_note(), "");
  EXPECT_EQ(topo.cuda_driver_version(), 13000);
  ASSERT_EQ(topo.gpus_size(), 2);
  EXPECT_EQ(topo.gpus(0).numa_node(), 0);
  EXPECT_EQ(topo.gpus(1).numa_node(), 1);
  EXPECT_EQ(topo.gpu_pairs_size(), 2);
  ASSERT_EQ(topo.nics_size(), 4);
  ASSERT_EQ(topo.affinity_size(), 8);

  std::vector<std::string> closest0, closest1;
  for (const v1::GpuNicAffinity& a : topo.affinity()) {
    if (!a.closest()) continue;
    (a.gpu() == 0 ? closest0 : closest1).push_back(a.nic() + ":" + a.distance());
  }
  EXPECT_THAT(closest0, ::testing::ElementsAre("mlx5_0:PIX", "mlx5_1:PIX"));
  EXPECT_THAT(closest1, ::testing::ElementsAre("mlx5_3:PHB"));
}

}  // namespace
}  // namespace mooncake::daemon
