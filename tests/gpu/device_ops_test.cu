// The Device API (mooncake/device/comm_device.h) on two real GPUs joined by
// NVLink, one process: puts + signals with the receiver checking every byte,
// relaxed signals after mc_fence, LL slots, concurrent mc_red_add from many
// blocks of both GPUs (no lost increments), wait timeouts, routing errors.
// CommCtx tables are filled by hand from cudaMalloc'd buffers with peer
// access, as P2pTransport would fill them.
//
// Needs two GPUs with peer access; not registered with ctest (CI has no
// GPU); tests/gpu/run.sh runs it on the GPU machine.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "mooncake/device/comm_device.h"

using namespace mooncake::device;

namespace {

#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    cudaError_t err_ = (expr);                                                 \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

constexpr uint64_t kTimeoutNs = 5000000000ull;  // a protocol bug fails, it does not hang
constexpr size_t kSymBytes = 64ull << 20;

// Symmetric layout (same offsets on both ranks).
constexpr size_t kOffFlag = 0;           // u64 data-ready flag (written by the peer)
constexpr size_t kOffAck = 256;          // u64 ack flag (written by the peer)
constexpr size_t kOffCounter = 512;      // u64 red_add counter
constexpr size_t kOffCounter32 = 768;    // u32 red_add counter
constexpr size_t kOffSlot = 1024;        // McLLSlot
constexpr size_t kOffStatus = 2048;      // int32 McStatus results
constexpr size_t kOffData = 1ull << 20;  // put landing zone (up to 16 MiB + 64)
constexpr size_t kOffSrc = 32ull << 20;  // two source patterns of up to 16 MiB

struct Result {
  unsigned long long errors;
  unsigned long long timeouts;
  unsigned long long first_bad;
};

__host__ __device__ inline uint8_t pattern(uint64_t seq, size_t i) {
  return (uint8_t)((i * 131u + seq * 17u) ^ (i >> 9));
}

__global__ void fillSrc(char* base, size_t n, uint64_t seq) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    base[i] = (char)pattern(seq, i);
}

enum class Granularity { kThread, kWarp, kBlock };

// Rank 0: for seq = 1..iters: wait for the ack of seq-1, put n bytes of
// pattern seq (source buffer seq&1, filled before launch) at dst_off, then
// signal seq. `relaxed`: mc_fence + mc_signal_relaxed instead of mc_signal.
__global__ void __launch_bounds__(1024) sender(CommCtx ctx, size_t dst_off, size_t n, int iters,
                                               Granularity g, bool relaxed, Result* r) {
  char* base = static_cast<char*>(ctx.p2p.local_base);
  auto* ack = reinterpret_cast<uint64_t*>(base + kOffAck);
  auto* flag_sym = reinterpret_cast<uint64_t*>(base + kOffFlag);
  __shared__ int stop;
  for (int seq = 1; seq <= iters; ++seq) {
    if (threadIdx.x == 0) {
      uint64_t seen = 0;
      stop = !mc_wait_until_for(ack, McCmp::kGe, (uint64_t)(seq - 1), kTimeoutNs, &seen);
      if (stop) atomicAdd(&r->timeouts, 1ull);
    }
    __syncthreads();
    if (stop) return;
    const char* src = base + kOffSrc + (seq & 1) * (16ull << 20) + dst_off % 16;
    McStatus st = McStatus::kOk;
    if (g == Granularity::kBlock) {
      st = mc_put_block(ctx, 1, base + kOffData + dst_off, src, n);
    } else if (g == Granularity::kWarp) {
      if (threadIdx.x < 32)
        st = mc_put_warp(ctx, 1, base + kOffData + dst_off, src, n, threadIdx.x);
      __syncthreads();
    } else {
      if (threadIdx.x == 0) st = mc_put_thread(ctx, 1, base + kOffData + dst_off, src, n);
      __syncthreads();
    }
    if (st != McStatus::kOk) atomicAdd(&r->errors, 1ull);
    if (threadIdx.x == 0) {
      // mc_put_warp/_block end with a barrier, and the thread put is this
      // thread's own: one release (or fence + relaxed) covers every byte.
      if (relaxed) {
        mc_fence();
        mc_signal_relaxed(ctx, 1, flag_sym, (uint64_t)seq);
      } else {
        mc_signal(ctx, 1, flag_sym, (uint64_t)seq);
      }
    }
  }
}

