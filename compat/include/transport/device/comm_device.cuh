// Upstream Mooncake's communication device API (<transport/device/comm_device.cuh>)
// over this project's Device API (mooncake/device/comm_device.h). Mooncake EP
// kernels compile against it unchanged: CommCtx, make_comm_ctx, the routing
// helpers and the routed put / signal / red_add take upstream's arguments.
//
//   CommCtx          the native struct: upstream's fields (p2p, ibgda, rank)
//                    plus num_ranks (and ibgda.qps_per_rank), which
//                    make_comm_ctx fills from its arguments.
//   make_comm_ctx    upstream's 11 arguments, in upstream's order.
//   mc_comm_p2p_available, mc_comm_peer_ptr, mc_route_put   routing.
//   mc_rdma_put      RDMA WRITE, posted by lane 0.
//   mc_signal        release store over P2P (and to self); 32-bit fetch-add
//                    over RDMA: upstream's meanings, one per route.
//   mc_red_add       an atomic add on every route (upstream: mc_signal, so a
//                    store over P2P, which loses concurrent contributions).
//
// A CommCtx built field by field (upstream style, as EP's elastic kernels
// do) has num_ranks 0. It never routes peers to RDMA silently: by default
// mc_route_put decides by the P2P tables as upstream does, the calls here
// use the qps_per_rank they are given, and the native calls return
// McStatus::kIncompleteContext; with MOONCAKE_DEVICE_CHECKS=1 (opt in) the
// first routing call traps with a message instead.
// Every difference from upstream is listed in docs/compat.md.
#pragma once

#include <cstdint>

#include "mooncake/device/comm_device.h"
#include "mooncake/device/contexts_device.h"
#include "transport/device/device_ops.cuh"
#include "transport/device/ibgda_device.cuh"
#include "transport/device/p2p_device.cuh"

