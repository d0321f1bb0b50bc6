// The Device API: what a kernel calls to move data to and synchronise with
// other ranks. One source for every platform: compiled by nvcc it runs on the
// GPU (ops_cuda.cuh), compiled by g++ it runs on CPU threads over shared
// memory (ops_host.h), so the CPU tests prove the same protocol code.
//
// Terms
//   dst       destination rank, 0 <= dst < ctx.num_ranks.
//   symmetric pointer  an address inside THIS rank's registered buffer
//             (ctx.p2p.local_base ...). It names the same offset in every
//             rank's buffer; the functions translate it for `dst`.
//   route     self -> the pointer itself; P2P (ctx.p2p.available[dst]) ->
//             the peer mapping; otherwise RDMA through the queue pair
//             ctx.ibgda.qp_devctxs[dst * qps_per_rank + channel] when the
//             context has one (the thread writes an mlx5 WQE and rings the
//             doorbell; the NIC or softnic moves the bytes); otherwise
//             McStatus::kNoRoute and nothing is written.
//
// Ordering guarantees (what a peer is guaranteed to see, and when)
//   mc_put_*          weak stores; no ordering on their own.
//   mc_signal         release store: a peer whose acquire load (mc_wait_until)
//                     reads the value also sees every write this thread made
//                     before the signal (and, after mc_put_warp/_block, those
//                     of the whole warp/block: they end with a barrier).
//   mc_signal_relaxed strong store ordering nothing: the flag alone.
//   mc_red_add        atomic add, release: a counter many senders bump; the
//                     same meaning on every path.
//   mc_fence          earlier writes of this thread become visible no later
//                     than any later strong write of it (a relaxed signal, a
//                     red_add) that a peer acquires.
//   mc_quiet          earlier puts of this thread are complete (globally
//                     visible) when it returns.
//   mc_wait_until     acquire: after it returns, what the signaller wrote
//                     before its release is visible here.
//   mc_put_signal_ll / mc_wait_ll  8 bytes of data and a flag in one 16-byte
//                     store; self-contained, orders nothing else.
//   mc_put_grid       like mc_put_block, shared by several blocks (64 KiB
//                     tiles interleaved across them: the fastest large put).
//
// Resolved peers: each call also takes a McPeer from mc_peer(ctx, dst) in
// place of (ctx, dst); resolve once outside latency-critical loops.
//
// Cooperative forms: mc_put_warp must be called by all lanes of a warp (32 on
// CUDA; on the host, every thread of the emulated warp, see host_coop.h) and
// mc_put_block by every thread of the block, with the same (uniform)
// arguments. They return after a warp/block barrier, so one lane may signal
// for the whole group right after. An error return is uniform too (it
// depends only on uniform arguments), and then no barrier is taken.
// mc_put_lanes is called by all lanes of a warp too, but each lane passes
// its own dst_sym/src/bytes (same peer): a warp-wide scatter of small puts,
// which over RDMA rings one doorbell per warp instead of one per put;
// mc_put_lanes_block is the same over every thread of a block (one doorbell
// per block).
//
// `src` of the puts: on CUDA it is read through the non-coherent path (see
// detail/cuda_copy.cuh): nobody may write it while the put runs.
//
// Thread-safety: device functions are as thread-safe as the memory they
// touch; concurrent puts to the same destination bytes race as plain
// stores do. Any number of threads may post to one RDMA queue pair at once.
//
// Over RDMA (what differs from load/store, and why)
//   - A put is posted, not done: the NIC reads `src` later, so `src` must
//     stay unchanged until mc_quiet(ctx) returns; puts of at most 28 bytes
//     travel inline in the WQE and copy `src` at once. Larger puts must read
//     from this rank's registered buffer, else kNotRegistered.
//   - Cooperative puts post once (lane 0 / thread 0 / thread 0 of each
//     block); a posting failure (kRdmaError, kTimedOut) is returned by the
//     posting thread only, and by mc_quiet to everyone.
//   - Put then signal on one channel (queue pair) is ordered, as over
//     NVLink, by the RC transport itself: the responder executes a QP's
//     requests in order and writes memory in order, because every region
//     the daemon registers is strictly ordered (never relaxed ordering).
//     No WQE carries the fence bit: a fence waits for the responses of
//     earlier RDMA reads and atomics on the QP, a round trip each, and
//     nothing here reads a fetched value back into a later WQE (upstream
//     and NVSHMEM do not fence these either). Across channels, mc_quiet
//     first.
//   - mc_red_add is a NIC atomic (64-bit fetch-add, or 32-bit masked
//     fetch-add), the same meaning as on the other routes.
//   - mc_quiet polls every queue pair of the context until the WQEs rung so
//     far have completed, and reports the first error completion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "mooncake/device/contexts_device.h"
#include "mooncake/device/ibgda_qp.h"
#include "mooncake/device/mlx5/qp_ops.h"
#include "mooncake/device/mlx5/wqe.h"
#include "mooncake/device/platform.h"
#include "mooncake/device/types_device.h"

