#include "discovery/nic_discovery.h"

#include "fake_sysfs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

using test_support::FakeSysfs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(NicParsingTest, PortState) {
  EXPECT_EQ(ParsePortState("4: ACTIVE"), "ACTIVE");
  EXPECT_EQ(ParsePortState("1: DOWN\n"), "DOWN");
  EXPECT_EQ(ParsePortState("5: LinkUp"), "LinkUp");
  EXPECT_EQ(ParsePortState("3: Disabled"), "Disabled");
  EXPECT_EQ(ParsePortState("ACTIVE"), "ACTIVE");
  EXPECT_EQ(ParsePortState(""), "");
}

TEST(NicParsingTest, RateGbps) {
  EXPECT_EQ(ParseRateGbps("400 Gb/sec (4X NDR)"), 400u);
  EXPECT_EQ(ParseRateGbps("200 Gb/sec (2X HDR)"), 200u);
  EXPECT_EQ(ParseRateGbps("100 Gb/sec (4X EDR)"), 100u);
  EXPECT_EQ(ParseRateGbps("2.5 Gb/sec (1X SDR)"), 2u);
  EXPECT_EQ(ParseRateGbps("Invalid argument"), 0u);
  EXPECT_EQ(ParseRateGbps(""), 0u);
  EXPECT_EQ(ParseRateGbps("99999999999 Gb/sec"), 0u);
}

TEST(NicParsingTest, ZeroGid) {
  EXPECT_TRUE(IsZeroGid("0000:0000:0000:0000:0000:0000:0000:0000"));
  EXPECT_FALSE(IsZeroGid("fe80:0000:0000:0000:0e42:a1ff:fe6b:2c10"));
  EXPECT_FALSE(IsZeroGid("0000:0000:0000:0000:0000:ffff:0a00:0001"));
  EXPECT_FALSE(IsZeroGid(""));
}

TEST(NicParsingTest, GidTypeNames) {
  EXPECT_EQ(GidTypeName("IB/RoCE v1", "InfiniBand"), "IB");
  EXPECT_EQ(GidTypeName("IB/RoCE v1", "Ethernet"), "RoCE v1");
  EXPECT_EQ(GidTypeName("RoCE v2", "Ethernet"), "RoCE v2");
}

class NicDiscoveryTest : public ::testing::Test {
 protected:
  NicDiscoveryResult Discover() {
    return DiscoverNics({.sysfs_root = sys_.root(), .use_verbs = false});
  }
  FakeSysfs sys_;
};

TEST_F(NicDiscoveryTest, ReadsInfiniBandNic) {
  sys_.AddPciDevice("pci0000:00/0000:00:01.0/0000:01:00.0", 0, "mlx5_core");
  sys_.AddRdmaDevice("mlx5_0", "0000:01:00.0", "0c42:a103:0065:ef30", "28.39.1002");
  sys_.AddPort("mlx5_0", 1, "4: ACTIVE", "5: LinkUp", "InfiniBand", "400 Gb/sec (4X NDR)", "0x1a");
  sys_.AddGid("mlx5_0", 1, 0, "fe80:0000:0000:0000:0c42:a103:0065:ef30", "IB/RoCE v1");
  sys_.AddGid("mlx5_0", 1, 1, "0000:0000:0000:0000:0000:0000:0000:0000");

  NicDiscoveryResult result = Discover();
  EXPECT_EQ(result.note, "");
  ASSERT_EQ(result.nics.size(), 1u);
  const v1::Nic& nic = result.nics[0];
  EXPECT_EQ(nic.name(), "mlx5_0");
  EXPECT_EQ(nic.pci_bus_id(), "0000:01:00.0");
  EXPECT_EQ(nic.numa_node(), 0);
  EXPECT_EQ(nic.node_guid(), "0c42:a103:0065:ef30");
  EXPECT_EQ(nic.fw_ver(), "28.39.1002");
  EXPECT_EQ(nic.driver(), "mlx5_core");
  ASSERT_EQ(nic.ports_size(), 1);
  const v1::NicPort& port = nic.ports(0);
  EXPECT_EQ(port.port(), 1u);
  EXPECT_EQ(port.state(), "ACTIVE");
  EXPECT_EQ(port.phys_state(), "LinkUp");
  EXPECT_EQ(port.link_layer(), "InfiniBand");
  EXPECT_EQ(port.rate(), "400 Gb/sec (4X NDR)");
  EXPECT_EQ(port.rate_gbps(), 400u);
  EXPECT_EQ(port.lid(), 0x1au);
  ASSERT_EQ(port.gids_size(), 1) << "the all-zero GID must be skipped";
  EXPECT_EQ(port.gids(0).index(), 0u);
  EXPECT_EQ(port.gids(0).gid(), "fe80:0000:0000:0000:0c42:a103:0065:ef30");
  EXPECT_EQ(port.gids(0).type(), "IB");
  EXPECT_EQ(port.gids(0).netdev(), "");
}

