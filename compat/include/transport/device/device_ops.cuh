// Upstream Mooncake's platform ops under their upstream names and argument
// types (<transport/device/device_ops.cuh>), over this project's ops
// (mooncake/device/platform.h). One platform per translation unit, chosen
// at compile time as the native API chooses it: CUDA under nvcc, the host
// platform (CPU threads over shared memory) under a plain C++20 compiler.
//
// What each name does, and where it differs from upstream (docs/compat.md):
//   mc_ld_acquire(const int*)            ld.acquire.sys (native template)
//   mc_ld_acquire_u64, mc_ld_volatile_u64  acquire / relaxed 64-bit loads
//   mc_st_release(const int*, int)       st.release.sys (also _u32, _u64)
//   mc_atomic_add_release(const int*, int)  atom.add.release.sys; old value
//   mc_ld_nc(const int4*), mc_ld_nc_s32/_f32/_s64  non-coherent loads
//   mc_st_na(const int4*, const int4&)   16-byte store, no L1 allocation
//   mc_bar_init, mc_bar_sync(id, n)      named barriers
//   mc_grid_sync()                       whole-grid barrier
//   mc_fence()                           a real system-scope fence here
//                                        (upstream: a no-op on CUDA)
//   mc_fence_barrier_fence()             block barrier with its ordering
//   mc_bswap16/32/64                     byte swaps (native)
// Upstream takes `const int*` for the stores and atomics it writes through;
// the overloads below accept that. With a non-const pointer the native
// templates (any 4- or 8-byte integer) are chosen instead; same meaning.
//
// Host platform: `int4` (CUDA's vector type) is declared here at global
// scope when no CUDA header provides it; a "grid" is one block (host_coop.h
// runs a kernel body as one block of threads), so mc_grid_sync is a block
// barrier, and mc_bar_sync must name the whole block (it aborts otherwise:
// the host platform has no named sub-block barriers).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "mooncake/device/comm_device.h"  // mc_fence, and the platform ops
#include "mooncake/device/platform.h"

#if defined(MC_PLATFORM_CUDA)
#include <cooperative_groups.h>
#elif !defined(__CUDACC__)
// CUDA's 16-byte vector of four ints, for host-platform builds of code
// written for CUDA (same layout and alignment as vector_types.h's).
struct alignas(16) int4 {
  int x, y, z, w;
};
#endif

namespace mooncake {
namespace device {

static_assert(sizeof(int4) == sizeof(McVec16) && alignof(int4) == alignof(McVec16),
              "int4 must be one 16-byte vector");

// ---- loads with ordering --------------------------------------------------
// mc_ld_acquire(const int*) is the native template (any 4- or 8-byte integer).

MC_DEVICE uint64_t mc_ld_acquire_u64(const uint64_t* ptr) { return mc_ld_acquire(ptr); }

// A polling load that orders nothing (upstream: ld.volatile). A waiter
// acquires once (mc_ld_acquire) after it sees the awaited value.
MC_DEVICE uint64_t mc_ld_volatile_u64(const uint64_t* ptr) { return mc_ld_relaxed(ptr); }

// ---- stores and atomics with ordering -------------------------------------

MC_DEVICE void mc_st_release(const int* ptr, int val) { mc_st_release(const_cast<int*>(ptr), val); }
MC_DEVICE void mc_st_release_u32(const uint32_t* ptr, uint32_t val) {
  mc_st_release(const_cast<uint32_t*>(ptr), val);
}
MC_DEVICE void mc_st_release_u64(const uint64_t* ptr, uint64_t val) {
  mc_st_release(const_cast<uint64_t*>(ptr), val);
}

// Returns the value before the add.
MC_DEVICE int mc_atomic_add_release(const int* ptr, int val) {
  return mc_atomic_add_release(const_cast<int*>(ptr), val);
}

// ---- non-coherent loads and non-allocating stores --------------------------
// `nc` loads go through the read-only path on CUDA: the data must not change
// while the kernel reads it (the sender's own source buffer).

MC_DEVICE int4 mc_ld_nc(const int4* ptr) {
  const McVec16 v = mc_ld_nc_v4(ptr);
  int4 r;
  std::memcpy(&r, &v, sizeof(r));
  return r;
}

MC_DEVICE void mc_st_na(const int4* ptr, const int4& val) {
  McVec16 v;
  std::memcpy(&v, &val, sizeof(v));
  mc_st_na_v4(const_cast<int4*>(ptr), v);
}

#if defined(MC_PLATFORM_CUDA)
MC_DEVICE int mc_ld_nc_s32(const int* ptr) {
  int v;
  asm volatile("ld.global.nc.L1::no_allocate.s32 %0, [%1];" : "=r"(v) : "l"(ptr));
  return v;
}
MC_DEVICE float mc_ld_nc_f32(const float* ptr) {
  float v;
  asm volatile("ld.global.nc.L1::no_allocate.f32 %0, [%1];" : "=f"(v) : "l"(ptr));
  return v;
}
MC_DEVICE int64_t mc_ld_nc_s64(const int64_t* ptr) {
  int64_t v;
  asm volatile("ld.global.nc.L1::no_allocate.s64 %0, [%1];" : "=l"(v) : "l"(ptr));
  return v;
}
#else
// The host has no read-only cache: ordinary loads, ordered by the
// acquire that made the data visible.
MC_DEVICE int mc_ld_nc_s32(const int* ptr) { return *ptr; }
MC_DEVICE float mc_ld_nc_f32(const float* ptr) { return *ptr; }
MC_DEVICE int64_t mc_ld_nc_s64(const int64_t* ptr) { return *ptr; }
#endif

// ---- barriers and fences ----------------------------------------------------
// mc_fence() is the native one (comm_device.h): a system-scope acq_rel fence.

// Named barriers need no set-up on either platform.
MC_DEVICE void mc_bar_init() {}

#if defined(MC_PLATFORM_CUDA)
// `num_threads` threads (a multiple of 32) meet at hardware barrier `bar_id`.
MC_DEVICE void mc_bar_sync(int bar_id, int num_threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(bar_id), "r"(num_threads) : "memory");
}

// Every thread of the grid meets; needs a cooperative launch
// (cudaLaunchCooperativeKernel or the cooperative launch attribute).
MC_DEVICE void mc_grid_sync() { cooperative_groups::this_grid().sync(); }
#else
MC_DEVICE void mc_bar_sync(int bar_id, int num_threads) {
  if (static_cast<unsigned>(num_threads) != mc_block_size()) {
    std::fprintf(stderr,
                 "mooncake device (host platform): mc_bar_sync(%d, %d) in a block of %u threads: "
                 "the host platform has block-wide barriers only\n",
                 bar_id, num_threads, mc_block_size());
    std::abort();
  }
  mc_syncthreads();
}

// A host "kernel" is one block: the grid barrier is the block barrier.
MC_DEVICE void mc_grid_sync() { mc_syncthreads(); }
#endif

// A block barrier that also orders the block's memory operations (what
// __syncthreads gives on CUDA, what the barrier gives on the host).
MC_DEVICE void mc_fence_barrier_fence() { mc_syncthreads(); }

}  // namespace device
}  // namespace mooncake
