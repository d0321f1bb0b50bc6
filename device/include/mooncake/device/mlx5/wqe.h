// Builders for the send WQEs the Device API posts. Each fills one 64-byte
// basic block (every WQE we post fits in one, so none wraps the ring) in a
// local Wqe64, which the poster then stores into the ring with four 16-byte
// stores. Pure functions: tests/device/mlx5_prm_test.cc checks each one byte
// by byte against rdma-core's mlx5dv structures and a golden image.
//
// Common arguments
//   wqe_idx  the WQE's index in the send queue (only its low 16 bits are sent)
//   qpn      this QP's number
//   flags    fm_ce_se: kCtrlCqUpdate and kCtrlFence (mc_qp_post replaces
//            the CQE request with the queue pair's interval, every
//            cqe_every WQEs). The Device API never sets kCtrlFence
//            (comm_device.h says why); the builders take it for callers that
//            read a fetched value back into a later WQE.
#pragma once

#include <cstdint>

#include "mooncake/device/detail/macros.h"
#include "mooncake/device/mlx5/prm.h"

namespace mooncake {
namespace device {
namespace mlx5 {

struct alignas(16) Wqe64 {
  uint32_t word[16];
};
static_assert(sizeof(Wqe64) == kSendWqeBb);

namespace wqe_detail {
// Segment views over the block, at 16-byte offsets.
MC_HOST_DEVICE void zero(Wqe64* w) {
  for (int i = 0; i < 16; ++i) w->word[i] = 0;
}
MC_HOST_DEVICE void ctrl(Wqe64* w, uint8_t opcode, uint8_t opmod, uint16_t wqe_idx, uint32_t qpn,
                         uint8_t ds, uint8_t flags, uint32_t imm_be) {
  w->word[0] = ctrl_opmod_idx_opcode(opmod, wqe_idx, opcode);
  w->word[1] = ctrl_qpn_ds(qpn, ds);
  // word 2: signature (byte 8) = 0, dci stream (bytes 9-10) = 0, fm_ce_se (byte 11).
  // Little-endian word: byte 11 is bits 31..24.
  w->word[2] = static_cast<uint32_t>(flags) << 24;
  w->word[3] = imm_be;
}
MC_HOST_DEVICE void raddr(Wqe64* w, uint64_t remote_addr, uint32_t rkey) {
  const uint64_t a = be64(remote_addr);
  w->word[4] = static_cast<uint32_t>(a);
  w->word[5] = static_cast<uint32_t>(a >> 32);
  w->word[6] = be32(rkey);
  w->word[7] = 0;
}
MC_HOST_DEVICE void data(Wqe64* w, int seg, uint32_t bytes, uint32_t lkey, uint64_t addr) {
  const uint64_t a = be64(addr);
  w->word[seg * 4 + 0] = be32(bytes);
  w->word[seg * 4 + 1] = be32(lkey);
  w->word[seg * 4 + 2] = static_cast<uint32_t>(a);
  w->word[seg * 4 + 3] = static_cast<uint32_t>(a >> 32);
}
}  // namespace wqe_detail

// RDMA WRITE of `bytes` (1 .. 2^31-1) from local [laddr, +bytes) (lkey) to
// remote [raddr, +bytes) (rkey). ds = 3.
MC_HOST_DEVICE void build_rdma_write(Wqe64* w, uint16_t wqe_idx, uint32_t qpn, uint8_t flags,
                                     uint64_t raddr, uint32_t rkey, uint64_t laddr, uint32_t lkey,
                                     uint32_t bytes) {
  wqe_detail::zero(w);
  wqe_detail::ctrl(w, kOpRdmaWrite, 0, wqe_idx, qpn, 3, flags, 0);
  wqe_detail::raddr(w, raddr, rkey);
  wqe_detail::data(w, 2, bytes, lkey, laddr);
}

// RDMA WRITE with immediate: as build_rdma_write, and `imm` (host order) is
// delivered to the responder. ds = 3.
MC_HOST_DEVICE void build_rdma_write_imm(Wqe64* w, uint16_t wqe_idx, uint32_t qpn, uint8_t flags,
                                         uint64_t raddr, uint32_t rkey, uint64_t laddr,
                                         uint32_t lkey, uint32_t bytes, uint32_t imm) {
  wqe_detail::zero(w);
  wqe_detail::ctrl(w, kOpRdmaWriteImm, 0, wqe_idx, qpn, 3, flags, be32(imm));
  wqe_detail::raddr(w, raddr, rkey);
  wqe_detail::data(w, 2, bytes, lkey, laddr);
}

// RDMA WRITE of `bytes` (1 .. kMaxInlineBytes) carried inside the WQE: no
// local key, the source may be anywhere. ds = 2 + ceil((4 + bytes) / 16).
MC_HOST_DEVICE void build_rdma_write_inline(Wqe64* w, uint16_t wqe_idx, uint32_t qpn, uint8_t flags,
                                            uint64_t raddr, uint32_t rkey, const void* src,
                                            uint32_t bytes) {
  wqe_detail::zero(w);
  const uint8_t ds = static_cast<uint8_t>(2 + (4 + bytes + 15) / 16);
  wqe_detail::ctrl(w, kOpRdmaWrite, 0, wqe_idx, qpn, ds, flags, 0);
  wqe_detail::raddr(w, raddr, rkey);
  w->word[8] = be32(kInlineSeg | bytes);
  auto* out = reinterpret_cast<uint8_t*>(&w->word[9]);
  const auto* in = static_cast<const uint8_t*>(src);
  for (uint32_t i = 0; i < bytes; ++i) out[i] = in[i];
}

// 64-bit fetch-add: adds `add` to the 8-byte word at raddr (8-byte aligned);
// the old value lands at local [laddr, +8) (lkey). ds = 4.
MC_HOST_DEVICE void build_atomic_fa64(Wqe64* w, uint16_t wqe_idx, uint32_t qpn, uint8_t flags,
                                      uint64_t raddr, uint32_t rkey, uint64_t add, uint64_t laddr,
                                      uint32_t lkey) {
  wqe_detail::zero(w);
  wqe_detail::ctrl(w, kOpAtomicFa, 0, wqe_idx, qpn, 4, flags, 0);
  wqe_detail::raddr(w, raddr, rkey);
  const uint64_t a = be64(add);
  w->word[8] = static_cast<uint32_t>(a);
  w->word[9] = static_cast<uint32_t>(a >> 32);
  wqe_detail::data(w, 3, 8, lkey, laddr);
}

// 32-bit masked fetch-add (extended atomic, opmod kOpmodExtAtomic32): adds
// `add` to the 4-byte word at raddr (4-byte aligned), one field (boundary 0);
// the old value lands at local [laddr, +4). ds = 4.
MC_HOST_DEVICE void build_masked_fa32(Wqe64* w, uint16_t wqe_idx, uint32_t qpn, uint8_t flags,
                                      uint64_t raddr, uint32_t rkey, uint32_t add, uint64_t laddr,
                                      uint32_t lkey) {
  wqe_detail::zero(w);
  wqe_detail::ctrl(w, kOpAtomicMaskedFa, kOpmodExtAtomic32, wqe_idx, qpn, 4, flags, 0);
  wqe_detail::raddr(w, raddr, rkey);
  w->word[8] = be32(add);
  w->word[9] = 0;  // field boundary: none
  wqe_detail::data(w, 3, 4, lkey, laddr);
}

// NOP: completes in order, moves nothing (used to fill a reserved slot).
MC_HOST_DEVICE void build_nop(Wqe64* w, uint16_t wqe_idx, uint32_t qpn, uint8_t flags) {
  wqe_detail::zero(w);
  wqe_detail::ctrl(w, kOpNop, 0, wqe_idx, qpn, 1, flags, 0);
}

}  // namespace mlx5
}  // namespace device
}  // namespace mooncake