namespace mooncake {
namespace device {

// ---- contexts without a rank count -------------------------------------------
// Upstream's CommCtx has no num_ranks, and upstream-style code builds its
// context field by field, leaving num_ranks 0. Such a context must never
// look like "every peer is RDMA" (what a plain bound check would make of
// it). What happens instead:
//   by default: calls that return a McStatus return kIncompleteContext;
//     mc_route_put and mc_p2p_available, which have no status to return,
//     decide by the P2P tables alone, as upstream does (no bound check).
//     Upstream's code builds such contexts on purpose (EP's elastic
//     kernels), debug builds included, so the default must let it run.
//   MOONCAKE_DEVICE_CHECKS = 1 (opt in, to find such contexts in code of
//     your own): the first routing call on it traps, naming the fix
//     (make_comm_ctx, or set num_ranks).
#ifndef MOONCAKE_DEVICE_CHECKS
#define MOONCAKE_DEVICE_CHECKS 0
#endif

MC_HOST_DEVICE bool mc_ctx_incomplete(const CommCtx& ctx) { return ctx.num_ranks <= 0; }

// Reports a routing call on an incomplete context: traps when
// MOONCAKE_DEVICE_CHECKS is on, returns otherwise.
MC_DEVICE_OUTLINE void mc_detail_incomplete_ctx(int rank, int dst) {
#if MOONCAKE_DEVICE_CHECKS
#define MC_DETAIL_INCOMPLETE_MSG                                                             \
  "mooncake device: CommCtx.num_ranks is 0 (rank %d, peer %d): the context was built field " \
  "by field; build it with make_comm_ctx() or set num_ranks\n"
#if defined(MC_PLATFORM_CUDA)
  printf(MC_DETAIL_INCOMPLETE_MSG, rank, dst);
#else
  std::fprintf(stderr, MC_DETAIL_INCOMPLETE_MSG, rank, dst);
#endif
#undef MC_DETAIL_INCOMPLETE_MSG
  mc_trap();
#else
  (void)rank;
  (void)dst;
#endif
}

// ---- routing ---------------------------------------------------------------

MC_HOST_DEVICE bool mc_rank_valid(const CommCtx& ctx, int rank) {
  return rank >= 0 && rank < ctx.num_ranks;
}

// True when `dst` is reachable by load/store (self counts; out-of-range
// ranks are not). On a context without num_ranks see above.
MC_DEVICE bool mc_p2p_available(const CommCtx& ctx, int dst) {
  if (dst == ctx.rank) return true;
  if (!mc_rank_valid(ctx, dst)) {
    if (!mc_ctx_incomplete(ctx) || dst < 0) return false;
    mc_detail_incomplete_ctx(ctx.rank, dst);
  }
  return ctx.p2p.available != nullptr && ctx.p2p.peer_ptrs != nullptr &&
         ctx.p2p.available[dst] != 0;
}

// Where a store to symmetric pointer `ptr` meant for `dst` has to go from
// this thread: `ptr` itself for self, the peer-mapped address over P2P, or
// nullptr when `dst` is reachable only over RDMA (or out of range).
// Upstream's signature: void* in, void* out, so upstream code that
// static_casts the result to a counter of another type compiles (issue 25).
MC_DEVICE void* mc_route_put(const CommCtx& ctx, int dst, void* ptr) {
  if (dst == ctx.rank) return ptr;
  if (!mc_p2p_available(ctx, dst)) return nullptr;
  const uintptr_t offset =
      reinterpret_cast<uintptr_t>(ptr) - reinterpret_cast<uintptr_t>(ctx.p2p.local_base);
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(ctx.p2p.peer_ptrs[dst]) + offset);
}

// ---- resolved peers ---------------------------------------------------------
// A route worked out once. Every call below also has a form taking a McPeer
// instead of (ctx, dst): kernels that signal or put to the same peer in a
// loop resolve it with mc_peer() before the loop, and the loop then does no
// table lookups. That matters for latency: after an acquire (mc_wait_until)
// the two dependent table loads of a (ctx, dst) call miss L1 and add about
// 0.3 us per signal on H200 (bench/results/2026-11-29-h200x2-p2p.md).
struct McPeer {
  // Address at the peer = symmetric address + delta (mod 2^64): the mapped
  // address over P2P, the remote iova (registered address) over RDMA.
  uintptr_t delta = 0;
  McStatus status = McStatus::kInvalidRank;
  int rank = -1;
  // Non-null: the route is RDMA through this queue pair, with the peer's rkey.
  IbgdaQpDevCtx* qp = nullptr;
  uint32_t rkey = 0;
  // NIC atomics (see "Atomics across routes" at mc_red_add): set when the
  // context routes every atomic through the target's NIC and the route
  // above is load/store (self or P2P). atomic_qp is the queue pair toward
  // the peer that mc_red_add uses then (null: none, kNoRoute), with the
  // peer's rkey and the remote address delta.
  bool nic_atomics = false;
  IbgdaQpDevCtx* atomic_qp = nullptr;
  uint32_t atomic_rkey = 0;
  uintptr_t atomic_delta = 0;
};

// The queue pair for (dst, channel), or null when the context has none for
// dst (P2P-only contexts, self, peers without RDMA).
MC_DEVICE IbgdaQpDevCtx* mc_detail_qp_of(const IbgdaContext& ibgda, int dst, int channel) {
  const int qps = ibgda.qps_per_rank;
  if (ibgda.qp_devctxs == nullptr || qps <= 0 || ibgda.raddrs == nullptr ||
      ibgda.rkeys == nullptr) {
    return nullptr;
  }
  const unsigned ch = static_cast<unsigned>(channel) % static_cast<unsigned>(qps);
  IbgdaQpDevCtx* qp = &ibgda.qp_devctxs[static_cast<size_t>(dst) * qps + ch];
  return qp->sq != nullptr ? qp : nullptr;
}

MC_DEVICE IbgdaQpDevCtx* mc_rdma_qp(const CommCtx& ctx, int dst, int channel) {
  return mc_detail_qp_of(ctx.ibgda, dst, channel);
}

// The RDMA half of mc_peer (out of line: P2P loops never run it). Takes
// the tables by value (see MC_DEVICE_OUTLINE).
MC_DEVICE_OUTLINE McPeer mc_detail_rdma_peer(IbgdaContext ibgda, const void* local_base, int dst,
                                             int channel) {
  McPeer p;
  p.rank = dst;
  p.status = McStatus::kNoRoute;
  IbgdaQpDevCtx* qp = mc_detail_qp_of(ibgda, dst, channel);
  if (qp == nullptr) return p;
  p.qp = qp;
  p.rkey = ibgda.rkeys[dst];
  p.delta = static_cast<uintptr_t>(ibgda.raddrs[dst]) - reinterpret_cast<uintptr_t>(local_base);
  p.status = McStatus::kOk;
  return p;
}

// True when the context routes every atomic through the target rank's NIC:
// its rank's queue pair toward itself is connected to itself (the loopback
// the Communicator makes only for that, marked IbgdaQpDevCtx::loopback;
// docs/rdma.md "Atomics across routes").
MC_DEVICE bool mc_detail_is_loopback(const IbgdaQpDevCtx* qp) {
  return qp != nullptr && qp->sq != nullptr && qp->loopback != 0;
}
MC_DEVICE bool mc_nic_atomics(const IbgdaContext& ibgda, int rank) {
  return ibgda.qp_devctxs != nullptr && mc_detail_is_loopback(mc_detail_qp_of(ibgda, rank, 0));
}

// The NIC-atomics half of mc_peer for a self or P2P route (out of line).
MC_DEVICE_OUTLINE void mc_detail_nic_atomic_route(IbgdaContext ibgda, const void* local_base,
                                                  int rank, int dst, int channel, McPeer* p) {
  if (!mc_nic_atomics(ibgda, rank)) return;
  const McPeer r = mc_detail_rdma_peer(ibgda, local_base, dst, channel);
  p->nic_atomics = true;
  p->atomic_qp = r.qp;
  p->atomic_rkey = r.rkey;
  p->atomic_delta = r.delta;
}

// Resolves dst once. `channel` picks among the peer's queue pairs (RDMA
// only; spread independent streams over channels, ordering holds within one).
MC_DEVICE McPeer mc_peer(const CommCtx& ctx, int dst, int channel = 0) {
  McPeer p;
  p.rank = dst;
  if (!mc_rank_valid(ctx, dst)) {
    if (mc_ctx_incomplete(ctx)) {
      mc_detail_incomplete_ctx(ctx.rank, dst);
      p.status = McStatus::kIncompleteContext;
    }
    return p;
  }
  if (dst == ctx.rank) {
    p.status = McStatus::kOk;
  } else if (mc_p2p_available(ctx, dst)) {
    p.delta = reinterpret_cast<uintptr_t>(ctx.p2p.peer_ptrs[dst]) -
              reinterpret_cast<uintptr_t>(ctx.p2p.local_base);
    p.status = McStatus::kOk;
  } else {
    return mc_detail_rdma_peer(ctx.ibgda, ctx.p2p.local_base, dst, channel);
  }
  if (ctx.ibgda.qp_devctxs != nullptr) {
    mc_detail_nic_atomic_route(ctx.ibgda, ctx.p2p.local_base, ctx.rank, dst, channel, &p);
  }
  return p;
}

// True when the resolved route is RDMA.
MC_DEVICE bool mc_peer_is_rdma(const McPeer& peer) { return peer.qp != nullptr; }

// The address of symmetric `sym` at the peer (only meaningful when
// peer.status is kOk).
template <class T>
MC_DEVICE T* mc_peer_ptr(const McPeer& peer, T* sym) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(sym) + peer.delta);
}

