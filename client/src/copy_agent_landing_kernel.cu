// The copy agent's landing kernel (copy_agent_landing_kernel.h): moves the
// bytes of one request from the staging area (host memory) into the
// process's GPU memory, unless the daemon called the request off first
// (the Dekker handshake of mooncake/common/copy_agent_gate.h). Each block
// decides for itself: a block the daemon did not see start writes nothing,
// and the daemon waits for every block it saw start before it writes.
#include <cstdint>

#include "mooncake/common/copy_agent_gate.h"

namespace {

using mooncake::copy_agent::Gate;

__device__ __forceinline__ void StoreRelaxedSys(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t LoadRelaxedSys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void FenceScSys() { asm volatile("fence.sc.sys;" ::: "memory"); }
// 16 bytes of the staging area, read again from memory (never a line an
// earlier request's landing left in a cache).
__device__ __forceinline__ uint4 LoadVolatile16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

}  // namespace

extern "C" __global__ void mc_copy_agent_land(uint8_t* dst, const uint8_t* src, uint64_t bytes,
                                              Gate* gate, uint32_t seq) {
  __shared__ int go;
  const uint32_t b = blockIdx.x;
  if (threadIdx.x == 0) {
    StoreRelaxedSys(&gate->intent[b], seq);
    FenceScSys();
    go = LoadRelaxedSys(&gate->cancel_seq) != seq;
  }
  __syncthreads();
  if (go) {
    uint64_t begin = 0, end = 0;
    mooncake::copy_agent::LandingSlice(bytes, gridDim.x, b, &begin, &end);
    // The staging area is host memory another process writes between
    // requests: volatile loads, never a cached copy of an earlier request.
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | begin) & 15) == 0) {
      // Four loads in flight per thread before their stores: each is a
      // round trip over PCIe (about a microsecond), so one at a time would
      // make a 64 KiB slice cost tens of microseconds.
      constexpr uint32_t kUnroll = 4;
      const uint64_t units = (end - begin) / 16;
      const uint8_t* s = src + begin;
      uint8_t* d = dst + begin;
      uint64_t u = threadIdx.x;
      for (; u + (kUnroll - 1) * blockDim.x < units; u += kUnroll * blockDim.x) {
        uint4 v[kUnroll];
#pragma unroll
        for (uint32_t k = 0; k < kUnroll; ++k) v[k] = LoadVolatile16(s + 16 * (u + k * blockDim.x));
#pragma unroll
        for (uint32_t k = 0; k < kUnroll; ++k) {
          *reinterpret_cast<uint4*>(d + 16 * (u + k * blockDim.x)) = v[k];
        }
      }
      for (; u < units; u += blockDim.x) {
        *reinterpret_cast<uint4*>(d + 16 * u) = LoadVolatile16(s + 16 * u);
      }
      for (uint64_t i = begin + units * 16 + threadIdx.x; i < end; i += blockDim.x) {
        dst[i] = *reinterpret_cast<const volatile uint8_t*>(src + i);
      }
    } else {
      for (uint64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        dst[i] = *reinterpret_cast<const volatile uint8_t*>(src + i);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // Every thread's stores to dst before `landed`: the daemon writes dst
    // itself once it sees it.
    FenceScSys();
    StoreRelaxedSys(&gate->landed[b], seq);
  }
}
