// mlx5 device-visible structures (the PRM contract between whoever posts work
// and the NIC): send WQE segments, the 64-byte CQE, doorbell records, and the
// constants that fill them. Our own definitions, written from the PRM field
// list and checked field by field (offset, width, byte order) against
// rdma-core's <infiniband/mlx5dv.h> by tests/device/mlx5_prm_test.cc, so
// device code needs no verbs header (upstream pulls verbs.h into every
// kernel). Multi-byte fields are big-endian on the wire: the names end in
// _be and hold the value byte-swapped; use the accessors below.
//
// Compiles with g++ and nvcc (MC_HOST_DEVICE): the CPU tests check the same
// builders the GPU runs.
#pragma once

#include <cstdint>

#include "mooncake/device/detail/macros.h"

namespace mooncake {
namespace device {
namespace mlx5 {

// ---- byte order ----------------------------------------------------------------
// Written here rather than taken from the platform ops so PRM code stays
// usable from host-only translation units of a CUDA build.
MC_HOST_DEVICE uint16_t be16(uint16_t x) { return static_cast<uint16_t>((x >> 8) | (x << 8)); }
MC_HOST_DEVICE uint32_t be32(uint32_t x) {
  return (x >> 24) | ((x >> 8) & 0xff00u) | ((x << 8) & 0xff0000u) | (x << 24);
}
MC_HOST_DEVICE uint64_t be64(uint64_t x) {
  return (static_cast<uint64_t>(be32(static_cast<uint32_t>(x))) << 32) |
         be32(static_cast<uint32_t>(x >> 32));
}

// ---- sizes ---------------------------------------------------------------------------
inline constexpr uint32_t kSendWqeBb = 64;  // one send WQE basic block
inline constexpr uint32_t kDsBytes = 16;    // "ds" counts 16-byte octowords
inline constexpr uint32_t kCqeBytes = 64;

// ---- send opcodes (ctrl segment opcode byte) -------------------------------------------
inline constexpr uint8_t kOpNop = 0x00;
inline constexpr uint8_t kOpRdmaWrite = 0x08;
inline constexpr uint8_t kOpRdmaWriteImm = 0x09;
inline constexpr uint8_t kOpRdmaRead = 0x10;
inline constexpr uint8_t kOpAtomicFa = 0x12;        // 64-bit fetch-add
inline constexpr uint8_t kOpAtomicMaskedFa = 0x15;  // extended (masked) fetch-add
// opmod of an extended atomic: log2(operand bytes) - 2 in bits [3:1] with bit 3
// set, i.e. 0x08 selects 4-byte operands (what upstream Mooncake and NVSHMEM
// put in opmod for the 32-bit masked fetch-add).
inline constexpr uint8_t kOpmodExtAtomic32 = 0x08;

// ---- ctrl segment fm_ce_se byte ---------------------------------------------------------
inline constexpr uint8_t kCtrlCqUpdate = 2u << 2;  // always write a CQE
inline constexpr uint8_t kCtrlSolicited = 1u << 1;
inline constexpr uint8_t kCtrlFence = 4u << 5;       // wait for earlier WQEs
inline constexpr uint8_t kCtrlSmallFence = 1u << 5;  // initiator small fence

// Inline data segment: byte_count carries this flag.
inline constexpr uint32_t kInlineSeg = 0x80000000u;

// ---- doorbell records --------------------------------------------------------------------
// A QP's doorbell record is two big-endian words: [0] receive counter, [1]
// send counter (the index of the next WQE to post, low 16 bits).
inline constexpr int kRcvDbr = 0;
inline constexpr int kSndDbr = 1;
// A CQ's doorbell record: [0] consumer index (low 24 bits), [1] arm word.
inline constexpr int kCqSetCi = 0;
inline constexpr int kCqArm = 1;
inline constexpr uint32_t kCqCiMask = 0xffffffu;

// ---- CQE opcodes (high nibble of op_own) ---------------------------------------------------
inline constexpr uint8_t kCqeReq = 0;
inline constexpr uint8_t kCqeRespWrImm = 1;
inline constexpr uint8_t kCqeReqErr = 13;
inline constexpr uint8_t kCqeRespErr = 14;
inline constexpr uint8_t kCqeInvalid = 15;
inline constexpr uint8_t kCqeOwnerMask = 1;

// ---- error syndromes (CQE byte 55) ---------------------------------------------------------
inline constexpr uint8_t kSyndLocalLengthErr = 0x01;
inline constexpr uint8_t kSyndLocalQpOpErr = 0x02;
inline constexpr uint8_t kSyndLocalProtErr = 0x04;
inline constexpr uint8_t kSyndWrFlushErr = 0x05;
inline constexpr uint8_t kSyndBadRespErr = 0x10;
inline constexpr uint8_t kSyndLocalAccessErr = 0x11;
inline constexpr uint8_t kSyndRemoteInvalReqErr = 0x12;
inline constexpr uint8_t kSyndRemoteAccessErr = 0x13;
inline constexpr uint8_t kSyndRemoteOpErr = 0x14;
inline constexpr uint8_t kSyndTransportRetryExcErr = 0x15;
inline constexpr uint8_t kSyndRnrRetryExcErr = 0x16;

// ---- WQE segments --------------------------------------------------------------------------

// First 16 bytes of every send WQE.
struct WqeCtrlSeg {
  uint32_t opmod_idx_opcode_be;  // opmod[31:24] | wqe index[23:8] | opcode[7:0]
  uint32_t qpn_ds_be;            // qpn[31:8] | ds[5:0] (WQE size in 16-byte units)
  uint8_t signature;
  uint8_t dci_stream_channel_id_be[2];
  uint8_t fm_ce_se;  // fence mode | completion (CQ_UPDATE) | solicited
  uint32_t imm_be;   // immediate data of WRITE_IMM (as sent)
};

// Remote address segment of RDMA and atomic WQEs.
struct WqeRaddrSeg {
  uint64_t raddr_be;
  uint32_t rkey_be;
  uint32_t reserved;
};

// Pointer to local memory (source of a write, destination of an atomic's
// fetched value).
struct WqeDataSeg {
  uint32_t byte_count_be;
  uint32_t lkey_be;
  uint64_t addr_be;
};

// 64-bit fetch-add / compare-swap operand.
struct WqeAtomicSeg {
  uint64_t swap_add_be;
  uint64_t compare_be;
};

// 32-bit masked fetch-add operand (extended atomic, 4-byte form): the value
// to add and the field-boundary mask (0: the whole 32-bit word is one field).
struct WqeMaskedFa32Seg {
  uint32_t add_be;
  uint32_t field_boundary_be;
  uint64_t reserved;
};

// Inline data header; the data follows immediately.
struct WqeInlineSeg {
  uint32_t byte_count_be;  // kInlineSeg | bytes
};

static_assert(sizeof(WqeCtrlSeg) == 16 && sizeof(WqeRaddrSeg) == 16 && sizeof(WqeDataSeg) == 16 &&
              sizeof(WqeAtomicSeg) == 16 && sizeof(WqeMaskedFa32Seg) == 16 &&
              sizeof(WqeInlineSeg) == 4);

// Every WQE we post is exactly one basic block: ctrl + raddr + one of
// {data, inline, atomic+data}. Largest inline payload in one block:
inline constexpr uint32_t kMaxInlineBytes =
    kSendWqeBb - sizeof(WqeCtrlSeg) - sizeof(WqeRaddrSeg) - sizeof(WqeInlineSeg);  // 28

// ---- CQE -----------------------------------------------------------------------------------
// The 64-byte completion entry, reduced to the fields a requester reads or an
// error CQE carries. Byte offsets are the PRM's (and mlx5_cqe64 / mlx5_err_cqe's).
struct Cqe64 {
  uint8_t reserved0[32];
  uint32_t srqn_uidx_be;       // 32
  uint32_t imm_inval_pkey_be;  // 36: immediate of a responder WRITE_IMM CQE
  uint8_t reserved1[4];        // 40: app fields
  uint32_t byte_cnt_be;        // 44: bytes of a successful WQE
  uint64_t timestamp_be;       // 48; in an error CQE bytes 54 and 55 carry the
                               //     vendor syndrome and the syndrome instead
  uint32_t sop_drop_qpn_be;    // 56: opcode of the WQE[31:24] | qpn[23:0]
  uint16_t wqe_counter_be;     // 60: index (low 16 bits) of the WQE completed
  uint8_t signature;           // 62
  uint8_t op_own;              // 63: CQE opcode[7:4] | ... | owner[0]
};
static_assert(sizeof(Cqe64) == kCqeBytes);
// Error CQE bytes (inside the timestamp field of a successful one).
inline constexpr int kCqeVendorSyndromeByte = 54;
inline constexpr int kCqeSyndromeByte = 55;

MC_HOST_DEVICE uint8_t cqe_opcode(uint8_t op_own) { return static_cast<uint8_t>(op_own >> 4); }
MC_HOST_DEVICE uint8_t cqe_owner(uint8_t op_own) { return op_own & kCqeOwnerMask; }

// The owner bit a valid CQE carries at consumer index `ci` of a ring of `n`
// (power of two) entries: it flips on every pass, starting at 0. A CQ ring is
// initialised to 0xff bytes (opcode INVALID, owner 1), so nothing is valid
// until the NIC writes it.
MC_HOST_DEVICE uint8_t cqe_expected_owner(uint64_t ci, uint32_t n) {
  return static_cast<uint8_t>((ci / n) & 1u);
}

// ---- field packing ----------------------------------------------------------------------------
MC_HOST_DEVICE uint32_t ctrl_opmod_idx_opcode(uint8_t opmod, uint16_t wqe_idx, uint8_t opcode) {
  return be32((static_cast<uint32_t>(opmod) << 24) | (static_cast<uint32_t>(wqe_idx) << 8) |
              opcode);
}
MC_HOST_DEVICE uint32_t ctrl_qpn_ds(uint32_t qpn, uint8_t ds) {
  return be32((qpn << 8) | (ds & 0x3fu));
}

}  // namespace mlx5
}  // namespace device
}  // namespace mooncake
