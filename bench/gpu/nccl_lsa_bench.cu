// NCCL device-API baseline for the P2P put, GPU0 -> GPU1: a kernel on GPU0
// takes the peer's address from a symmetric NCCL window (ncclGetLsaPointer)
// and copies into it with plain 16-byte stores. Set beside p2p_put_bench (the
// Mooncake primitives) and nvshmem_bench; cudaMemcpyPeerAsync on the same
// buffers is measured in this program as the reference.
//
// The kernel inlines NCCL's device structures (ncclWindow_vidmem), so this is
// built on the GPU machine against that machine's NCCL (tests/gpu/run.sh):
//   nvcc -std=c++17 -O3 -arch=sm_90 nccl_lsa_bench.cu -o nccl_lsa_bench -lnccl
//   NCCL_NVLS_ENABLE=0 ./nccl_lsa_bench [--reps N] [--max-bytes N]
// One process drives both GPUs (ncclCommInitAll); every collective setup call
// is issued for both ranks inside one ncclGroupStart/End.
// Exit status 0 only when every put was verified on GPU1.
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.cuh"

using mcbench::median;
using mcbench::sizeName;

#define BENCH_NCCL(expr)                                                             \
  do {                                                                               \
    ncclResult_t r_ = (expr);                                                        \
    if (r_ != ncclSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #expr, \
                   ncclGetErrorString(r_), ncclGetLastError(nullptr));               \
      std::exit(2);                                                                  \
    }                                                                                \
  } while (0)

namespace {

constexpr uint32_t kSeed = 0x5eedu;

__host__ __device__ __forceinline__ uint32_t patternWord(size_t i) {
  return (uint32_t)(i * 2654435761u) ^ kSeed;
}

__global__ void fillPattern(uint32_t* p, size_t words) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = patternWord(i);
}

// Runs on GPU1 over its own memory: the expected bytes are recomputed from
// the pattern, so the check reads nothing across the link.
__global__ void countMismatches(const uint32_t* p, size_t words, unsigned long long* bad) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words;
       i += (size_t)gridDim.x * blockDim.x)
    local += p[i] != patternWord(i);
  if (local) atomicAdd(bad, local);
}

// The put under test. Every thread resolves the peer's address through the
// window itself (ncclGetLsaPointer reads the window's flat LSA base and
// stride), as a kernel written against NCCL's device API would; the source is
// this rank's own slot of the same window. Grid-stride over 16-byte units,
// kUnroll loads in flight per thread before their stores.
template <int kUnroll>
__global__ void lsaPut(ncclWindow_t win, int peer, size_t offset, size_t n) {
  const char* src = static_cast<const char*>(ncclGetLocalPointer(win, offset));
  char* dst = static_cast<char*>(ncclGetLsaPointer(win, offset, peer));
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  const size_t nvec = n / 16;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  const size_t step = stride * kUnroll;
  const size_t full = nvec - nvec % step;
  for (size_t base = tid; base < full; base += step) {
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(s + base + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[base + u * stride] = v[u];
  }
  for (size_t i = full + tid; i < nvec; i += stride) d[i] = __ldg(s + i);
  for (size_t i = nvec * 16 + tid; i < n; i += stride) dst[i] = src[i];
}

struct Options {
  int reps = 9;
  size_t max_bytes = 1ull << 30;
};

struct Ctx {
  Options opt;
  ncclComm_t comms[2] = {nullptr, nullptr};
  ncclWindow_t wins[2] = {nullptr, nullptr};
  ncclDevComm dev[2];
  char* buf[2] = {nullptr, nullptr};  // ncclMemAlloc'd, the window of each rank
  cudaStream_t s0 = nullptr, s1 = nullptr;
  unsigned long long* bad1 = nullptr;  // on GPU1
  int failures = 0;
};

// Same batching as p2p_put_bench: about 256 MiB per rep, 1..2000 operations.
int itersFor(size_t n) {
  size_t it = (256ull << 20) / n;
  if (it < 1) it = 1;
  if (it > 2000) it = 2000;
  return (int)it;
}

// Block count for a size: at most max_blocks, and none with less than
// min_bytes (as p2p_put_bench's blocksFor, so the rows compare).
unsigned blocksFor(size_t n, unsigned max_blocks, size_t min_bytes) {
  size_t b = (n + min_bytes - 1) / min_bytes;
  if (b < 1) b = 1;
  return (unsigned)(b < max_blocks ? b : max_blocks);
}

double timeOp(Ctx& c, size_t n, const std::function<void()>& op) {
  BENCH_CUDA(cudaSetDevice(0));
  const int iters = itersFor(n);
  for (int i = 0; i < 2; ++i) op();  // warm-up
  BENCH_CUDA(cudaStreamSynchronize(c.s0));
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  std::vector<double> gbps;
  for (int r = 0; r < c.opt.reps; ++r) {
    BENCH_CUDA(cudaEventRecord(a, c.s0));
    for (int i = 0; i < iters; ++i) op();
    BENCH_CUDA(cudaEventRecord(b, c.s0));
    BENCH_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    gbps.push_back((double)n * iters / (ms * 1e-3) / 1e9);
  }
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaStreamSynchronize(c.s0));
  return median(gbps);
}

