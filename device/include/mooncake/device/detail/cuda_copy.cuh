// Copy primitives for device code on CUDA: one thread, one warp, one block or
// several blocks move an arbitrary byte range, typically from local GPU
// memory into a peer GPU's memory mapped over NVLink (a P2P "put").
//
// Contract (all of them):
//  - `dst` and `src` may have any alignment and `n` any size (0 is a no-op).
//  - The ranges must not overlap.
//  - `src` is read through the non-coherent (read-only) path, so by the PTX
//    rule for ld.global.nc it must not be written while the kernel that
//    copies it runs (writes by earlier kernels are fine). A source produced
//    or modified by the same kernel must go through
//    mc_detail_copy_group<kUnroll, false> (coherent loads).
//  - The stores are weak (relaxed, not ordered). A caller that signals the
//    peer after the copy must order the stores first (fence / release), and
//    for warp/block copies wait for every participating lane (__syncwarp /
//    __syncthreads) before one of them signals.
//  - Warp variant: all 32 lanes of the warp call it with the same arguments,
//    `lane` = threadIdx.x % 32 (or any 0..31 permutation). Block and tiles
//    variants: every thread of each participating block calls it with the
//    same arguments. None synchronises on entry or exit.
//  - Registers: the block copy keeps 4 x 16 bytes in flight per thread (32
//    registers on its own, 60 for the 8-deep thread/warp copies); a kernel
//    launched with 1024-thread blocks should declare __launch_bounds__(1024)
//    so the compiler keeps the whole kernel within 64.
//  - Thread-safety: none needed beyond the above; concurrent copies into the
//    same destination bytes race like plain stores.
//
// How: the bytes before the first 16-byte aligned destination address and
// after the last one are copied one by one; the body moves 16 bytes per
// access with several loads in flight per thread before their stores (the
// NVLink path needs many outstanding writes to reach its bandwidth). When
// source and destination are misaligned relative to each other, aligned
// source words are loaded and shifted so the destination still receives
// aligned 16-byte stores.
//
// Measured on 2x H200 (bench/results/2026-11-29-h200x2-p2p.md): a put spread
// over the GPU with mc_detail_copy_tiles reaches 347 GB/s at 16 MiB and
// 369-371 GB/s at 256 MiB-1 GiB, 0.94-0.95x cudaMemcpyPeerAsync, the same
// ceiling as TMA bulk copies and above NVSHMEM putmem_block.
#pragma once

#if !defined(__CUDACC__)
#error "cuda_copy.cuh is CUDA device code: include it only from .cu files compiled by nvcc"
#endif

#include <cstddef>
#include <cstdint>

// 16-byte loads in flight per thread in the vectorised body, before their
// stores. A lone thread or warp is latency-bound, so it keeps 8 in flight; a
// block has enough threads that 4 reach the same NVLink bandwidth (measured:
// bench/results/2026-11-29-h200x2-p2p.md) with half the registers, which
// keeps 1024-thread blocks launchable.
#ifndef MC_DETAIL_COPY_UNROLL
#define MC_DETAIL_COPY_UNROLL 8
#endif
#ifndef MC_DETAIL_COPY_UNROLL_BLOCK
#define MC_DETAIL_COPY_UNROLL_BLOCK 4
#endif

// Tile size of mc_detail_copy_tiles. Large puts split into one contiguous
// slice per block (>= ~1 MiB each) lose ~6% NVLink bandwidth on H200 against
// the same bytes interleaved across blocks in smaller tiles (bench results).
#ifndef MC_DETAIL_COPY_TILE_BYTES
#define MC_DETAIL_COPY_TILE_BYTES (64u * 1024u)
#endif