// The one branch on the P2P fast path: true for an RDMA peer or a failed
// resolution, both handled out of line by the rdma_detail function called
// (it returns peer.status first). One predicted-not-taken branch measured
// best on 2x H200 (bench/results/2026-12-01-h200x2-mixed-routes.md).
MC_DEVICE bool mc_detail_slow_route(const McPeer& peer) {
  return __builtin_expect(peer.qp != nullptr || peer.status != McStatus::kOk, 0);
}

// ---- the RDMA route: one WQE per call -----------------------------------------

namespace rdma_detail {
// fm_ce_se of every WQE posted here: no fence (see the header comment: RC
// ordering orders put -> signal; a fence would make a signal or atomic wait
// a round trip behind any atomic before it). The CQE request is the queue
// pair's to decide (every cqe_every WQEs, mlx5/qp_ops.h).
inline constexpr uint8_t kPutFlags = mlx5::kCtrlCqUpdate;
// Largest byte count of one WRITE WQE we post (the field allows 2^31 - 1).
inline constexpr uint64_t kMaxWriteBytes = 1ull << 30;

// Builds the one WQE of a put of 1..kMaxWriteBytes bytes: inline up to 28
// bytes (src copied now), else a WRITE from the registered buffer.
MC_DEVICE McStatus build_put(const McPeer& peer, uint64_t raddr, const void* src, size_t bytes,
                             mlx5::Wqe64* w) {
  IbgdaQpDevCtx* qp = peer.qp;
  if (bytes <= mlx5::kMaxInlineBytes) {
    mlx5::build_rdma_write_inline(w, 0, qp->qpn, kPutFlags, raddr, peer.rkey, src,
                                  static_cast<uint32_t>(bytes));
    return McStatus::kOk;
  }
  const uint64_t s = reinterpret_cast<uintptr_t>(src);
  if (s < qp->local_base || bytes > qp->local_size || s - qp->local_base > qp->local_size - bytes) {
    return McStatus::kNotRegistered;
  }
  mlx5::build_rdma_write(w, 0, qp->qpn, kPutFlags, raddr, peer.rkey, s, qp->lkey,
                         static_cast<uint32_t>(bytes));
  return McStatus::kOk;
}

MC_DEVICE_OUTLINE McStatus put(McPeer peer, void* dst_sym, const void* src, size_t bytes) {
  if (peer.status != McStatus::kOk) return peer.status;
  if (bytes == 0) return McStatus::kOk;
  const uint64_t raddr = reinterpret_cast<uintptr_t>(dst_sym) + peer.delta;
  const auto* s = static_cast<const uint8_t*>(src);
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = bytes - done < kMaxWriteBytes ? bytes - done : kMaxWriteBytes;
    mlx5::Wqe64 w;
    McStatus st = build_put(peer, raddr + done, s + done, n, &w);
    if (st == McStatus::kOk) st = mc_qp_post(peer.qp, w);
    if (st != McStatus::kOk) return st;
    done += n;
  }
  return McStatus::kOk;
}

