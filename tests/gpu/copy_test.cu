// Correctness of the CUDA copy primitives (device/.../detail/cuda_copy.cuh)
// on a real GPU: every size class from 1 byte to 1 GiB, odd source and
// destination alignments, thread/warp/block/grid variants, local and over
// NVLink into a peer GPU. Every byte of the destination, plus guard bytes on
// both sides, is checked on the GPU.
//
// Needs a CUDA GPU (two for the peer cases): built only with CUDA and not
// registered with ctest (CI has no GPU); tests/gpu/run.sh runs it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "mooncake/device/detail/cuda_copy.cuh"

using namespace mooncake::device;

namespace {

#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    cudaError_t err_ = (expr);                                                 \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

constexpr size_t kGuard = 64;      // sentinel bytes checked on each side of dst
constexpr size_t kMaxOffset = 16;  // offsets are in [0, 16)
constexpr unsigned char kSentinel = 0xA5;

__host__ __device__ inline unsigned char patternByte(size_t i) {
  // Position-dependent so a shifted, dropped or duplicated byte is caught.
  uint64_t x = i * 0x9E3779B97F4A7C15ull;
  return (unsigned char)((x >> 29) ^ (x >> 47) ^ i);
}

__global__ void fillPattern(unsigned char* p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = patternByte(i);
}

__global__ void fillByte(unsigned char* p, size_t n, unsigned char v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = v;
}

// Checks dst region [0, total): bytes [dst_off, dst_off+n) must equal
// patternByte(src_off + i); all others must still be the sentinel.
struct CheckResult {
  unsigned long long mismatches;
  unsigned long long first;
};
__global__ void checkCopy(const unsigned char* dst, size_t total, size_t dst_off, size_t src_off,
                          size_t n, CheckResult* r) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned char want =
        (i >= dst_off && i < dst_off + n) ? patternByte(src_off + (i - dst_off)) : kSentinel;
    if (dst[i] != want) {
      atomicAdd(&r->mismatches, 1ull);
      atomicMin(&r->first, (unsigned long long)i);
    }
  }
}

