#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "cuda_run.h"
#include "mooncake/device/comm_device.h"

namespace mooncake::example {
namespace {

using device::CommCtx;
using device::McCmp;
using device::McStatus;

__device__ __forceinline__ uint8_t DevPatternByte(size_t i, int src, int dst) {
  return static_cast<uint8_t>(
      (i * 131u + static_cast<size_t>(src) * 31u + static_cast<size_t>(dst) * 7u + 1u) & 0xffu);
}

__global__ void FillKernel(uint8_t* p, size_t n, int src, int dst) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = DevPatternByte(i, src, dst);
  }
}

// All blocks share the put (64 KiB tiles interleaved across them).
__global__ void PutKernel(CommCtx ctx, int dst, uint8_t* dst_sym, const uint8_t* src, size_t n,
                          int* status) {
  McStatus st = device::mc_put_grid(ctx, dst, dst_sym, src, n, blockIdx.x, gridDim.x);
  if (threadIdx.x == 0 && st != McStatus::kOk) atomicExch(status, static_cast<int>(st));
}

// After the put kernel (stream order), one thread publishes it, then waits
// for its RDMA work requests to complete (mc_quiet; a fence over P2P): the
// staged message may then be overwritten, and the process may exit.
__global__ void SignalKernel(CommCtx ctx, int dst, unsigned long long* sig_sym, bool add,
                             int* status) {
  device::mc_fence();
  McStatus st = add ? device::mc_red_add(ctx, dst, sig_sym, 1ull)
                    : device::mc_signal(ctx, dst, sig_sym, 1ull);
  if (st == McStatus::kOk) st = device::mc_quiet(ctx);
  if (st != McStatus::kOk) atomicExch(status, static_cast<int>(st));
}

__global__ void WaitKernel(const unsigned long long* sig, unsigned long long want,
                           uint64_t timeout_ns, unsigned long long* observed, int* ok) {
  unsigned long long seen = 0;
  *ok = device::mc_wait_until_for(sig, McCmp::kGe, want, timeout_ns, &seen) ? 1 : 0;
  *observed = seen;
}

__global__ void CheckKernel(const uint8_t* p, size_t n, int src, int dst, unsigned long long* bad) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    local += (p[i] != DevPatternByte(i, src, dst));
  }
  if (local) atomicAdd(bad, local);
}

struct Scratch {
  int* status = nullptr;  // device: first McStatus error
  unsigned long long* bad = nullptr;
  unsigned long long* observed = nullptr;
  int* ok = nullptr;
  ~Scratch() {
    cudaFree(status);
    cudaFree(bad);
    cudaFree(observed);
    cudaFree(ok);
  }
};