// A strong write of one naturally aligned word (signals): one inline WRITE,
// ordered after the QP's earlier WQEs by RC ordering.
template <class T>
MC_DEVICE_OUTLINE McStatus store_word(McPeer peer, T* sig_sym, T value) {
  if (peer.status != McStatus::kOk) return peer.status;
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "signals are 4- or 8-byte integers");
  mlx5::Wqe64 w;
  mlx5::build_rdma_write_inline(&w, 0, peer.qp->qpn, kPutFlags,
                                reinterpret_cast<uintptr_t>(sig_sym) + peer.delta, peer.rkey,
                                &value, sizeof(T));
  return mc_qp_post(peer.qp, w);
}

template <class T>
MC_DEVICE_OUTLINE McStatus add_word(McPeer peer, T* ptr_sym, T value) {
  if (peer.status != McStatus::kOk) return peer.status;
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics take 4- or 8-byte integers");
  IbgdaQpDevCtx* qp = peer.qp;
  const uint64_t raddr = reinterpret_cast<uintptr_t>(ptr_sym) + peer.delta;
  const uint64_t scratch = reinterpret_cast<uintptr_t>(qp->fetch_scratch);
  mlx5::Wqe64 w;
  if constexpr (sizeof(T) == 8) {
    mlx5::build_atomic_fa64(&w, 0, qp->qpn, kPutFlags, raddr, peer.rkey,
                            static_cast<uint64_t>(value), scratch, qp->scratch_lkey);
  } else {
    mlx5::build_masked_fa32(&w, 0, qp->qpn, kPutFlags, raddr, peer.rkey,
                            static_cast<uint32_t>(value), scratch, qp->scratch_lkey);
  }
  return mc_qp_post(qp, w);
}
// A self or P2P peer's atomic through its NIC (mc_red_add, "Atomics across
// routes").
template <class T>
MC_DEVICE_OUTLINE McStatus add_word_via_nic(McPeer peer, T* ptr_sym, T value) {
  if (peer.atomic_qp == nullptr) return McStatus::kNoRoute;
  McPeer nic;
  nic.rank = peer.rank;
  nic.status = McStatus::kOk;
  nic.qp = peer.atomic_qp;
  nic.rkey = peer.atomic_rkey;
  nic.delta = peer.atomic_delta;
  return add_word(nic, ptr_sym, value);
}
// One inline WRITE of a 16-byte LL slot (each half carries the flag, so a
// NIC that writes it as two 8-byte pieces is still read correctly).
MC_DEVICE_OUTLINE McStatus put_ll(McPeer peer, McLLSlot* slot_sym, uint64_t data, uint32_t flag) {
  if (peer.status != McStatus::kOk) return peer.status;
  const uint64_t halves[2] = {mc_ll_pack(static_cast<uint32_t>(data), flag),
                              mc_ll_pack(static_cast<uint32_t>(data >> 32), flag)};
  mlx5::Wqe64 w;
  mlx5::build_rdma_write_inline(&w, 0, peer.qp->qpn, kPutFlags,
                                reinterpret_cast<uintptr_t>(slot_sym) + peer.delta, peer.rkey,
                                halves, sizeof(halves));
  return mc_qp_post(peer.qp, w);
}

