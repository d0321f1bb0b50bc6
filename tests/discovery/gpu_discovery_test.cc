#include "discovery/gpu_discovery.h"

#include <stdlib.h>

#include <fstream>
#include <set>
#include <utility>

#include "fake_sysfs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

// Paths of the fake driver libraries built next to this test.
#ifndef MC_FAKE_CUDA_LIB
#error "MC_FAKE_CUDA_LIB must name the fake libcuda built by tests/discovery"
#endif

namespace mooncake::daemon {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using test_support::FakeSysfs;

constexpr const char* kEnvVars[] = {"MC_FAKE_CUDA_INIT_RESULT", "MC_FAKE_CUDA_BUS_IDS",
                                    "MC_FAKE_CUDA_FAIL_ATTRIBUTE"};

class GpuDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* var : kEnvVars) ::unsetenv(var);
    sys_.AddPciDevice("pci0000:00/0000:00:01.0/0000:1b:00.0", 1, "nvidia");
  }
  void TearDown() override {
    for (const char* var : kEnvVars) ::unsetenv(var);
  }
  GpuDiscoveryResult Discover(const std::string& library = MC_FAKE_CUDA_LIB) {
    return DiscoverGpus({.cuda_library = library, .sysfs_root = sys_.root()});
  }
  FakeSysfs sys_;
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
  ::setenv("MC_FAKE_CUDA_BUS_IDS", "0000:01:00.0,0000:02:00.0,0000:03:00.0,0000:04:00.0", 1);
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
  ::setenv("MC_FAKE_CUDA_FAIL_ATTRIBUTE", "128", 1);  // HANDLE_TYPE_FABRIC_SUPPORTED
  GpuDiscoveryResult result = Discover();
  ASSERT_EQ(result.gpus.size(), 2u);
  EXPECT_FALSE(result.gpus[0].fabric_handle_supported());
  EXPECT_TRUE(result.gpus[0].dmabuf_supported());
  EXPECT_THAT(result.note, AllOf(HasSubstr("GPU 0"), HasSubstr("HANDLE_TYPE_FABRIC_SUPPORTED"),
                                 HasSubstr("CUDA_ERROR_INVALID_VALUE")));
}

TEST_F(GpuDiscoveryTest, CuInitFailureIsANote) {
  ::setenv("MC_FAKE_CUDA_INIT_RESULT", "100", 1);  // CUDA_ERROR_NO_DEVICE
  GpuDiscoveryResult result = Discover();
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_THAT(result.pairs, IsEmpty());
  EXPECT_EQ(result.driver_version, 13000) << "the version is known even when cuInit fails";
  EXPECT_THAT(result.note, AllOf(HasSubstr("cuInit"), HasSubstr("CUDA_ERROR_NO_DEVICE"),
                                 HasSubstr("no CUDA-capable device"), HasSubstr("nvidia-smi")));
}

TEST_F(GpuDiscoveryTest, ZeroDevicesIsANote) {
  ::setenv("MC_FAKE_CUDA_BUS_IDS", "", 1);
  GpuDiscoveryResult result = Discover();
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_THAT(result.note, HasSubstr("reports no GPU"));
}

TEST_F(GpuDiscoveryTest, FallsBackToTheFirstUuidEntryPoint) {
  GpuDiscoveryResult result = Discover(MC_FAKE_CUDA_LEGACY_UUID_LIB);
  EXPECT_EQ(result.note, "");
  ASSERT_EQ(result.gpus.size(), 2u);
  EXPECT_EQ(result.gpus[0].uuid(), "GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfeff");
}

TEST_F(GpuDiscoveryTest, MissingSymbolIsANoteNotACrash) {
  GpuDiscoveryResult result = Discover(MC_FAKE_CUDA_NO_P2P_LIB);
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_THAT(result.note, AllOf(HasSubstr("lacks cuDeviceGetP2PAttribute"),
                                 HasSubstr("update the driver")));
}

TEST_F(GpuDiscoveryTest, MissingLibraryIsANote) {
  GpuDiscoveryResult result = Discover("libdoesnotexist.so");
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_EQ(result.driver_version, 0);
  EXPECT_THAT(result.note, AllOf(HasSubstr("libdoesnotexist.so not found"),
                                 HasSubstr("install the NVIDIA driver")));
}

TEST_F(GpuDiscoveryTest, BrokenLibraryIsANote) {
  std::string path = sys_.root() + "/../libcuda.so.1";
  std::ofstream(path) << "not an ELF file\n";
  GpuDiscoveryResult result = Discover(path);
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_THAT(result.note, HasSubstr("could not be loaded"));
}

TEST_F(GpuDiscoveryTest, EmptyLibraryNameDisablesDiscovery) {
  GpuDiscoveryResult result = Discover("");
  EXPECT_THAT(result.gpus, IsEmpty());
  EXPECT_THAT(result.note, HasSubstr("disabled"));
}

}  // namespace
}  // namespace mooncake::daemon
