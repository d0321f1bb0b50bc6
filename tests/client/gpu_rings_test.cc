// Queue rings in GPU memory (client/src/gpu_rings.h) against the fake CUDA
// driver, whose "GPU memory" is a memfd the test reads back: the
// allocation and its dmabuf (the same memory, as the NIC would reach it),
// the clean rings a QP starts with, and the flush CQE written through the
// driver when the daemon goes, checked byte for byte against the host
// form's (FailQueuePairRings). That a real NIC accepts the dmabuf as umem
// needs a ConnectX NIC; that a real driver exports it runs in
// tests/gpu (device_transport_example --rings gpu).
#include "gpu_rings.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "fake_cuda_context.h"
#include "gtest/gtest.h"
#include "rdma_control_layout.h"

namespace mooncake {
namespace {

using drivers::FakeCudaDriver;
namespace mlx5 = device::mlx5;

constexpr uint32_t kDepth = 8;

class GpuRingsTest : public FakeCudaContextTest {
 protected:
  // A GPU control allocation of `bytes` (the fake exports dmabufs here).
  GpuControlMemory Allocate(uint64_t bytes) {
    cu_.setDmabufExport(true);
    absl::StatusOr<GpuControlMemory> m =
        AllocateGpuControlMemory(cu_, FakeCudaDriver::kHandleBase, bytes);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : GpuControlMemory{};
  }
  uint8_t* At(const GpuControlMemory& m, uint64_t offset) {
    return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(m.base + offset));
  }
};

TEST_F(GpuRingsTest, TheAllocationIsExportedAsADmabufOfTheSameMemory) {
  cu_.setDmabufExport(true);
  const uint64_t want = 3 * QpControlSlotBytes(kDepth);
  absl::StatusOr<GpuControlMemory> m =
      AllocateGpuControlMemory(cu_, FakeCudaDriver::kHandleBase, want);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_NE(m->base, 0u);
  EXPECT_GE(m->bytes, want);
  EXPECT_EQ(m->bytes % (size_t{2} << 20), 0u);  // whole granules
  ASSERT_TRUE(m->dmabuf.valid());
  // A store by "the GPU" is what the NIC sees through the dmabuf.
  At(*m, 4096)[0] = 0x5a;
  void* nic = ::mmap(nullptr, m->bytes, PROT_READ, MAP_SHARED, m->dmabuf.get(), 0);
  ASSERT_NE(nic, MAP_FAILED);
  EXPECT_EQ(static_cast<uint8_t*>(nic)[4096], 0x5a);
  ::munmap(nic, m->bytes);
  // Its own non-blocking stream, made in the current context.
  EXPECT_NE(m->stream, nullptr);
  EXPECT_EQ(cu_.liveStreams(), 1);
  drivers::CuContext current = nullptr;
  ASSERT_EQ(cu_.ctxGetCurrent(&current), drivers::kCudaSuccess);
  EXPECT_EQ(m->context, current);
  FreeGpuControlMemory(cu_, *m);
  EXPECT_EQ(m->base, 0u);
  EXPECT_FALSE(m->dmabuf.valid());
  EXPECT_EQ(cu_.calls("memRelease"), 1);
  EXPECT_EQ(cu_.liveStreams(), 0);
  FreeGpuControlMemory(cu_, *m);  // idempotent
  EXPECT_EQ(cu_.calls("memRelease"), 1);
}

TEST_F(GpuRingsTest, ADriverWithoutDmabufExportIsAPreconditionAndLeavesNothing) {
  absl::StatusOr<GpuControlMemory> m =
      AllocateGpuControlMemory(cu_, FakeCudaDriver::kHandleBase, QpControlSlotBytes(kDepth));
  ASSERT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();
  EXPECT_TRUE(absl::StrContains(m.status().message(), "exports no dmabuf of GPU memory"))
      << m.status();
  EXPECT_EQ(cu_.calls("memUnmap"), 1);
  EXPECT_EQ(cu_.calls("memAddressFree"), 1);
  EXPECT_EQ(cu_.calls("memRelease"), 1);
  // A refused cuMemCreate (no GPUDirect RDMA for this allocation) likewise.
  cu_.failNext("memCreate", drivers::kCudaErrorNotSupported);
  m = AllocateGpuControlMemory(cu_, FakeCudaDriver::kHandleBase, 4096);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "cuMemCreate (RDMA rings in GPU memory"))
      << m.status();
  EXPECT_EQ(cu_.calls("memRelease"), 1);
  // A driver without streams: the export is closed and the memory freed.
  cu_.setDmabufExport(true);
  cu_.failNext("streamCreate", drivers::kCudaErrorNotSupported);
  m = AllocateGpuControlMemory(cu_, FakeCudaDriver::kHandleBase, 4096);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "cuStreamCreate")) << m.status();
  EXPECT_EQ(cu_.calls("memRelease"), 2);
  EXPECT_EQ(cu_.liveStreams(), 0);
}

