// IbgdaQpDevCtx: one RC queue pair as a kernel sees it. The host (RdmaTransport
// over the daemon) fills the first part once; the second part is the QP's
// posting state, shared by every thread that posts to or polls the QP, so the
// struct lives in memory every poster can reach (device memory on CUDA) and
// is never copied after setup.
//
// Index spaces (64-bit, never wrap in practice; the NIC sees the low 16 bits):
//   resv_head   next WQE index a poster may reserve
//   ready_head  WQEs [0, ready_head) are written and the doorbell says so
//   cons_tail   WQEs [0, cons_tail) have completions the poller has seen
//   signaled_head  end of the last rung batch whose last WQE asks for a CQE
//               (completions are asked for every cqe_every WQEs; mc_qp_quiet
//               posts a NOP that asks for one when signaled_head < ready_head)
// A slot i % sq_wqe_cnt is written only once i - cons_tail < sq_wqe_cnt:
// a WQE is never overwritten before its completion is seen (upstream
// overwrote live WQEs past 16384 outstanding).
//
// Plain data: compiles with g++ and nvcc, no verbs headers.
#pragma once

#include <cstdint>

#include "mooncake/device/mlx5/prm.h"

namespace mooncake {
namespace device {

// IbgdaQpDevCtx::error values: 0, or the first failure seen on the QP.
//   kQpErrCqe | vendor_syndrome << 8 | syndrome   an error CQE
//   kQpErrStalled                                 no ring space within timeout_ns
inline constexpr uint32_t kQpErrCqe = 1u << 16;
inline constexpr uint32_t kQpErrStalled = 2u << 16;

struct alignas(64) IbgdaQpDevCtx {
  // ---- set up by the host, read-only for kernels -------------------------
  uint8_t* sq = nullptr;              // send queue: sq_wqe_cnt 64-byte blocks
  uint32_t* sq_dbrec = nullptr;       // doorbell record: [kSndDbr] = be32(next index)
  uint64_t* bf_reg = nullptr;         // doorbell register in the UAR; null when the
                                      // doorbell record alone rings (softnic, CPU-assisted)
  mlx5::Cqe64* cq = nullptr;          // completion queue: cq_cqe_cnt CQEs
  uint32_t* cq_dbrec = nullptr;       // [kCqSetCi] = be32(consumer index)
  uint64_t* fetch_scratch = nullptr;  // 8 bytes receiving atomics' old values
  uint64_t local_base = 0;            // this rank's registered data buffer ...
  uint64_t local_size = 0;            // ... (iova == address): puts read from it
  uint64_t timeout_ns = 0;            // longest wait for ring space; 0 = forever
  uint32_t qpn = 0;
  uint32_t sq_wqe_cnt = 0;    // power of two, <= 32768
  uint32_t cq_cqe_cnt = 0;    // power of two, >= sq_wqe_cnt
  uint32_t lkey = 0;          // lkey of the data buffer
  uint32_t scratch_lkey = 0;  // lkey of fetch_scratch
  // 1: this QP is connected to itself, the loopback of NIC atomics (set by
  // the transport once connected; a QP merely created toward its own rank,
  // as upstream's createQueuePairs makes, is not one). comm_device.h
  // mc_nic_atomics reads it.
  uint32_t loopback = 0;
  // WQE i asks for a CQE (kCtrlCqUpdate) when (i + 1) % cqe_every == 0:
  // fewer CQEs for the NIC to write and the poller to read. A power of two,
  // at most sq_wqe_cnt / 2 (so the WQEs without a CQE never fill the ring);
  // 0 or 1: every WQE.
  uint32_t cqe_every = 0;
  // 1: sq, sq_dbrec and cq are GPU memory (the NIC reads them through the
  // GPU's BAR, which the GPU's L2 serves): the doorbell needs GPU-scope
  // ordering only. 0: host memory, system scope.
  uint32_t rings_on_gpu = 0;

  // ---- posting state (device-mutable) --------------------------------------
  alignas(64) uint64_t resv_head = 0;
  uint64_t ready_head = 0;
  uint64_t cons_tail = 0;
  uint64_t cq_ci = 0;
  uint64_t signaled_head = 0;
  uint32_t poll_lock = 0;
  uint32_t error = 0;
};

}  // namespace device
}  // namespace mooncake
