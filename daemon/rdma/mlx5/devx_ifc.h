// Our own table of the mlx5 PRM fields the daemon writes or reads to create
// CQs and RC QPs through DevX and to query the device's general caps.
// Names follow the PRM (and so mlx5_ifc.h): a newcomer can grep either for
// `log_sq_size` and land on the same field. Only the fields we use are
// listed; everything else in these commands stays zero.
//
// Offsets are bits from the most significant bit of dword 0 (devx_layout.h).
// Context fields (cqc, qpc, ads, cmd_hca_cap) are relative to the start of
// their context; place them with Field::In(container), e.g.
//   kAds.rlid.In(kQpc.primary_address_path).In(kModifyQpIn.qpc)
// tests/daemon/mlx5_devx_prm_test.cc checks every entry against an
// independent table written from the upstream headers (Linux
// include/linux/mlx5/mlx5_ifc.h, rdma-core providers/mlx5/mlx5_ifc.h and
// tests/mlx5_prm_structs.py) and each command against a golden byte image.
#pragma once

#include <cstdint>

#include "rdma/mlx5/devx_layout.h"

namespace mooncake::daemon::mlx5 {

// ---- opcodes ------------------------------------------------------------------------------------
inline constexpr uint16_t kCmdQueryHcaCap = 0x100;
inline constexpr uint16_t kCmdCreateCq = 0x400;
inline constexpr uint16_t kCmdDestroyCq = 0x401;
inline constexpr uint16_t kCmdCreateQp = 0x500;
inline constexpr uint16_t kCmdDestroyQp = 0x501;
inline constexpr uint16_t kCmdRst2InitQp = 0x502;
inline constexpr uint16_t kCmdInit2RtrQp = 0x503;
inline constexpr uint16_t kCmdRtr2RtsQp = 0x504;

// ---- field values -------------------------------------------------------------------------------
inline constexpr uint32_t kQpcStRc = 0x0;             // qpc.st: reliable connected
inline constexpr uint32_t kQpcPmStateMigrated = 0x3;  // qpc.pm_state: no alternate path armed
inline constexpr uint32_t kQpcRqTypeZeroSize = 0x3;   // qpc.rq_type: the QP has no RQ
inline constexpr uint32_t kCapPortTypeIb = 0x0;       // cmd_hca_cap.port_type
inline constexpr uint32_t kCapPortTypeEth = 0x1;
// QUERY_HCA_CAP op_mod = (capability type << 1) | mode; type 0 = general device.
inline constexpr uint16_t kHcaCapTypeGeneralDevice = 0x0;
inline constexpr uint16_t kHcaCapModeMax = 0x0;
inline constexpr uint16_t kHcaCapModeCurrent = 0x1;

// ---- mailbox headers, shared by every command ---------------------------------------------------
// Input: opcode, uid (the DevX context's user id; the kernel stamps it, we
// leave 0) and op_mod. Output: status (0 = OK) and a firmware syndrome.
struct CmdInLayout {
  Field opcode{0x00, 16};
  Field uid{0x10, 16};
  Field op_mod{0x30, 16};
};
inline constexpr CmdInLayout kCmdIn;

struct CmdOutLayout {
  Field status{0x00, 8};
  Field syndrome{0x20, 32};
};
inline constexpr CmdOutLayout kCmdOut;

// Every output we parse is at least this long: status, syndrome, one object
// number and a reserved dword.
inline constexpr uint32_t kCmdOutBytes = 16;

// ---- cqc: completion queue context (64 bytes) ---------------------------------------------------
struct CqcLayout {
  Field bits{0, 0x200};
  Field dbr_umem_valid{0x06, 1};  // dbr_addr is an offset in umem dbr_umem_id
  Field cqe_sz{0x08, 3};          // 0 = 64-byte CQEs, 1 = 128-byte
  Field oi{0x0e, 1};              // overrun ignore
  Field dbr_umem_id{0x20, 32};
  Field log_cq_size{0x63, 5};
  Field uar_page{0x68, 24};
  // Current Linux names this c_eqn_or_apu_element (32 bits); older headers
  // and rdma-core's tests keep an 8-bit c_eqn in its low byte with the rest
  // reserved. Both give the same bytes for EQ numbers below 256.
  Field c_eqn{0xa0, 32};
  Field dbr_addr{0x1c0, 64};  // bits [2:0] reserved: the record is 8-byte aligned
};
inline constexpr CqcLayout kCqc;

// ---- ads: address path (44 bytes), inside qpc ---------------------------------------------------
struct AdsLayout {
  Field bits{0, 0x160};
  Field pkey_index{0x10, 16};
  Field grh{0x28, 1};  // IB: a GRH follows (rgid_rip etc. valid)
  Field rlid{0x30, 16};
  Field ack_timeout{0x40, 5};
  Field src_addr_index{0x48, 8};  // local GID table index
  Field hop_limit{0x58, 8};
  Field tclass{0x64, 8};
  Field flow_label{0x6c, 20};
  Field rgid_rip{0x80, 128};  // remote GID (RoCE: the peer's IP as a GID)
  Field dscp{0x10a, 6};       // RoCE v2: the IP header's DSCP
  Field udp_sport{0x110, 16};
  Field eth_prio{0x121, 3};
  Field sl{0x124, 4};
  Field vhca_port_num{0x128, 8};
  Field rmac_47_32{0x130, 16};
  Field rmac_31_0{0x140, 32};
};
inline constexpr AdsLayout kAds;

// ---- qpc: queue pair context (232 bytes) --------------------------------------------------------
struct QpcLayout {
  Field bits{0, 0x740};
  Field st{0x08, 8};
  Field pm_state{0x13, 2};
  Field pd{0x28, 24};
  Field mtu{0x40, 3};
  Field log_msg_max{0x43, 5};
  Field log_rq_size{0x49, 4};
  Field log_rq_stride{0x4d, 3};
  Field no_sq{0x50, 1};
  Field log_sq_size{0x51, 4};
  Field ts_format{0x58, 2};
  Field uar_page{0x68, 24};
  Field user_index{0x88, 24};
  Field remote_qpn{0xa8, 24};
  Field primary_address_path{0xc0, 0x160};
  Field log_sra_max{0x388, 3};
  Field retry_count{0x38d, 3};
  Field rnr_retry{0x390, 3};
  Field next_send_psn{0x3c8, 24};
  Field cqn_snd{0x3e8, 24};
  Field log_rra_max{0x488, 3};
  Field atomic_mode{0x48c, 4};
  Field rre{0x490, 1};
  Field rwe{0x491, 1};
  Field rae{0x492, 1};
  Field min_rnr_nak{0x4a3, 5};
  Field next_rcv_psn{0x4a8, 24};
  Field cqn_rcv{0x4e8, 24};
  Field dbr_addr{0x500, 64};
  Field rq_type{0x565, 3};
  Field dbr_umem_valid{0x683, 1};
  Field dbr_umem_id{0x720, 32};
};
inline constexpr QpcLayout kQpc;

// ---- cmd_hca_cap: general device capabilities (256 bytes), the few we read ----------------------
struct CmdHcaCapLayout {
  Field bits{0, 0x800};
  Field log_max_qp_sz{0x88, 8};
  Field log_max_cq_sz{0xc8, 8};
  Field log_max_ra_req_qp{0x14a, 6};
  Field log_max_ra_res_qp{0x15a, 6};
  Field gid_table_size{0x170, 16};
  Field port_type{0x1b6, 2};
  Field num_ports{0x1b8, 8};
  Field log_max_msg{0x1c3, 5};
  Field cqe_version{0x1fc, 4};
  Field roce{0x21d, 1};
  Field atomic{0x21e, 1};
  Field rc{0x23f, 1};
  Field log_max_uctx{0x463, 5};  // DevX user contexts
  Field log_max_umem{0x46b, 5};  // DevX umem registrations
};
inline constexpr CmdHcaCapLayout kCmdHcaCap;

// ---- commands -----------------------------------------------------------------------------------
// Sizes are whole mailboxes without the trailing `pas` list: with umem the
// firmware translates through the umem, so no physical addresses follow.

struct CreateCqInLayout {
  uint32_t bytes = 272;
  Field cq_context{0x80, 0x200};
  Field cq_umem_offset{0x280, 64};
  Field cq_umem_id{0x2c0, 32};
  Field cq_umem_valid{0x2e0, 1};
};
inline constexpr CreateCqInLayout kCreateCqIn;

// CREATE_CQ_OUT / DESTROY_CQ_IN: the CQ number in dword 2.
inline constexpr Field kCqnField{0x48, 24};
inline constexpr uint32_t kDestroyCqInBytes = 16;

struct CreateQpInLayout {
  uint32_t bytes = 272;
  Field qpc{0xc0, 0x740};
  Field wq_umem_offset{0x800, 64};
  Field wq_umem_id{0x840, 32};
  Field wq_umem_valid{0x860, 1};
};
inline constexpr CreateQpInLayout kCreateQpIn;

// CREATE_QP_OUT / DESTROY_QP_IN: the QP number in dword 2.
inline constexpr Field kQpnField{0x48, 24};
inline constexpr uint32_t kDestroyQpInBytes = 16;

// RST2INIT_QP_IN, INIT2RTR_QP_IN and RTR2RTS_QP_IN share this shape.
struct ModifyQpInLayout {
  uint32_t bytes = 272;
  Field qpn{0x48, 24};
  Field opt_param_mask{0x80, 32};  // optional fields being changed; 0: only the required ones
  Field qpc{0xc0, 0x740};
};
inline constexpr ModifyQpInLayout kModifyQpIn;

// atomic_caps (the capability union under op_mod type MLX5_CAP_ATOMIC):
// which atomic operations and operand sizes the responder takes, and the
// byte order of 8-byte atomic replies.
inline constexpr uint16_t kHcaCapTypeAtomic = 0x3;
struct AtomicCapsLayout {
  Field atomic_req_8b_endianness_mode{0x40, 2};  // nonzero: replies in host order
  Field supported_atomic_req_8b_endianness_mode_1{0x46, 1};
  Field atomic_operations{0x90, 16};  // kAtomicOps* bits
  Field atomic_size_qp{0xb0, 16};     // kAtomicSize* bits, RC QPs
  Field atomic_size_dc{0xd0, 16};
};
inline constexpr AtomicCapsLayout kAtomicCaps;
inline constexpr uint32_t kAtomicOpsCmpSwap = 1u << 0;
inline constexpr uint32_t kAtomicOpsFetchAdd = 1u << 1;
inline constexpr uint32_t kAtomicOpsMaskedCmpSwap = 1u << 2;
inline constexpr uint32_t kAtomicOpsMaskedFetchAdd = 1u << 3;
inline constexpr uint32_t kAtomicSize4Bytes = 0x4;
inline constexpr uint32_t kAtomicSize8Bytes = 0x8;

inline constexpr uint32_t kQueryHcaCapInBytes = 16;
struct QueryHcaCapOutLayout {
  uint32_t bytes = 16 + 4096;  // header + the capability union
  Field capability{0x80, 0x8000};
};
inline constexpr QueryHcaCapOutLayout kQueryHcaCapOut;

// ---- compile-time checks ------------------------------------------------------------------------
// Every field inside its context, every context inside its command.
static_assert(kCqc.dbr_addr.Inside(kCqc.bits) && kCqc.c_eqn.Inside(kCqc.bits));
static_assert(kAds.rmac_31_0.Inside(kAds.bits) && kAds.rgid_rip.Inside(kAds.bits));
static_assert(kQpc.dbr_umem_id.Inside(kQpc.bits) && kQpc.primary_address_path.Inside(kQpc.bits));
static_assert(kQpc.primary_address_path.bit_width == kAds.bits.bit_width);
static_assert(kCmdHcaCap.log_max_umem.Inside(kCmdHcaCap.bits));
static_assert(kCreateCqIn.cq_context.bit_width == kCqc.bits.bit_width);
static_assert(kCreateCqIn.cq_umem_valid.FitsIn(kCreateCqIn.bytes));
static_assert(kCreateQpIn.qpc.bit_width == kQpc.bits.bit_width);
static_assert(kCreateQpIn.wq_umem_valid.FitsIn(kCreateQpIn.bytes));
static_assert(kModifyQpIn.qpc.bit_width == kQpc.bits.bit_width);
static_assert(kModifyQpIn.qpc.end_bit() <= kModifyQpIn.bytes * 8);
static_assert(kCreateQpIn.qpc.end_bit() <= kCreateQpIn.wq_umem_offset.bit_offset);
static_assert(kCreateCqIn.cq_context.end_bit() <= kCreateCqIn.cq_umem_offset.bit_offset);
static_assert(kCmdHcaCap.bits.In(kQueryHcaCapOut.capability).end_bit() <=
              kQueryHcaCapOut.bytes * 8);
static_assert(kQpnField.FitsIn(kCmdOutBytes) && kCqnField.FitsIn(kDestroyCqInBytes));

}  // namespace mooncake::daemon::mlx5
