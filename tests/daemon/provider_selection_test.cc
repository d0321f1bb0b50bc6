// rdma_provider with made-up discovery results: auto without mlx5 is
// softnic, mlx5 forced without a usable NIC is a startup error naming why,
// and the probe decides between NICs.
#include "rdma/provider_selection.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

v1::Nic MakeNic(const std::string& name, const std::string& driver, const std::string& state) {
  v1::Nic n;
  n.set_name(name);
  n.set_driver(driver);
  v1::NicPort* p = n.add_ports();
  p->set_port(1);
  p->set_state(state);
  return n;
}

Mlx5Probe Refuse(std::vector<std::string>* probed) {
  return [probed](const std::string& device, uint32_t) {
    probed->push_back(device);
    return absl::NotFoundError("no RDMA devices");
  };
}

TEST(ProviderSelectionTest, AutoWithoutMlx5IsSoftnicWithoutProbing) {
  std::vector<std::string> probed;
  auto c = ChooseRdmaProvider("auto", {MakeNic("rxe0", "rdma_rxe", "ACTIVE")}, Refuse(&probed));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->provider, "softnic");
  EXPECT_NE(c->reason.find("no mlx5 NIC"), std::string::npos) << c->reason;
  EXPECT_TRUE(probed.empty());
  c = ChooseRdmaProvider("auto", {}, Refuse(&probed));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->provider, "softnic");
}

TEST(ProviderSelectionTest, AutoFallsBackToSoftnicWhenNoMlx5Opens) {
  std::vector<std::string> probed;
  auto c = ChooseRdmaProvider("auto", {MakeNic("mlx5_0", "mlx5_core", "ACTIVE")}, Refuse(&probed));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->provider, "softnic");
  EXPECT_EQ(probed, std::vector<std::string>{"mlx5_0"});
  EXPECT_NE(c->reason.find("mlx5_0: no RDMA devices"), std::string::npos) << c->reason;
}

TEST(ProviderSelectionTest, Mlx5ForcedWithoutAUsableNicIsAnErrorNamingWhy) {
  std::vector<std::string> probed;
  auto c = ChooseRdmaProvider("mlx5", {MakeNic("rxe0", "rdma_rxe", "ACTIVE")}, Refuse(&probed));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("rdma_provider = mlx5"), std::string::npos);
  EXPECT_NE(c.status().message().find("discovery found no mlx5 NIC"), std::string::npos)
      << c.status();
  EXPECT_NE(c.status().message().find("rdma_provider = auto or softnic"), std::string::npos);

  c = ChooseRdmaProvider("mlx5", {MakeNic("mlx5_1", "mlx5_core", "DOWN")}, Refuse(&probed));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("mlx5_1: no RDMA devices"), std::string::npos) << c.status();
}

TEST(ProviderSelectionTest, FirstMlx5NicThatOpensWinsOnItsActivePort) {
  v1::Nic two = MakeNic("mlx5_1", "mlx5_core", "DOWN");
  v1::NicPort* p2 = two.add_ports();
  p2->set_port(2);
  p2->set_state("ACTIVE");
  std::vector<std::pair<std::string, uint32_t>> probed;
  Mlx5Probe probe = [&](const std::string& device, uint32_t port) {
    probed.emplace_back(device, port);
    return device == "mlx5_0" ? absl::FailedPreconditionError("no DevX") : absl::OkStatus();
  };
  for (const std::string config : {"auto", "mlx5"}) {
    probed.clear();
    auto c = ChooseRdmaProvider(config, {MakeNic("mlx5_0", "mlx5_core", "ACTIVE"), two}, probe);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->provider, "mlx5");
    EXPECT_EQ(c->device, "mlx5_1");
    EXPECT_EQ(c->port, 2u);
    ASSERT_EQ(probed.size(), 2u);
    EXPECT_EQ(probed[0].second, 1u);
  }
}

TEST(ProviderSelectionTest, EveryMlx5NicThatOpensIsServedAndTheFilterNarrows) {
  std::vector<v1::Nic> nics = {
      MakeNic("mlx5_0", "mlx5_core", "ACTIVE"), MakeNic("mlx5_1", "mlx5_core", "ACTIVE"),
      MakeNic("mlx5_2", "mlx5_core", "ACTIVE"), MakeNic("eth0", "virtio_net", "ACTIVE")};
  std::vector<std::string> probed;
  Mlx5Probe probe = [&](const std::string& device, uint32_t) {
    probed.push_back(device);
    return device == "mlx5_1" ? absl::FailedPreconditionError("no DevX") : absl::OkStatus();
  };
  auto c = ChooseRdmaProvider("auto", nics, probe);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->devices.size(), 2u);
  EXPECT_EQ(c->devices[0].device, "mlx5_0");
  EXPECT_EQ(c->devices[1].device, "mlx5_2");
  EXPECT_EQ(c->device, "mlx5_0");
  EXPECT_NE(c->reason.find("mlx5_1: no DevX"), std::string::npos) << c->reason;
  // rdma_devices: only those are probed and served.
  probed.clear();
  c = ChooseRdmaProvider("auto", nics, probe, {"mlx5_2"});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->devices.size(), 1u);
  EXPECT_EQ(c->device, "mlx5_2");
  EXPECT_EQ(probed, std::vector<std::string>{"mlx5_2"});
  // A name discovery did not find is a typo to report, not a fallback.
  c = ChooseRdmaProvider("auto", nics, probe, {"mlx5_7"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("mlx5_7"), std::string::npos);
}

TEST(ProviderSelectionTest, SoftnicAndOffAreTakenAsSaidAndOthersRefused) {
  Mlx5Probe never = [](const std::string&, uint32_t) -> absl::Status {
    ADD_FAILURE() << "probed";
    return absl::OkStatus();
  };
  std::vector<v1::Nic> mlx = {MakeNic("mlx5_0", "mlx5_core", "ACTIVE")};
  EXPECT_EQ(ChooseRdmaProvider("softnic", mlx, never)->provider, "softnic");
  EXPECT_EQ(ChooseRdmaProvider("off", mlx, never)->provider, "off");
  auto bad = ChooseRdmaProvider("rxe", mlx, never);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mooncake::daemon
