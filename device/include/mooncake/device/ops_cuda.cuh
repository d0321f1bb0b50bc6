// Platform ops for CUDA (sm_70 and newer: the scoped .acquire/.release/
// .relaxed qualifiers need PTX ISA 6.0 / sm_70).
//
// Every op here names its PTX so the ordering is explicit and does not depend
// on how a given compiler lowers libcu++ atomics. Scope is .sys throughout:
// the peer touching the memory is another GPU (NVLink/PCIe) or a CPU thread
// of another process (the software NIC), never only this GPU.
//
// Addresses passed to the .global ops must point to global memory (cudaMalloc,
// cuMem VMM, a peer mapping, or host memory mapped into the GPU); generic
// addresses of global memory are used as-is, as CUDA's own headers do.
//
// Do not include directly: include mooncake/device/platform.h.
#pragma once

#if !defined(__CUDACC__)
#error "ops_cuda.cuh is CUDA-only; include mooncake/device/platform.h instead"
#endif

#include <cstdint>
#include <type_traits>

#include "mooncake/device/detail/macros.h"
#include "mooncake/device/types_device.h"

namespace mooncake {
namespace device {

inline constexpr unsigned kMcCudaWarpSize = 32;

namespace cuda_detail {
template <class T>
inline constexpr bool kIsWord =
    std::is_integral_v<T> && !std::is_same_v<T, bool> && (sizeof(T) == 4 || sizeof(T) == 8);
}  // namespace cuda_detail

// ---- loads and stores with ordering (system scope) ------------------------

template <class T>
MC_DEVICE T mc_ld_acquire(const T* p) {
  static_assert(cuda_detail::kIsWord<T>, "Device API atomics take 4- or 8-byte integers");
  if constexpr (sizeof(T) == 4) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return static_cast<T>(v);
  } else {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return static_cast<T>(v);
  }
}

template <class T>
MC_DEVICE T mc_ld_relaxed(const T* p) {
  static_assert(cuda_detail::kIsWord<T>, "Device API atomics take 4- or 8-byte integers");
  if constexpr (sizeof(T) == 4) {
    uint32_t v;
    asm volatile("ld.relaxed.sys.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return static_cast<T>(v);
  } else {
    uint64_t v;
    asm volatile("ld.relaxed.sys.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return static_cast<T>(v);
  }
}

template <class T>
MC_DEVICE void mc_st_release(T* p, T v) {
  static_assert(cuda_detail::kIsWord<T>, "Device API atomics take 4- or 8-byte integers");
  if constexpr (sizeof(T) == 4) {
    asm volatile("st.release.sys.global.b32 [%0], %1;" ::"l"(p), "r"(static_cast<uint32_t>(v))
                 : "memory");
  } else {
    asm volatile("st.release.sys.global.b64 [%0], %1;" ::"l"(p), "l"(static_cast<uint64_t>(v))
                 : "memory");
  }
}

// GPU-scope forms, for words only the threads of this GPU touch (a queue
// pair's posting state): st.release.gpu waits for this GPU's memory system
// only, where .sys also waits for writes still on their way across PCIe.
template <class T>
MC_DEVICE T mc_ld_acquire_gpu(const T* p) {
  static_assert(cuda_detail::kIsWord<T>, "Device API atomics take 4- or 8-byte integers");
  if constexpr (sizeof(T) == 4) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return static_cast<T>(v);
  } else {
    uint64_t v;
    asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return static_cast<T>(v);
  }
}

template <class T>
MC_DEVICE void mc_st_release_gpu(T* p, T v) {
  static_assert(cuda_detail::kIsWord<T>, "Device API atomics take 4- or 8-byte integers");
  if constexpr (sizeof(T) == 4) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(static_cast<uint32_t>(v))
                 : "memory");
  } else {
    asm volatile("st.release.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(static_cast<uint64_t>(v))
                 : "memory");
  }
}

// A GPU-scope relaxed load: several of these (and atomics) issue back to
// back and wait once, where each acquire load waits on its own. For
// posting state whose order the caller's later release store provides.
template <class T>
MC_DEVICE T mc_ld_relaxed_gpu(const T* p) {
  static_assert(cuda_detail::kIsWord<T>, "Device API atomics take 4- or 8-byte integers");
  if constexpr (sizeof(T) == 4) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return static_cast<T>(v);
  } else {
    uint64_t v;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return static_cast<T>(v);
  }
}