__global__ void copyThread(void* d, const void* s, size_t n) {
  if (threadIdx.x == 0 && blockIdx.x == 0) mc_detail_copy_thread(d, s, n);
}
__global__ void copyWarp(void* d, const void* s, size_t n) {
  if (threadIdx.x < 32 && blockIdx.x == 0) mc_detail_copy_warp(d, s, n, threadIdx.x);
}
__global__ void copyBlock(void* d, const void* s, size_t n) {
  if (blockIdx.x == 0) mc_detail_copy_block(d, s, n);
}
// Many blocks, each copying its own slice with the block primitive; slice
// boundaries fall at arbitrary byte positions, as in a put split by blocks.
__global__ void copyBlocksSliced(void* d, const void* s, size_t n) {
  size_t per = (n + gridDim.x - 1) / gridDim.x;
  size_t begin = per * blockIdx.x;
  if (begin >= n) return;
  size_t len = (n - begin < per) ? n - begin : per;
  mc_detail_copy_block(static_cast<char*>(d) + begin, static_cast<const char*>(s) + begin, len);
}
// Many warps of many blocks, each its own slice, as a warp-granular put.
__global__ void copyWarpsSliced(void* d, const void* s, size_t n) {
  size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
  size_t w = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32;
  size_t per = (n + warps - 1) / warps;
  size_t begin = per * w;
  if (begin >= n) return;
  size_t len = (n - begin < per) ? n - begin : per;
  mc_detail_copy_warp(static_cast<char*>(d) + begin, static_cast<const char*>(s) + begin, len,
                      threadIdx.x % 32);
}
// Tiles interleaved over blocks (mc_detail_copy_tiles): a small odd tile so
// small sizes cross tile boundaries, and the default tile.
__global__ void copyTilesSmall(void* d, const void* s, size_t n) {
  mc_detail_copy_tiles(d, s, n, blockIdx.x, gridDim.x, 4112);
}
__global__ void copyTilesDefault(void* d, const void* s, size_t n) {
  mc_detail_copy_tiles(d, s, n, blockIdx.x, gridDim.x);
}
// The whole grid as one group.
__global__ void copyGrid(void* d, const void* s, size_t n) {
  mc_detail_copy_group(d, s, n, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}
// Coherent-load variant with a small unroll, to cover the other template arms.
__global__ void copyBlockCoherent(void* d, const void* s, size_t n) {
  if (blockIdx.x == 0) mc_detail_copy_group<2, false>(d, s, n, threadIdx.x, blockDim.x);
}

enum class Variant {
  kThread,
  kWarp,
  kBlock,
  kBlocksSliced,
  kWarpsSliced,
  kGrid,
  kBlockCoherent,
  kTilesSmall,
  kTilesDefault
};

const char* variantName(Variant v) {
  switch (v) {
    case Variant::kThread: return "Thread";
    case Variant::kWarp: return "Warp";
    case Variant::kBlock: return "Block";
    case Variant::kBlocksSliced: return "BlocksSliced";
    case Variant::kWarpsSliced: return "WarpsSliced";
    case Variant::kGrid: return "Grid";
    case Variant::kBlockCoherent: return "BlockCoherent";
    case Variant::kTilesSmall: return "TilesSmall";
    case Variant::kTilesDefault: return "TilesDefault";
  }
  return "?";
}

void launchCopy(Variant v, void* d, const void* s, size_t n) {
  switch (v) {
    case Variant::kThread: copyThread<<<1, 32>>>(d, s, n); break;
    case Variant::kWarp: copyWarp<<<1, 32>>>(d, s, n); break;
    case Variant::kBlock: copyBlock<<<1, 512>>>(d, s, n); break;
    case Variant::kBlocksSliced: copyBlocksSliced<<<132, 512>>>(d, s, n); break;
    case Variant::kWarpsSliced: copyWarpsSliced<<<132, 256>>>(d, s, n); break;
    case Variant::kGrid: copyGrid<<<264, 256>>>(d, s, n); break;
    case Variant::kBlockCoherent: copyBlockCoherent<<<1, 256>>>(d, s, n); break;
    case Variant::kTilesSmall: copyTilesSmall<<<7, 256>>>(d, s, n); break;
    case Variant::kTilesDefault: copyTilesDefault<<<528, 512>>>(d, s, n); break;
  }
}

// Device buffers shared by all tests of the binary (allocating 2 GiB per
// test would dominate the run time).
struct Buffers {
  int dev_count = 0;
  bool peer = false;                  // device 0 can write device 1's memory
  size_t cap = 0;                     // largest n supported
  unsigned char* src = nullptr;       // device 0
  unsigned char* dst = nullptr;       // device 0
  unsigned char* peer_dst = nullptr;  // device 1, mapped into device 0
  CheckResult* result = nullptr;      // device 0
};
Buffers* g_buf = nullptr;

class CopyEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    g_buf = new Buffers;
    CUDA_OK(cudaGetDeviceCount(&g_buf->dev_count));
    ASSERT_GE(g_buf->dev_count, 1) << "no CUDA device: these tests need a GPU";
    CUDA_OK(cudaSetDevice(0));
    // MC_COPY_TEST_CAP_BYTES bounds the buffers (the sanitizer runs use a
    // small cap; cases above it are skipped, not passed).
    g_buf->cap = (1ull << 30) + 4096;
    if (const char* cap = getenv("MC_COPY_TEST_CAP_BYTES")) g_buf->cap = strtoull(cap, nullptr, 10);
    size_t bytes = g_buf->cap + kMaxOffset + 2 * kGuard;
    CUDA_OK(cudaMalloc(&g_buf->src, bytes));
    CUDA_OK(cudaMalloc(&g_buf->dst, bytes));
    CUDA_OK(cudaMalloc(&g_buf->result, sizeof(CheckResult)));
    fillPattern<<<1024, 256>>>(g_buf->src, bytes);
    CUDA_OK(cudaGetLastError());
    if (g_buf->dev_count >= 2) {
      int can = 0;
      CUDA_OK(cudaDeviceCanAccessPeer(&can, 0, 1));
      if (can) {
        CUDA_OK(cudaDeviceEnablePeerAccess(1, 0));
        CUDA_OK(cudaSetDevice(1));
        CUDA_OK(cudaMalloc(&g_buf->peer_dst, bytes));
        CUDA_OK(cudaSetDevice(0));
        g_buf->peer = true;
      }
    }
    CUDA_OK(cudaDeviceSynchronize());
  }
  void TearDown() override {
    if (!g_buf) return;
    cudaSetDevice(0);
    cudaFree(g_buf->src);
    cudaFree(g_buf->dst);
    cudaFree(g_buf->result);
    if (g_buf->peer_dst) {
      cudaSetDevice(1);
      cudaFree(g_buf->peer_dst);
    }
    delete g_buf;
    g_buf = nullptr;
  }
};

