// Posting to and polling one mlx5 RC queue pair from a kernel (or a host
// "kernel" thread): the IBGDA data path. Written against the platform ops
// only, so the CPU tests run this exact code against softnic.
//
//   mc_qp_post(qp, wqe)   reserve a slot (waiting, and polling, while the ring
//                         is full), store the WQE, then ring the doorbell in
//                         index order: doorbell record, then the UAR register.
//                         Safe from any number of threads at once. On CUDA
//                         the lanes of a warp that post to the same QP in the
//                         same call go out as one batch: one reservation,
//                         one doorbell (mc_lanes_with_key).
//   mc_qp_poll(qp)        consume the valid CQEs (one poller at a time; others
//                         return at once), advance cons_tail, record the first
//                         error CQE in qp->error.
//   mc_qp_post_warp(qp, wqe, have)  the lanes of a warp post together: one
//                         reservation and one doorbell for up to 32 WQEs.
//   mc_qp_post_block(qp, wqe, have) the threads of a block: one reservation
//                         and one doorbell per half ring.
//   mc_qp_quiet(qp)       wait until everything rung before the call completed,
//                         or the QP failed (kRdmaError / kTimedOut at once).
//
// Completions: WQE i asks for a CQE (kCtrlCqUpdate) when (i + 1) % cqe_every
// == 0, whatever the caller's WQE said; a NIC reports an error on any WQE
// all the same. A CQE for WQE i completes every WQE up to i (the queue pair
// executes in order), so cons_tail jumps to i + 1. mc_qp_quiet posts a NOP
// asking for a CQE when the last rung WQE did not ask for one. The CQ has at
// least as many entries as the send queue, so it cannot overrun.
//
// What a post costs (bench/results/2026-12-04-h200-post-path.md): on CUDA,
// one round trip to L2 (the error word, cons_tail, ready_head and the
// reservation, issued together), the WQE stores, and per doorbell one
// release store to the doorbell record (system scope for host rings, GPU
// scope for rings in GPU memory) and one GPU-scope release of ready_head.
// The release to host memory is the floor: it waits until the WQEs' posted
// writes have crossed PCIe.
#pragma once

#include <cstdint>

#include "mooncake/device/ibgda_qp.h"
#include "mooncake/device/mlx5/prm.h"
#include "mooncake/device/mlx5/wqe.h"
#include "mooncake/device/platform.h"
#include "mooncake/device/types_device.h"