// A strong store that orders nothing: the cheapest flag (same SASS class as
// a volatile store, STG.STRONG.SYS).
template <class T>
MC_DEVICE void mc_st_relaxed(T* p, T v) {
  static_assert(cuda_detail::kIsWord<T>, "Device API atomics take 4- or 8-byte integers");
  if constexpr (sizeof(T) == 4) {
    asm volatile("st.relaxed.sys.global.b32 [%0], %1;" ::"l"(p), "r"(static_cast<uint32_t>(v))
                 : "memory");
  } else {
    asm volatile("st.relaxed.sys.global.b64 [%0], %1;" ::"l"(p), "l"(static_cast<uint64_t>(v))
                 : "memory");
  }
}

// Returns the value before the add. Signed 64-bit adds go through .u64
// (two's complement makes them identical).
template <class T>
MC_DEVICE T mc_atomic_add_release(T* p, T v) {
  static_assert(cuda_detail::kIsWord<T>, "Device API atomics take 4- or 8-byte integers");
  if constexpr (sizeof(T) == 4 && std::is_signed_v<T>) {
    int32_t old;
    asm volatile("atom.release.sys.global.add.s32 %0, [%1], %2;"
                 : "=r"(old)
                 : "l"(p), "r"(static_cast<int32_t>(v))
                 : "memory");
    return static_cast<T>(old);
  } else if constexpr (sizeof(T) == 4) {
    uint32_t old;
    asm volatile("atom.release.sys.global.add.u32 %0, [%1], %2;"
                 : "=r"(old)
                 : "l"(p), "r"(static_cast<uint32_t>(v))
                 : "memory");
    return static_cast<T>(old);
  } else {
    uint64_t old;
    asm volatile("atom.release.sys.global.add.u64 %0, [%1], %2;"
                 : "=l"(old)
                 : "l"(p), "l"(static_cast<uint64_t>(v))
                 : "memory");
    return static_cast<T>(old);
  }
}

template <class T>
MC_DEVICE T mc_atomic_add_relaxed(T* p, T v) {
  static_assert(cuda_detail::kIsWord<T>, "Device API atomics take 4- or 8-byte integers");
  if constexpr (sizeof(T) == 4) {
    uint32_t old;
    asm volatile("atom.relaxed.sys.global.add.u32 %0, [%1], %2;"
                 : "=r"(old)
                 : "l"(p), "r"(static_cast<uint32_t>(v))
                 : "memory");
    return static_cast<T>(old);
  } else {
    uint64_t old;
    asm volatile("atom.relaxed.sys.global.add.u64 %0, [%1], %2;"
                 : "=l"(old)
                 : "l"(p), "l"(static_cast<uint64_t>(v))
                 : "memory");
    return static_cast<T>(old);
  }
}

// Add without a result: `red` lets the SM move on without waiting for the
// old value to come back across NVLink.
template <class T>
MC_DEVICE void mc_red_add_release(T* p, T v) {
  static_assert(cuda_detail::kIsWord<T>, "Device API atomics take 4- or 8-byte integers");
  if constexpr (sizeof(T) == 4) {
    asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(static_cast<uint32_t>(v))
                 : "memory");
  } else {
    asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(static_cast<uint64_t>(v))
                 : "memory");
  }
}

// Compare-and-swap of a 32-bit word with acquire ordering; returns the value
// found (== expected when it swapped). Used for the RDMA CQ poller's lock.
// GPU-scope relaxed add, for counters only this GPU's threads touch (a
// queue pair's reservation head).
MC_DEVICE uint64_t mc_atomic_add_relaxed_gpu(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.relaxed.gpu.global.add.u64 %0, [%1], %2;"
               : "=l"(old)
               : "l"(p), "l"(v)
               : "memory");
  return old;
}

// GPU-scope acquiring CAS (a lock only this GPU's threads take).
MC_DEVICE uint32_t mc_atomic_cas_acquire_gpu(uint32_t* p, uint32_t expected, uint32_t desired) {
  uint32_t old;
  asm volatile("atom.acquire.gpu.global.cas.b32 %0, [%1], %2, %3;"
               : "=r"(old)
               : "l"(p), "r"(expected), "r"(desired)
               : "memory");
  return old;
}

MC_DEVICE uint32_t mc_atomic_cas_acquire(uint32_t* p, uint32_t expected, uint32_t desired) {
  uint32_t old;
  asm volatile("atom.acquire.sys.global.cas.b32 %0, [%1], %2, %3;"
               : "=r"(old)
               : "l"(p), "r"(expected), "r"(desired)
               : "memory");
  return old;
}

