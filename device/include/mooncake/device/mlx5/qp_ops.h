// Posting to and polling one mlx5 RC queue pair from a kernel (or a host
// "kernel" thread): the IBGDA data path. Written against the platform ops
// only, so the CPU tests run this exact code against softnic.
//
//   mc_qp_post(qp, wqe)   reserve a slot (waiting, and polling, while the ring
//                         is full), store the WQE, then ring the doorbell in
//                         index order: doorbell record, then the UAR register.
//                         Safe from any number of threads at once.
//   mc_qp_poll(qp)        consume the valid CQEs (one poller at a time; others
//                         return at once), advance cons_tail, record the first
//                         error CQE in qp->error.
//   mc_qp_post_warp(qp, wqe, have)  the lanes of a warp post together: one
//                         reservation and one doorbell for up to 32 WQEs.
//   mc_qp_quiet(qp)       wait until everything rung before the call completed,
//                         or the QP failed (kRdmaError / kTimedOut at once).
//
// Every WQE asks for a CQE (kCtrlCqUpdate) and the CQ has at least as many
// entries as the send queue, so the CQ cannot overrun: at most sq_wqe_cnt WQEs
// are outstanding, hence at most that many unconsumed CQEs.
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
  if (mc_atomic_cas_acquire(&qp->poll_lock, 0u, 1u) != 0u) return;
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
    const uint16_t counter = mlx5::be16(static_cast<uint16_t>(word & 0xffffu));
    tail += static_cast<uint16_t>(counter + 1u - static_cast<uint16_t>(tail));
    ++ci;
    progressed = true;
  }
  if (progressed) {
    mc_st_relaxed(&qp->cq_ci, ci);
    mc_st_release(&qp->cq_dbrec[mlx5::kCqSetCi],
                  mlx5::be32(static_cast<uint32_t>(ci) & mlx5::kCqCiMask));
    mc_st_release_gpu(&qp->cons_tail, tail);
  }
  mc_st_release_gpu(&qp->poll_lock, 0u);
}

namespace qp_detail {
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

// Reserves slots [*base, *base + n) (1 <= n <= sq_wqe_cnt) and waits until
// all of them may be written.
MC_DEVICE McStatus reserve(IbgdaQpDevCtx* qp, uint32_t n, uint64_t* base) {
  if (mc_ld_relaxed(&qp->error) != 0) return McStatus::kRdmaError;
  *base = mc_atomic_add_relaxed(&qp->resv_head, uint64_t{n});
  return wait_for_slot(qp, *base + n - 1) ? McStatus::kOk : McStatus::kTimedOut;
}

// Stores `wqe` in slot `idx`, with its index bits set. Returns the first 8
// bytes of its control segment as the doorbell register takes them.
MC_DEVICE uint64_t write_slot(IbgdaQpDevCtx* qp, uint64_t idx, mlx5::Wqe64 wqe) {
  const uint32_t w0 = mlx5::be32(wqe.word[0]);
  wqe.word[0] = mlx5::be32((w0 & 0xff0000ffu) | ((static_cast<uint32_t>(idx) & 0xffffu) << 8));
  uint8_t* slot = qp->sq + (idx & (qp->sq_wqe_cnt - 1)) * mlx5::kSendWqeBb;
  for (int i = 0; i < 4; ++i) {
    McVec16 v{wqe.word[4 * i], wqe.word[4 * i + 1], wqe.word[4 * i + 2], wqe.word[4 * i + 3]};
    mc_st_v4(slot + 16 * i, v);
  }
  return (static_cast<uint64_t>(wqe.word[1]) << 32) | wqe.word[0];
}

// The first 8 bytes of slot `idx` as written (by any thread ordered before).
MC_DEVICE uint64_t slot_ctrl(const IbgdaQpDevCtx* qp, uint64_t idx) {
  const McVec16 v = mc_ld_v4(qp->sq + (idx & (qp->sq_wqe_cnt - 1)) * mlx5::kSendWqeBb);
  return (static_cast<uint64_t>(v.y) << 32) | v.x;
}

// Rings the doorbell for slots [base, base + n), all written, once every
// earlier reservation has rung: doorbells go out in index order.
// `last_ctrl`: the first 8 bytes of slot base + n - 1 (for the UAR write).
MC_DEVICE McStatus ring(IbgdaQpDevCtx* qp, uint64_t base, uint32_t n, uint64_t last_ctrl) {
  uint32_t spins = 0;
  while (mc_ld_acquire_gpu(&qp->ready_head) != base) {
    if ((mc_ld_acquire(&qp->error) & kQpErrStalled) != 0) return McStatus::kTimedOut;
    mc_spin_backoff(&spins);
  }
  // A system-scope release: these WQEs (and, through the acquire of
  // ready_head above, every earlier one) are visible before the doorbell
  // record says so. No separate fence: it cost a PCIe round trip per post.
  mc_st_release(&qp->sq_dbrec[mlx5::kSndDbr],
                mlx5::be32(static_cast<uint32_t>(base + n) & 0xffffu));
  if (qp->bf_reg != nullptr) mc_st_mmio64(qp->bf_reg, last_ctrl);
  // Only this GPU's posters read ready_head: a GPU-scope release suffices.
  mc_st_release_gpu(&qp->ready_head, base + n);
  return McStatus::kOk;
}
}  // namespace qp_detail

