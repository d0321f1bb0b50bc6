// Upstream Mooncake's IBGDA device names (<transport/device/ibgda_device.cuh>)
// over this project's RDMA route (mooncake/device/ibgda_qp.h, mlx5/qp_ops.h):
// the same mlx5 WQEs and doorbells, posted lock-free by any number of
// threads, executed by a ConnectX NIC or by softnic in mooncaked.
//
//   IbgdaContext       the native struct (contexts_device.h): upstream's
//                      fields in upstream's order (qp_devctxs, raddrs, rkeys,
//                      local_atomic_base, remote_atomic_base), then ours,
//                      qps_per_rank, which make_comm_ctx fills; the calls
//                      below take qps_per_rank as an argument, as upstream's
//                      do.
//   MAX_QP_COUNT       256, as upstream's ibgda/mlx5gda.h.
//   mlx5gda_qp_devctx  upstream's QP context type name: this project's
//                      IbgdaQpDevCtx (a different layout; kernels only pass
//                      pointers to it around).
//   mc_ibgda_channel   the QP for (channel, dst_rank).
//   mc_ibgda_put       one RDMA WRITE to a remote address.
//   mc_ibgda_red_add   one 32-bit fetch-add at a remote address.
// Both posts come back at once; the NIC (or softnic) runs them later, in
// order per queue pair. Failures stay on the queue pair: mc_quiet(ctx)
// (comm_device.h) returns them, and `mcctl qps` shows them. Differences from
// upstream: the local key is the queue pair's own (upstream used
// rkeys[src_rank], assuming one key for both), so `src_rank` is unused; the
// fetched value of an atomic lands in the QP's scratch word, so `laddr` is
// unused; there is no per-QP lock to take (mc_ibgda_lock/unlock and the
// raw WQE writers are not provided, see docs/compat.md).
#pragma once

#include <cstdint>

#include "mooncake/device/comm_device.h"
#include "mooncake/device/contexts_device.h"
#include "mooncake/device/ibgda_qp.h"
#include "transport/device/device_ops.cuh"
#include "transport/device/ibgda/mlx5gda.h"

namespace mooncake {
namespace device {

MC_DEVICE IbgdaQpDevCtx* mc_ibgda_channel(const IbgdaContext& ctx, int channel, int dst_rank,
                                          int qps_per_rank) {
  return ctx.qp_devctxs + (static_cast<size_t>(dst_rank) * qps_per_rank +
                           static_cast<unsigned>(channel) % static_cast<unsigned>(qps_per_rank));
}

// Aborts the kernel: an upstream-style post found no queue pair for its
// peer. Upstream would have written through a null or stale context; with
// no status to return, stopping is the only way not to lose the data
// unseen.
MC_DEVICE_OUTLINE void mc_detail_no_rdma_route(const char* call, int dst_rank, int channel) {
#if defined(MC_PLATFORM_CUDA)
  printf(
      "mooncake device: %s: no RDMA queue pair to rank %d (channel %d): the peer is neither "
      "P2P-reachable nor connected over RDMA\n",
      call, dst_rank, channel);
#else
  std::fprintf(stderr,
               "mooncake device: %s: no RDMA queue pair to rank %d (channel %d): the peer is "
               "neither P2P-reachable nor connected over RDMA\n",
               call, dst_rank, channel);
#endif
  mc_trap();
}

// The peer as the native RDMA route sees it, for a remote address given
// whole (delta 0), on upstream's QP indexing.
MC_DEVICE McPeer mc_detail_upstream_qp(const IbgdaContext& ctx, int channel, int dst_rank,
                                       int qps_per_rank, const char* call) {
  McPeer p;
  p.rank = dst_rank;
  p.status = McStatus::kNoRoute;
  if (qps_per_rank > 0 && ctx.qp_devctxs != nullptr && ctx.rkeys != nullptr) {
    IbgdaQpDevCtx* qp = mc_ibgda_channel(ctx, channel, dst_rank, qps_per_rank);
    if (qp->sq != nullptr) {
      p.qp = qp;
      p.rkey = ctx.rkeys[dst_rank];
      p.delta = 0;
      p.status = McStatus::kOk;
    }
  }
  if (p.status != McStatus::kOk) mc_detail_no_rdma_route(call, dst_rank, channel);
  return p;
}

// RDMA WRITE of `nbytes` from `send_ptr` (inside this rank's registered
// buffer, or at most 28 bytes from anywhere: those travel inline) to the
// remote address `recv_raddr` at `dst_rank`. One thread calls it.
// Returns kOk once posted, or kNotRegistered when `send_ptr` is neither in
// this rank's registered buffer nor short enough to go inline: nothing is
// posted then, and upstream code that ignores the result (its call returns
// nothing) sends nothing, so check it where the source may lie elsewhere.
MC_DEVICE McStatus mc_ibgda_put(const IbgdaContext& ctx, int channel, int dst_rank, int src_rank,
                                int qps_per_rank, const void* send_ptr, uint64_t recv_raddr,
                                uint32_t nbytes) {
  (void)src_rank;
  const McPeer p = mc_detail_upstream_qp(ctx, channel, dst_rank, qps_per_rank, "mc_ibgda_put");
  return rdma_detail::put(p, reinterpret_cast<void*>(static_cast<uintptr_t>(recv_raddr)), send_ptr,
                          nbytes);
}

// Atomic add of `value` to the 32-bit word at `recv_raddr` on `dst_rank`
// (masked fetch-add), ordered after the queue pair's earlier WQEs. One
// thread calls it.
MC_DEVICE void mc_ibgda_red_add(const IbgdaContext& ctx, int channel, int dst_rank, int src_rank,
                                int qps_per_rank, uint64_t laddr, uint64_t recv_raddr,
                                int32_t value) {
  (void)src_rank;
  (void)laddr;
  const McPeer p = mc_detail_upstream_qp(ctx, channel, dst_rank, qps_per_rank, "mc_ibgda_red_add");
  (void)rdma_detail::add_word(p, reinterpret_cast<int32_t*>(static_cast<uintptr_t>(recv_raddr)),
                              value);
}

}  // namespace device
}  // namespace mooncake