std::string Err(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

#define EX_CUDA(call)             \
  do {                            \
    cudaError_t e_ = (call);      \
    if (e_ != cudaSuccess) {      \
      r.message = Err(#call, e_); \
      return r;                   \
    }                             \
  } while (0)

constexpr int kBlocks = 32;
constexpr int kThreads = 512;

// The message is staged in this rank's own slot of its buffer (which no peer
// writes): over RDMA the NIC reads the source, and only registered memory.
RunResult SendTo(const CommCtx& ctx, uint8_t* buf, int dst, size_t n, bool add, Scratch& s,
                 uint8_t* /*unused*/) {
  RunResult r;
  uint8_t* own = buf + SlotOffset(n, ctx.rank);
  FillKernel<<<kBlocks, kThreads>>>(own, n, ctx.rank, dst);
  PutKernel<<<kBlocks, kThreads>>>(ctx, dst, own, own, n, s.status);
  auto* sig =
      reinterpret_cast<unsigned long long*>(buf + (add ? CounterOffset() : FlagOffset(ctx.rank)));
  SignalKernel<<<1, 1>>>(ctx, dst, sig, add, s.status);
  EX_CUDA(cudaDeviceSynchronize());
  int st = 0;
  EX_CUDA(cudaMemcpy(&st, s.status, sizeof(int), cudaMemcpyDeviceToHost));
  if (st != 0) {
    r.message = "put to rank " + std::to_string(dst) + " failed: McStatus " + std::to_string(st) +
                " (2 no route, 3 RDMA error completion, 4 RDMA timeout, 5 not registered)";
    return r;
  }
  r.ok = true;
  return r;
}

RunResult WaitAndCheck(uint8_t* buf, size_t n, int self, const unsigned long long* sig,
                       unsigned long long want, int first_src, int last_src, uint64_t timeout_ns,
                       Scratch& s) {
  RunResult r;
  WaitKernel<<<1, 1>>>(sig, want, timeout_ns, s.observed, s.ok);
  EX_CUDA(cudaDeviceSynchronize());
  int ok = 0;
  unsigned long long seen = 0;
  EX_CUDA(cudaMemcpy(&ok, s.ok, sizeof(int), cudaMemcpyDeviceToHost));
  EX_CUDA(cudaMemcpy(&seen, s.observed, sizeof(seen), cudaMemcpyDeviceToHost));
  if (!ok) {
    r.message =
        "timed out with " + std::to_string(seen) + " of " + std::to_string(want) + " signals";
    return r;
  }
  EX_CUDA(cudaMemset(s.bad, 0, sizeof(unsigned long long)));
  for (int src = first_src; src <= last_src; ++src) {
    if (src == self) continue;
    CheckKernel<<<kBlocks, kThreads>>>(buf + SlotOffset(n, src), n, src, self, s.bad);
  }
  EX_CUDA(cudaDeviceSynchronize());
  unsigned long long bad = 0;
  EX_CUDA(cudaMemcpy(&bad, s.bad, sizeof(bad), cudaMemcpyDeviceToHost));
  r.bad_bytes = bad;
  r.ok = bad == 0;
  return r;
}

RunResult Alloc(Scratch& s, uint8_t** src, size_t n) {
  RunResult r;
  EX_CUDA(cudaMalloc(&s.status, sizeof(int)));
  EX_CUDA(cudaMalloc(&s.bad, sizeof(unsigned long long)));
  EX_CUDA(cudaMalloc(&s.observed, sizeof(unsigned long long)));
  EX_CUDA(cudaMalloc(&s.ok, sizeof(int)));
  EX_CUDA(cudaMemset(s.status, 0, sizeof(int)));
  EX_CUDA(cudaMalloc(src, n > 0 ? n : 1));
  r.ok = true;
  return r;
}

}  // namespace

std::string PrepareCudaDeviceImpl(int device, int rank, std::string* uuid) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return "no CUDA device: " + std::string(e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
  }
  int dev = device >= 0 ? device : rank % count;
  if (dev >= count)
    return "--device " + std::to_string(dev) + " but only " + std::to_string(count) + " GPUs";
  if ((e = cudaSetDevice(dev)) != cudaSuccess) return Err("cudaSetDevice", e);
  if ((e = cudaFree(nullptr)) != cudaSuccess) return Err("creating the CUDA context", e);
  cudaDeviceProp prop{};
  if ((e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess)
    return Err("cudaGetDeviceProperties", e);
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  char text[64];
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  *uuid = text;
  return "";
}

RunResult RunPairCuda(const CommCtx& ctx, void* buffer, size_t n, uint64_t timeout_ns) {
  auto* buf = static_cast<uint8_t*>(buffer);
  Scratch s;
  uint8_t* src = nullptr;
  RunResult r = Alloc(s, &src, n);
  if (!r.ok) return r;
  if (ctx.rank == 0) {
    r = SendTo(ctx, buf, 1, n, /*add=*/false, s, src);
    cudaFree(src);
    if (r.ok)
      r.message =
          "rank 0 wrote " + std::to_string(n) + " bytes to rank 1 from the GPU and signalled";
    return r;
  }
  cudaFree(src);
  if (ctx.rank != 1) {
    r.ok = true;
    r.message = "rank " + std::to_string(ctx.rank) + " idle in pair mode";
    return r;
  }
  auto* flag = reinterpret_cast<const unsigned long long*>(buf + FlagOffset(0));
  r = WaitAndCheck(buf, n, 1, flag, 1, 0, 0, timeout_ns, s);
  if (r.ok)
    r.message = "rank 1 received " + std::to_string(n) + " bytes, all correct";
  else if (r.message.empty())
    r.message = std::to_string(r.bad_bytes) + " of " + std::to_string(n) + " bytes wrong";
  return r;
}

RunResult RunAllToAllCuda(const CommCtx& ctx, void* buffer, size_t n, uint64_t timeout_ns) {
  auto* buf = static_cast<uint8_t*>(buffer);
  Scratch s;
  uint8_t* src = nullptr;
  RunResult r = Alloc(s, &src, n);
  if (!r.ok) return r;
  for (int step = 1; step < ctx.num_ranks; ++step) {
    int dst = (ctx.rank + step) % ctx.num_ranks;
    r = SendTo(ctx, buf, dst, n, /*add=*/true, s, src);
    if (!r.ok) {
      cudaFree(src);
      return r;
    }
  }
  cudaFree(src);
  auto* counter = reinterpret_cast<const unsigned long long*>(buf + CounterOffset());
  const unsigned long long want = static_cast<unsigned long long>(ctx.num_ranks - 1);
  r = WaitAndCheck(buf, n, ctx.rank, counter, want, 0, ctx.num_ranks - 1, timeout_ns, s);
  if (r.ok) {
    r.message = "received " + std::to_string(want) + " messages of " + std::to_string(n) +
                " bytes, all correct";
  } else if (r.message.empty()) {
    r.message = std::to_string(r.bad_bytes) + " bytes wrong";
  }
  return r;
}

}  // namespace mooncake::example
