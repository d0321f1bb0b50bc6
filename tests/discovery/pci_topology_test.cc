#include "discovery/pci_topology.h"

#include "fake_sysfs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

using test_support::BuildTwoSocketNode;
using test_support::FakeSysfs;
using ::testing::ElementsAre;

class PciTopologyTest : public ::testing::Test {
 protected:
  void SetUp() override { BuildTwoSocketNode(sys_); }

  PciDistance Between(const std::string& a, const std::string& b) {
    return ClassifyPciDistance(ResolvePciPath(sys_.root(), a), ResolvePciPath(sys_.root(), b));
  }

  FakeSysfs sys_;
};

TEST_F(PciTopologyTest, ResolvesBridgesFromRootPortDown) {
  absl::StatusOr<PciPath> path = ResolvePciPath(sys_.root(), "0000:07:00.0");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(path->bus_id, "0000:07:00.0");
  EXPECT_EQ(path->root_complex, "pci0000:00");
  EXPECT_THAT(path->bridges, ElementsAre("0000:00:01.0", "0000:01:00.0", "0000:02:02.0",
                                         "0000:05:00.0", "0000:06:00.0"));
  EXPECT_EQ(path->numa_node, 0);
}

TEST_F(PciTopologyTest, AcceptsCudaStyleBusIds) {
  // cuDeviceGetPCIBusId / nvidia-smi spell bus ids in upper case, NVML with
  // an 8-digit domain.
  absl::StatusOr<PciPath> path = ResolvePciPath(sys_.root(), "00000000:82:00.0");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(path->bus_id, "0000:82:00.0");
  EXPECT_EQ(path->root_complex, "pci0000:80");
  EXPECT_THAT(path->bridges, ElementsAre("0000:80:02.0"));
  EXPECT_EQ(path->numa_node, 1);
  sys_.AddPciDevice("pci0000:00/0000:00:03.0/0000:1b:00.0", 0);
  ASSERT_TRUE(ResolvePciPath(sys_.root(), "0000:1B:00.0").ok());
}

TEST_F(PciTopologyTest, MissingDeviceIsNotFound) {
  absl::StatusOr<PciPath> path = ResolvePciPath(sys_.root(), "0000:ee:00.0");
  EXPECT_EQ(path.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(path.status().message()), ::testing::HasSubstr("0000:ee:00.0"));
}

TEST_F(PciTopologyTest, MissingRootIsNotFound) {
  EXPECT_EQ(ResolvePciPath(sys_.root() + "/nonexistent", "0000:03:00.0").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(PciTopologyTest, DeviceOutsideAHostBridgeIsRejected) {
  // A bus/pci/devices entry that does not lead into a pciDDDD:BB tree.
  sys_.Write("devices/platform/0000:99:00.0/numa_node", "0\n");
  std::filesystem::create_symlink("../../../devices/platform/0000:99:00.0",
                                  sys_.root() + "/bus/pci/devices/0000:99:00.0");
  EXPECT_EQ(ResolvePciPath(sys_.root(), "0000:99:00.0").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(PciTopologyTest, SameSwitchIsPix) {
  EXPECT_EQ(Between("0000:03:00.0", "0000:04:00.0"), PciDistance::kPix);
  EXPECT_EQ(Between("0000:04:00.0", "0000:03:00.0"), PciDistance::kPix);
  // Two functions of one NIC.
  EXPECT_EQ(Between("0000:04:00.0", "0000:04:00.1"), PciDistance::kPix);
}

TEST_F(PciTopologyTest, NestedSwitchIsPxb) {
  EXPECT_EQ(Between("0000:07:00.0", "0000:04:00.0"), PciDistance::kPxb);
  EXPECT_EQ(Between("0000:03:00.0", "0000:07:00.0"), PciDistance::kPxb);
}

TEST_F(PciTopologyTest, OtherRootPortSameHostBridgeIsPhb) {
  EXPECT_EQ(Between("0000:03:00.0", "0000:08:00.0"), PciDistance::kPhb);
  EXPECT_EQ(Between("0000:07:00.0", "0000:08:00.0"), PciDistance::kPhb);
  EXPECT_EQ(Between("0000:82:00.0", "0000:81:00.0"), PciDistance::kPhb);
}

TEST_F(PciTopologyTest, OtherHostBridgeSameNumaNodeIsNode) {
  EXPECT_EQ(Between("0000:21:00.0", "0000:04:00.0"), PciDistance::kNode);
  EXPECT_EQ(Between("0000:21:00.0", "0000:08:00.0"), PciDistance::kNode);
}

TEST_F(PciTopologyTest, OtherNumaNodeIsSys) {
  EXPECT_EQ(Between("0000:03:00.0", "0000:81:00.0"), PciDistance::kSys);
  EXPECT_EQ(Between("0000:82:00.0", "0000:08:00.0"), PciDistance::kSys);
}

TEST_F(PciTopologyTest, UnknownWhenEitherSideIsUnknown) {
  EXPECT_EQ(Between("0000:03:00.0", "0000:ee:00.0"), PciDistance::kUnknown);
  EXPECT_EQ(Between("0000:ee:00.0", "0000:03:00.0"), PciDistance::kUnknown);
}

TEST(PciTopologyNoNumaTest, HostBridgesWithoutNumaInfoCountAsOneNode) {
  FakeSysfs sys;
  sys.AddPciDevice("pci0000:00/0000:00:01.0/0000:01:00.0", -1);
  sys.AddPciDevice("pci0000:40/0000:40:01.0/0000:41:00.0", -1);
  sys.AddPciDevice("pci0000:80/0000:80:01.0/0000:81:00.0", 1);
  auto path = [&](const char* bdf) { return ResolvePciPath(sys.root(), bdf); };
  EXPECT_EQ(path("0000:01:00.0")->numa_node, -1);
  EXPECT_EQ(ClassifyPciDistance(path("0000:01:00.0"), path("0000:41:00.0")), PciDistance::kNode);
  EXPECT_EQ(ClassifyPciDistance(path("0000:01:00.0"), path("0000:81:00.0")), PciDistance::kSys);
}

TEST(PciDistanceNameTest, MatchesProtoStrings) {
  EXPECT_EQ(PciDistanceName(PciDistance::kPix), "PIX");
  EXPECT_EQ(PciDistanceName(PciDistance::kPxb), "PXB");
  EXPECT_EQ(PciDistanceName(PciDistance::kPhb), "PHB");
  EXPECT_EQ(PciDistanceName(PciDistance::kNode), "NODE");
  EXPECT_EQ(PciDistanceName(PciDistance::kSys), "SYS");
  EXPECT_EQ(PciDistanceName(PciDistance::kUnknown), "UNKNOWN");
}

}  // namespace
}  // namespace mooncake::daemon