// Copies n bytes from src+kGuard+src_off to dst+kGuard+dst_off and checks the
// whole window [dst, dst + 2*kGuard + kMaxOffset + n).
void runCase(Variant v, size_t n, size_t src_off, size_t dst_off, bool to_peer) {
  ASSERT_NE(g_buf, nullptr);
  if (n > g_buf->cap) GTEST_SKIP() << "n=" << n << " exceeds MC_COPY_TEST_CAP_BYTES=" << g_buf->cap;
  unsigned char* dst_base = to_peer ? g_buf->peer_dst : g_buf->dst;
  ASSERT_NE(dst_base, nullptr);
  const size_t window = n + kMaxOffset + 2 * kGuard;
  fillByte<<<1024, 256>>>(dst_base, window, kSentinel);  // peer memory, written over NVLink
  CUDA_OK(cudaGetLastError());
  const size_t s_at = kGuard + src_off;
  launchCopy(v, dst_base + kGuard + dst_off, g_buf->src + s_at, n);
  CUDA_OK(cudaGetLastError());
  CheckResult init{0, ~0ull};
  CUDA_OK(cudaMemcpy(g_buf->result, &init, sizeof(init), cudaMemcpyHostToDevice));
  checkCopy<<<1024, 256>>>(dst_base, window, kGuard + dst_off, s_at, n, g_buf->result);
  CUDA_OK(cudaGetLastError());
  CheckResult r;
  CUDA_OK(cudaMemcpy(&r, g_buf->result, sizeof(r), cudaMemcpyDeviceToHost));
  EXPECT_EQ(r.mismatches, 0u) << variantName(v) << " n=" << n << " src_off=" << src_off
                              << " dst_off=" << dst_off << (to_peer ? " (peer)" : "")
                              << ": first bad byte at window offset " << r.first
                              << " (copy starts at " << kGuard + dst_off << ")";
}

struct Case {
  Variant variant;
  size_t n;
  size_t src_off;
  size_t dst_off;
  bool peer;
};

std::string caseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(variantName(c.variant)) + "_n" + std::to_string(c.n) + "_s" +
         std::to_string(c.src_off) + "_d" + std::to_string(c.dst_off) + (c.peer ? "_peer" : "");
}

// Offsets chosen to hit: both aligned, same misalignment, every word shift
// (1..3 bytes, 4/8/12 bytes) and the largest one.
const size_t kOffsets[][2] = {{0, 0}, {1, 1}, {0, 1},  {1, 0},  {3, 8},
                              {4, 0}, {8, 3}, {12, 0}, {15, 2}, {5, 15}};

