#include "discovery/gpu_discovery.h"

#include <fstream>
#include <memory>
#include <set>
#include <utility>

#include "fake_cuda_driver.h"
#include "fake_sysfs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

using drivers::FakeCudaDriver;
using drivers::FakeGpu;
using test_support::FakeSysfs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// `n` Hopper-like GPUs (FakeGpu::Hopper: bus ids 0000:1B:00.0,
// 0000:3C:00.0, ...) with P2P access between all, native atomics from GPU 0
// only and performance rank src + dst.
std::shared_ptr<FakeCudaDriver> FakeNode(int n) {
  auto cu = std::make_shared<FakeCudaDriver>();
  for (int i = 0; i < n; ++i) cu->addGpu(FakeGpu::Hopper(i));
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      cu->setP2PAttribute(s, d, drivers::kCuP2pAttrAccessSupported, 1);
      cu->setP2PAttribute(s, d, drivers::kCuP2pAttrNativeAtomicSupported, s == 0 ? 1 : 0);
      cu->setP2PAttribute(s, d, drivers::kCuP2pAttrPerformanceRank, s + d);
    }
  }
  return cu;
}

class GpuDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override { sys_.AddPciDevice("pci0000:00/0000:00:01.0/0000:1b:00.0", 1, "nvidia"); }
  GpuDiscoveryResult Discover() { return DiscoverGpus({.sysfs_root = sys_.root(), .driver = cu_}); }
  GpuDiscoveryResult DiscoverLibrary(const std::string& library) {
    return DiscoverGpus({.cuda_library = library, .sysfs_root = sys_.root()});
  }
  FakeSysfs sys_;
  std::shared_ptr<FakeCudaDriver> cu_ = FakeNode(2);
};

TEST(GpuUuidTest, FormatsLikeNvidiaSmi) {
  std::array<uint8_t, 16> bytes = {0x5e, 0x2f, 0x1a, 0x0b, 0xc3, 0xd4, 0x00, 0x01,
                                   0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10};
  EXPECT_EQ(FormatGpuUuid(bytes), "GPU-5e2f1a0b-c3d4-0001-fedc-ba9876543210");
}

TEST_F(GpuDiscoveryTest, ReadsEveryGpuAndItsAttributes) {
  GpuDiscoveryResult result = Discover();
  EXPECT_EQ(result.note, "");
  EXPECT_EQ(result.driver_version, 13000);
  ASSERT_EQ(result.gpus.size(), 2u);

  const v1::Gpu& g0 = result.gpus[0];
  EXPECT_EQ(g0.index(), 0);
  EXPECT_EQ(g0.name(), "Fake GPU 0");
  EXPECT_EQ(g0.uuid(), "GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfeff");
  EXPECT_EQ(g0.pci_bus_id(), "0000:1b:00.0");  // lowercased from the driver's "1B"
  EXPECT_EQ(g0.numa_node(), 1);                // from the fake sysfs
  EXPECT_EQ(g0.total_memory_bytes(), 80ull << 30);
  EXPECT_EQ(g0.compute_capability_major(), 9);
  EXPECT_EQ(g0.compute_capability_minor(), 0);
  EXPECT_EQ(g0.multiprocessor_count(), 132);
  EXPECT_TRUE(g0.vmm_supported());
  EXPECT_TRUE(g0.posix_fd_handle_supported());
  EXPECT_TRUE(g0.fabric_handle_supported());
  EXPECT_TRUE(g0.dmabuf_supported());

  const v1::Gpu& g1 = result.gpus[1];
  EXPECT_EQ(g1.index(), 1);
  EXPECT_EQ(g1.uuid(), "GPU-e0e1e2e3-e4e5-e6e7-e8e9-eaebecedeeef");
  EXPECT_EQ(g1.pci_bus_id(), "0000:3c:00.0");
  EXPECT_EQ(g1.numa_node(), -1) << "no sysfs entry for this GPU";
  EXPECT_EQ(g1.total_memory_bytes(), 160ull << 30);
  EXPECT_EQ(g1.multiprocessor_count(), 131);
  EXPECT_FALSE(g1.fabric_handle_supported());

  ASSERT_EQ(result.pairs.size(), 2u);
  EXPECT_EQ(result.pairs[0].src(), 0);
  EXPECT_EQ(result.pairs[0].dst(), 1);
  EXPECT_TRUE(result.pairs[0].access_supported());
  EXPECT_TRUE(result.pairs[0].native_atomics());
  EXPECT_EQ(result.pairs[0].performance_rank(), 1);
  EXPECT_EQ(result.pairs[1].src(), 1);
  EXPECT_EQ(result.pairs[1].dst(), 0);
  EXPECT_FALSE(result.pairs[1].native_atomics());
}