// Rank 1: waits for each seq, checks all n bytes against pattern seq (the
// source was offset by dst_off%16 so src and dst alignments differ), acks.
__global__ void receiver(CommCtx ctx, size_t dst_off, size_t n, int iters, Result* r) {
  char* base = static_cast<char*>(ctx.p2p.local_base);
  auto* flag = reinterpret_cast<uint64_t*>(base + kOffFlag);
  auto* ack_sym = reinterpret_cast<uint64_t*>(base + kOffAck);
  const volatile uint8_t* data =
      reinterpret_cast<const volatile uint8_t*>(base + kOffData + dst_off);
  __shared__ int stop;
  __shared__ unsigned long long bad;
  for (int seq = 1; seq <= iters; ++seq) {
    if (threadIdx.x == 0) {
      uint64_t seen = 0;
      stop = !mc_wait_until_for(flag, McCmp::kEq, (uint64_t)seq, kTimeoutNs, &seen);
      if (stop) atomicAdd(&r->timeouts, 1ull);
      bad = 0;
    }
    __syncthreads();
    if (stop) return;
    unsigned long long local_bad = 0;
    const size_t src_shift = dst_off % 16;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
      if (data[i] != pattern(seq & 1 ? 1 : 2, i + src_shift)) {
        ++local_bad;
        atomicMin(&r->first_bad, (unsigned long long)i);
      }
    if (local_bad) atomicAdd(&bad, local_bad);
    __syncthreads();
    if (threadIdx.x == 0) {
      if (bad) atomicAdd(&r->errors, bad);
      mc_signal(ctx, 0, ack_sym, (uint64_t)seq);
    }
  }
}

// Every thread of every block adds 1 `per_thread` times to the counter at
// rank `dst` (mixing remote adds from GPU0 with local adds on GPU1).
__global__ void redAdder(CommCtx ctx, int dst, int per_thread, Result* r) {
  char* base = static_cast<char*>(ctx.p2p.local_base);
  auto* c64 = reinterpret_cast<unsigned long long*>(base + kOffCounter);
  auto* c32 = reinterpret_cast<uint32_t*>(base + kOffCounter32);
  for (int i = 0; i < per_thread; ++i) {
    if (mc_red_add(ctx, dst, c64, 1ull) != McStatus::kOk) atomicAdd(&r->errors, 1ull);
    if (mc_red_add(ctx, dst, c32, 2u) != McStatus::kOk) atomicAdd(&r->errors, 1ull);
  }
}

// LL ping-pong: rank 0 sends (data(seq), seq) to rank 1's slot, rank 1
// checks and answers into rank 0's slot.
__device__ inline uint64_t llData(uint64_t seq) { return seq * 0x9E3779B97F4A7C15ull + 7; }
__global__ void llPingPong(CommCtx ctx, int iters, Result* r) {
  char* base = static_cast<char*>(ctx.p2p.local_base);
  auto* slot = reinterpret_cast<McLLSlot*>(base + kOffSlot);
  const int peer = 1 - ctx.rank;
  for (int seq = 1; seq <= iters; ++seq) {
    if (ctx.rank == 0) mc_put_signal_ll(ctx, peer, slot, llData(seq), (uint32_t)seq);
    uint64_t d = 0;
    const uint64_t start = mc_time_ns();
    while (!mc_poll_ll(slot, (uint32_t)seq, &d)) {
      if (mc_time_ns() - start > kTimeoutNs) {
        atomicAdd(&r->timeouts, 1ull);
        return;
      }
    }
    if (d != llData(seq)) atomicAdd(&r->errors, 1ull);
    if (ctx.rank == 1) mc_put_signal_ll(ctx, peer, slot, llData(seq), (uint32_t)seq);
  }
}

