// Queue rings in GPU memory (client/src/gpu_rings.h) on a real GPU: the
// allocation is exported as a dmabuf, and the host's own accesses (clearing
// a QP's rings, failing it with a flush CQE when the daemon goes) run on
// the memory's non-blocking stream, so they finish while the application's
// kernels spin on those rings, in a blocking stream or in the legacy
// default stream, instead of waiting behind them (which would hang the
// client's session thread until the kernels time out, or forever). The
// spinning kernel is the consumer: it must see the flush CQE the host wrote
// under it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>

#include "gpu_rings.h"
#include "mooncake/device/mlx5/prm.h"
#include "rdma_control_layout.h"

namespace mooncake {

// The spinning consumer (rings_spin.cu), launched on `stream` (null: the
// legacy default stream).
void LaunchSpinOnCqe(const uint8_t* cqe, uint8_t want_op_own, const int* stop, int* result,
                     cudaStream_t stream);

namespace {

namespace mlx5 = device::mlx5;
constexpr uint32_t kDepth = 8;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << cudaGetErrorString(x)

class GpuRingsOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaFree(nullptr));  // the primary context, current on this thread
    absl::StatusOr<std::shared_ptr<drivers::CudaDriver>> drv = drivers::LoadCudaDriver();
    ASSERT_TRUE(drv.ok()) << drv.status();
    cu_ = *drv;
    drivers::CuDevice dev = 0;
    ASSERT_EQ(cu_->ctxGetDevice(&dev), drivers::kCudaSuccess);
    absl::StatusOr<GpuControlMemory> m =
        AllocateGpuControlMemory(*cu_, dev, 2 * QpControlSlotBytes(kDepth));
    ASSERT_TRUE(m.ok()) << m.status();
    mem_ = *std::move(m);
    CUDA_OK(cudaMalloc(&result_, sizeof(int)));
    CUDA_OK(cudaMemset(result_, 0, sizeof(int)));
    CUDA_OK(cudaHostAlloc(&stop_, sizeof(int), cudaHostAllocMapped));
    *stop_ = 0;
  }
  void TearDown() override {
    if (result_ != nullptr) cudaFree(result_);
    if (stop_ != nullptr) cudaFreeHost(stop_);
    if (cu_) FreeGpuControlMemory(*cu_, mem_);
  }
  uint8_t* At(uint64_t offset) const {
    return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(mem_.base + offset));
  }
  int Result() {
    int r = -1;
    EXPECT_EQ(cudaMemcpy(&r, result_, sizeof(r), cudaMemcpyDeviceToHost), cudaSuccess);
    return r;
  }

  // Slot 1 has posted 5 WQEs and consumed 3 CQEs; a kernel on `stream`
  // waits for the flush CQE while the host writes it, and the host's call
  // must return well before the kernel would give up.
  void FlushUnderASpinningKernel(cudaStream_t stream) {
    ASSERT_TRUE(ClearGpuQueueRings(*cu_, mem_, kDepth, 1).ok());
    const QpControlLayout at = QpControlAt(kDepth, 1);
    const uint32_t sq = mlx5::be32(5), cq = mlx5::be32(3);
    CUDA_OK(cudaMemcpy(At(at.misc + kSqDbrecAt + 4), &sq, 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(At(at.misc + kCqDbrecAt), &cq, 4, cudaMemcpyHostToDevice));
    const uint8_t want =
        static_cast<uint8_t>((mlx5::kCqeReqErr << 4) | mlx5::cqe_expected_owner(3, kDepth));
    LaunchSpinOnCqe(At(at.cq + 3 * mlx5::kCqeBytes), want, nullptr, result_, stream);
    CUDA_OK(cudaGetLastError());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the kernel is spinning
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = FailGpuQueuePairRings(*cu_, mem_, kDepth, 1, 0x123);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_LT(ms, 1000.0) << "the flush waited behind the spinning kernel";
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(Result(), 1) << "1: the kernel saw the flush CQE (WR_FLUSH_ERR); 3: it never came";
    std::printf("flush CQE written in %.3f ms under a spinning kernel\n", ms);
  }

  std::shared_ptr<drivers::CudaDriver> cu_;
  GpuControlMemory mem_;
  int* result_ = nullptr;
  int* stop_ = nullptr;
};

TEST_F(GpuRingsOnGpu, TheAllocationHasADmabufAndItsOwnStream) {
  ASSERT_TRUE(mem_.dmabuf.valid());
  struct stat st {};
  EXPECT_EQ(::fstat(mem_.dmabuf.get(), &st), 0);
  EXPECT_NE(mem_.stream, nullptr);
  EXPECT_GE(mem_.bytes, 2 * QpControlSlotBytes(kDepth));
}

TEST_F(GpuRingsOnGpu, TheFlushReachesAKernelSpinningInABlockingStream) {
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreate(&s));  // blocking: synchronizes with the legacy stream
  FlushUnderASpinningKernel(s);
  CUDA_OK(cudaStreamDestroy(s));
}

TEST_F(GpuRingsOnGpu, TheFlushReachesAKernelSpinningInTheLegacyDefaultStream) {
  FlushUnderASpinningKernel(nullptr);
}

// Clearing a replacement QP's rings while other QPs' kernels run (an
// elastic group re-forming): done without waiting for them.
TEST_F(GpuRingsOnGpu, ClearingRingsDoesNotWaitForRunningKernels) {
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreate(&s));
  // Spins on slot 0's first CQE (cleared: 0xff), which nobody writes, until
  // told to stop.
  ASSERT_TRUE(ClearGpuQueueRings(*cu_, mem_, kDepth, 0).ok());
  LaunchSpinOnCqe(At(QpControlAt(kDepth, 0).cq), 0x5a, stop_, result_, s);
  CUDA_OK(cudaGetLastError());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status cleared = ClearGpuQueueRings(*cu_, mem_, kDepth, 1);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  *reinterpret_cast<volatile int*>(stop_) = 1;
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_TRUE(cleared.ok()) << cleared;
  EXPECT_LT(ms, 1000.0) << "clearing waited behind the running kernel";
  EXPECT_EQ(Result(), 2);
  // The rings read back clean.
  const QpControlLayout at = QpControlAt(kDepth, 1);
  uint8_t cq[kDepth * mlx5::kCqeBytes];
  CUDA_OK(cudaMemcpy(cq, At(at.cq), sizeof(cq), cudaMemcpyDeviceToHost));
  for (uint8_t b : cq) ASSERT_EQ(b, 0xff);
  CUDA_OK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace mooncake