TEST_F(GpuDiscoveryTest, OnePairPerOrderedPairOfGpus) {
  cu_ = FakeNode(4);
  GpuDiscoveryResult result = Discover();
  ASSERT_EQ(result.gpus.size(), 4u);
  ASSERT_EQ(result.pairs.size(), 12u);
  std::set<std::pair<int, int>> seen;
  for (const v1::GpuPair& p : result.pairs) {
    EXPECT_NE(p.src(), p.dst());
    EXPECT_EQ(p.performance_rank(), p.src() + p.dst());
    EXPECT_TRUE(seen.emplace(p.src(), p.dst()).second);
  }
}

TEST_F(GpuDiscoveryTest, FailingAttributeIsReportedAsUnsupportedWithANote) {
  // An attribute the driver does not know fails with CUDA_ERROR_INVALID_VALUE.
  for (int i = 0; i < 2; ++i) {
    cu_->gpu(i).attributes.erase(drivers::kCuDeviceAttrHandleTypeFabricSupported);
  }
  GpuDiscoveryResult result = Discover();
  ASSERT_EQ(result.gpus.size(), 2u);
  EXPECT_FALSE(result.gpus[0].fabric_handle_supported());
  EXPECT_TRUE(result.gpus[0].dmabuf_supported());
  EXPECT_THAT(result.note, AllOf(HasSubstr("GPU 0"), HasSubstr("HANDLE_TYPE_FABRIC_SUPPORTED"),
                                 HasSubstr("CUDA_ERROR_INVALID_VALUE")));
}

TEST_F(GpuDiscoveryTest, CuInitFailureIsANote) {
  cu_->setInitResult(drivers::kCudaErrorNoDevice);
  GpuDiscoveryResult result = Discover();
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_THAT(result.pairs, IsEmpty());
  EXPECT_EQ(result.driver_version, 13000) << "the version is known even when cuInit fails";
  EXPECT_THAT(result.note, AllOf(HasSubstr("cuInit"), HasSubstr("CUDA_ERROR_NO_DEVICE"),
                                 HasSubstr("no CUDA-capable device"), HasSubstr("nvidia-smi")));
}

TEST_F(GpuDiscoveryTest, StubLibcudaIsExplained) {
  cu_->setInitResult(drivers::kCudaErrorStubLibrary);
  GpuDiscoveryResult result = Discover();
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_THAT(result.note, AllOf(HasSubstr("CUDA_ERROR_STUB_LIBRARY"), HasSubstr("stubs/")));
}

TEST_F(GpuDiscoveryTest, ZeroDevicesIsANote) {
  cu_ = FakeNode(0);
  GpuDiscoveryResult result = Discover();
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_THAT(result.note, AllOf(HasSubstr("fake reports no GPU"), HasSubstr("nvidia-smi")));
}

TEST_F(GpuDiscoveryTest, DeviceCountFailureIsANote) {
  cu_->failNext("deviceGetCount", drivers::kCudaErrorUnknown);
  GpuDiscoveryResult result = Discover();
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_THAT(result.note, AllOf(HasSubstr("cuDeviceGetCount"), HasSubstr("CUDA_ERROR_UNKNOWN")));
}

// Which UUID entry point the loader picks (cuDeviceGetUuid_v2, or the first
// version on drivers before 11.4) and what it says about a missing entry
// point are tested on the loader itself, in tests/drivers/cuda_driver_test.

