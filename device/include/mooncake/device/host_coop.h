// Host platform only: runs a "kernel" body on a group of std::threads that
// behaves as a CUDA warp or block does for the Device API (mc_lane_id,
// mc_warp_size, mc_block_thread_index, mc_block_size, mc_syncwarp,
// mc_syncthreads, the warp and block collectives), so cooperative calls
// such as mc_put_warp run the same way they do on a GPU.
//
//   mooncake::device::host::runWarp(8, [&](unsigned lane) {
//     mc_put_warp(ctx, peer, dst, src, n, lane);
//   });
//
// A block of n threads is cut into warps of up to kMcCudaWarpSize
// consecutive threads, as on the GPU. Both calls return after every thread
// has finished; the thread body must not throw.
#pragma once

#if defined(__CUDACC__) && !defined(MOONCAKE_DEVICE_FORCE_HOST)
#error "host_coop.h belongs to the host platform; CUDA kernels get warps from the hardware"
#endif

#include <algorithm>
#include <barrier>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "mooncake/device/ops_host.h"

namespace mooncake {
namespace device {
namespace host {

// Runs fn(thread_index) on `threads` threads forming one block.
template <class F>
void runBlock(unsigned threads, F&& fn) {
  if (threads == 0) return;
  std::barrier<> block_barrier(static_cast<std::ptrdiff_t>(threads));
  host_detail::CoopShared block_shared;
  const host_detail::CoopGroup block{threads, &block_barrier, &block_shared};

  const unsigned warps = (threads + kMcCudaWarpSize - 1) / kMcCudaWarpSize;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
  std::vector<host_detail::CoopShared> warp_shared(warps);
  std::vector<host_detail::CoopGroup> warp_groups(warps);
  for (unsigned w = 0; w < warps; ++w) {
    const unsigned first = w * kMcCudaWarpSize;
    const unsigned width = std::min(kMcCudaWarpSize, threads - first);
    warp_barriers.push_back(std::make_unique<std::barrier<>>(static_cast<std::ptrdiff_t>(width)));
    warp_groups[w] = host_detail::CoopGroup{width, warp_barriers.back().get(), &warp_shared[w]};
  }

  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      host_detail::tls_coop =
          host_detail::CoopState{&warp_groups[t / kMcCudaWarpSize], t % kMcCudaWarpSize, &block, t};
      fn(t);
      host_detail::tls_coop = host_detail::CoopState{};
    });
  }
  for (auto& th : pool) th.join();
}

// Runs fn(lane) on `width` threads forming one warp (and one block).
// width <= kMcCudaWarpSize keeps the GPU's meaning; wider host warps are
// allowed for stress tests.
template <class F>
void runWarp(unsigned width, F&& fn) {
  if (width == 0) return;
  std::barrier<> warp_barrier(static_cast<std::ptrdiff_t>(width));
  host_detail::CoopShared warp_shared;
  const host_detail::CoopGroup warp{width, &warp_barrier, &warp_shared};
  std::barrier<> block_barrier(static_cast<std::ptrdiff_t>(width));
  host_detail::CoopShared block_shared;
  const host_detail::CoopGroup block{width, &block_barrier, &block_shared};
  std::vector<std::thread> pool;
  pool.reserve(width);
  for (unsigned lane = 0; lane < width; ++lane) {
    pool.emplace_back([&, lane] {
      host_detail::tls_coop = host_detail::CoopState{&warp, lane, &block, lane};
      fn(lane);
      host_detail::tls_coop = host_detail::CoopState{};
    });
  }
  for (auto& th : pool) th.join();
}

}  // namespace host
}  // namespace device
}  // namespace mooncake