// mc_put_lanes (kBlock false: the lanes of a warp) and mc_put_lanes_block
// (kBlock true: the threads of a block): each caller's own put, one WQE
// each, posted as one batch; ends with the group's barrier.
template <bool kBlock>
MC_DEVICE McStatus put_each(const McPeer& peer, void* dst_sym, const void* src, size_t bytes) {
  if (peer.status != McStatus::kOk) return peer.status;
  if (peer.qp == nullptr) {
    mc_detail_copy_thread(mc_peer_ptr(peer, dst_sym), src, bytes);
    if (kBlock) {
      mc_syncthreads();
    } else {
      mc_syncwarp();
    }
    return McStatus::kOk;
  }
  const uint64_t raddr = reinterpret_cast<uintptr_t>(dst_sym) + peer.delta;
  const bool one_wqe = bytes != 0 && bytes <= kMaxWriteBytes;
  mlx5::Wqe64 w;
  McStatus mine = one_wqe ? build_put(peer, raddr, src, bytes, &w) : McStatus::kOk;
  const bool have = one_wqe && mine == McStatus::kOk;
  const McStatus batch =
      kBlock ? mc_qp_post_block(peer.qp, w, have) : mc_qp_post_warp(peer.qp, w, have);
  // Puts over 1 GiB take several WQEs: posted one by one after the batch.
  if (mine == McStatus::kOk && bytes > kMaxWriteBytes) mine = put(peer, dst_sym, src, bytes);
  if (kBlock) {
    mc_syncthreads();
  } else {
    mc_syncwarp();
  }
  if (mine != McStatus::kOk) return mine;
  return batch;
}
}  // namespace rdma_detail

// ---- puts --------------------------------------------------------------------
// Each routed call is written once, for a resolved peer; the (ctx, dst) forms
// further down resolve and forward.

// One thread copies `bytes` from local `src` to `dst_sym` at the peer. Any
// size and alignment; the ranges must not overlap.
MC_DEVICE McStatus mc_put_thread(const McPeer& peer, void* dst_sym, const void* src, size_t bytes) {
  if (mc_detail_slow_route(peer)) return rdma_detail::put(peer, dst_sym, src, bytes);
  mc_detail_copy_thread(mc_peer_ptr(peer, dst_sym), src, bytes);
  return McStatus::kOk;
}

// The lanes of one warp copy together; `lane` is this thread's lane id
// (0..31 on CUDA). Ends with mc_syncwarp().
MC_DEVICE McStatus mc_put_warp(const McPeer& peer, void* dst_sym, const void* src, size_t bytes,
                               unsigned lane) {
  if (peer.status != McStatus::kOk) return peer.status;
  if (peer.qp != nullptr) {
    McStatus st = McStatus::kOk;
    if (lane == 0) st = rdma_detail::put(peer, dst_sym, src, bytes);
    mc_syncwarp();
    return st;
  }
  mc_detail_copy_warp(mc_peer_ptr(peer, dst_sym), src, bytes, lane);
  mc_syncwarp();
  return McStatus::kOk;
}

// Every lane of a warp puts its own `bytes` from its own `src` to its own
// `dst_sym` at the same peer (a scatter of small messages: tokens, rows).
// Called by all lanes, converged; `peer` must be the same in every lane; a
// lane with nothing to send passes bytes = 0. Over P2P each lane copies its
// own bytes; over RDMA each lane's put is one WQE, and the warp's WQEs go
// out with one reservation and one doorbell (mc_qp_post_warp): the fast way
// to post many small RDMA writes. Ends with mc_syncwarp(). A lane whose
// own arguments are bad (kNotRegistered) returns that and posts nothing;
// a posting failure of the batch (kRdmaError, kTimedOut) is returned by
// every other lane.
MC_DEVICE McStatus mc_put_lanes(const McPeer& peer, void* dst_sym, const void* src, size_t bytes) {
  return rdma_detail::put_each<false>(peer, dst_sym, src, bytes);
}

