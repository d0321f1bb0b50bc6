// NVSHMEM baseline for the P2P path, GPU0 (PE 0) -> GPU1 (PE 1): putmem_block
// bandwidth and signal latencies, to set beside p2p_put_bench and
// p2p_latency_bench. NVSHMEM exists only on the GPU machine, so this is
// built there (tests/gpu/run.sh):
//   NV=.../site-packages/nvidia/nvshmem
//   mkdir -p /tmp/nvl && ln -sf $NV/lib/libnvshmem_host.so.3 /tmp/nvl/libnvshmem_host.so
//   nvcc -std=c++17 -O3 -rdc=true -arch=sm_90 -I$NV/include nvshmem_bench.cu -o nvshmem_bench \
//        -L$NV/lib -L/tmp/nvl -lnvshmem_device -lnvshmem_host
//   LD_LIBRARY_PATH=$NV/lib ./nvshmem_bench
// One executable: it forks PE 1 before any CUDA call (CUDA does not survive
// fork), PE 0 makes the unique id and passes it through a pipe; no MPI.
// Exit status 0 only when both PEs finished and every check passed.
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(expr)                                                                    \
  do {                                                                              \
    cudaError_t e_ = (expr);                                                        \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "PE%d %s:%d: %s: %s\n", g_pe, __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(e_));                                         \
      std::exit(2);                                                                 \
    }                                                                               \
  } while (0)

namespace {

int g_pe = -1;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

__device__ __forceinline__ uint64_t nowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void putBlocks(char* dst, const char* src, size_t n, int pe) {
  size_t per = ((n + gridDim.x - 1) / gridDim.x + 15) & ~size_t(15);
  size_t begin = per * blockIdx.x;
  if (begin >= n) return;
  size_t len = n - begin < per ? n - begin : per;
  nvshmemx_putmem_block(dst + begin, src + begin, len, pe);
}

__global__ void fillPattern(uint32_t* p, size_t words) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = (uint32_t)(i * 2654435761u) ^ 0x5eedu;
}
__global__ void countBad(const uint32_t* p, size_t words, unsigned long long* bad) {
  unsigned long long b = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words;
       i += (size_t)gridDim.x * blockDim.x)
    b += p[i] != ((uint32_t)(i * 2654435761u) ^ 0x5eedu);
  if (b) atomicAdd(bad, b);
}

enum LatMode { kSignalOp, kPutSignal8, kPutSignalWarp4K, kPutFenceP };
const char* latName(int m) {
  switch (m) {
    case kSignalOp: return "NVSHMEM signal_op(SET) / signal_wait_until";
    case kPutSignal8: return "NVSHMEM putmem_signal_nbi 8 B / signal_wait_until";
    case kPutSignalWarp4K: return "NVSHMEM putmem_signal_nbi_warp 4 KiB / signal_wait_until";
    case kPutFenceP: return "NVSHMEM putmem_nbi 8 B + fence + uint64 p / wait_until";
  }
  return "?";
}

// Ping-pong; PE 0 times `iters` round trips after `warmup`.
template <int M>
__global__ void pingPong(uint64_t* sig, char* data, const char* src, int peer, bool initiator,
                         int warmup, int iters, unsigned long long* out_ns) {
  const unsigned lane = threadIdx.x % 32;
  uint64_t t0 = 0;
  for (int i = 1; i <= warmup + iters; ++i) {
    if (initiator && i == warmup + 1) t0 = nowNs();
    auto send = [&] {
      if constexpr (M == kSignalOp) {
        if (lane == 0) nvshmemx_signal_op(sig, (uint64_t)i, NVSHMEM_SIGNAL_SET, peer);
      } else if constexpr (M == kPutSignal8) {
        if (lane == 0)
          nvshmem_putmem_signal_nbi(data, src, 8, sig, (uint64_t)i, NVSHMEM_SIGNAL_SET, peer);
      } else if constexpr (M == kPutSignalWarp4K) {
        nvshmemx_putmem_signal_nbi_warp(data, src, 4096, sig, (uint64_t)i, NVSHMEM_SIGNAL_SET,
                                        peer);
      } else {
        if (lane == 0) {
          nvshmem_putmem_nbi(data, src, 8, peer);
          nvshmem_fence();
          nvshmem_uint64_p(sig, (uint64_t)i, peer);
        }
      }
    };
    auto recv = [&] {
      if (lane == 0) nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, (uint64_t)i);
      __syncwarp();
    };
    if (initiator) {
      send();
      recv();
    } else {
      recv();
      send();
    }
  }
  if (initiator && lane == 0) *out_ns = nowNs() - t0;
}

