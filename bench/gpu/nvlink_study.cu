// nvlink_study: one kind of GPU0 -> GPU1 traffic at a time, for a fixed
// number of bytes, so NVLink counters read before and after it (nvidia-smi,
// NVML field values, Nsight Compute) can be set against the payload.
//
// Usage: nvlink_study ce|sm|sm-pull BYTES_PER_COPY COPIES [BLOCKS THREADS]
//   ce       cudaMemcpyPeerAsync (the copy engine)
//   sm       the shipping grid-wide store copy (mc_detail_copy_group over the
//            whole grid: what mc_put_grid runs), GPU0's SMs writing GPU1
//   sm-pull  the same copy run on GPU1, reading GPU0 (loads over the link)
// Prints one line: mode, payload bytes, seconds, GB/s. The output is checked.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mooncake/device/comm_device.h"

using namespace mooncake::device;

namespace {

#define CHECK(x)                                                                             \
  do {                                                                                       \
    cudaError_t e = (x);                                                                     \
    if (e != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

template <int kUnroll>
__global__ void copyGrid(char* dst, const char* src, size_t n) {
  mc_detail_copy_group<kUnroll>(dst, src, n, blockIdx.x * blockDim.x + threadIdx.x,
                                gridDim.x * blockDim.x);
}

__global__ void fill(unsigned* p, size_t words, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words;
       i += (size_t)gridDim.x * blockDim.x) {
    p[i] = (unsigned)i * 2654435761u + seed;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s ce|sm|sm-pull BYTES_PER_COPY COPIES [BLOCKS THREADS]\n",
                 argv[0]);
    return 64;
  }
  std::string mode = argv[1];
  size_t bytes = std::strtoull(argv[2], nullptr, 10) & ~size_t(15);
  int copies = std::atoi(argv[3]);
  unsigned blocks = argc > 4 ? std::atoi(argv[4]) : 132 * 4;
  unsigned threads = argc > 5 ? std::atoi(argv[5]) : 512;
  int n = 0;
  CHECK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::fprintf(stderr, "nvlink_study needs two GPUs (found %d)\n", n);
    return 77;
  }
  char *src = nullptr, *dst = nullptr;
  CHECK(cudaSetDevice(0));
  CHECK(cudaDeviceEnablePeerAccess(1, 0));
  CHECK(cudaMalloc(&src, bytes));
  fill<<<1024, 256>>>(reinterpret_cast<unsigned*>(src), bytes / 4, 7);
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaSetDevice(1));
  CHECK(cudaDeviceEnablePeerAccess(0, 0));
  CHECK(cudaMalloc(&dst, bytes));
  CHECK(cudaMemset(dst, 0, bytes));
  CHECK(cudaDeviceSynchronize());
  int run_on = mode == "sm-pull" ? 1 : 0;
  CHECK(cudaSetDevice(run_on));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < copies; ++i) {
    if (mode == "ce") {
      CHECK(cudaMemcpyPeerAsync(dst, 1, src, 0, bytes, s));
    } else if (mode == "sm" || mode == "sm-pull") {
      copyGrid<4><<<blocks, threads, 0, s>>>(dst, src, bytes);
    } else {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 64;
    }
  }
  CHECK(cudaEventRecord(b, s));
  CHECK(cudaEventSynchronize(b));
  CHECK(cudaGetLastError());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  // Check the copy: compare GPU1's buffer with GPU0's.
  char* back = nullptr;
  CHECK(cudaSetDevice(0));
  CHECK(cudaMalloc(&back, bytes));
  CHECK(cudaMemcpyPeer(back, 0, dst, 1, bytes));
  size_t probe = bytes < (64u << 20) ? bytes : (64u << 20);
  char* h1 = static_cast<char*>(std::malloc(probe));
  char* h2 = static_cast<char*>(std::malloc(probe));
  CHECK(cudaMemcpy(h1, src + bytes - probe, probe, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(h2, back + bytes - probe, probe, cudaMemcpyDeviceToHost));
  bool ok = std::memcmp(h1, h2, probe) == 0;
  double payload = (double)bytes * copies;
  std::printf("mode=%s payload_bytes=%.0f seconds=%.6f gbps=%.1f check=%s\n", mode.c_str(), payload,
              ms / 1e3, payload / (ms / 1e3) / 1e9, ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
