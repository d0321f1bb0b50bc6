// Copy primitives of the host platform (the CUDA ones are in cuda_copy.cuh).
//
// "Cooperative" on the host means the threads of an emulated warp/block
// (host_coop.h) each call the function with the same arguments; each copies
// one contiguous share, cut at 64-byte boundaries of dst so two threads
// never write the same cache line. None of them synchronises: the caller
// (mc_put_warp / mc_put_block) places the barrier.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "mooncake/device/detail/macros.h"
#include "mooncake/device/ops_host.h"

namespace mooncake {
namespace device {

namespace host_detail {

// Copies the part of [0, n) that belongs to participant `index` of `count`.
inline void CopyShare(void* dst, const void* src, size_t n, unsigned index, unsigned count) {
  if (n == 0 || count == 0 || index >= count) return;
  constexpr uintptr_t kLine = 64;
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
  // Cut points are dst offsets where dst+offset is line-aligned, so the
  // shares tile [0, n) exactly and never split a destination line.
  const size_t head = static_cast<size_t>((kLine - (d % kLine)) % kLine);
  auto cut = [&](unsigned k) -> size_t {
    if (k == 0) return 0;
    if (k >= count) return n;
    if (n <= head) return n;
    const size_t lines = (n - head + kLine - 1) / kLine;
    const size_t at = head + (lines * k / count) * kLine;
    return at < n ? at : n;
  };
  const size_t begin = cut(index);
  const size_t end = cut(index + 1);
  if (end > begin) {
    std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin,
                end - begin);
  }
}

}  // namespace host_detail

MC_DEVICE void mc_detail_copy_thread(void* dst, const void* src, size_t n) {
  if (n != 0) std::memcpy(dst, src, n);
}

MC_DEVICE void mc_detail_copy_warp(void* dst, const void* src, size_t n, unsigned lane) {
  host_detail::CopyShare(dst, src, n, lane, mc_warp_size());
}

MC_DEVICE void mc_detail_copy_block(void* dst, const void* src, size_t n) {
  host_detail::CopyShare(dst, src, n, mc_block_thread_index(), mc_block_size());
}

// Host twin of the CUDA tile copy: block `block` of `blocks` takes tiles
// block, block + blocks, ...; within a tile the threads of the (emulated)
// block share the bytes.
MC_DEVICE void mc_detail_copy_tiles(void* dst, const void* src, size_t n, unsigned block,
                                    unsigned blocks, size_t tile = 64u * 1024u) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (blocks == 0 || tile == 0) return;
  for (size_t off = static_cast<size_t>(block) * tile; off < n;
       off += static_cast<size_t>(blocks) * tile) {
    const size_t len = n - off < tile ? n - off : tile;
    host_detail::CopyShare(d + off, s + off, len, mc_block_thread_index(), mc_block_size());
  }
}

}  // namespace device
}  // namespace mooncake
