// How one block of the copy agent's kernels (copy_agent_landing_kernel.cu)
// shares a copy among its threads, in a header the host compiles too: the
// index arithmetic runs in tests/client/copy_agent_block_copy_test.cc for
// every size and alignment, with a thread loop standing in for the block.
//
// One side of each copy is host memory (the staging area), so every load is
// a round trip over PCIe: each thread keeps four in flight, and moves the
// widest unit in which both addresses are aligned alike (16, 8, 4, 2 or 1
// bytes; CoalignedUnit), after a head of single bytes that brings them to
// it. A WRITE to an address 4 or 8 bytes past a 16-byte boundary, from a
// staging area that is 16-byte aligned, thus moves 4- or 8-byte words, not
// bytes one round trip at a time.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MC_BLOCK_COPY_HD __host__ __device__ __forceinline__
#else
#define MC_BLOCK_COPY_HD inline
#endif

namespace mooncake::copy_agent {

#if defined(__CUDACC__)
using Unit16 = uint4;
#else
struct alignas(16) Unit16 {
  uint32_t x, y, z, w;
};
#endif

// The widest power-of-two unit, up to 16 bytes, in which `dst` and `src`
// are aligned alike (their low bits agree), so that after the same head of
// bytes both are aligned to it.
MC_BLOCK_COPY_HD uint32_t CoalignedUnit(uintptr_t dst, uintptr_t src) {
  const uintptr_t differ = dst ^ src;
  return (differ & 15) == 0  ? 16
         : (differ & 7) == 0 ? 8
         : (differ & 3) == 0 ? 4
         : (differ & 1) == 0 ? 2
                             : 1;
}

// Thread `tid` of `threads` moves its share of [0, n) from `src` to `dst`
// in units of T: the head's bytes up to dst's first T boundary, whole units
// (four loads in flight before their stores), then the tail's bytes. `load`
// reads: load(const T*) a unit, load.Byte(const uint8_t*) a byte.
template <class T, class Load>
MC_BLOCK_COPY_HD void CopyInUnits(uint8_t* dst, const uint8_t* src, uint64_t n, uint32_t tid,
                                  uint32_t threads, const Load& load) {
  constexpr uint64_t kUnit = sizeof(T);
  constexpr uint32_t kInFlight = 4;
  const uint64_t to_boundary =
      (kUnit - (reinterpret_cast<uintptr_t>(dst) & (kUnit - 1))) & (kUnit - 1);
  const uint64_t head = to_boundary < n ? to_boundary : n;
  for (uint64_t i = tid; i < head; i += threads) dst[i] = load.Byte(src + i);
  const uint64_t units = (n - head) / kUnit;
  T* d = reinterpret_cast<T*>(dst + head);
  const T* s = reinterpret_cast<const T*>(src + head);
  uint64_t u = tid;
  for (; u + (kInFlight - 1) * uint64_t{threads} < units; u += kInFlight * uint64_t{threads}) {
    T v[kInFlight];
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (uint32_t k = 0; k < kInFlight; ++k) v[k] = load(s + u + k * uint64_t{threads});
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (uint32_t k = 0; k < kInFlight; ++k) d[u + k * uint64_t{threads}] = v[k];
  }
  for (; u < units; u += threads) d[u] = load(s + u);
  for (uint64_t i = head + units * kUnit + tid; i < n; i += threads) dst[i] = load.Byte(src + i);
}

// This thread's share of a copy of n bytes, in the widest co-aligned unit.
template <class Load>
MC_BLOCK_COPY_HD void BlockCopy(uint8_t* dst, const uint8_t* src, uint64_t n, uint32_t tid,
                                uint32_t threads, const Load& load) {
  switch (CoalignedUnit(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src))) {
    case 16: return CopyInUnits<Unit16>(dst, src, n, tid, threads, load);
    case 8: return CopyInUnits<uint64_t>(dst, src, n, tid, threads, load);
    case 4: return CopyInUnits<uint32_t>(dst, src, n, tid, threads, load);
    case 2: return CopyInUnits<uint16_t>(dst, src, n, tid, threads, load);
    default: return CopyInUnits<uint8_t>(dst, src, n, tid, threads, load);
  }
}

}  // namespace mooncake::copy_agent
