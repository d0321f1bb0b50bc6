// The client's half of the doorbell hand-off (client/src/gpu_doorbell.h)
// against the fake CUDA driver: a memfd stands in for the verbs command fd,
// so the mapping at the UAR's offset is real and a store through the
// "device" register lands in the page the daemon handed out. The real NIC
// path (mlx5_ib_mmap of a DevX UAR, cuMemHostRegister(IOMEMORY) on a GPU)
// needs a ConnectX NIC and a GPU together; so does the proof that the
// kernel then frees the daemon's context (here: no mapping of the stand-in
// fd is left in /proc/self/maps).
#include "gpu_doorbell.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "fake_cuda_context.h"
#include "gtest/gtest.h"

namespace mooncake {
namespace {

using drivers::FakeCudaDriver;

class GpuDoorbellTest : public FakeCudaContextTest {
 protected:
  void SetUp() override {
    FakeCudaContextTest::SetUp();
    memfd_ = ::memfd_create("fake-uverbs", MFD_CLOEXEC);
    ASSERT_GE(memfd_, 0);
    ASSERT_EQ(::ftruncate(memfd_, 3 * kPage), 0);
  }
  void TearDown() override {
    if (memfd_ >= 0) ::close(memfd_);
    FakeCudaContextTest::TearDown();
  }
  DoorbellAccess Access() const {
    DoorbellAccess a;
    a.command_fd = UniqueFd(::dup(memfd_));
    a.device = "mlx5_0";
    a.uar_mmap_offset = 2 * kPage;  // the third page is "the UAR"
    a.uar_reg_offset = 0x800;
    a.uar_page_bytes = kPage;
    return a;
  }
  uint64_t ReadBack(uint64_t file_offset) const {
    uint64_t v = 0;
    EXPECT_EQ(::pread(memfd_, &v, sizeof(v), static_cast<off_t>(file_offset)), 8);
    return v;
  }
  static constexpr uint64_t kPage = 4096;
  int memfd_ = -1;
};

TEST_F(GpuDoorbellTest, TheRegisterTheKernelStoresToIsTheHandedOutUarRegister) {
  absl::StatusOr<GpuUar> uar = MapUarForGpu(Access(), cu_);
  ASSERT_TRUE(uar.ok()) << uar.status();
  EXPECT_EQ(cu_.liveHostRegistrations(), 1u);
  EXPECT_EQ(cu_.calls("memHostRegister"), 1);
  // The fake answers host addresses as device addresses: the register is
  // the mapped page plus the offset, and a store reaches the fd's page.
  EXPECT_EQ(uar->device_register, reinterpret_cast<uintptr_t>(uar->page) + 0x800);
  *reinterpret_cast<volatile uint64_t*>(uar->device_register) = 0x1122334455667788ull;
  EXPECT_EQ(ReadBack(2 * kPage + 0x800), 0x1122334455667788ull);
  EXPECT_EQ(ReadBack(0x800), 0u) << "mapped at the UAR's offset, not the fd's start";
  UnmapUarForGpu(*uar, cu_);
  EXPECT_EQ(cu_.liveHostRegistrations(), 0u);
  EXPECT_EQ(uar->page, nullptr);
}

// Lines of /proc/self/maps naming the stand-in command fd.
int MappingsOfTheCommandFd() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    n += line.find("fake-uverbs") != std::string::npos;
  return n;
}

// The daemon went away: the process must stop holding its verbs context.
// The mapping is the only hold (the command fd is closed after mmap), so
// detaching it leaves nothing of the file in this process, while the
// address and the CUDA registration stay valid for a kernel still ringing.
TEST_F(GpuDoorbellTest, DetachingFromTheDaemonDropsTheCommandFdButKeepsTheRegister) {
  absl::StatusOr<GpuUar> uar = MapUarForGpu(Access(), cu_);
  ASSERT_TRUE(uar.ok()) << uar.status();
  ASSERT_EQ(MappingsOfTheCommandFd(), 1);
  void* const page = uar->page;
  const drivers::CuDevicePtr reg = uar->device_register;

  ASSERT_TRUE(DetachUarFromCommandFd(*uar).ok());
  EXPECT_TRUE(uar->detached);
  EXPECT_EQ(MappingsOfTheCommandFd(), 0) << "the UAR mapping still references the command fd";
  EXPECT_EQ(uar->page, page);
  EXPECT_EQ(uar->device_register, reg);
  EXPECT_EQ(cu_.liveHostRegistrations(), 1u) << "unregistering under a running kernel faults it";
  // A late store lands in anonymous memory, not in the daemon's page.
  *reinterpret_cast<volatile uint64_t*>(reg) = 0x99;
  EXPECT_EQ(ReadBack(2 * kPage + 0x800), 0u);
  ASSERT_TRUE(DetachUarFromCommandFd(*uar).ok()) << "idempotent";

  UnmapUarForGpu(*uar, cu_);
  EXPECT_EQ(cu_.liveHostRegistrations(), 0u);
  EXPECT_EQ(uar->page, nullptr);
  GpuUar empty;
  EXPECT_TRUE(DetachUarFromCommandFd(empty).ok());
}

// The daemon went away (issue 24 item 7): the flush CQEs are written only
// once this process no longer maps the command fd, so the verbs context,
// and a NIC that could still write CQEs over them, is gone first.
TEST_F(GpuDoorbellTest, OnDaemonLossTheRingsFailOnlyAfterTheCommandFdIsLetGo) {
  absl::StatusOr<GpuUar> uar = MapUarForGpu(Access(), cu_);
  ASSERT_TRUE(uar.ok()) << uar.status();
  ASSERT_EQ(MappingsOfTheCommandFd(), 1);
  int mappings_when_failing = -1;
  ASSERT_TRUE(
      DetachThenFailRings(*uar, [&] { mappings_when_failing = MappingsOfTheCommandFd(); }).ok());
  EXPECT_EQ(mappings_when_failing, 0) << "the rings failed while the verbs context was held";
  EXPECT_TRUE(uar->detached);
  // Without a UAR (cpu-assisted doorbells, softnic) the rings still fail.
  GpuUar none;
  bool failed = false;
  EXPECT_TRUE(DetachThenFailRings(none, [&] { failed = true; }).ok());
  EXPECT_TRUE(failed);
  UnmapUarForGpu(*uar, cu_);
}

TEST_F(GpuDoorbellTest, AGpuThatRefusesIoMemorySaysWhatToEnableAndLeavesNothingMapped) {
  cu_.failNext("memHostRegister", drivers::kCudaErrorNotSupported);
  absl::StatusOr<GpuUar> uar = MapUarForGpu(Access(), cu_);
  ASSERT_FALSE(uar.ok());
  EXPECT_NE(uar.status().message().find("cuMemHostRegister(IOMEMORY)"), std::string::npos)
      << uar.status();
  EXPECT_NE(uar.status().message().find("PeerMappingOverride"), std::string::npos) << uar.status();
  EXPECT_EQ(cu_.liveHostRegistrations(), 0u);

  cu_.failNext("memHostGetDevicePointer", drivers::kCudaErrorInvalidValue);
  uar = MapUarForGpu(Access(), cu_);
  ASSERT_FALSE(uar.ok());
  EXPECT_EQ(cu_.liveHostRegistrations(), 0u) << "registered, then unregistered on the failure";
}

TEST_F(GpuDoorbellTest, ImplausibleHandOffsAreRefusedBeforeAnyMapping) {
  DoorbellAccess a = Access();
  a.uar_reg_offset = kPage - 4;  // the 8-byte register would cross the page
  EXPECT_EQ(MapUarForGpu(a, cu_).status().code(), absl::StatusCode::kInvalidArgument);
  a = Access();
  a.uar_page_bytes = 3000;
  EXPECT_EQ(MapUarForGpu(a, cu_).status().code(), absl::StatusCode::kInvalidArgument);
  a = Access();
  a.command_fd = UniqueFd();
  EXPECT_EQ(MapUarForGpu(a, cu_).status().code(), absl::StatusCode::kInvalidArgument);
  // Offset 0 would map the context's legacy UAR, not the session's.
  a = Access();
  a.uar_mmap_offset = 0;
  absl::Status zero = MapUarForGpu(a, cu_).status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("legacy UAR"), std::string::npos) << zero;
  EXPECT_EQ(cu_.calls("memHostRegister"), 0);
  // An fd that cannot be mapped (a pipe: ENODEV): the mmap's own error,
  // named, and nothing registered.
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  ::close(p[1]);
  a = Access();
  a.command_fd = UniqueFd(p[0]);
  absl::StatusOr<GpuUar> uar = MapUarForGpu(a, cu_);
  ASSERT_FALSE(uar.ok());
  EXPECT_EQ(uar.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(uar.status().message().find("mmap"), std::string::npos) << uar.status();
  EXPECT_EQ(cu_.liveHostRegistrations(), 0u);
}

}  // namespace
}  // namespace mooncake