template <int M>
void launchLat(uint64_t* sig, char* data, const char* src, int peer, bool init, int warmup,
               int iters, unsigned long long* out) {
  pingPong<M>
      <<<1, M == kPutSignalWarp4K ? 32 : 1>>>(sig, data, src, peer, init, warmup, iters, out);
}

int runPe(int pe, const nvshmemx_uniqueid_t& uid) {
  g_pe = pe;
  CK(cudaSetDevice(pe));
  nvshmemx_init_attr_t attr;
  std::memset(&attr, 0, sizeof attr);
#ifdef NVSHMEMX_INIT_ATTR_INITIALIZER
  attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
#endif
  nvshmemx_set_attr_uniqueid_args(pe, 2, &uid, &attr);
  if (nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) != 0) {
    std::fprintf(stderr, "PE%d: nvshmemx_init_attr failed\n", pe);
    return 2;
  }
  const int peer = 1 - pe;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, pe));
  const size_t cap = 256ull << 20;
  char* src = static_cast<char*>(nvshmem_malloc(cap));
  char* dst = static_cast<char*>(nvshmem_malloc(cap));
  uint64_t* sig = static_cast<uint64_t*>(nvshmem_malloc(4096));
  char* ldata = static_cast<char*>(nvshmem_malloc(8192));
  unsigned long long* dev_out = nullptr;
  CK(cudaMalloc(&dev_out, 16));
  if (!src || !dst || !sig || !ldata) {
    std::fprintf(stderr, "PE%d: nvshmem_malloc failed (set NVSHMEM_SYMMETRIC_SIZE >= 1G)\n", pe);
    return 2;
  }
  fillPattern<<<1024, 256>>>(reinterpret_cast<uint32_t*>(src), cap / 4);
  CK(cudaDeviceSynchronize());
  nvshmem_barrier_all();
  int failures = 0;

  // --- putmem_block bandwidth, PE 0 -> PE 1 ---------------------------------
  struct Cfg {
    unsigned blocks, threads;
  };
  std::vector<Cfg> cfgs = {{(unsigned)sms, 512}, {(unsigned)sms, 1024}, {2u * sms, 512}};
  std::vector<size_t> sizes;
  for (size_t n = 4096; n <= cap; n *= 4) sizes.push_back(n);
  if (pe == 0) {
    std::printf(
        "\n## NVSHMEM putmem_block PE0 (GPU0) -> PE1 (GPU1), GB/s, median of 9 reps\n\n| config |");
    for (size_t n : sizes) std::printf(" %zu KiB |", n >> 10);
    std::printf("\n|---|");
    for (size_t i = 0; i < sizes.size(); ++i) std::printf("---|");
    std::printf("\n");
  }
  for (const Cfg& c : cfgs) {
    std::vector<double> row;
    for (size_t n : sizes) {
      if (pe == 1) CK(cudaMemset(dst, 0, n));
      CK(cudaDeviceSynchronize());
      nvshmem_barrier_all();
      if (pe == 0) {
        size_t it = std::min<size_t>(2000, std::max<size_t>(1, (256ull << 20) / n));
        unsigned b =
            (unsigned)std::min<size_t>(c.blocks, std::max<size_t>(1, n / (c.threads * 16 * 4)));
        cudaEvent_t a, z;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&z));
        for (int w = 0; w < 2; ++w) putBlocks<<<b, c.threads>>>(dst, src, n, 1);
        std::vector<double> g;
        for (int r = 0; r < 9; ++r) {
          CK(cudaEventRecord(a));
          for (size_t i = 0; i < it; ++i) putBlocks<<<b, c.threads>>>(dst, src, n, 1);
          CK(cudaEventRecord(z));
          CK(cudaEventSynchronize(z));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, a, z));
          g.push_back((double)n * it / (ms * 1e-3) / 1e9);
        }
        CK(cudaGetLastError());
        row.push_back(median(g));
      }
      nvshmem_quiet();
      CK(cudaDeviceSynchronize());
      nvshmem_barrier_all();
      if (pe == 1) {
        CK(cudaMemset(dev_out, 0, 8));
        countBad<<<264, 512>>>(reinterpret_cast<const uint32_t*>(dst), n / 4, dev_out);
        unsigned long long bad = 0;
        CK(cudaMemcpy(&bad, dev_out, 8, cudaMemcpyDeviceToHost));
        if (bad) {
          std::fprintf(stderr, "PE1: putmem_block %zu bytes: %llu words wrong\n", n, bad);
          ++failures;
        }
      }
      nvshmem_barrier_all();
    }
    if (pe == 0) {
      std::printf("| putmem_block B=%u T=%u |", c.blocks, c.threads);
      for (double g : row) std::printf(" %.1f |", g);
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  // --- latency ping-pong ----------------------------------------------------
  const int warmup = 1000, iters = 20000;
  if (pe == 0) std::printf("\n| protocol (NVSHMEM) | one-way µs (median of 5) |\n|---|---|\n");
  for (int m = kSignalOp; m <= kPutFenceP; ++m) {
    std::vector<double> us;
    for (int r = 0; r < 5; ++r) {
      CK(cudaMemset(sig, 0, 4096));
      CK(cudaDeviceSynchronize());
      nvshmem_barrier_all();
      switch (m) {
        case kSignalOp:
          launchLat<kSignalOp>(sig, ldata, src, peer, pe == 0, warmup, iters, dev_out);
          break;
        case kPutSignal8:
          launchLat<kPutSignal8>(sig, ldata, src, peer, pe == 0, warmup, iters, dev_out);
          break;
        case kPutSignalWarp4K:
          launchLat<kPutSignalWarp4K>(sig, ldata, src, peer, pe == 0, warmup, iters, dev_out);
          break;
        case kPutFenceP:
          launchLat<kPutFenceP>(sig, ldata, src, peer, pe == 0, warmup, iters, dev_out);
          break;
      }
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      if (pe == 0) {
        unsigned long long ns = 0;
        CK(cudaMemcpy(&ns, dev_out, 8, cudaMemcpyDeviceToHost));
        us.push_back(ns / 1e3 / iters / 2);
      }
      nvshmem_barrier_all();
    }
    if (pe == 0) {
      std::printf("| %s | %.3f |\n", latName(m), median(us));
      std::fflush(stdout);
    }
  }
  nvshmem_barrier_all();
  nvshmem_free(src);
  nvshmem_free(dst);
  nvshmem_free(sig);
  nvshmem_free(ldata);
  nvshmem_finalize();
  return failures ? 1 : 0;
}

}  // namespace

