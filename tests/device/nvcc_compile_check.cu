// Compile-only: the Device API headers under nvcc. Every op and device
// function is instantiated in a kernel, for every integer type it accepts,
// so ptxas validates the inline PTX for MOONCAKE_CUDA_ARCHITECTURES. Nothing
// launches these kernels (this machine has no GPU); the GPU tests in
// tests/gpu/ run them.
#include <cstdint>

#include "mooncake/device/comm_device.h"
#include "mooncake/device/device_transport.h"  // host header: must also compile under nvcc

static_assert(MC_PLATFORM_CUDA, "nvcc must select the CUDA platform");

namespace mooncake::device {
// External linkage on purpose: unreferenced internal kernels could be
// dropped before ptxas sees them.

template <class T>
__device__ void exerciseWord(T* p, T* out) {
  T v = mc_ld_acquire(p);
  v += mc_ld_relaxed(p);
  mc_st_release(p, v);
  mc_st_relaxed(p, v);
  v += mc_atomic_add_release(p, T{1});
  v += mc_atomic_add_relaxed(p, T{1});
  mc_red_add_release(p, T{2});
  v += mc_wait_until(p, McCmp::kGe, T{0});
  T seen{};
  if (mc_wait_until_for(p, McCmp::kNe, T{5}, 1000, &seen)) v += seen;
  *out = v;
}

template <class T>
__device__ void exerciseComm(const CommCtx& ctx, T* sym, T* out) {
  McStatus s1 = mc_signal(ctx, 1, sym, T{1});
  McStatus s2 = mc_signal_relaxed(ctx, 1, sym, T{2});
  McStatus s3 = mc_red_add(ctx, 1, sym, T{3});
  *out = static_cast<T>(static_cast<int>(s1) + static_cast<int>(s2) + static_cast<int>(s3));
}

__global__ void opsKernel(uint32_t* u32, int32_t* s32, uint64_t* u64, int64_t* s64, McVec16* vec,
                          McLLSlot* slot, uint64_t* out) {
  exerciseWord(u32, u32 + 1);
  exerciseWord(s32, s32 + 1);
  exerciseWord(u64, u64 + 1);
  exerciseWord(s64, s64 + 1);
  McVec16 v = mc_ld_v4(vec);
  McVec16 w = mc_ld_nc_v4(vec + 1);
  v.x ^= w.y;
  mc_st_v4(vec + 2, v);
  mc_st_na_v4(vec + 3, w);
  mc_st_relaxed_v2u64(slot, 1, 2);
  uint64_t a = 0, b = 0;
  mc_ld_relaxed_v2u64(slot, &a, &b);
  out[0] = a + b + mc_bswap64(a) + mc_bswap32(static_cast<uint32_t>(b)) + mc_bswap16(7) +
           mc_time_ns() + mc_lane_id() + mc_warp_size() + mc_block_size() + mc_block_thread_index();
  mc_compiler_barrier();
  mc_fence_acq_rel_sys();
  mc_fence_sc_sys();
  mc_syncwarp();
  mc_syncthreads();
  if (out[1] == 0xdead) mc_trap();
}

__global__ void commKernel(CommCtx ctx, unsigned char* sym, const unsigned char* src, size_t n,
                           uint64_t* out) {
  const unsigned lane = threadIdx.x % 32;
  void* route = mc_route_put(ctx, 1, static_cast<void*>(sym));
  int st = static_cast<int>(mc_put_thread(ctx, 1, sym, src, n));
  st += static_cast<int>(mc_put_warp(ctx, 1, sym, src, n, lane));
  st += static_cast<int>(mc_put_lanes(ctx, 1, sym + 64 * lane, src + 64 * lane, n));
  st += static_cast<int>(
      mc_put_lanes_block(ctx, 1, sym + 64 * threadIdx.x, src + 64 * threadIdx.x, n));
  st += static_cast<int>(mc_put_block(ctx, 1, sym, src, n));
  uint32_t r32 = 0;
  uint64_t r64 = 0;
  exerciseComm(ctx, reinterpret_cast<uint32_t*>(sym), &r32);
  exerciseComm(ctx, reinterpret_cast<int32_t*>(sym), reinterpret_cast<int32_t*>(&r32));
  exerciseComm(ctx, reinterpret_cast<uint64_t*>(sym), &r64);
  exerciseComm(ctx, reinterpret_cast<int64_t*>(sym), reinterpret_cast<int64_t*>(&r64));
  mc_fence();
  st += static_cast<int>(mc_quiet(ctx));
  auto* slot = reinterpret_cast<McLLSlot*>(sym);
  st += static_cast<int>(mc_put_signal_ll(ctx, 1, slot, 42, 1));
  uint64_t d = 0;
  if (mc_poll_ll(slot, 1, &d)) d += mc_wait_ll(slot, 1);
  out[threadIdx.x] = d + r32 + r64 + st + reinterpret_cast<uintptr_t>(route) +
                     (mc_p2p_available(ctx, 1) ? 1 : 0) + (mc_rank_valid(ctx, 1) ? 1 : 0);
}

}  // namespace mooncake::device

// Host-side use of the same headers in an nvcc translation unit.
int mooncakeDeviceNvccCompileCheckHost() {
  mooncake::device::CommCtx ctx;
  return ctx.num_ranks + static_cast<int>(mooncake::device::mc_bswap32(1u) >> 24) +
         static_cast<int>(mooncake::device::mc_rank_valid(ctx, 0));
}