__global__ void waitTimesOut(CommCtx ctx, Result* r) {
  char* base = static_cast<char*>(ctx.p2p.local_base);
  auto* flag = reinterpret_cast<uint64_t*>(base + kOffFlag);
  uint64_t seen = 123;
  bool ok = mc_wait_until_for(flag, McCmp::kGe, (uint64_t)1, 2000000ull /* 2 ms */, &seen);
  if (ok) atomicAdd(&r->errors, 1ull);
  if (seen != 0) atomicAdd(&r->errors, 1ull);
}

// Routing errors are uniform return values and write nothing.
__global__ void routeErrors(CommCtx ctx, int32_t* status) {
  char* base = static_cast<char*>(ctx.p2p.local_base);
  McStatus a = mc_put_block(ctx, 7, base + kOffData, base + kOffSrc, 4096);
  McStatus b = mc_put_block(ctx, -1, base + kOffData, base + kOffSrc, 4096);
  McStatus c = mc_signal(ctx, 1, reinterpret_cast<uint64_t*>(base + kOffFlag), (uint64_t)9);
  McStatus d = mc_put_block(ctx, 0, base + kOffData, base + kOffSrc, 4096);  // self
  if (threadIdx.x == 0) {
    status[0] = (int32_t)a;
    status[1] = (int32_t)b;
    status[2] = (int32_t)c;
    status[3] = (int32_t)d;
  }
}

struct Rank {
  char* sym = nullptr;
  void** peer_ptrs = nullptr;
  int32_t* available = nullptr;
  Result* result = nullptr;
  cudaStream_t stream = nullptr;
  CommCtx ctx;
};

class DeviceOps : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) return;
    int can01 = 0, can10 = 0;
    cudaDeviceCanAccessPeer(&can01, 0, 1);
    cudaDeviceCanAccessPeer(&can10, 1, 0);
    if (!can01 || !can10) return;
    for (int d = 0; d < 2; ++d) {
      cudaSetDevice(d);
      cudaError_t e = cudaDeviceEnablePeerAccess(1 - d, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) return;
      cudaGetLastError();
      if (cudaMalloc(&ranks_[d].sym, kSymBytes) != cudaSuccess) return;
      cudaMalloc(&ranks_[d].peer_ptrs, 2 * sizeof(void*));
      cudaMalloc(&ranks_[d].available, 2 * sizeof(int32_t));
      cudaMalloc(&ranks_[d].result, sizeof(Result));
      cudaStreamCreateWithFlags(&ranks_[d].stream, cudaStreamNonBlocking);
    }
    void* ptrs[2] = {ranks_[0].sym, ranks_[1].sym};
    int32_t avail[2] = {1, 1};
    for (int d = 0; d < 2; ++d) {
      cudaSetDevice(d);
      cudaMemcpy(ranks_[d].peer_ptrs, ptrs, sizeof ptrs, cudaMemcpyHostToDevice);
      cudaMemcpy(ranks_[d].available, avail, sizeof avail, cudaMemcpyHostToDevice);
      CommCtx& c = ranks_[d].ctx;
      c.rank = d;
      c.num_ranks = 2;
      c.p2p.available = ranks_[d].available;
      c.p2p.peer_ptrs = ranks_[d].peer_ptrs;
      c.p2p.local_base = ranks_[d].sym;
    }
    ready_ = cudaDeviceSynchronize() == cudaSuccess;
  }

  void SetUp() override {
    if (!ready_) GTEST_SKIP() << "needs two GPUs with peer access";
    for (int d = 0; d < 2; ++d) {
      CUDA_OK(cudaSetDevice(d));
      CUDA_OK(cudaMemset(ranks_[d].sym, 0, kOffSrc));  // flags, slots, landing zone
      Result init{0, 0, ~0ull};
      CUDA_OK(cudaMemcpy(ranks_[d].result, &init, sizeof init, cudaMemcpyHostToDevice));
      CUDA_OK(cudaDeviceSynchronize());
    }
  }

  Result result(int d) {
    Result r{};
    cudaSetDevice(d);
    cudaMemcpy(&r, ranks_[d].result, sizeof r, cudaMemcpyDeviceToHost);
    return r;
  }

  // Waits for both GPUs before judging either, so a failed launch on one
  // side never leaves the other side's kernel running into the next test.
  void syncBoth() {
    cudaError_t e[2][2];
    for (int d = 0; d < 2; ++d) {
      cudaSetDevice(d);
      e[d][0] = cudaStreamSynchronize(ranks_[d].stream);
      e[d][1] = cudaGetLastError();
    }
    for (int d = 0; d < 2; ++d) {
      EXPECT_EQ(e[d][0], cudaSuccess) << "GPU" << d << ": " << cudaGetErrorString(e[d][0]);
      EXPECT_EQ(e[d][1], cudaSuccess) << "GPU" << d << ": " << cudaGetErrorString(e[d][1]);
    }
  }

  void putSignal(Granularity g, size_t n, size_t dst_off, int iters, bool relaxed,
                 unsigned threads) {
    ASSERT_LE(n + dst_off, 16ull << 20);
    CUDA_OK(cudaSetDevice(0));
    fillSrc<<<264, 256>>>(ranks_[0].sym + kOffSrc + (16ull << 20), (16ull << 20), 1);  // odd seqs
    fillSrc<<<264, 256>>>(ranks_[0].sym + kOffSrc, (16ull << 20), 2);                  // even seqs
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaSetDevice(1));
    receiver<<<1, 512, 0, ranks_[1].stream>>>(ranks_[1].ctx, dst_off, n, iters, ranks_[1].result);
    CUDA_OK(cudaSetDevice(0));
    // A failed sender launch must not leave the receiver waiting: check it
    // before anything else.
    sender<<<1, threads, 0, ranks_[0].stream>>>(ranks_[0].ctx, dst_off, n, iters, g, relaxed,
                                                ranks_[0].result);
    syncBoth();
    Result s = result(0), r = result(1);
    EXPECT_EQ(s.timeouts + r.timeouts, 0u);
    EXPECT_EQ(s.errors, 0u) << "put returned an error status";
    EXPECT_EQ(r.errors, 0u) << "receiver saw wrong bytes after the signal; first bad offset "
                            << r.first_bad;
  }

  static inline Rank ranks_[2];
  static inline bool ready_ = false;
};