int main() {
  setenv("NVSHMEM_DISABLE_NVLS", "1", 1);  // NVLink multicast stays off (shared/gpu.md)
  setenv("NVSHMEM_REMOTE_TRANSPORT", "none", 0);
  setenv("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo", 0);
  setenv("NVSHMEM_SYMMETRIC_SIZE", "1073741824", 0);
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("pipe");
    return 2;
  }
  // Fork first: no CUDA (and no NVSHMEM) call may precede it.
  pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    return 2;
  }
  nvshmemx_uniqueid_t uid;
  if (child == 0) {
    close(fds[1]);
    size_t got = 0;
    while (got < sizeof uid) {
      ssize_t r = read(fds[0], reinterpret_cast<char*>(&uid) + got, sizeof uid - got);
      if (r <= 0) {
        std::fprintf(stderr, "PE1: no unique id from PE0\n");
        _exit(2);
      }
      got += (size_t)r;
    }
    _exit(runPe(1, uid));
  }
  close(fds[0]);
  std::memset(&uid, 0, sizeof uid);
  if (nvshmemx_get_uniqueid(&uid) != 0) {
    std::fprintf(stderr, "PE0: nvshmemx_get_uniqueid failed\n");
    return 2;
  }
  if (write(fds[1], &uid, sizeof uid) != (ssize_t)sizeof uid) {
    std::perror("write unique id");
    return 2;
  }
  close(fds[1]);
  int rc = runPe(0, uid);
  int status = 0;
  waitpid(child, &status, 0);
  int child_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 3;
  std::printf("\nnvshmem_bench: PE0 rc=%d, PE1 rc=%d\n", rc, child_rc);
  return rc || child_rc ? 1 : 0;
}
