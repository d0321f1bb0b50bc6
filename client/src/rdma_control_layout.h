// Where each queue pair's rings live in the RDMA control memfd (one memfd
// per transport, one slot per QP): send queue, completion queue, then a
// small block with the two doorbell records and the atomics' fetch scratch.
//
// Every ring starts on a 4 KiB boundary, and so does every slot: the mlx5
// DevX provider registers the memfd as umem and its CQ/QP contexts take
// page-aligned ring offsets (mooncaked's Mlx5Session refuses others);
// softnic takes any 64-byte alignment. The cost is at most 4 KiB of padding
// per ring and one page per QP for the doorbell block.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "mooncake/device/mlx5/prm.h"

namespace mooncake {

inline constexpr uint64_t kRdmaRingAlign = 4096;
// In the doorbell block: SQ doorbell record, CQ doorbell record, scratch.
inline constexpr uint64_t kRdmaMiscBytes = 64;
inline constexpr uint64_t kSqDbrecAt = 0;
inline constexpr uint64_t kCqDbrecAt = 8;
inline constexpr uint64_t kScratchAt = 16;

struct QpControlLayout {
  uint64_t sq = 0;    // depth 64-byte WQE basic blocks
  uint64_t cq = 0;    // depth 64-byte CQEs
  uint64_t misc = 0;  // kRdmaMiscBytes: doorbell records, fetch scratch
};

inline uint64_t RdmaRingBytes(uint32_t depth) {
  const uint64_t bytes = uint64_t{depth} * device::mlx5::kSendWqeBb;
  return (bytes + kRdmaRingAlign - 1) / kRdmaRingAlign * kRdmaRingAlign;
}

// Bytes of one QP's slot (a multiple of kRdmaRingAlign).
inline uint64_t QpControlSlotBytes(uint32_t depth) {
  return 2 * RdmaRingBytes(depth) + kRdmaRingAlign;
}

inline QpControlLayout QpControlAt(uint32_t depth, uint64_t slot) {
  QpControlLayout l;
  l.sq = slot * QpControlSlotBytes(depth);
  l.cq = l.sq + RdmaRingBytes(depth);
  l.misc = l.cq + RdmaRingBytes(depth);
  return l;
}

// What a QP's rings hold before its first WQE: no WQEs (zero), every CQE
// invalid (0xff: owned by the NIC), the doorbell block zero. Three byte
// ranges of the control memory, each filled with one value.
struct RingFill {
  uint64_t at = 0;
  uint64_t bytes = 0;
  uint8_t value = 0;
};
inline std::array<RingFill, 3> CleanRings(uint32_t depth, uint64_t slot) {
  const QpControlLayout at = QpControlAt(depth, slot);
  return {RingFill{at.sq, uint64_t{depth} * device::mlx5::kSendWqeBb, 0},
          RingFill{at.cq, uint64_t{depth} * device::mlx5::kCqeBytes, 0xff},
          RingFill{at.misc, kRdmaMiscBytes, 0}};
}

// The completion that fails a QP whose provider is gone (below): its
// place in the CQ ring and its 64 bytes.
struct FlushCqe {
  uint64_t offset = 0;  // into the control memory
  uint8_t bytes[device::mlx5::kCqeBytes] = {};
};

// The flush CQE of the QP in `slot`, from its two doorbell records as the
// client last wrote them (`sq_dbrec`, `cq_dbrec`: 8 bytes each, as they lie
// in memory): one REQ_ERR, syndrome WR_FLUSH_ERR, at the consumer index the
// poller published, with that pass's owner bit and the index of the last
// WQE the send record announced.
inline FlushCqe BuildFlushCqe(const uint32_t sq_dbrec[2], const uint32_t cq_dbrec[2],
                              uint32_t depth, uint64_t slot, uint32_t qpn) {
  namespace mlx5 = device::mlx5;
  const uint32_t posted = mlx5::be32(sq_dbrec[mlx5::kSndDbr]) & 0xffffu;
  const uint32_t ci = mlx5::be32(cq_dbrec[mlx5::kCqSetCi]) & mlx5::kCqCiMask;
  FlushCqe c;
  // depth divides 2^24, so the published 24 bits give the slot and the pass.
  c.offset = QpControlAt(depth, slot).cq + uint64_t{ci & (depth - 1)} * mlx5::kCqeBytes;
  c.bytes[mlx5::kCqeSyndromeByte] = mlx5::kSyndWrFlushErr;
  const uint32_t qpn_be = mlx5::be32(qpn & 0xffffffu);
  std::memcpy(c.bytes + offsetof(mlx5::Cqe64, sop_drop_qpn_be), &qpn_be, sizeof(qpn_be));
  // Bytes 60..63: wqe_counter (big-endian), signature, op_own.
  const uint16_t last = static_cast<uint16_t>(posted - 1u);  // 0xffff: nothing posted
  c.bytes[60] = static_cast<uint8_t>(last >> 8);
  c.bytes[61] = static_cast<uint8_t>(last & 0xffu);
  c.bytes[62] = 0;
  c.bytes[63] = static_cast<uint8_t>((mlx5::kCqeReqErr << 4) | mlx5::cqe_expected_owner(ci, depth));
  return c;
}

// The provider of the QP whose rings sit in `slot` of `control` (the NIC's
// objects, or softnic) is gone for good, with the daemon: fails the QP the
// way a NIC fails one it moved to ERROR, so kernels get kRdmaError instead
// of waiting for completions that will never come. Writes BuildFlushCqe's
// entry: the next poll consumes it, completing every WQE rung so far, and
// records the error in the QP; from then on mc_qp_post refuses
// (kRdmaError) and mc_qp_quiet returns kRdmaError at once (qp_ops.h). Host
// memory (the control memfd as this process maps it; the GPU reads the
// same pages); rings in GPU memory: FailGpuQueuePairRings (gpu_rings.h).
// Only once nothing writes the CQ any more: a provider still completing
// WQEs could overwrite the entry (that QP then ends in kTimedOut after its
// timeout_ns, as before). `depth` is the SQ's and the CQ's entry count.
inline void FailQueuePairRings(uint8_t* control, uint32_t depth, uint64_t slot, uint32_t qpn) {
  const QpControlLayout at = QpControlAt(depth, slot);
  uint32_t sq[2], cq[2];
  for (int i = 0; i < 2; ++i) {
    sq[i] = __atomic_load_n(reinterpret_cast<uint32_t*>(control + at.misc + kSqDbrecAt) + i,
                            __ATOMIC_ACQUIRE);
    cq[i] = __atomic_load_n(reinterpret_cast<uint32_t*>(control + at.misc + kCqDbrecAt) + i,
                            __ATOMIC_ACQUIRE);
  }
  const FlushCqe c = BuildFlushCqe(sq, cq, depth, slot, qpn);
  uint8_t* cqe = control + c.offset;
  std::memcpy(cqe, c.bytes, 60);
  // Bytes 60..63 in one release store: the poller reads them first, with
  // acquire, and the body after.
  uint32_t word = 0;
  std::memcpy(&word, c.bytes + 60, sizeof(word));
  __atomic_store_n(reinterpret_cast<uint32_t*>(cqe + 60), word, __ATOMIC_RELEASE);
}

}  // namespace mooncake