// mc_put_lanes for a whole block: every thread of the block calls it,
// converged, with its own dst_sym/src/bytes (same peer; bytes = 0 for none).
// Over RDMA the block's WQEs go out with one reservation and one doorbell
// per half ring (mc_qp_post_block) where mc_put_lanes rings once per warp.
// Ends with mc_syncthreads(); statuses as mc_put_lanes's.
MC_DEVICE McStatus mc_put_lanes_block(const McPeer& peer, void* dst_sym, const void* src,
                                      size_t bytes) {
  return rdma_detail::put_each<true>(peer, dst_sym, src, bytes);
}

// The threads of one block copy together. Ends with mc_syncthreads().
MC_DEVICE McStatus mc_put_block(const McPeer& peer, void* dst_sym, const void* src, size_t bytes) {
  if (peer.status != McStatus::kOk) return peer.status;
  if (peer.qp != nullptr) {
    McStatus st = McStatus::kOk;
    if (mc_block_thread_index() == 0) st = rdma_detail::put(peer, dst_sym, src, bytes);
    mc_syncthreads();
    return st;
  }
  mc_detail_copy_block(mc_peer_ptr(peer, dst_sym), src, bytes);
  mc_syncthreads();
  return McStatus::kOk;
}

// Several blocks put `bytes` together: every thread of blocks 0..blocks-1
// calls it with the same arguments and its own `block` index (blockIdx.x,
// gridDim.x on CUDA). The bytes are interleaved across blocks in 64 KiB
// tiles, which keeps NVLink ~6% busier than one contiguous slice per block
// (bench results). Ends with a block barrier only: signal after a grid-wide
// sync or from a kernel launched after this one.
MC_DEVICE McStatus mc_put_grid(const McPeer& peer, void* dst_sym, const void* src, size_t bytes,
                               unsigned block, unsigned blocks) {
  if (peer.status != McStatus::kOk) return peer.status;
  if (peer.qp != nullptr) {
    // One WRITE per block, over its contiguous share.
    McStatus st = McStatus::kOk;
    if (mc_block_thread_index() == 0 && blocks != 0) {
      const size_t share = (bytes + blocks - 1) / blocks;
      const size_t begin = share * block < bytes ? share * block : bytes;
      const size_t end = begin + share < bytes ? begin + share : bytes;
      st = rdma_detail::put(peer, static_cast<uint8_t*>(dst_sym) + begin,
                            static_cast<const uint8_t*>(src) + begin, end - begin);
    }
    mc_syncthreads();
    return st;
  }
  mc_detail_copy_tiles(mc_peer_ptr(peer, dst_sym), src, bytes, block, blocks);
  mc_syncthreads();
  return McStatus::kOk;
}

// ---- signals and atomics -------------------------------------------------------
// T is a 4- or 8-byte integer; sig_sym a naturally aligned symmetric pointer.

// Release store of `value` to `sig_sym` at the peer: whoever acquires the
// value sees this thread's earlier writes (to any rank's memory).
template <class T>
MC_DEVICE McStatus mc_signal(const McPeer& peer, T* sig_sym, T value) {
  if (mc_detail_slow_route(peer)) return rdma_detail::store_word(peer, sig_sym, value);
  mc_st_release(mc_peer_ptr(peer, sig_sym), value);
  return McStatus::kOk;
}

// Strong store that orders nothing: for a flag that carries no data, or after
// mc_fence. Fastest signal.
template <class T>
MC_DEVICE McStatus mc_signal_relaxed(const McPeer& peer, T* sig_sym, T value) {
  if (mc_detail_slow_route(peer)) return rdma_detail::store_word(peer, sig_sym, value);
  mc_st_relaxed(mc_peer_ptr(peer, sig_sym), value);
  return McStatus::kOk;
}

// Atomic add of `value` to `ptr_sym` at the peer, with release ordering. An
// add on every path (upstream stored the value over P2P, losing concurrent
// contributions; not so here).
//
// Atomics across routes. A NIC atomic is a read, an add and a write by the
// responder's HCA: atomic against other atomics through that same HCA, not
// against SM, CPU or NVLink atomics on the word (nor through another NIC).
// So a counter that RDMA peers bump with NIC atomics while P2P peers or its
// owner bump it with SM atomics can lose updates. The rule: in a group
// with RDMA peers, every mc_red_add to a rank's word goes through the
// queue pair toward that rank, i.e. is executed by the target's NIC, from
// every rank, P2P peers and the owner itself included (a loopback queue
// pair). A context says it follows the rule by giving its own rank a queue
// pair (mc_nic_atomics); the Communicator sets it up (atomics_route).
// Then a peer without a queue pair gives kNoRoute, never a device atomic.
template <class T>
MC_DEVICE McStatus mc_red_add(const McPeer& peer, T* ptr_sym, T value) {
  if (mc_detail_slow_route(peer)) return rdma_detail::add_word(peer, ptr_sym, value);
  if (__builtin_expect(peer.nic_atomics, 0))
    return rdma_detail::add_word_via_nic(peer, ptr_sym, value);
  mc_red_add_release(mc_peer_ptr(peer, ptr_sym), value);
  return McStatus::kOk;
}

