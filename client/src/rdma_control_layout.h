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

#include <cstdint>

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

}  // namespace mooncake
