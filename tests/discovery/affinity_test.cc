#include "discovery/affinity.h"

#include <map>
#include <utility>

#include "fake_sysfs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

using test_support::BuildTwoSocketNode;
using test_support::FakeSysfs;
using ::testing::IsEmpty;

struct Entry {
  std::string distance;
  bool closest;
  bool operator==(const Entry&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Entry& e) {
  return os << e.distance << (e.closest ? " (closest)" : "");
}

// (gpu, nic) -> entry, checking each pair appears once.
std::map<std::pair<int, std::string>, Entry> ByPair(
    const std::vector<v1::GpuNicAffinity>& affinity) {
  std::map<std::pair<int, std::string>, Entry> out;
  for (const v1::GpuNicAffinity& a : affinity) {
    bool inserted =
        out.emplace(std::make_pair(a.gpu(), a.nic()), Entry{a.distance(), a.closest()}).second;
    EXPECT_TRUE(inserted) << "duplicate entry for GPU " << a.gpu() << " / " << a.nic();
  }
  return out;
}

class AffinityTest : public ::testing::Test {
 protected:
  void SetUp() override { BuildTwoSocketNode(sys_); }
  FakeSysfs sys_;
  // The NICs of BuildTwoSocketNode, minus mlx5_1 (second function of mlx5_0).
  std::vector<NicLocation> nics_ = {
      {"mlx5_0", "0000:04:00.0"}, {"mlx5_2", "0000:08:00.0"}, {"mlx5_3", "0000:81:00.0"}};
};

TEST_F(AffinityTest, PicksTheClosestNicForEachGpu) {
  std::vector<GpuLocation> gpus = {
      {0, "0000:03:00.0"}, {1, "0000:07:00.0"}, {2, "0000:21:00.0"}, {3, "0000:82:00.0"}};
  std::vector<v1::GpuNicAffinity> affinity = ComputeGpuNicAffinity(sys_.root(), gpus, nics_);
  ASSERT_EQ(affinity.size(), gpus.size() * nics_.size());
  // GPU-major order, NICs in the given order.
  EXPECT_EQ(affinity[0].gpu(), 0);
  EXPECT_EQ(affinity[0].nic(), "mlx5_0");
  EXPECT_EQ(affinity[1].nic(), "mlx5_2");
  EXPECT_EQ(affinity[3].gpu(), 1);

  auto got = ByPair(affinity);
  std::map<std::pair<int, std::string>, Entry> want = {
      // Same switch as mlx5_0.
      {{0, "mlx5_0"}, {"PIX", true}},
      {{0, "mlx5_2"}, {"PHB", false}},
      {{0, "mlx5_3"}, {"SYS", false}},
      // Behind a second switch: mlx5_0 is still the nearest.
      {{1, "mlx5_0"}, {"PXB", true}},
      {{1, "mlx5_2"}, {"PHB", false}},
      {{1, "mlx5_3"}, {"SYS", false}},
      // Its own host bridge on NUMA node 0: both node-0 NICs tie.
      {{2, "mlx5_0"}, {"NODE", true}},
      {{2, "mlx5_2"}, {"NODE", true}},
      {{2, "mlx5_3"}, {"SYS", false}},
      // Socket 1: only mlx5_3 is local.
      {{3, "mlx5_0"}, {"SYS", false}},
      {{3, "mlx5_2"}, {"SYS", false}},
      {{3, "mlx5_3"}, {"PHB", true}},
  };
  EXPECT_EQ(got, want);
}

TEST_F(AffinityTest, TwoFunctionsOfOneNicAreBothClosest) {
  std::vector<NicLocation> nics = {
      {"mlx5_0", "0000:04:00.0"}, {"mlx5_1", "0000:04:00.1"}, {"mlx5_2", "0000:08:00.0"}};
  auto got = ByPair(ComputeGpuNicAffinity(sys_.root(), {{0, "0000:03:00.0"}}, nics));
  EXPECT_EQ(got[std::make_pair(0, std::string("mlx5_0"))], (Entry{"PIX", true}));
  EXPECT_EQ(got[std::make_pair(0, std::string("mlx5_1"))], (Entry{"PIX", true}));
  EXPECT_EQ(got[std::make_pair(0, std::string("mlx5_2"))], (Entry{"PHB", false}));
}

TEST_F(AffinityTest, CudaSpellingOfGpuBusIdIsAccepted) {
  auto got = ByPair(ComputeGpuNicAffinity(sys_.root(), {{5, "00000000:03:00.0"}}, nics_));
  EXPECT_EQ(got[std::make_pair(5, std::string("mlx5_0"))], (Entry{"PIX", true}));
}

TEST_F(AffinityTest, UnplaceableDevicesAreUnknownAndNeverClosest) {
  std::vector<NicLocation> nics = {{"mlx5_0", "0000:04:00.0"}, {"rxe0", ""}};
  auto got =
      ByPair(ComputeGpuNicAffinity(sys_.root(), {{0, "0000:03:00.0"}, {1, "0000:ee:00.0"}}, nics));
  EXPECT_EQ(got[std::make_pair(0, std::string("mlx5_0"))], (Entry{"PIX", true}));
  EXPECT_EQ(got[std::make_pair(0, std::string("rxe0"))], (Entry{"UNKNOWN", false}));
  EXPECT_EQ(got[std::make_pair(1, std::string("mlx5_0"))], (Entry{"UNKNOWN", false}));
  EXPECT_EQ(got[std::make_pair(1, std::string("rxe0"))], (Entry{"UNKNOWN", false}));
}

TEST_F(AffinityTest, EmptyInputsGiveNoEntries) {
  EXPECT_THAT(ComputeGpuNicAffinity(sys_.root(), {}, nics_), IsEmpty());
  EXPECT_THAT(ComputeGpuNicAffinity(sys_.root(), {{0, "0000:03:00.0"}}, {}), IsEmpty());
}

TEST(AffinityMissingRootTest, EverythingUnknown) {
  auto got = ComputeGpuNicAffinity("/nonexistent/mooncake-sysfs", {{0, "0000:03:00.0"}},
                                   {{"mlx5_0", "0000:04:00.0"}});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].distance(), "UNKNOWN");
  EXPECT_FALSE(got[0].closest());
}

}  // namespace
}  // namespace mooncake::daemon