void clearDst(Ctx& c, size_t n) {
  BENCH_CUDA(cudaSetDevice(1));
  BENCH_CUDA(cudaMemsetAsync(c.buf[1], 0, n, c.s1));
  BENCH_CUDA(cudaStreamSynchronize(c.s1));
}

bool verify(Ctx& c, const std::string& name, size_t n) {
  BENCH_CUDA(cudaSetDevice(1));
  BENCH_CUDA(cudaMemsetAsync(c.bad1, 0, sizeof(unsigned long long), c.s1));
  countMismatches<<<264, 512, 0, c.s1>>>(reinterpret_cast<const uint32_t*>(c.buf[1]), n / 4,
                                         c.bad1);
  BENCH_CUDA(cudaGetLastError());
  unsigned long long bad = 0;
  BENCH_CUDA(cudaMemcpyAsync(&bad, c.bad1, sizeof bad, cudaMemcpyDeviceToHost, c.s1));
  BENCH_CUDA(cudaStreamSynchronize(c.s1));
  if (bad) {
    std::fprintf(stderr, "VERIFY FAILED: %s at %s: %llu of %zu words differ on GPU1\n",
                 name.c_str(), sizeName(n).c_str(), bad, n / 4);
    ++c.failures;
    return false;
  }
  return true;
}

using Launch = std::function<void(size_t n)>;

struct Design {
  std::string name;
  Launch launch;
};

Design lsaDesign(Ctx& c, int unroll, unsigned threads, unsigned max_blocks) {
  char name[128];
  std::snprintf(name, sizeof name, "NCCL device API LSA put, grid-stride int4 U=%d T=%u B=%u",
                unroll, threads, max_blocks);
  ncclWindow_t win = c.wins[0];
  cudaStream_t s = c.s0;
  const size_t min_bytes = (size_t)threads * 16 * unroll;
  Launch l = [=](size_t n) {
    unsigned b = blocksFor(n, max_blocks, min_bytes);
    switch (unroll) {
      case 2: lsaPut<2><<<b, threads, 0, s>>>(win, 1, 0, n); break;
      case 4: lsaPut<4><<<b, threads, 0, s>>>(win, 1, 0, n); break;
      case 8: lsaPut<8><<<b, threads, 0, s>>>(win, 1, 0, n); break;
      default: std::fprintf(stderr, "unsupported unroll %d\n", unroll); std::exit(2);
    }
  };
  return Design{name, l};
}