TEST_F(NicDiscoveryTest, ReadsRoceGidsInIndexOrder) {
  sys_.AddPciDevice("pci0000:00/0000:00:02.0/0000:02:00.0", 1, "mlx5_core");
  sys_.AddRdmaDevice("mlx5_1", "0000:02:00.0");
  sys_.AddPort("mlx5_1", 1, "4: ACTIVE", "5: LinkUp", "Ethernet", "100 Gb/sec (2X HDR)", "0x0");
  // Indexes past 9 check numeric (not lexical) ordering.
  sys_.AddGid("mlx5_1", 1, 0, "fe80:0000:0000:0000:0e42:a1ff:fe6b:2c10", "IB/RoCE v1", "eth2");
  sys_.AddGid("mlx5_1", 1, 1, "fe80:0000:0000:0000:0e42:a1ff:fe6b:2c10", "RoCE v2", "eth2");
  sys_.AddGid("mlx5_1", 1, 2, "0000:0000:0000:0000:0000:0000:0000:0000");
  sys_.AddGid("mlx5_1", 1, 11, "0000:0000:0000:0000:0000:FFFF:0A00:0001", "RoCE v2", "eth2");
  sys_.AddGid("mlx5_1", 1, 10, "0000:0000:0000:0000:0000:ffff:0a00:0001", "IB/RoCE v1", "eth2");

  NicDiscoveryResult result = Discover();
  ASSERT_EQ(result.nics.size(), 1u);
  const v1::NicPort& port = result.nics[0].ports(0);
  EXPECT_EQ(result.nics[0].numa_node(), 1);
  EXPECT_EQ(port.link_layer(), "Ethernet");
  EXPECT_EQ(port.lid(), 0u);
  EXPECT_EQ(port.rate_gbps(), 100u);
  ASSERT_EQ(port.gids_size(), 4);
  EXPECT_EQ(port.gids(0).index(), 0u);
  EXPECT_EQ(port.gids(0).type(), "RoCE v1");
  EXPECT_EQ(port.gids(0).netdev(), "eth2");
  EXPECT_EQ(port.gids(1).index(), 1u);
  EXPECT_EQ(port.gids(1).type(), "RoCE v2");
  EXPECT_EQ(port.gids(2).index(), 10u);
  EXPECT_EQ(port.gids(2).type(), "RoCE v1");
  EXPECT_EQ(port.gids(3).index(), 11u);
  EXPECT_EQ(port.gids(3).gid(), "0000:0000:0000:0000:0000:ffff:0a00:0001");
  EXPECT_EQ(port.gids(3).type(), "RoCE v2");
}

TEST_F(NicDiscoveryTest, SeveralNicsAndPortsSortedByNameAndNumber) {
  sys_.AddPciDevice("pci0000:00/0000:00:01.0/0000:01:00.0", 0, "mlx5_core");
  sys_.AddPciDevice("pci0000:00/0000:00:01.0/0000:01:00.1", 0, "mlx5_core");
  sys_.AddRdmaDevice("mlx5_1", "0000:01:00.1");
  sys_.AddRdmaDevice("mlx5_0", "0000:01:00.0");
  sys_.AddPort("mlx5_0", 2, "1: DOWN", "3: Disabled", "InfiniBand", "10 Gb/sec (4X SDR)", "0x0");
  sys_.AddPort("mlx5_0", 1, "4: ACTIVE", "5: LinkUp", "InfiniBand", "200 Gb/sec (4X HDR)", "0x2");
  sys_.AddPort("mlx5_1", 1, "2: INIT", "5: LinkUp", "InfiniBand", "200 Gb/sec (4X HDR)", "0x3");

  NicDiscoveryResult result = Discover();
  EXPECT_EQ(result.note, "");
  ASSERT_EQ(result.nics.size(), 2u);
  EXPECT_EQ(result.nics[0].name(), "mlx5_0");
  EXPECT_EQ(result.nics[1].name(), "mlx5_1");
  EXPECT_EQ(result.nics[1].pci_bus_id(), "0000:01:00.1");
  ASSERT_EQ(result.nics[0].ports_size(), 2);
  EXPECT_EQ(result.nics[0].ports(0).port(), 1u);
  EXPECT_EQ(result.nics[0].ports(0).state(), "ACTIVE");
  EXPECT_EQ(result.nics[0].ports(1).port(), 2u);
  EXPECT_EQ(result.nics[0].ports(1).state(), "DOWN");
  EXPECT_EQ(result.nics[0].ports(1).phys_state(), "Disabled");
  EXPECT_EQ(result.nics[1].ports(0).state(), "INIT");
  EXPECT_EQ(result.nics[1].ports(0).lid(), 3u);
}