TEST_F(DeviceOps, PutBlockSignalSmallOdd) {
  putSignal(Granularity::kBlock, 4097, 3, 200, false, 512);
}
TEST_F(DeviceOps, PutBlockSignal1MiB) {
  putSignal(Granularity::kBlock, (1u << 20) + 5, 1, 100, false, 1024);
}
TEST_F(DeviceOps, PutBlockSignal16MiB) {
  putSignal(Granularity::kBlock, 16u << 20, 0, 10, false, 512);
}
TEST_F(DeviceOps, PutWarpSignal) { putSignal(Granularity::kWarp, 65536 + 13, 7, 200, false, 64); }
TEST_F(DeviceOps, PutThreadSignal) { putSignal(Granularity::kThread, 1000, 5, 200, false, 32); }
TEST_F(DeviceOps, PutThreadOneByte) { putSignal(Granularity::kThread, 1, 0, 500, false, 32); }
TEST_F(DeviceOps, FenceThenRelaxedSignal) {
  putSignal(Granularity::kBlock, 256 * 1024 + 9, 2, 200, true, 512);
}
TEST_F(DeviceOps, FenceThenRelaxedSignalThread) {
  putSignal(Granularity::kThread, 777, 11, 300, true, 32);
}

TEST_F(DeviceOps, RedAddFromManyBlocksOfBothGpusLosesNothing) {
  const int blocks = 264, threads = 256, per = 16;
  // GPU0 adds remotely to rank 1's counters while GPU1 adds locally to them.
  CUDA_OK(cudaSetDevice(1));
  redAdder<<<blocks, threads, 0, ranks_[1].stream>>>(ranks_[1].ctx, 1, per, ranks_[1].result);
  CUDA_OK(cudaSetDevice(0));
  redAdder<<<blocks, threads, 0, ranks_[0].stream>>>(ranks_[0].ctx, 1, per, ranks_[0].result);
  syncBoth();
  unsigned long long c64 = 0;
  uint32_t c32 = 0;
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaMemcpy(&c64, ranks_[1].sym + kOffCounter, 8, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&c32, ranks_[1].sym + kOffCounter32, 4, cudaMemcpyDeviceToHost));
  const unsigned long long expect = 2ull * blocks * threads * per;
  EXPECT_EQ(c64, expect);
  EXPECT_EQ(c32, (uint32_t)(2 * expect));
  EXPECT_EQ(result(0).errors + result(1).errors, 0u);
}