TEST_F(GpuRingsTest, RingsStartCleanAndOnlyTheirSlotIsTouched) {
  GpuControlMemory mem = Allocate(2 * QpControlSlotBytes(kDepth));
  ASSERT_NE(mem.base, 0u);
  GpuControlMemory* m = &mem;
  std::memset(At(*m, 0), 0x77, 2 * QpControlSlotBytes(kDepth));
  ASSERT_TRUE(ClearGpuQueueRings(cu_, *m, kDepth, 1).ok());
  const QpControlLayout one = QpControlAt(kDepth, 1);
  for (uint64_t i = 0; i < kDepth * mlx5::kSendWqeBb; ++i) ASSERT_EQ(At(*m, one.sq)[i], 0) << i;
  for (uint64_t i = 0; i < kDepth * mlx5::kCqeBytes; ++i) ASSERT_EQ(At(*m, one.cq)[i], 0xff) << i;
  for (uint64_t i = 0; i < kRdmaMiscBytes; ++i) ASSERT_EQ(At(*m, one.misc)[i], 0) << i;
  EXPECT_EQ(At(*m, 0)[0], 0x77);                          // slot 0 untouched
  EXPECT_EQ(At(*m, one.misc + kRdmaMiscBytes)[0], 0x77);  // past the block
  EXPECT_EQ(ClearGpuQueueRings(cu_, *m, kDepth, m->bytes / QpControlSlotBytes(kDepth)).code(),
            absl::StatusCode::kOutOfRange);
  FreeGpuControlMemory(cu_, *m);
}

// The CQE written through the driver is the host form's, byte for byte, at
// the same place: for a QP that posted 5 WQEs and consumed 3 CQEs, and for
// one on its second pass around the CQ.
TEST_F(GpuRingsTest, TheFlushCqeIsTheHostFormsWrittenThroughTheDriver) {
  const uint64_t bytes = 2 * QpControlSlotBytes(kDepth);
  GpuControlMemory mem = Allocate(bytes);
  ASSERT_NE(mem.base, 0u);
  GpuControlMemory* m = &mem;
  std::vector<uint8_t> host(bytes);
  const struct {
    uint64_t slot;
    uint32_t posted, consumed, qpn;
  } cases[] = {{0, 5, 3, 0x123}, {1, 0x10011, kDepth + 2, 0xabcdef}};
  for (const auto& c : cases) {
    ASSERT_TRUE(ClearGpuQueueRings(cu_, *m, kDepth, c.slot).ok());
    const QpControlLayout at = QpControlAt(kDepth, c.slot);
    std::memset(host.data() + at.cq, 0xff, kDepth * mlx5::kCqeBytes);
    const uint32_t sq = mlx5::be32(c.posted), cq = mlx5::be32(c.consumed);
    for (uint8_t* base : {At(*m, 0), host.data()}) {
      std::memcpy(base + at.misc + kSqDbrecAt + 4, &sq, 4);
      std::memcpy(base + at.misc + kCqDbrecAt, &cq, 4);
    }
    // From a thread with no current context (the client's session thread):
    // done in the memory's context, and the thread is left as it was.
    ASSERT_EQ(cu_.ctxSetCurrent(nullptr), drivers::kCudaSuccess);
    ASSERT_TRUE(FailGpuQueuePairRings(cu_, *m, kDepth, c.slot, c.qpn).ok());
    drivers::CuContext after = m->context;  // not null: the call must overwrite it
    ASSERT_EQ(cu_.ctxGetCurrent(&after), drivers::kCudaSuccess);
    EXPECT_EQ(after, nullptr);
    ASSERT_EQ(cu_.ctxSetCurrent(m->context), drivers::kCudaSuccess);
    FailQueuePairRings(host.data(), kDepth, c.slot, c.qpn);
    EXPECT_EQ(std::memcmp(At(*m, at.cq), host.data() + at.cq, kDepth * mlx5::kCqeBytes), 0)
        << "slot " << c.slot;
    const uint8_t* cqe = At(*m, at.cq + (c.consumed & (kDepth - 1)) * mlx5::kCqeBytes);
    EXPECT_EQ(cqe[mlx5::kCqeSyndromeByte], mlx5::kSyndWrFlushErr);
    EXPECT_EQ(cqe[63] >> 4, mlx5::kCqeReqErr);
    EXPECT_EQ(cqe[63] & 1, mlx5::cqe_expected_owner(c.consumed, kDepth));
  }
  FreeGpuControlMemory(cu_, *m);
}

TEST(GpuRingsFallback, OnlyAutoBeforeTheFirstQpAndWhileTheDaemonAnswers) {
  using RingMemory = DaemonRdmaOptions::RingMemory;
  const absl::StatusCode refused = absl::StatusCode::kFailedPrecondition;
  EXPECT_TRUE(FallsBackToHostRings(RingMemory::kAuto, false, refused));
  EXPECT_TRUE(FallsBackToHostRings(RingMemory::kAuto, false, absl::StatusCode::kInternal));
  EXPECT_FALSE(FallsBackToHostRings(RingMemory::kGpu, false, refused));  // the caller's error
  EXPECT_FALSE(FallsBackToHostRings(RingMemory::kAuto, true, refused));  // QPs use that memory
  EXPECT_FALSE(FallsBackToHostRings(RingMemory::kAuto, false, absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace mooncake