std::vector<Case> smallCases() {
  const size_t sizes[] = {0,   1,   2,   3,    7,    15,   16,   17,   31,   32,
                          33,  47,  48,  49,   63,   64,   65,   95,   127,  128,
                          129, 255, 511, 1000, 4095, 4096, 4097, 8191, 65543};
  std::vector<Case> out;
  for (Variant v : {Variant::kThread, Variant::kWarp, Variant::kBlock, Variant::kBlocksSliced,
                    Variant::kWarpsSliced, Variant::kGrid, Variant::kBlockCoherent,
                    Variant::kTilesSmall, Variant::kTilesDefault})
    for (size_t n : sizes)
      for (auto& o : kOffsets) out.push_back({v, n, o[0], o[1], false});
  return out;
}

std::vector<Case> largeCases() {
  std::vector<Case> out;
  // Up to 16 MiB for the single-thread/warp/block variants (they are slow on
  // purpose: one thread moves everything), up to 1 GiB for the grid ones.
  for (Variant v : {Variant::kThread, Variant::kWarp, Variant::kBlock, Variant::kBlockCoherent})
    for (size_t n : {(size_t)1 << 20, ((size_t)1 << 20) + 3, ((size_t)16 << 20) + 5})
      for (int k : {0, 2, 4}) {
        if (v == Variant::kThread && n > ((size_t)1 << 20) + 3) continue;
        out.push_back({v, n, kOffsets[k][0], kOffsets[k][1], false});
      }
  for (Variant v : {Variant::kBlocksSliced, Variant::kWarpsSliced, Variant::kGrid,
                    Variant::kTilesSmall, Variant::kTilesDefault})
    for (size_t n : {((size_t)16 << 20) + 1, ((size_t)256 << 20) + 7, (size_t)1 << 30})
      for (int k : {0, 2, 6}) out.push_back({v, n, kOffsets[k][0], kOffsets[k][1], false});
  return out;
}

std::vector<Case> peerCases() {
  std::vector<Case> out;
  for (Variant v : {Variant::kThread, Variant::kWarp, Variant::kBlock})
    for (size_t n : {(size_t)1, (size_t)17, (size_t)4096, (size_t)65543})
      for (int k : {0, 2, 8}) out.push_back({v, n, kOffsets[k][0], kOffsets[k][1], true});
  for (Variant v :
       {Variant::kBlocksSliced, Variant::kWarpsSliced, Variant::kGrid, Variant::kTilesDefault})
    for (size_t n : {(size_t)4097, ((size_t)16 << 20) + 3, (size_t)256 << 20})
      for (int k : {0, 2, 8}) out.push_back({v, n, kOffsets[k][0], kOffsets[k][1], true});
  return out;
}

class CopySmall : public ::testing::TestWithParam<Case> {};
class CopyLarge : public ::testing::TestWithParam<Case> {};
class CopyPeer : public ::testing::TestWithParam<Case> {};

TEST_P(CopySmall, EveryByte) {
  const Case& c = GetParam();
  runCase(c.variant, c.n, c.src_off, c.dst_off, false);
}
TEST_P(CopyLarge, EveryByte) {
  const Case& c = GetParam();
  runCase(c.variant, c.n, c.src_off, c.dst_off, false);
}
TEST_P(CopyPeer, EveryByte) {
  if (!g_buf->peer) GTEST_SKIP() << "needs two GPUs with peer access";
  const Case& c = GetParam();
  runCase(c.variant, c.n, c.src_off, c.dst_off, true);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CopySmall, ::testing::ValuesIn(smallCases()), caseName);
INSTANTIATE_TEST_SUITE_P(Sizes, CopyLarge, ::testing::ValuesIn(largeCases()), caseName);
INSTANTIATE_TEST_SUITE_P(Sizes, CopyPeer, ::testing::ValuesIn(peerCases()), caseName);

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new CopyEnvironment);
  return RUN_ALL_TESTS();
}