// ---- the same, addressed by (ctx, dst) --------------------------------------
// Resolve the peer on every call: two table loads, which after an acquire
// cost ~0.3 us on H200. Prefer mc_peer() once in latency-critical loops.

MC_DEVICE McStatus mc_put_thread(const CommCtx& ctx, int dst, void* dst_sym, const void* src,
                                 size_t bytes) {
  return mc_put_thread(mc_peer(ctx, dst), dst_sym, src, bytes);
}

MC_DEVICE McStatus mc_put_warp(const CommCtx& ctx, int dst, void* dst_sym, const void* src,
                               size_t bytes, unsigned lane) {
  return mc_put_warp(mc_peer(ctx, dst), dst_sym, src, bytes, lane);
}

// dst must be the same in every lane.
MC_DEVICE McStatus mc_put_lanes(const CommCtx& ctx, int dst, void* dst_sym, const void* src,
                                size_t bytes) {
  return mc_put_lanes(mc_peer(ctx, dst), dst_sym, src, bytes);
}
MC_DEVICE McStatus mc_put_lanes_block(const CommCtx& ctx, int dst, void* dst_sym, const void* src,
                                      size_t bytes) {
  return mc_put_lanes_block(mc_peer(ctx, dst), dst_sym, src, bytes);
}

MC_DEVICE McStatus mc_put_block(const CommCtx& ctx, int dst, void* dst_sym, const void* src,
                                size_t bytes) {
  return mc_put_block(mc_peer(ctx, dst), dst_sym, src, bytes);
}

MC_DEVICE McStatus mc_put_grid(const CommCtx& ctx, int dst, void* dst_sym, const void* src,
                               size_t bytes, unsigned block, unsigned blocks) {
  return mc_put_grid(mc_peer(ctx, dst), dst_sym, src, bytes, block, blocks);
}

template <class T>
MC_DEVICE McStatus mc_signal(const CommCtx& ctx, int dst, T* sig_sym, T value) {
  return mc_signal(mc_peer(ctx, dst), sig_sym, value);
}

template <class T>
MC_DEVICE McStatus mc_signal_relaxed(const CommCtx& ctx, int dst, T* sig_sym, T value) {
  return mc_signal_relaxed(mc_peer(ctx, dst), sig_sym, value);
}

template <class T>
MC_DEVICE McStatus mc_red_add(const CommCtx& ctx, int dst, T* ptr_sym, T value) {
  return mc_red_add(mc_peer(ctx, dst), ptr_sym, value);
}

// ---- waiting ---------------------------------------------------------------------

// Spins until `*ptr <cmp> value` holds and returns the value that satisfied
// it. `ptr` is local memory (this rank's buffer, or any memory peers write).
// Acquire: writes the signaller made before its release are visible after.
template <class T>
MC_DEVICE T mc_wait_until(const T* ptr, McCmp cmp, T value) {
  uint32_t spins = 0;
  for (;;) {
    const T v = mc_ld_acquire(ptr);
    if (mc_compare(v, cmp, value)) return v;
    mc_spin_backoff(&spins);
  }
}

// As mc_wait_until, but gives up after `timeout_ns`: returns false on
// timeout (`*observed` then holds the last value read), so a kernel can
// report a hang instead of spinning forever.
template <class T>
MC_DEVICE bool mc_wait_until_for(const T* ptr, McCmp cmp, T value, uint64_t timeout_ns,
                                 T* observed) {
  uint32_t spins = 0;
  const uint64_t start = mc_time_ns();
  for (;;) {
    const T v = mc_ld_acquire(ptr);
    if (mc_compare(v, cmp, value)) {
      if (observed != nullptr) *observed = v;
      return true;
    }
    if ((spins & 255u) == 0 && mc_time_ns() - start > timeout_ns) {
      if (observed != nullptr) *observed = v;
      return false;
    }
    mc_spin_backoff(&spins);
  }
}

// ---- ordering and completion --------------------------------------------------

// Orders this thread's earlier puts before its later strong writes to any
// rank at system scope: `put; mc_fence(); mc_signal_relaxed(...)` gives the
// receiver the same guarantee as `put; mc_signal(...)`. Over RDMA a strong
// write is already ordered after the earlier WQEs of its queue pair (RC
// ordering, strictly ordered regions), so nothing more is needed there.
MC_DEVICE void mc_fence() { mc_fence_acq_rel_sys(); }