namespace mooncake {
namespace device {

// 16-byte load through the read-only path, without allocating in L1 (the data
// is streamed once; keeping it out of L1 leaves room for the caller's data).
__device__ __forceinline__ int4 mc_detail_ld_nc_v4(const int4* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// 16-byte coherent (weak) load, for sources that may be written concurrently.
__device__ __forceinline__ int4 mc_detail_ld_v4(const int4* p) {
  int4 v;
  asm volatile("ld.global.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

template <bool kNonCoherent>
__device__ __forceinline__ int4 mc_detail_ld_src_v4(const int4* p) {
  if constexpr (kNonCoherent) {
    return mc_detail_ld_nc_v4(p);
  } else {
    return mc_detail_ld_v4(p);
  }
}

// 16-byte weak store that does not allocate in L1 (remote lines never hit
// there anyway; local ones are not read back by the copier).
__device__ __forceinline__ void mc_detail_st_na_v4(int4* p, int4 v) {
  asm volatile("st.global.L1::no_allocate.v4.s32 [%0], {%1, %2, %3, %4};"
               :
               : "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Bytes [offset .. offset+count) of the 32-byte little-endian concatenation
// lo:hi, for a compile-time word offset kWord (0..3) and a run-time bit shift
// 8*(offset%4) in 8..24. Funnel shifts keep everything in registers; a
// run-time word index into an array would spill to local memory.
template <int kWord>
__device__ __forceinline__ int4 mc_detail_shift_v4(int4 lo, int4 hi, unsigned shift) {
  const unsigned w[8] = {(unsigned)lo.x, (unsigned)lo.y, (unsigned)lo.z, (unsigned)lo.w,
                         (unsigned)hi.x, (unsigned)hi.y, (unsigned)hi.z, (unsigned)hi.w};
  int4 r;
  r.x = (int)__funnelshift_r(w[kWord + 0], w[kWord + 1], shift);
  r.y = (int)__funnelshift_r(w[kWord + 1], w[kWord + 2], shift);
  r.z = (int)__funnelshift_r(w[kWord + 2], w[kWord + 3], shift);
  r.w = (int)__funnelshift_r(w[kWord + 3], w[kWord + 4], shift);
  return r;
}

// Byte-granular copy of n bytes shared by `size` threads; `rank` in [0,size).
__device__ __forceinline__ void mc_detail_copy_bytes(unsigned char* d, const unsigned char* s,
                                                     size_t n, unsigned rank, unsigned size) {
  for (size_t i = rank; i < n; i += size) d[i] = s[i];
}

// Body for 16-byte aligned dst and src: nvec units of 16 bytes. Each group
// step covers size*kUnroll units; inside a step thread `rank` takes units
// rank, rank+size, ... so each load/store instruction of a warp touches 512
// contiguous bytes.
template <int kUnroll, bool kNonCoherent>
__device__ __forceinline__ void mc_detail_copy_v4_aligned(int4* d, const int4* s, size_t nvec,
                                                          unsigned rank, unsigned size) {
  const size_t step = (size_t)size * kUnroll;
  const size_t full = nvec - nvec % step;
  for (size_t base = rank; base < full; base += step) {
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      v[u] = mc_detail_ld_src_v4<kNonCoherent>(s + base + (size_t)u * size);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) mc_detail_st_na_v4(d + base + (size_t)u * size, v[u]);
  }
  for (size_t i = full + rank; i < nvec; i += size)
    mc_detail_st_na_v4(d + i, mc_detail_ld_src_v4<kNonCoherent>(s + i));
}

// Body for a 16-byte aligned dst whose source is not 16-byte aligned:
// destination unit i receives source bytes [16*i + off, 16*i + off + 16) of
// the aligned source words w (w = align_down(src)), i.e. words i and i+1
// shifted by off bytes. Units [first, last) only; the caller guarantees both
// words of every such unit lie inside the source range.
template <int kUnroll, bool kNonCoherent, int kWord>
__device__ __forceinline__ void mc_detail_copy_v4_shifted(int4* d, const int4* w, size_t first,
                                                          size_t last, unsigned shift,
                                                          unsigned rank, unsigned size) {
  const size_t step = (size_t)size * kUnroll;
  const size_t count = last - first;
  const size_t full = first + (count - count % step);
  for (size_t base = first + rank; base < full; base += step) {
    int4 lo[kUnroll], hi[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      lo[u] = mc_detail_ld_src_v4<kNonCoherent>(w + base + (size_t)u * size);
      hi[u] = mc_detail_ld_src_v4<kNonCoherent>(w + base + (size_t)u * size + 1);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      mc_detail_st_na_v4(d + base + (size_t)u * size,
                         mc_detail_shift_v4<kWord>(lo[u], hi[u], shift));
  }
  for (size_t i = full + rank; i < last; i += size) {
    int4 lo = mc_detail_ld_src_v4<kNonCoherent>(w + i);
    int4 hi = mc_detail_ld_src_v4<kNonCoherent>(w + i + 1);
    mc_detail_st_na_v4(d + i, mc_detail_shift_v4<kWord>(lo, hi, shift));
  }
}

// The general group copy: `size` threads (any number, e.g. a whole grid)
// with distinct ranks in [0, size) call it with the same arguments and
// together copy n bytes. The three public variants below are this with
// (rank, size) = (0, 1), (lane, 32) and (threadIdx, blockDim).
template <int kUnroll = MC_DETAIL_COPY_UNROLL, bool kNonCoherent = true>
__device__ __forceinline__ void mc_detail_copy_group(void* dst, const void* src, size_t n,
                                                     unsigned rank, unsigned size) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // Bytes until dst is 16-byte aligned.
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > n) head = n;
  mc_detail_copy_bytes(d, s, head, rank, size);
  d += head;
  s += head;
  n -= head;
  const size_t nvec = n / 16;
  const unsigned off = (unsigned)((uintptr_t)s & 15);
  if (off == 0) {
    mc_detail_copy_v4_aligned<kUnroll, kNonCoherent>(
        reinterpret_cast<int4*>(d), reinterpret_cast<const int4*>(s), nvec, rank, size);
    mc_detail_copy_bytes(d + nvec * 16, s + nvec * 16, n - nvec * 16, rank, size);
    return;
  }
  // Misaligned source. Unit i needs aligned words i and i+1 from
  // w = align_down(s); word 0 starts before s and word nvec may end after
  // s+n, so units 0 and nvec-1 (and the byte tail) go byte by byte and no
  // load ever leaves [s, s+n).
  if (nvec < 3) {
    mc_detail_copy_bytes(d, s, n, rank, size);
    return;
  }
  const auto* w = reinterpret_cast<const int4*>(s - off);
  auto* dv = reinterpret_cast<int4*>(d);
  const unsigned shift = 8 * (off & 3);
  switch (off >> 2) {
    case 0:
      mc_detail_copy_v4_shifted<kUnroll, kNonCoherent, 0>(dv, w, 1, nvec - 1, shift, rank, size);
      break;
    case 1:
      mc_detail_copy_v4_shifted<kUnroll, kNonCoherent, 1>(dv, w, 1, nvec - 1, shift, rank, size);
      break;
    case 2:
      mc_detail_copy_v4_shifted<kUnroll, kNonCoherent, 2>(dv, w, 1, nvec - 1, shift, rank, size);
      break;
    default:
      mc_detail_copy_v4_shifted<kUnroll, kNonCoherent, 3>(dv, w, 1, nvec - 1, shift, rank, size);
      break;
  }
  // Head unit 0, last full unit and the byte tail: at most 16 + 16 + 15 bytes.
  mc_detail_copy_bytes(d, s, 16, rank, size);
  mc_detail_copy_bytes(d + (nvec - 1) * 16, s + (nvec - 1) * 16, n - (nvec - 1) * 16, rank, size);
}

// One thread copies n bytes.
__device__ __forceinline__ void mc_detail_copy_thread(void* dst, const void* src, size_t n) {
  mc_detail_copy_group(dst, src, n, 0u, 1u);
}

// The 32 lanes of a warp copy n bytes together; every lane calls with the
// same dst/src/n and its own lane id. No __syncwarp on entry or exit.
__device__ __forceinline__ void mc_detail_copy_warp(void* dst, const void* src, size_t n,
                                                    unsigned lane) {
  mc_detail_copy_group(dst, src, n, lane & 31u, 32u);
}

// All threads of the block copy n bytes together (1-D rank over a block of
// any shape). No __syncthreads on entry or exit.
__device__ __forceinline__ void mc_detail_copy_block(void* dst, const void* src, size_t n) {
  const unsigned rank = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned size = blockDim.x * blockDim.y * blockDim.z;
  mc_detail_copy_group<MC_DETAIL_COPY_UNROLL_BLOCK>(dst, src, n, rank, size);
}

// Several blocks copy n bytes together, tile by tile: block `block` of
// `blocks` takes tiles block, block + blocks, ... of `tile` bytes (a multiple
// of 16; tiles start at dst-relative offsets so every tile but the first
// keeps dst's alignment). Every thread of each participating block calls it
// with the same arguments. Use it instead of one contiguous slice per block
// for large multi-block puts (see MC_DETAIL_COPY_TILE_BYTES).
__device__ __forceinline__ void mc_detail_copy_tiles(void* dst, const void* src, size_t n,
                                                     unsigned block, unsigned blocks,
                                                     size_t tile = MC_DETAIL_COPY_TILE_BYTES) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const unsigned rank = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned size = blockDim.x * blockDim.y * blockDim.z;
  for (size_t off = (size_t)block * tile; off < n; off += (size_t)blocks * tile) {
    const size_t len = n - off < tile ? n - off : tile;
    mc_detail_copy_group<MC_DETAIL_COPY_UNROLL_BLOCK>(d + off, s + off, len, rank, size);
  }
}

}  // namespace device
}  // namespace mooncake
