// Small helpers shared by the GPU benchmarks: error checks that stop the
// program with the failing call, CUDA-event timing, medians.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define BENCH_CUDA(expr)                                                        \
  do {                                                                          \
    cudaError_t err_ = (expr);                                                  \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(err_));                                   \
      std::exit(2);                                                             \
    }                                                                           \
  } while (0)

namespace mcbench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

inline std::string sizeName(size_t n) {
  char buf[32];
  if (n >= (1ull << 30) && n % (1ull << 30) == 0)
    std::snprintf(buf, sizeof buf, "%zu GiB", n >> 30);
  else if (n >= (1ull << 20) && n % (1ull << 20) == 0)
    std::snprintf(buf, sizeof buf, "%zu MiB", n >> 20);
  else if (n >= 1024 && n % 1024 == 0)
    std::snprintf(buf, sizeof buf, "%zu KiB", n >> 10);
  else
    std::snprintf(buf, sizeof buf, "%zu B", n);
  return buf;
}

// Device-to-device peer access both ways; returns false when unsupported.
inline bool enablePeer(int a, int b) {
  int can_ab = 0, can_ba = 0;
  BENCH_CUDA(cudaDeviceCanAccessPeer(&can_ab, a, b));
  BENCH_CUDA(cudaDeviceCanAccessPeer(&can_ba, b, a));
  if (!can_ab || !can_ba) return false;
  BENCH_CUDA(cudaSetDevice(a));
  cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
  if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) BENCH_CUDA(e);
  BENCH_CUDA(cudaSetDevice(b));
  e = cudaDeviceEnablePeerAccess(a, 0);
  if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) BENCH_CUDA(e);
  cudaGetLastError();
  return true;
}

inline void printDevice(int dev) {
  cudaDeviceProp p{};
  BENCH_CUDA(cudaGetDeviceProperties(&p, dev));
  int clock_khz = 0, mem_clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
  cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, dev);
  std::printf(
      "# GPU%d: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %d KiB, smem/block optin %zu KiB, clock %d MHz\n",
      dev, p.name, p.major, p.minor, p.multiProcessorCount, p.totalGlobalMem / double(1 << 30),
      p.l2CacheSize >> 10, p.sharedMemPerBlockOptin >> 10, clock_khz / 1000);
}

}  // namespace mcbench