namespace mooncake {
namespace device {

// The context from a kernel's raw arguments (upstream's order). raddrs,
// rkeys and qp_devctxs may be null (P2P only). num_ranks and num_qps (the
// total over all peers, as given to RdmaTransport::initialize) are kept:
// num_ranks bounds every rank, qps_per_rank = num_qps / num_ranks picks the
// queue pairs of the native calls (upstream ignored both).
MC_HOST_DEVICE CommCtx make_comm_ctx(void* gdr_buffer, const int32_t* nvlink_available,
                                     void* const* ipc_peer_ptrs, void* raddrs, void* rkeys,
                                     void* qp_devctxs, const void* rdma_send_signal_buffer,
                                     const void* rdma_recv_signal_buffer, int rank, int num_ranks,
                                     int num_qps) {
  CommCtx ctx;
  ctx.rank = rank;
  ctx.num_ranks = num_ranks;
  ctx.p2p.available = nvlink_available;
  ctx.p2p.peer_ptrs = ipc_peer_ptrs;
  ctx.p2p.local_base = gdr_buffer;
  ctx.ibgda.qp_devctxs = static_cast<IbgdaQpDevCtx*>(qp_devctxs);
  ctx.ibgda.raddrs = static_cast<const uint64_t*>(raddrs);
  ctx.ibgda.rkeys = static_cast<const uint32_t*>(rkeys);
  ctx.ibgda.qps_per_rank = num_ranks > 0 && num_qps > 0 ? num_qps / num_ranks : 0;
  ctx.ibgda.local_atomic_base = rdma_send_signal_buffer;
  ctx.ibgda.remote_atomic_base = rdma_recv_signal_buffer;
  return ctx;
}

// ---- routing -------------------------------------------------------------------
// mc_route_put(ctx, dst_rank, ptr) is the native one, with upstream's
// signature (void* in, void* out): `ptr` itself for self, the peer-mapped
// address over P2P, nullptr for "use mc_rdma_put".

// True when dst_rank is reachable by load/store (self included).
MC_DEVICE bool mc_comm_p2p_available(const CommCtx& ctx, int dst_rank) {
  return mc_p2p_available(ctx, dst_rank);
}

// `local_ptr` (inside this rank's buffer) as mapped for dst_rank. Only
// meaningful where mc_comm_p2p_available holds.
MC_DEVICE void* mc_comm_peer_ptr(const CommCtx& ctx, int dst_rank, const void* local_ptr) {
  return mc_p2p_peer_ptr(ctx.p2p, dst_rank, local_ptr);
}

// The RDMA peer for an upstream-style call: checks the rank against the
// context's bound (or reports a context without one), then finds the queue
// pair on upstream's indexing with the caller's qps_per_rank. Traps where
// there is none: the caller has no status to look at.
MC_DEVICE McPeer mc_detail_upstream_rdma_peer(const CommCtx& ctx, int channel, int dst_rank,
                                              int qps_per_rank, const char* call) {
  if (!mc_rank_valid(ctx, dst_rank)) {
    if (mc_ctx_incomplete(ctx) && dst_rank >= 0) {
      mc_detail_incomplete_ctx(ctx.rank, dst_rank);
    } else {
      mc_detail_no_rdma_route(call, dst_rank, channel);
    }
  }
  McPeer p = mc_detail_upstream_qp(ctx.ibgda, channel, dst_rank, qps_per_rank, call);
  // Symmetric addressing: the remote address of local `ptr` is
  // raddrs[dst] + (ptr - local_base).
  p.delta = static_cast<uintptr_t>(ctx.ibgda.raddrs[dst_rank]) -
            reinterpret_cast<uintptr_t>(ctx.p2p.local_base);
  return p;
}

// ---- puts ------------------------------------------------------------------------

// RDMA WRITE of `nbytes` from `send_ptr` to the peer's copy of `recv_ptr`
// (both inside this rank's buffer; send_ptr may be anywhere for at most 28
// bytes). Call it where mc_route_put returned nullptr; every lane may call,
// lane 0 posts. Posted, not done: the NIC reads send_ptr later, so keep it
// unchanged until a signal on the same channel (ordered after it) or
// mc_quiet(ctx). Returns kOk (on every lane but 0 too), or kNotRegistered
// when lane 0 found send_ptr outside the buffer and too long to go inline:
// nothing is posted then. Upstream's call returns nothing, so upstream code
// never sees this: check it where the source may lie elsewhere.
MC_DEVICE McStatus mc_rdma_put(const CommCtx& ctx, int channel, int dst_rank, int qps_per_rank,
                               const void* send_ptr, void* recv_ptr, uint32_t nbytes, int lane_id) {
  if (lane_id != 0) return McStatus::kOk;
  const McPeer p =
      mc_detail_upstream_rdma_peer(ctx, channel, dst_rank, qps_per_rank, "mc_rdma_put");
  return rdma_detail::put(p, recv_ptr, send_ptr, nbytes);
}

// ---- signals -----------------------------------------------------------------------
// sig_ptr: a 4-byte-aligned word inside this rank's buffer; the call writes
// dst_rank's copy of it. One thread calls.

// Upstream's signal: a release store to self and over P2P, a 32-bit
// fetch-add over RDMA (ordered after the earlier WQEs of `channel`). On a
// zeroed slot with one writer (how EP uses it) both leave `val`.
MC_DEVICE void mc_signal(const CommCtx& ctx, int dst_rank, int channel, int qps_per_rank,
                         int* sig_ptr, int32_t val) {
  if (dst_rank == ctx.rank) {
    mc_st_release(sig_ptr, val);
    return;
  }
  if (mc_p2p_available(ctx, dst_rank)) {
    mc_st_release(static_cast<int*>(mc_p2p_peer_ptr(ctx.p2p, dst_rank, sig_ptr)), val);
    return;
  }
  const McPeer p = mc_detail_upstream_rdma_peer(ctx, channel, dst_rank, qps_per_rank, "mc_signal");
  (void)rdma_detail::add_word(p, sig_ptr, static_cast<int>(val));
}

// Atomic add of `val` to dst_rank's copy of sig_ptr, with release ordering,
// on every route: many senders may add to one counter and none is lost.
// (Upstream made this mc_signal, whose P2P and self routes store: fine for
// a zeroed slot with one writer, a lost update for a shared counter.)
// A context with NIC atomics (mc_nic_atomics: the Communicator's
// atomics_route) sends every add through the queue pair toward dst_rank,
// self and P2P peers included, as the native mc_red_add does.
MC_DEVICE void mc_red_add(const CommCtx& ctx, int dst_rank, int channel, int qps_per_rank,
                          int* sig_ptr, int32_t val) {
  // The caller's qps_per_rank finds the loopback, so a context built field
  // by field (no qps_per_rank in it) is still seen as NIC atomics.
  const IbgdaQpDevCtx* self =
      ctx.ibgda.qp_devctxs != nullptr && qps_per_rank > 0 && ctx.rank >= 0
          ? &ctx.ibgda.qp_devctxs[static_cast<size_t>(ctx.rank) * qps_per_rank]
          : nullptr;
  if (mc_detail_is_loopback(self)) {
    const McPeer p =
        mc_detail_upstream_rdma_peer(ctx, channel, dst_rank, qps_per_rank, "mc_red_add");
    (void)rdma_detail::add_word(p, sig_ptr, static_cast<int>(val));
    return;
  }
  if (dst_rank == ctx.rank) {
    mc_red_add_release(sig_ptr, static_cast<int>(val));
    return;
  }
  if (mc_p2p_available(ctx, dst_rank)) {
    mc_red_add_release(static_cast<int*>(mc_p2p_peer_ptr(ctx.p2p, dst_rank, sig_ptr)),
                       static_cast<int>(val));
    return;
  }
  const McPeer p = mc_detail_upstream_rdma_peer(ctx, channel, dst_rank, qps_per_rank, "mc_red_add");
  (void)rdma_detail::add_word(p, sig_ptr, static_cast<int>(val));
}

}  // namespace device
}  // namespace mooncake