// Posts `wqe` (built with any wqe_idx; its index bits are set here).
// Returns kRdmaError when the QP already failed (nothing posted) or stalled.
MC_DEVICE McStatus mc_qp_post(IbgdaQpDevCtx* qp, mlx5::Wqe64 wqe) {
  uint64_t idx = 0;
  const McStatus st = qp_detail::reserve(qp, 1, &idx);
  if (st != McStatus::kOk) return st;
  return qp_detail::ring(qp, idx, 1, qp_detail::write_slot(qp, idx, wqe));
}

// Warp-cooperative post: every lane of the warp calls it (converged, as for
// mc_put_warp); the lanes with `have` post their `wqe`. One reservation and
// one doorbell for the whole warp, so a warp posts up to 32 WQEs for the
// cost of one (the doorbell record's system-scope release is what a post
// costs). The status is the same on every lane. A warp wider than the ring
// (host stress tests only) posts lane by lane instead, each lane getting its
// own status.
MC_DEVICE McStatus mc_qp_post_warp(IbgdaQpDevCtx* qp, const mlx5::Wqe64& wqe, bool have) {
  unsigned total = 0;
  const unsigned pos = mc_warp_rank(have, &total);
  if (total == 0) return McStatus::kOk;
  if (total > qp->sq_wqe_cnt) return have ? mc_qp_post(qp, wqe) : McStatus::kOk;
  const bool leader = mc_lane_id() == 0;
  uint64_t base = 0;
  McStatus st = McStatus::kOk;
  if (leader) st = qp_detail::reserve(qp, total, &base);
  // Status in the top byte, base below it (indices stay far below 2^56).
  const uint64_t packed =
      mc_warp_bcast_u64((static_cast<uint64_t>(static_cast<uint32_t>(st)) << 56) | base, 0);
  st = static_cast<McStatus>(static_cast<int>(packed >> 56));
  base = packed & ((uint64_t{1} << 56) - 1);
  if (st != McStatus::kOk) return st;
  if (have) qp_detail::write_slot(qp, base + pos, wqe);
  // Orders every lane's slot writes before the leader's doorbell release.
  mc_syncwarp();
  if (leader) {
    const uint64_t last = qp->bf_reg != nullptr ? qp_detail::slot_ctrl(qp, base + total - 1) : 0;
    st = qp_detail::ring(qp, base, total, last);
  }
  return static_cast<McStatus>(
      static_cast<int>(mc_warp_bcast_u64(static_cast<uint64_t>(static_cast<uint32_t>(st)), 0)));
}

// Waits until every WQE rung on `qp` before the call has completed. Once
// the QP has failed it stops waiting: after an error CQE a NIC only flushes
// what is left (nothing of it executes), and a QP whose provider is gone
// (failed by the client with one WR_FLUSH_ERR CQE when the daemon went
// away) completes nothing more at all.
MC_DEVICE McStatus mc_qp_quiet(IbgdaQpDevCtx* qp) {
  const uint64_t target = mc_ld_acquire_gpu(&qp->ready_head);
  uint32_t spins = 0;
  uint64_t start = 0;
  while (mc_ld_acquire_gpu(&qp->cons_tail) < target) {
    mc_qp_poll(qp);
    const uint32_t error = mc_ld_acquire(&qp->error);
    if ((error & kQpErrStalled) != 0) return McStatus::kTimedOut;
    if (error != 0) return McStatus::kRdmaError;
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
