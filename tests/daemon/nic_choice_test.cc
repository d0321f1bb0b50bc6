// Which NIC a session's QPs go on (daemon/rdma/nic_choice.h): the served
// NIC closest to the caller's GPU among those it allows.
#include "rdma/nic_choice.h"

#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

// Two GPUs and four NICs, as on half of an 8-GPU node: mlx5_0 shares GPU 0's
// PCIe switch, mlx5_1 GPU 1's; mlx5_2 and mlx5_3 are across the socket.
v1::Topology Node() {
  v1::Topology t;
  const char* buses[] = {"0000:1b:00.0", "0000:43:00.0"};
  for (int g = 0; g < 2; ++g) {
    v1::Gpu* gpu = t.add_gpus();
    gpu->set_index(g);
    gpu->set_pci_bus_id(buses[g]);
  }
  auto link = [&](int gpu, const char* nic, const char* distance) {
    v1::GpuNicAffinity* a = t.add_affinity();
    a->set_gpu(gpu);
    a->set_nic(nic);
    a->set_distance(distance);
  };
  link(0, "mlx5_0", "PIX");
  link(0, "mlx5_1", "NODE");
  link(0, "mlx5_2", "SYS");
  link(0, "mlx5_3", "SYS");
  link(1, "mlx5_0", "NODE");
  link(1, "mlx5_1", "PXB");
  link(1, "mlx5_2", "SYS");
  link(1, "mlx5_3", "SYS");
  return t;
}

const std::vector<std::string> kServed = {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"};

TEST(NicChoice, TheClosestServedNicToTheGpu) {
  absl::StatusOr<NicChoice> c = ChooseSessionNic(Node(), kServed, {{}, "0000:43:00.0"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->nic, "mlx5_1");
  EXPECT_NE(c->reason.find("PXB"), std::string::npos) << c->reason;
  c = ChooseSessionNic(Node(), kServed, {{}, "0000:1b:00.0"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->nic, "mlx5_0");
}

TEST(NicChoice, CudasSpellingOfTheBusIdMatchesSysfs) {
  // cuDeviceGetPCIBusId: upper case, and an 8-digit domain on some drivers.
  absl::StatusOr<NicChoice> c = ChooseSessionNic(Node(), kServed, {{}, "00000000:43:00.0"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->nic, "mlx5_1");
  c = ChooseSessionNic(Node(), kServed, {{}, "0000:1B:00.0"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->nic, "mlx5_0");
}

TEST(NicChoice, TheCallersFilterNarrowsAndATieKeepsItsOrder) {
  absl::StatusOr<NicChoice> c =
      ChooseSessionNic(Node(), kServed, {{"mlx5_3", "mlx5_2"}, "0000:1b:00.0"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->nic, "mlx5_3");  // both SYS: the caller's first
  c = ChooseSessionNic(Node(), kServed, {{"mlx5_2", "mlx5_1"}, "0000:1b:00.0"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->nic, "mlx5_1");  // NODE beats SYS
}

TEST(NicChoice, WithoutAGpuTheFirstAllowedNic) {
  absl::StatusOr<NicChoice> c = ChooseSessionNic(Node(), kServed, {});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->nic, "mlx5_0");
  c = ChooseSessionNic(Node(), kServed, {{"mlx5_2"}, ""});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->nic, "mlx5_2");
  // A GPU discovery does not know: the first, and the reason says so.
  c = ChooseSessionNic(Node(), kServed, {{}, "0000:99:00.0"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->nic, "mlx5_0");
  EXPECT_NE(c->reason.find("not one discovery found"), std::string::npos) << c->reason;
}

TEST(NicChoice, ANicThatIsNotServedIsRefusedNamingThoseThatAre) {
  absl::StatusOr<NicChoice> c = ChooseSessionNic(Node(), {"mlx5_0"}, {{"mlx5_9"}, ""});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("serves mlx5_0"), std::string::npos) << c.status();
  // What the caller sent is escaped before it is shown.
  c = ChooseSessionNic(Node(), {"mlx5_0"}, {{"\x1b[31mred"}, ""});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().find('\x1b'), std::string::npos);
  std::vector<std::string> many(65, "mlx5_0");
  EXPECT_EQ(ChooseSessionNic(Node(), {"mlx5_0"}, {many, ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseSessionNic(Node(), {}, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(NicChoice, SoftnicServesOneNicAndAnyGpuGetsIt) {
  absl::StatusOr<NicChoice> c = ChooseSessionNic(Node(), {"softnic0"}, {{}, "0000:1b:00.0"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->nic, "softnic0");
  EXPECT_NE(c->reason.find("no path"), std::string::npos) << c->reason;
}

}  // namespace
}  // namespace mooncake::daemon