namespace mooncake {
namespace device {

namespace qp_detail {
// A store to a doorbell record (send or CQ) with release: GPU scope where
// the rings are GPU memory (the NIC reads them through the GPU's L2),
// system scope where they are host memory.
MC_DEVICE void release_record(const IbgdaQpDevCtx* qp, uint32_t* record, uint32_t value_be) {
  if (qp->rings_on_gpu != 0u) {
    mc_st_release_gpu(record, value_be);
  } else {
    mc_st_release(record, value_be);
  }
}
// Bytes 60..63 of a CQE as one little-endian word: wqe_counter (be16),
// signature, op_own (bits 31..24).
MC_DEVICE uint32_t cqe_tail_word(const mlx5::Cqe64* cqe) {
  return mc_ld_acquire(
      reinterpret_cast<const uint32_t*>(reinterpret_cast<const uint8_t*>(cqe) + 60));
}
MC_DEVICE void set_error_once(IbgdaQpDevCtx* qp, uint32_t err) {
  if (mc_ld_relaxed(&qp->error) == 0) mc_st_release(&qp->error, err);
}
}  // namespace qp_detail

MC_DEVICE void mc_qp_poll(IbgdaQpDevCtx* qp) {
  // A plain look first: pollers finding the lock held leave without the
  // atomic, so many waiting warps do not queue on the lock's word.
  if (mc_ld_relaxed_gpu(&qp->poll_lock) != 0u) return;
  if (mc_atomic_cas_acquire_gpu(&qp->poll_lock, 0u, 1u) != 0u) return;
  const uint32_t n = qp->cq_cqe_cnt;
  uint64_t ci = mc_ld_relaxed(&qp->cq_ci);
  uint64_t tail = mc_ld_relaxed(&qp->cons_tail);
  bool progressed = false;
  for (;;) {
    const mlx5::Cqe64* cqe = &qp->cq[ci & (n - 1)];
    const uint32_t word = qp_detail::cqe_tail_word(cqe);
    const uint8_t op_own = static_cast<uint8_t>(word >> 24);
    const uint8_t opcode = mlx5::cqe_opcode(op_own);
    if (opcode == mlx5::kCqeInvalid || mlx5::cqe_owner(op_own) != mlx5::cqe_expected_owner(ci, n)) {
      break;
    }
    if (opcode == mlx5::kCqeReqErr || opcode == mlx5::kCqeRespErr) {
      const uint32_t synd = mc_ld_relaxed(
          reinterpret_cast<const uint32_t*>(reinterpret_cast<const uint8_t*>(cqe) + 52));
      // Little-endian word of bytes 52..55: byte 54 = vendor, byte 55 = syndrome.
      qp_detail::set_error_once(qp, kQpErrCqe | (((synd >> 16) & 0xffu) << 8) | (synd >> 24));
    }
    // The CQE's WQE and every one before it are done (in-order execution).
    const uint16_t counter = mlx5::be16(static_cast<uint16_t>(word & 0xffffu));
    tail += static_cast<uint16_t>(counter + 1u - static_cast<uint16_t>(tail));
    ++ci;
    progressed = true;
  }
  if (progressed) {
    mc_st_relaxed(&qp->cq_ci, ci);
    qp_detail::release_record(qp, &qp->cq_dbrec[mlx5::kCqSetCi],
                              mlx5::be32(static_cast<uint32_t>(ci) & mlx5::kCqCiMask));
    mc_st_release_gpu(&qp->cons_tail, tail);
  }
  mc_st_release_gpu(&qp->poll_lock, 0u);
}

namespace qp_detail {
// Whether the CQE a poll would consume next holds a completion: one load,
// no atomic. Read with cq_ci as this thread last saw it, so a CQE another
// poller consumed since can read as ready (the poll then finds nothing),
// never the other way round.
MC_DEVICE bool cqe_ready(const IbgdaQpDevCtx* qp) {
  const uint64_t ci = mc_ld_relaxed(&qp->cq_ci);
  const uint32_t word = cqe_tail_word(&qp->cq[ci & (qp->cq_cqe_cnt - 1)]);
  const uint8_t op_own = static_cast<uint8_t>(word >> 24);
  return mlx5::cqe_opcode(op_own) != mlx5::kCqeInvalid &&
         mlx5::cqe_owner(op_own) == mlx5::cqe_expected_owner(ci, qp->cq_cqe_cnt);
}

// The CQE interval in force: cqe_every, bounded by half the ring (the WQEs
// after the last CQE must never fill it).
MC_DEVICE uint32_t cqe_interval(const IbgdaQpDevCtx* qp) {
  const uint32_t every = qp->cqe_every, half = qp->sq_wqe_cnt / 2u;
  return every < half ? every : (half > 0u ? half : 1u);
}
MC_DEVICE bool wants_cqe(const IbgdaQpDevCtx* qp, uint64_t idx) {
  const uint32_t every = cqe_interval(qp);
  return every <= 1u || ((idx + 1u) & (every - 1u)) == 0u;
}

// Waits, polling, until slot `idx` may be written. False when the QP stalled.
MC_DEVICE bool wait_for_slot(IbgdaQpDevCtx* qp, uint64_t idx) {
  uint32_t spins = 0;
  uint64_t start = 0;
  while (idx - mc_ld_acquire_gpu(&qp->cons_tail) >= qp->sq_wqe_cnt) {
    mc_qp_poll(qp);
    if ((mc_ld_acquire(&qp->error) & kQpErrStalled) != 0) return false;
    if (qp->timeout_ns != 0 && (spins & 255u) == 0) {
      const uint64_t now = mc_time_ns();
      if (start == 0) {
        start = now;
      } else if (now - start > qp->timeout_ns) {
        // Nothing completes: the NIC (or softnic) is gone. The slot stays
        // reserved forever, so the QP is unusable from here on.
        mc_st_release(&qp->error, kQpErrStalled);
        return false;
      }
    }
    mc_spin_backoff(&spins);
  }
  return true;
}

// A reservation: slots [base, base + n), and ready_head as seen when it was
// made (ring() skips its wait when that was already base).
struct Reservation {
  uint64_t base = 0;
  uint64_t ready_seen = ~uint64_t{0};
  McStatus status = McStatus::kOk;
};

// Reserves n slots (1 <= n <= sq_wqe_cnt / 2) and waits until all of them
// may be written. The error word, cons_tail and ready_head are read with
// relaxed loads issued together with the reservation's atomic: one round
// trip where acquire loads would take one each. (The slot writes that
// follow depend on the comparison with cons_tail; the doorbell's release
// store is the fence that orders everything after ready_head.)
//   kOk         write the slots, then ring()
//   kRdmaError  the QP had failed: the slots are reserved all the same and
//               must be handed on with pass()
//   kTimedOut   no ring space within timeout_ns (kQpErrStalled set: later
//               posters stop waiting for these slots)
MC_DEVICE Reservation reserve(IbgdaQpDevCtx* qp, uint32_t n) {
  Reservation r;
  const uint32_t error = mc_ld_relaxed(&qp->error);
  const uint64_t tail = mc_ld_relaxed_gpu(&qp->cons_tail);
  r.ready_seen = mc_ld_relaxed_gpu(&qp->ready_head);
  r.base = mc_atomic_add_relaxed_gpu(&qp->resv_head, uint64_t{n});
  if (error != 0) {
    r.status = McStatus::kRdmaError;
  } else if (r.base + n - 1 - tail >= qp->sq_wqe_cnt && !wait_for_slot(qp, r.base + n - 1)) {
    r.status = McStatus::kTimedOut;
  }
  return r;
}

// Stores `wqe` in slot `idx` with its index bits set and its CQE request
// set by the interval (or forced).
MC_DEVICE void write_slot(IbgdaQpDevCtx* qp, uint64_t idx, mlx5::Wqe64 wqe, bool force_cqe) {
  const uint32_t w0 = mlx5::be32(wqe.word[0]);
  wqe.word[0] = mlx5::be32((w0 & 0xff0000ffu) | ((static_cast<uint32_t>(idx) & 0xffffu) << 8));
  // fm_ce_se is byte 11: bits 31..24 of the little-endian word 2.
  constexpr uint32_t kCqBit = static_cast<uint32_t>(mlx5::kCtrlCqUpdate) << 24;
  wqe.word[2] = force_cqe || wants_cqe(qp, idx) ? wqe.word[2] | kCqBit : wqe.word[2] & ~kCqBit;
  uint8_t* slot = qp->sq + (idx & (qp->sq_wqe_cnt - 1)) * mlx5::kSendWqeBb;
  for (int i = 0; i < 4; ++i) {
    McVec16 v{wqe.word[4 * i], wqe.word[4 * i + 1], wqe.word[4 * i + 2], wqe.word[4 * i + 3]};
    mc_st_v4(slot + 16 * i, v);
  }
}

// Waits until every earlier reservation has rung (or passed): doorbells go
// out in index order. False when the QP stalled meanwhile.
MC_DEVICE bool wait_turn(IbgdaQpDevCtx* qp, const Reservation& r) {
  if (r.ready_seen == r.base) return true;
  uint32_t spins = 0;
  while (mc_ld_acquire_gpu(&qp->ready_head) != r.base) {
    if ((mc_ld_acquire(&qp->error) & kQpErrStalled) != 0) return false;
    mc_spin_backoff(&spins);
  }
  return true;
}

// Rings the doorbell for slots [base, base + n), all written.
// `cqe_last`: the last of them asks for a CQE.
MC_DEVICE McStatus ring(IbgdaQpDevCtx* qp, const Reservation& r, uint32_t n, bool cqe_last) {
  if (!wait_turn(qp, r)) return McStatus::kTimedOut;
  const uint64_t end = r.base + n;
  // The release orders this batch's WQEs (and, with the load of ready_head
  // that let this poster through, every earlier one) before the record says
  // so; at GPU scope for rings in GPU memory, which costs half as much.
  release_record(qp, &qp->sq_dbrec[mlx5::kSndDbr],
                 mlx5::be32(static_cast<uint32_t>(end) & 0xffffu));
  if (qp->bf_reg != nullptr) {
    // From (producer index, QPN) alone, as NVSHMEM's IBGDA rings: no read
    // back of a WQE the NIC may already have consumed.
    const uint64_t doorbell =
        (static_cast<uint64_t>(mlx5::be32((qp->qpn & 0xffffffu) << 8)) << 32) |
        mlx5::be32((static_cast<uint32_t>(end) & 0xffffu) << 8);
    mc_st_mmio64_after_release(qp->bf_reg, doorbell);
  }
  if (cqe_last) mc_st_relaxed(&qp->signaled_head, end);
  // Only this GPU's posters read ready_head: a GPU-scope release suffices.
  mc_st_release_gpu(&qp->ready_head, end);
  return McStatus::kOk;
}

// Hands reserved slots on without ringing them, on a QP that had already
// failed (everything it is given from now on is flushed, not executed).
MC_DEVICE void pass(IbgdaQpDevCtx* qp, const Reservation& r, uint32_t n) {
  if (wait_turn(qp, r)) mc_st_release_gpu(&qp->ready_head, r.base + n);
}

// One lane posts `wqe` on its own. `force_cqe`: it asks for a CQE (quiet's
// NOP); else the interval decides. `*end` (optional): the batch's end.
MC_DEVICE McStatus post_alone(IbgdaQpDevCtx* qp, const mlx5::Wqe64& wqe, bool force_cqe,
                              uint64_t* end) {
  const Reservation r = reserve(qp, 1);
  if (r.status == McStatus::kRdmaError) pass(qp, r, 1);
  if (r.status != McStatus::kOk) return r.status;
  if (end != nullptr) *end = r.base + 1;
  write_slot(qp, r.base, wqe, force_cqe);
  return ring(qp, r, 1, force_cqe || wants_cqe(qp, r.base));
}

// The calling lanes that post `wqe` to `qp` together: one reservation and one
// doorbell for the group (arguments as post_alone's).
MC_DEVICE McStatus post_group(IbgdaQpDevCtx* qp, const mlx5::Wqe64& wqe, bool force_cqe,
                              uint64_t* end = nullptr) {
#if defined(MC_QP_NO_LANE_GROUPS)
  // Every lane posts alone: the comparison build of
  // bench/results/2026-12-04-h200-post-path.md ("lane groups").
  if (true) return post_alone(qp, wqe, force_cqe, end);
#endif
  const McLaneGroup g = mc_lanes_with_key(reinterpret_cast<uintptr_t>(qp));
  // A lane alone on its queue pair posts without the group's shuffles:
  // lanes of one warp that each post to their own QP run as one converged
  // path here, where group collectives with 32 different masks would split
  // the warp into 32 (measured: 13 -> 8 M WQE/s for 32 lanes on 32 QPs).
  // So does every lane of a group wider than half the ring (rings of a few
  // dozen WQEs): a batch that large could wait for space only the CQE
  // interval's unsignaled tail holds (the bound in reserve()).
  if (g.size == 1 || g.size > qp->sq_wqe_cnt / 2u) return post_alone(qp, wqe, force_cqe, end);
  const bool leader = mc_group_leader(g);
  Reservation r;
  if (leader) r = reserve(qp, g.size);
  // Status in the top byte, base below it (indices stay far below 2^56).
  const uint64_t packed = mc_group_bcast_u64(
      g, (static_cast<uint64_t>(static_cast<uint32_t>(r.status)) << 56) | r.base);
  const auto st = static_cast<McStatus>(static_cast<int>(packed >> 56));
  const uint64_t base = packed & ((uint64_t{1} << 56) - 1);
  if (st == McStatus::kRdmaError && leader) pass(qp, r, g.size);
  if (st != McStatus::kOk) return st;
  if (end != nullptr) *end = base + g.size;
  write_slot(qp, base + g.rank, wqe, force_cqe);
  // Orders every lane's slot writes before the leader's doorbell release.
  mc_group_sync(g);
  McStatus rung = McStatus::kOk;
  if (leader) rung = ring(qp, r, g.size, force_cqe || wants_cqe(qp, base + g.size - 1));
  return static_cast<McStatus>(
      static_cast<int>(mc_group_bcast_u64(g, static_cast<uint64_t>(static_cast<uint32_t>(rung)))));
}
}  // namespace qp_detail

// Posts `wqe` (built with any wqe_idx and CQE request: the index bits and the
// CQE request are set here). Returns kRdmaError when the QP already failed
// (nothing posted), kTimedOut when it stalled.
MC_DEVICE McStatus mc_qp_post(IbgdaQpDevCtx* qp, const mlx5::Wqe64& wqe) {
  return qp_detail::post_group(qp, wqe, false);
}

// Warp-cooperative post: every lane of the warp calls it (converged, as for
// mc_put_warp); the lanes with `have` post their `wqe`. One reservation and
// one doorbell for the whole warp, so a warp posts up to 32 WQEs for the
// cost of one. The status is the same on every lane. A batch over half the
// ring (host stress tests only) posts lane by lane instead, each lane
// getting its own status.
MC_DEVICE McStatus mc_qp_post_warp(IbgdaQpDevCtx* qp, const mlx5::Wqe64& wqe, bool have) {
  unsigned total = 0;
  const unsigned pos = mc_warp_rank(have, &total);
  if (total == 0) return McStatus::kOk;
  if (total > qp->sq_wqe_cnt / 2u) return have ? mc_qp_post(qp, wqe) : McStatus::kOk;
  const bool leader = mc_lane_id() == 0;
  qp_detail::Reservation r;
  if (leader) r = qp_detail::reserve(qp, total);
  const uint64_t packed =
      mc_warp_bcast_u64((static_cast<uint64_t>(static_cast<uint32_t>(r.status)) << 56) | r.base, 0);
  McStatus st = static_cast<McStatus>(static_cast<int>(packed >> 56));
  const uint64_t base = packed & ((uint64_t{1} << 56) - 1);
  if (st == McStatus::kRdmaError && leader) qp_detail::pass(qp, r, total);
  if (st != McStatus::kOk) return st;
  if (have) qp_detail::write_slot(qp, base + pos, wqe, false);
  // Orders every lane's slot writes before the leader's doorbell release.
  mc_syncwarp();
  if (leader) st = qp_detail::ring(qp, r, total, qp_detail::wants_cqe(qp, base + total - 1));
  return static_cast<McStatus>(
      static_cast<int>(mc_warp_bcast_u64(static_cast<uint64_t>(static_cast<uint32_t>(st)), 0)));
}

// Block-cooperative post: every thread of the block calls it (converged,
// as for mc_put_block); the threads with `have` post their `wqe`. One
// reservation and one doorbell for the whole block, in chunks of at most
// half the ring: a block of 256 threads on a ring of 512 or more rings
// once where warps ring eight times. The status is the same on every
// thread.
MC_DEVICE McStatus mc_qp_post_block(IbgdaQpDevCtx* qp, const mlx5::Wqe64& wqe, bool have) {
  unsigned total = 0;
  const unsigned pos = mc_block_rank(have, &total);
  const unsigned cap = qp->sq_wqe_cnt / 2u > 0u ? qp->sq_wqe_cnt / 2u : 1u;
  const bool leader = mc_block_thread_index() == 0;
  McStatus st = McStatus::kOk;
  for (unsigned first = 0; first < total; first += cap) {
    const unsigned n = total - first < cap ? total - first : cap;
    qp_detail::Reservation r;
    if (leader) r = qp_detail::reserve(qp, n);
    const uint64_t packed = mc_block_bcast_u64(
        (static_cast<uint64_t>(static_cast<uint32_t>(r.status)) << 56) | r.base, 0);
    st = static_cast<McStatus>(static_cast<int>(packed >> 56));
    const uint64_t base = packed & ((uint64_t{1} << 56) - 1);
    if (st == McStatus::kRdmaError && leader) qp_detail::pass(qp, r, n);
    if (st != McStatus::kOk) break;  // the same on every thread
    if (have && pos >= first && pos - first < n) {
      qp_detail::write_slot(qp, base + (pos - first), wqe, false);
    }
    // Orders every thread's slot writes before the leader's doorbell release.
    mc_syncthreads();
    McStatus rung = McStatus::kOk;
    if (leader) rung = qp_detail::ring(qp, r, n, qp_detail::wants_cqe(qp, base + n - 1));
    st = static_cast<McStatus>(static_cast<int>(
        mc_block_bcast_u64(static_cast<uint64_t>(static_cast<uint32_t>(rung)), 0)));
    if (st != McStatus::kOk) break;
  }
  return st;
}

// Waits until every WQE rung on `qp` before the call has completed. When the
// last of them asked for no CQE it first posts a NOP that does. Once the QP
// has failed it stops waiting: after an error CQE a NIC only flushes what is
// left (nothing of it executes), and a QP whose provider is gone (failed by
// the client with one WR_FLUSH_ERR CQE when the daemon went away) completes
// nothing more at all.
MC_DEVICE McStatus mc_qp_quiet(IbgdaQpDevCtx* qp) {
  uint64_t target = mc_ld_acquire_gpu(&qp->ready_head);
  const bool done = mc_ld_acquire_gpu(&qp->cons_tail) >= target;
  const uint32_t failed = mc_ld_acquire(&qp->error);
  if (done) return failed != 0 ? McStatus::kRdmaError : McStatus::kOk;
  if ((failed & kQpErrStalled) != 0) return McStatus::kTimedOut;
  if (failed != 0) return McStatus::kRdmaError;
  if (mc_ld_relaxed_gpu(&qp->signaled_head) < target) {
    // Waits for its own NOP too: a quiet leaves nothing of its own behind.
    mlx5::Wqe64 nop;
    mlx5::build_nop(&nop, 0, qp->qpn, mlx5::kCtrlCqUpdate);
    const McStatus st = qp_detail::post_group(qp, nop, true, &target);
    if (st != McStatus::kOk) return st;
  }
  uint32_t spins = 0;
  uint64_t start = 0;
  while (mc_ld_acquire_gpu(&qp->cons_tail) < target) {
    // A pass that finds no CQE costs one load, not the poll lock's two
    // atomics: the completion is seen up to a pass sooner. The error word
    // (set by a poll, or stalled by another thread) is read after a poll
    // and every 64 passes.
    const bool polled = qp_detail::cqe_ready(qp);
    if (polled) mc_qp_poll(qp);
    if (polled || (spins & 63u) == 0) {
      const uint32_t error = mc_ld_acquire(&qp->error);
      if ((error & kQpErrStalled) != 0) return McStatus::kTimedOut;
      if (error != 0) return McStatus::kRdmaError;
    }
    if (qp->timeout_ns != 0 && (spins & 255u) == 0) {
      const uint64_t now = mc_time_ns();
      if (start == 0) {
        start = now;
      } else if (now - start > qp->timeout_ns) {
        return McStatus::kTimedOut;
      }
    }
    mc_spin_backoff(&spins);
  }
  return mc_ld_acquire(&qp->error) != 0 ? McStatus::kRdmaError : McStatus::kOk;
}

}  // namespace device
}  // namespace mooncake