TEST_F(NicDiscoveryTest, SoftDeviceHasNoPciFunction) {
  sys_.AddSoftRdmaDevice("rxe0");
  sys_.AddPort("rxe0", 1, "4: ACTIVE", "5: LinkUp", "Ethernet", "10 Gb/sec (1X QDR)", "0x0");
  NicDiscoveryResult result = Discover();
  ASSERT_EQ(result.nics.size(), 1u);
  EXPECT_EQ(result.nics[0].name(), "rxe0");
  EXPECT_EQ(result.nics[0].pci_bus_id(), "");
  EXPECT_EQ(result.nics[0].numa_node(), -1);
  EXPECT_EQ(result.nics[0].driver(), "");
  EXPECT_EQ(result.nics[0].ports_size(), 1);
}

TEST_F(NicDiscoveryTest, NicWithoutPortsIsListedAndNoted) {
  sys_.AddPciDevice("pci0000:00/0000:00:01.0/0000:01:00.0", 0, "mlx5_core");
  sys_.AddRdmaDevice("mlx5_0", "0000:01:00.0");
  NicDiscoveryResult result = Discover();
  ASSERT_EQ(result.nics.size(), 1u);
  EXPECT_THAT(result.note, HasSubstr("mlx5_0 has no readable ports"));
}

TEST_F(NicDiscoveryTest, NoInfinibandClassMeansNoNicsAndANote) {
  sys_.AddPciDevice("pci0000:00/0000:00:01.0/0000:01:00.0", 0, "e1000e");
  NicDiscoveryResult result = Discover();
  EXPECT_THAT(result.nics, IsEmpty());
  EXPECT_THAT(result.note, HasSubstr("no RDMA NIC"));
  EXPECT_THAT(result.note, HasSubstr("class/infiniband does not exist"));
  // Says what the daemon does without a NIC today: there is no software
  // NIC or RDMA transport to fall back to, only P2P within the node.
  EXPECT_THAT(result.note, Not(HasSubstr("software NIC")));
  EXPECT_THAT(result.note, HasSubstr("within this node (NVLink or PCIe P2P) do not need one"));
}

TEST_F(NicDiscoveryTest, EmptyInfinibandClassMeansNoNicsAndANote) {
  std::filesystem::create_directories(sys_.root() + "/class/infiniband");
  NicDiscoveryResult result = Discover();
  EXPECT_THAT(result.nics, IsEmpty());
  EXPECT_THAT(result.note, HasSubstr("is empty"));
}

TEST(NicDiscoveryRootTest, MissingSysfsRootIsANoteNotAnError) {
  NicDiscoveryResult result =
      DiscoverNics({.sysfs_root = "/nonexistent/mooncake-sysfs", .use_verbs = true});
  EXPECT_THAT(result.nics, IsEmpty());
  EXPECT_THAT(result.note, HasSubstr("'/nonexistent/mooncake-sysfs' does not exist"));
}

TEST(NicDiscoveryRootTest, ReadNicOfMissingDeviceIsNotFound) {
  FakeSysfs sys;
  EXPECT_EQ(ReadNic(sys.root(), "mlx5_9").status().code(), absl::StatusCode::kNotFound);
}

TEST(VerbsCrossCheckTest, ReportsDevicesOnlyOneSideSees) {
  std::vector<v1::Nic> nics(2);
  nics[0].set_name("mlx5_0");
  nics[0].set_driver("mlx5_core");
  nics[1].set_name("mlx5_1");
  nics[1].set_driver("mlx5_core");
  EXPECT_THAT(CompareWithVerbsDevices(nics, {"mlx5_0", "mlx5_1"}), IsEmpty());
  EXPECT_THAT(CompareWithVerbsDevices({}, {}), IsEmpty());

  std::vector<std::string> problems = CompareWithVerbsDevices(nics, {"mlx5_0", "rxe0"});
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_THAT(problems[0], HasSubstr("mlx5_1 is in sysfs but libibverbs cannot see it"));
  EXPECT_THAT(problems[0], HasSubstr("'mlx5_core'"));
  EXPECT_THAT(problems[1], HasSubstr("libibverbs lists rxe0"));
}

TEST(NicDiscoveryRootTest, RealSysfsDoesNotFail) {
  // Whatever this machine has, the answer is consistent: NICs or a note.
  NicDiscoveryResult result = DiscoverNics({});
  if (result.nics.empty()) EXPECT_THAT(result.note, HasSubstr("no RDMA NIC"));
  for (const v1::Nic& nic : result.nics) EXPECT_FALSE(nic.name().empty());
}

}  // namespace
}  // namespace mooncake::daemon