TEST_F(GpuDiscoveryTest, FailingIdentityQuerySkipsOnlyThatGpu) {
  cu_ = FakeNode(3);
  cu_->failNext("deviceGetUuid", drivers::kCudaErrorUnknown);  // GPU 0's
  GpuDiscoveryResult result = Discover();
  ASSERT_EQ(result.gpus.size(), 2u);
  EXPECT_EQ(result.gpus[0].index(), 1);
  EXPECT_EQ(result.gpus[1].index(), 2);
  ASSERT_EQ(result.pairs.size(), 2u) << "pairs only between the GPUs listed";
  EXPECT_EQ(result.pairs[0].src(), 1);
  EXPECT_EQ(result.pairs[0].dst(), 2);
  EXPECT_THAT(result.note, AllOf(HasSubstr("GPU 0 skipped"), HasSubstr("cuDeviceGetUuid"),
                                 HasSubstr("CUDA_ERROR_UNKNOWN")));
}

TEST_F(GpuDiscoveryTest, FailingDeviceGetSkipsTheGpu) {
  cu_->failNext("deviceGet", drivers::kCudaErrorInvalidDevice);
  GpuDiscoveryResult result = Discover();
  ASSERT_EQ(result.gpus.size(), 1u);
  EXPECT_EQ(result.gpus[0].index(), 1);
  EXPECT_THAT(result.pairs, IsEmpty());
  EXPECT_THAT(result.note, AllOf(HasSubstr("GPU 0 skipped"), HasSubstr("cuDeviceGet:"),
                                 HasSubstr("CUDA_ERROR_INVALID_DEVICE")));
}

TEST_F(GpuDiscoveryTest, NoP2PBetweenGpusIsReportedAsSuch) {
  cu_ = std::make_shared<FakeCudaDriver>();  // two GPUs, no P2P attribute set
  cu_->addGpu(FakeGpu::Hopper(0));
  cu_->addGpu(FakeGpu::Hopper(1));
  GpuDiscoveryResult result = Discover();
  EXPECT_EQ(result.note, "") << "no P2P is a normal answer, not a problem";
  ASSERT_EQ(result.pairs.size(), 2u);
  for (const v1::GpuPair& p : result.pairs) {
    EXPECT_FALSE(p.access_supported());
    EXPECT_FALSE(p.native_atomics());
    EXPECT_EQ(p.performance_rank(), 0);
  }
}

TEST_F(GpuDiscoveryTest, FailingP2PQueryIsReportedAsUnsupportedWithANote) {
  cu_->setResult("deviceGetP2PAttribute", drivers::kCudaErrorNotSupported);
  GpuDiscoveryResult result = Discover();
  ASSERT_EQ(result.gpus.size(), 2u) << "the GPUs are still listed";
  ASSERT_EQ(result.pairs.size(), 2u);
  EXPECT_FALSE(result.pairs[0].access_supported());
  EXPECT_FALSE(result.pairs[0].native_atomics());
  EXPECT_THAT(result.note,
              AllOf(HasSubstr("GPU 0->1"), HasSubstr("cuDeviceGetP2PAttribute(ACCESS_SUPPORTED)"),
                    HasSubstr("CUDA_ERROR_NOT_SUPPORTED"), HasSubstr("reported as unsupported")));
}

TEST_F(GpuDiscoveryTest, AGivenDriverIsUsedInsteadOfTheLibrary) {
  GpuDiscoveryResult result = DiscoverGpus(
      {.cuda_library = "libdoesnotexist.so", .sysfs_root = sys_.root(), .driver = cu_});
  EXPECT_EQ(result.gpus.size(), 2u);
  EXPECT_EQ(cu_->calls("init"), 1);
}

TEST_F(GpuDiscoveryTest, MissingLibraryIsANote) {
  GpuDiscoveryResult result = DiscoverLibrary("libdoesnotexist.so");
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_EQ(result.driver_version, 0);
  EXPECT_THAT(result.note, AllOf(HasSubstr("libdoesnotexist.so not found"),
                                 HasSubstr("install the NVIDIA driver")));
}

TEST_F(GpuDiscoveryTest, BrokenLibraryIsANote) {
  std::string path = sys_.root() + "/../libcuda.so.1";
  std::ofstream(path) << "not an ELF file\n";
  GpuDiscoveryResult result = DiscoverLibrary(path);
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_THAT(result.note, HasSubstr("could not be loaded"));
}

TEST_F(GpuDiscoveryTest, EmptyLibraryNameDisablesDiscovery) {
  GpuDiscoveryResult result = DiscoverLibrary("");
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_THAT(result.note, HasSubstr("disabled"));
}

}  // namespace
}  // namespace mooncake::daemon