void printRow(const std::string& name, const std::vector<double>& g,
              const std::vector<double>* base) {
  std::printf("| %s |", name.c_str());
  for (size_t i = 0; i < g.size(); ++i) {
    if (base && (*base)[i] > 0)
      std::printf(" %.1f (%.2fx) |", g[i], g[i] / (*base)[i]);
    else
      std::printf(" %.1f |", g[i]);
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      opt.reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--max-bytes") && i + 1 < argc)
      opt.max_bytes = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--max-bytes N]\n", argv[0]);
      return 2;
    }
  }
  // A symmetric window needs equal, 4 KiB-aligned sizes on every rank.
  const size_t cap =
      (opt.max_bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) & ~size_t(NCCL_WIN_REQUIRED_ALIGNMENT - 1);
  if (opt.reps < 1 || cap < 4096) {
    std::fprintf(stderr, "--reps must be >= 1 and --max-bytes >= 4096\n");
    return 2;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast stays off (shared/gpu.md)
  int ndev = 0;
  BENCH_CUDA(cudaGetDeviceCount(&ndev));
  if (ndev < 2) {
    std::fprintf(stderr, "nccl_lsa_bench needs 2 GPUs, found %d\n", ndev);
    return 2;
  }
  // Peer access as in p2p_put_bench, so that the cudaMemcpyPeerAsync
  // reference is the same direct copy-engine path as in that table.
  if (!mcbench::enablePeer(0, 1)) {
    std::fprintf(stderr,
                 "GPU0 and GPU1 cannot access each other (no P2P): no LSA team to measure\n");
    return 2;
  }
  mcbench::printDevice(0);
  mcbench::printDevice(1);

  Ctx c;
  c.opt = opt;
  int devs[2] = {0, 1};
  BENCH_NCCL(ncclCommInitAll(c.comms, 2, devs));
  int lib_version = 0;
  BENCH_NCCL(ncclGetVersion(&lib_version));
  std::printf("# NCCL library %d, headers %d (NCCL_NVLS_ENABLE=%s)\n", lib_version,
              NCCL_VERSION_CODE, getenv("NCCL_NVLS_ENABLE"));
  if (lib_version != NCCL_VERSION_CODE)
    std::printf(
        "# WARNING: built against NCCL %d but running %d: the kernel inlines ncclWindow_vidmem of "
        "the "
        "headers; rebuild against the running library\n",
        NCCL_VERSION_CODE, lib_version);

  for (int r = 0; r < 2; ++r) {
    BENCH_CUDA(cudaSetDevice(r));
    BENCH_NCCL(ncclMemAlloc(reinterpret_cast<void**>(&c.buf[r]), cap));
  }
  // Window registration and device-communicator creation are collective:
  // with one thread driving both ranks they must be grouped, or the first
  // rank's call would wait for the second forever.
  BENCH_NCCL(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    BENCH_NCCL(
        ncclCommWindowRegister(c.comms[r], c.buf[r], cap, &c.wins[r], NCCL_WIN_COLL_SYMMETRIC));
  BENCH_NCCL(ncclGroupEnd());
  // No barriers, multimem or GIN resources: the put needs only the window.
  // Zero-filled because 2.28 has no requirements initializer macro.
  ncclDevCommRequirements reqs;
  std::memset(&reqs, 0, sizeof reqs);
  std::memset(c.dev, 0, sizeof c.dev);
  BENCH_NCCL(ncclGroupStart());
  for (int r = 0; r < 2; ++r) BENCH_NCCL(ncclDevCommCreate(c.comms[r], &reqs, &c.dev[r]));
  BENCH_NCCL(ncclGroupEnd());
  std::printf(
      "# device comm rank 0: rank %d of %d, LSA rank %d of %d; window %zu bytes per rank "
      "(ncclMemAlloc)\n",
      c.dev[0].rank, c.dev[0].nRanks, c.dev[0].lsaRank, c.dev[0].lsaSize, cap);
  if (c.dev[0].lsaSize < 2 || c.dev[1].lsaSize < 2) {
    std::fprintf(
        stderr,
        "GPU1 is not in GPU0's LSA team (lsaSize %d): NCCL cannot give a load/store pointer\n",
        c.dev[0].lsaSize);
    return 2;
  }
  const int peer_lsa = c.dev[1].lsaRank;  // ranks 0/1 of one process: LSA rank == world rank
  if (peer_lsa != 1) {
    std::fprintf(stderr, "unexpected LSA rank %d for world rank 1\n", peer_lsa);
    return 2;
  }

  BENCH_CUDA(cudaSetDevice(0));
  BENCH_CUDA(cudaStreamCreateWithFlags(&c.s0, cudaStreamNonBlocking));
  fillPattern<<<1024, 256, 0, c.s0>>>(reinterpret_cast<uint32_t*>(c.buf[0]), cap / 4);
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaStreamSynchronize(c.s0));
  BENCH_CUDA(cudaSetDevice(1));
  BENCH_CUDA(cudaStreamCreateWithFlags(&c.s1, cudaStreamNonBlocking));
  BENCH_CUDA(cudaMalloc(&c.bad1, sizeof(unsigned long long)));

  std::vector<size_t> sizes;
  for (size_t n = 4096; n <= cap; n *= 4) sizes.push_back(n);
  if (sizes.back() != cap) sizes.push_back(cap);

  std::printf(
      "# medians of %d reps; each rep = a batch of back-to-back puts (about 256 MiB, 1..2000 "
      "ops),\n"
      "# after 2 warm-up puts; GB/s = 1e9 B/s; every put verified on GPU1 after its timing\n",
      opt.reps);
  std::printf(
      "\n## GPU0 -> GPU1 put into an NCCL symmetric window (GB/s, ratio to "
      "cudaMemcpyPeerAsync)\n\n| design |");
  for (size_t n : sizes) std::printf(" %s |", sizeName(n).c_str());
  std::printf("\n|---|");
  for (size_t i = 0; i < sizes.size(); ++i) std::printf("---|");
  std::printf("\n");

  // Reference: the copy engine between the same two ncclMemAlloc buffers.
  std::vector<double> base;
  for (size_t n : sizes) {
    clearDst(c, n);
    base.push_back(
        timeOp(c, n, [&] { BENCH_CUDA(cudaMemcpyPeerAsync(c.buf[1], 1, c.buf[0], 0, n, c.s0)); }));
    verify(c, "cudaMemcpyPeerAsync", n);
  }
  printRow("cudaMemcpyPeerAsync (same ncclMemAlloc buffers)", base, nullptr);

  // A few launch shapes around the ones that reached the NVLink ceiling in
  // p2p_put_bench's sweep (grid-stride U=4, 132..528 blocks).
  std::vector<Design> designs = {
      lsaDesign(c, 4, 256, 132), lsaDesign(c, 4, 512, 132),  lsaDesign(c, 4, 512, 264),
      lsaDesign(c, 4, 512, 528), lsaDesign(c, 4, 1024, 264), lsaDesign(c, 2, 512, 528),
      lsaDesign(c, 8, 256, 528), lsaDesign(c, 8, 512, 264),
  };
  for (const Design& d : designs) {
    std::vector<double> g;
    for (size_t n : sizes) {
      clearDst(c, n);
      g.push_back(timeOp(c, n, [&] { d.launch(n); }));
      verify(c, d.name, n);
    }
    printRow(d.name, g, &base);
  }

  BENCH_NCCL(ncclGroupStart());
  for (int r = 0; r < 2; ++r) BENCH_NCCL(ncclDevCommDestroy(c.comms[r], &c.dev[r]));
  BENCH_NCCL(ncclGroupEnd());
  BENCH_NCCL(ncclGroupStart());
  for (int r = 0; r < 2; ++r) BENCH_NCCL(ncclCommWindowDeregister(c.comms[r], c.wins[r]));
  BENCH_NCCL(ncclGroupEnd());
  for (int r = 0; r < 2; ++r) {
    BENCH_CUDA(cudaSetDevice(r));
    BENCH_NCCL(ncclMemFree(c.buf[r]));
  }
  for (int r = 0; r < 2; ++r) BENCH_NCCL(ncclCommDestroy(c.comms[r]));

  std::printf("\n## Verification\n\n%s\n",
              c.failures ? "FAILED (see stderr)" : "every put matched on GPU1");
  return c.failures ? 1 : 0;
}