// Completes this thread's outstanding puts: when it returns they are visible
// to every observer. P2P stores need only a system fence. Over RDMA it polls
// every queue pair of the context until all WQEs rung so far (by any thread)
// have completed, and returns kRdmaError if any queue pair has seen an error
// completion (kTimedOut if one made no progress within its timeout).
MC_DEVICE McStatus mc_quiet(const CommCtx& ctx) {
  mc_fence_sc_sys();
  McStatus result = McStatus::kOk;
  if (ctx.ibgda.qp_devctxs == nullptr) return result;
  if (mc_ctx_incomplete(ctx) || ctx.ibgda.qps_per_rank <= 0) {
    // Which queue pairs exist is unknown: completing none of them silently
    // would make unfinished puts look finished.
    mc_detail_incomplete_ctx(ctx.rank, -1);
    return McStatus::kIncompleteContext;
  }
  const size_t n = static_cast<size_t>(ctx.num_ranks) * ctx.ibgda.qps_per_rank;
  // A look at kQuietBatch queue pairs at a time with relaxed loads issued
  // together and one fence after them (the fence makes them acquires):
  // only a queue pair with WQEs still outstanding is waited for. Before,
  // each queue pair cost its own three acquire loads in a row, about 1 us,
  // idle or not: 20-30 us of an 8-byte WRITE + mc_quiet with 32 queue pairs
  // per peer (bench/results/2026-12-05-h200-resident-kernel.md). A queue
  // pair found done holds nothing rung before this call: its ready_head,
  // whenever read, is at or past what was rung before the call, and
  // cons_tail never passes ready_head.
  constexpr size_t kQuietBatch = 16;
  for (size_t first = 0; first < n; first += kQuietBatch) {
    const size_t m = n - first < kQuietBatch ? n - first : kQuietBatch;
    uint64_t rung[kQuietBatch], done[kQuietBatch];
    uint32_t failed[kQuietBatch];
    for (size_t j = 0; j < kQuietBatch; ++j) {
      // A fixed count with no branch, so the loads go out back to back
      // (past the end, the last queue pair is read again).
      const IbgdaQpDevCtx* qp = &ctx.ibgda.qp_devctxs[first + (j < m ? j : m - 1)];
      rung[j] = mc_ld_relaxed_gpu(&qp->ready_head);
      done[j] = mc_ld_relaxed_gpu(&qp->cons_tail);
      failed[j] = mc_ld_relaxed(&qp->error);
    }
    mc_fence_acq_rel_sys();
    for (size_t j = 0; j < m; ++j) {
      IbgdaQpDevCtx* qp = &ctx.ibgda.qp_devctxs[first + j];
      if (qp->sq == nullptr) continue;  // a slot without a queue pair (this rank's own)
      McStatus st = McStatus::kOk;
      if (done[j] >= rung[j]) {
        st = failed[j] != 0 ? McStatus::kRdmaError : McStatus::kOk;
      } else {
        st = mc_qp_quiet(qp);
      }
      if (st != McStatus::kOk && result == McStatus::kOk) result = st;
    }
  }
  return result;
}

// ---- LL: 8-byte put + signal in one store ------------------------------------

// Writes `data` and `flag` to the LL slot `slot_sym` at `dst` with one
// 16-byte store; the receiver learns both at once with mc_wait_ll, with no
// fence in between (NCCL's LL idea). Orders nothing else: earlier puts are
// not guaranteed visible when the slot is.
// Flag rule: each write to a slot must use a flag different from the one it
// holds (use an epoch counter that starts at 1; slots start zeroed, so 0
// means "empty").
MC_DEVICE McStatus mc_put_signal_ll(const McPeer& peer, McLLSlot* slot_sym, uint64_t data,
                                    uint32_t flag) {
  if (mc_detail_slow_route(peer)) return rdma_detail::put_ll(peer, slot_sym, data, flag);
  mc_st_relaxed_v2u64(mc_peer_ptr(peer, slot_sym), mc_ll_pack(static_cast<uint32_t>(data), flag),
                      mc_ll_pack(static_cast<uint32_t>(data >> 32), flag));
  return McStatus::kOk;
}

MC_DEVICE McStatus mc_put_signal_ll(const CommCtx& ctx, int dst, McLLSlot* slot_sym, uint64_t data,
                                    uint32_t flag) {
  return mc_put_signal_ll(mc_peer(ctx, dst), slot_sym, data, flag);
}

// One look at a local LL slot: true and `*data` set when both halves carry
// `flag`.
MC_DEVICE bool mc_poll_ll(const McLLSlot* slot, uint32_t flag, uint64_t* data) {
  uint64_t lo, hi;
  mc_ld_relaxed_v2u64(slot, &lo, &hi);
  if (static_cast<uint32_t>(lo >> 32) != flag || static_cast<uint32_t>(hi >> 32) != flag) {
    return false;
  }
  *data = (hi << 32) | (lo & 0xffffffffull);
  return true;
}

// Spins on a local LL slot until it carries `flag`; returns its data.
MC_DEVICE uint64_t mc_wait_ll(const McLLSlot* slot, uint32_t flag) {
  uint32_t spins = 0;
  uint64_t data = 0;
  while (!mc_poll_ll(slot, flag, &data)) mc_spin_backoff(&spins);
  return data;
}

}  // namespace device
}  // namespace mooncake