// An 8-byte store to a device register (the NIC doorbell in a UAR page the
// GPU maps as I/O memory): volatile, after a system fence, never combined.
MC_DEVICE void mc_st_mmio64(uint64_t* p, uint64_t v) {
  asm volatile("fence.sc.sys;" ::: "memory");
  *reinterpret_cast<volatile uint64_t*>(p) = v;
}

// The same store without the fence, for a caller whose release store just
// before it (the doorbell record) already ordered every earlier write: a
// release is a fence.acq_rel, which orders earlier writes before every later
// one, this store included. Saves a second system fence per doorbell.
MC_DEVICE void mc_st_mmio64_after_release(uint64_t* p, uint64_t v) {
  *reinterpret_cast<volatile uint64_t*>(p) = v;
}

// ---- 16-byte vector accesses (p 16-byte aligned) --------------------------

MC_DEVICE McVec16 mc_ld_v4(const void* p) {
  McVec16 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Non-coherent (read-only path), no L1 allocation, 256-byte L2 prefetch.
// Only for data no one writes while the kernel runs: the nc path may return
// stale bytes for memory modified during the kernel.
MC_DEVICE McVec16 mc_ld_nc_v4(const void* p) {
  McVec16 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

MC_DEVICE void mc_st_v4(void* p, McVec16 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

// Store that does not allocate in L1: the line is remote (peer GPU), so
// keeping it in this SM's L1 only evicts useful data.
MC_DEVICE void mc_st_na_v4(void* p, McVec16 v) {
  asm volatile("st.global.L1::no_allocate.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// LL slot store/load: one 16-byte vector access whose two 8-byte elements
// are each single-copy atomic and strong at system scope (the PTX memory
// model treats a vector access as per-element accesses of unspecified order,
// which is exactly what McLLSlot is built to tolerate).
MC_DEVICE void mc_st_relaxed_v2u64(void* p, uint64_t a, uint64_t b) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
MC_DEVICE void mc_ld_relaxed_v2u64(const void* p, uint64_t* a, uint64_t* b) {
  uint64_t x, y;
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(x), "=l"(y)
               : "l"(p)
               : "memory");
  *a = x;
  *b = y;
}

// ---- byte swaps (WQE fields are big-endian) -------------------------------

MC_HOST_DEVICE uint32_t mc_bswap32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, 0u, 0x0123);
#else
  return __builtin_bswap32(x);
#endif
}
MC_HOST_DEVICE uint16_t mc_bswap16(uint16_t x) {
#if defined(__CUDA_ARCH__)
  // Result byte 0 <- x byte 1, byte 1 <- x byte 0, bytes 2-3 <- zero byte.
  return static_cast<uint16_t>(__byte_perm(static_cast<uint32_t>(x), 0u, 0x4401));
#else
  return __builtin_bswap16(x);
#endif
}
MC_HOST_DEVICE uint64_t mc_bswap64(uint64_t x) {
  return (static_cast<uint64_t>(mc_bswap32(static_cast<uint32_t>(x))) << 32) |
         mc_bswap32(static_cast<uint32_t>(x >> 32));
}

// ---- fences and barriers --------------------------------------------------

MC_DEVICE void mc_compiler_barrier() { asm volatile("" ::: "memory"); }

// Earlier accesses of this thread are ordered before its later strong writes
// as seen by an acquiring reader anywhere in the system; lighter than
// fence.sc.sys.
MC_DEVICE void mc_fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// __threadfence_system(): sequentially consistent at system scope.
MC_DEVICE void mc_fence_sc_sys() { asm volatile("fence.sc.sys;" ::: "memory"); }

MC_DEVICE unsigned mc_warp_size() { return kMcCudaWarpSize; }
MC_DEVICE unsigned mc_lane_id() {
  unsigned lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}
MC_DEVICE unsigned mc_block_size() { return blockDim.x * blockDim.y * blockDim.z; }
MC_DEVICE unsigned mc_block_thread_index() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

// All 32 lanes must reach it (full mask), as every cooperative put requires.
MC_DEVICE void mc_syncwarp() { __syncwarp(); }
MC_DEVICE void mc_syncthreads() { __syncthreads(); }

// ---- warp collectives (all 32 lanes, converged) --------------------------

MC_DEVICE uint64_t mc_warp_bcast_u64(uint64_t v, unsigned src_lane) {
  return __shfl_sync(0xffffffffu, v, static_cast<int>(src_lane));
}

// Numbers the lanes whose `pred` holds, in lane order: index in [0, *total).
MC_DEVICE unsigned mc_warp_rank(bool pred, unsigned* total) {
  const unsigned mask = __ballot_sync(0xffffffffu, pred);
  unsigned lt;
  asm volatile("mov.u32 %0, %%lanemask_lt;" : "=r"(lt));
  *total = static_cast<unsigned>(__popc(mask));
  return static_cast<unsigned>(__popc(mask & lt));
}

// ---- block collectives (every thread of the block, converged) -------------
// Each is two __syncthreads(): the second lets the next call reuse the
// shared words. Blocks of any size up to 1024 threads, a partial last warp
// included.

MC_DEVICE uint64_t mc_block_bcast_u64(uint64_t v, unsigned src_thread) {
  __shared__ uint64_t word;
  if (mc_block_thread_index() == src_thread) word = v;
  __syncthreads();
  const uint64_t r = word;
  __syncthreads();
  return r;
}

// Numbers the threads whose `pred` holds, in thread order: index in
// [0, *total).
MC_DEVICE unsigned mc_block_rank(bool pred, unsigned* total) {
  __shared__ unsigned per_warp[32];
  const unsigned t = mc_block_thread_index();
  const unsigned warp = t / kMcCudaWarpSize;
  const unsigned mask = __ballot_sync(__activemask(), pred);
  if (t % kMcCudaWarpSize == 0) per_warp[warp] = static_cast<unsigned>(__popc(mask));
  __syncthreads();
  const unsigned warps = (mc_block_size() + kMcCudaWarpSize - 1) / kMcCudaWarpSize;
  unsigned before = 0, all = 0;
  for (unsigned w = 0; w < warps; ++w) {
    const unsigned c = per_warp[w];
    before += w < warp ? c : 0u;
    all += c;
  }
  __syncthreads();
  unsigned lt;
  asm volatile("mov.u32 %0, %%lanemask_lt;" : "=r"(lt));
  *total = all;
  return before + static_cast<unsigned>(__popc(mask & lt));
}

// ---- lane groups: the lanes running a call together --------------------------
// The lanes of this warp that execute the call at the same time (converged,
// whatever the caller's branches) and pass the same `key`: a queue pair's
// posts from them go out as one batch. Unlike the warp collectives above, no
// lane has to be present: a lone lane is a group of one.
struct McLaneGroup {
  unsigned mask;    // the group's lanes
  unsigned leader;  // its lowest lane
  unsigned rank;    // this lane's index in the group, in lane order
  unsigned size;
};
MC_DEVICE McLaneGroup mc_lanes_with_key(uint64_t key) {
  const unsigned active = __activemask();
  const unsigned mask = __match_any_sync(active, static_cast<unsigned long long>(key));
  unsigned lt;
  asm volatile("mov.u32 %0, %%lanemask_lt;" : "=r"(lt));
  return McLaneGroup{mask, static_cast<unsigned>(__ffs(mask) - 1),
                     static_cast<unsigned>(__popc(mask & lt)), static_cast<unsigned>(__popc(mask))};
}
MC_DEVICE bool mc_group_leader(const McLaneGroup& g) { return g.rank == 0; }
MC_DEVICE uint64_t mc_group_bcast_u64(const McLaneGroup& g, uint64_t v) {
  return __shfl_sync(g.mask, v, static_cast<int>(g.leader));
}
// Orders the group's earlier writes before its later ones (as __syncwarp).
MC_DEVICE void mc_group_sync(const McLaneGroup& g) { __syncwarp(g.mask); }

// ---- spinning, time, abort ------------------------------------------------

// A polite spin for pollers and waiters: the first 32 rounds at full speed
// (a completion is usually a microsecond away), then __nanosleep of 64 ns,
// doubling to 1 us, so many warps waiting on one queue pair leave its words
// and the SMs' issue slots to the threads doing the work.
MC_DEVICE void mc_spin_backoff(uint32_t* spins) {
  const uint32_t s = ++*spins;
  if (s <= 32u) return;
  const uint32_t shift = (s - 32u) / 32u;
  __nanosleep(shift >= 4u ? 1024u : 64u << shift);
}

MC_DEVICE uint64_t mc_time_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

[[noreturn]] __device__ inline void mc_trap() {
  __trap();
  __builtin_unreachable();
}

}  // namespace device
}  // namespace mooncake