TEST_F(DeviceOps, LLPingPongCarriesData) {
  CUDA_OK(cudaSetDevice(1));
  llPingPong<<<1, 1, 0, ranks_[1].stream>>>(ranks_[1].ctx, 20000, ranks_[1].result);
  CUDA_OK(cudaSetDevice(0));
  llPingPong<<<1, 1, 0, ranks_[0].stream>>>(ranks_[0].ctx, 20000, ranks_[0].result);
  syncBoth();
  Result a = result(0), b = result(1);
  EXPECT_EQ(a.timeouts + b.timeouts, 0u);
  EXPECT_EQ(a.errors + b.errors, 0u);
}

TEST_F(DeviceOps, WaitUntilForTimesOut) {
  CUDA_OK(cudaSetDevice(0));
  waitTimesOut<<<1, 1, 0, ranks_[0].stream>>>(ranks_[0].ctx, ranks_[0].result);
  syncBoth();
  EXPECT_EQ(result(0).errors, 0u);
}

TEST_F(DeviceOps, RouteErrorsWriteNothing) {
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaMemset(ranks_[1].sym + kOffData, 0, 4096));
  CUDA_OK(cudaSetDevice(0));
  fillSrc<<<16, 256>>>(ranks_[0].sym + kOffSrc, 4096, 3);
  // Rank 1 marked unreachable by P2P: the route falls to RDMA, not built.
  int32_t avail[2] = {1, 0};
  CUDA_OK(cudaMemcpy(ranks_[0].available, avail, sizeof avail, cudaMemcpyHostToDevice));
  int32_t* status = reinterpret_cast<int32_t*>(ranks_[0].sym + kOffStatus);
  routeErrors<<<1, 128>>>(ranks_[0].ctx, status);
  CUDA_OK(cudaDeviceSynchronize());
  int32_t st[4];
  CUDA_OK(cudaMemcpy(st, status, sizeof st, cudaMemcpyDeviceToHost));
  int32_t all[2] = {1, 1};
  CUDA_OK(cudaMemcpy(ranks_[0].available, all, sizeof all, cudaMemcpyHostToDevice));
  EXPECT_EQ(st[0], (int32_t)McStatus::kInvalidRank);
  EXPECT_EQ(st[1], (int32_t)McStatus::kInvalidRank);
  EXPECT_EQ(st[2], (int32_t)McStatus::kRdmaNotImplemented);
  EXPECT_EQ(st[3], (int32_t)McStatus::kOk);
  // Nothing reached rank 1; the self put landed locally.
  std::vector<uint8_t> remote(4096), local(4096);
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaMemcpy(remote.data(), ranks_[1].sym + kOffData, 4096, cudaMemcpyDeviceToHost));
  uint64_t flag1 = 1;
  CUDA_OK(cudaMemcpy(&flag1, ranks_[1].sym + kOffFlag, 8, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaMemcpy(local.data(), ranks_[0].sym + kOffData, 4096, cudaMemcpyDeviceToHost));
  size_t remote_nonzero = 0, local_bad = 0;
  for (size_t i = 0; i < 4096; ++i) {
    remote_nonzero += remote[i] != 0;
    local_bad += local[i] != pattern(3, i);
  }
  EXPECT_EQ(remote_nonzero, 0u);
  EXPECT_EQ(flag1, 0u);
  EXPECT_EQ(local_bad, 0u);
}

}  // namespace
