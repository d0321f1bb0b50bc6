// Conformance of our mlx5 device-visible structures (device/mlx5/prm.h) and
// WQE builders (device/mlx5/wqe.h) with the PRM, field by field: offset,
// width and byte order. rdma-core's <infiniband/mlx5dv.h> is the reference
// wherever it defines the structure or constant (header only: every helper
// used here is static inline, nothing links libmlx5); the PRM itself where
// mlx5dv.h has nothing (the 4-byte masked fetch-add operand, the CQ doorbell
// record). Each builder is checked three ways: against the same WQE composed
// with mlx5dv helpers and structs, by decoding its fields back with
// be32toh/be64toh, and against a golden byte image written out by hand.
#include <endian.h>
#include <gtest/gtest.h>
#include <infiniband/mlx5dv.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mooncake/device/mlx5/prm.h"
#include "mooncake/device/mlx5/wqe.h"

namespace mooncake::device::mlx5 {
namespace {

static_assert(sizeof(uintptr_t) == 8, "mlx5dv_set_data_seg takes the address as uintptr_t");

// ---- helpers -------------------------------------------------------------------------------

// Offset and width of one of our fields against the mlx5dv.h field it mirrors,
// and against the PRM offset written out (so a change on either side shows).
#define EXPECT_FIELD_AT(Ours, ours_field, Theirs, theirs_field, prm_offset)       \
  do {                                                                            \
    EXPECT_EQ(offsetof(Ours, ours_field), offsetof(Theirs, theirs_field))         \
        << "offset of " #Ours "::" #ours_field " vs " #Theirs "::" #theirs_field; \
    EXPECT_EQ(offsetof(Ours, ours_field), static_cast<size_t>(prm_offset))        \
        << "PRM offset of " #Ours "::" #ours_field;                               \
    EXPECT_EQ(sizeof(Ours::ours_field), sizeof(Theirs::theirs_field))             \
        << "width of " #Ours "::" #ours_field " vs " #Theirs "::" #theirs_field;  \
  } while (0)

// A constant of ours against its MLX5_* counterpart, compared wide so that
// neither side is truncated to the other's type.
#define EXPECT_CONST(ours, theirs) \
  EXPECT_EQ(static_cast<uint64_t>(ours), static_cast<uint64_t>(theirs)) << #ours " vs " #theirs

std::string hexBytes(const uint8_t* p, size_t n) {
  std::string s;
  char buf[4];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", p[i]);
    if (i != 0) s += (i % 16 == 0) ? "\n  " : " ";
    s += buf;
  }
  return s;
}

// Byte-for-byte comparison that names every differing offset.
::testing::AssertionResult sameBytes(const void* expected, const void* actual, size_t n) {
  const auto* e = static_cast<const uint8_t*>(expected);
  const auto* a = static_cast<const uint8_t*>(actual);
  std::string diffs;
  for (size_t i = 0; i < n; ++i) {
    if (e[i] != a[i]) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "  byte %zu: expected 0x%02x, actual 0x%02x\n", i, e[i],
                    a[i]);
      diffs += buf;
    }
  }
  if (diffs.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "\n"
         << diffs << "expected:\n  " << hexBytes(e, n) << "\nactual:\n  " << hexBytes(a, n);
}

const uint8_t* bytesOf(const Wqe64& w) { return reinterpret_cast<const uint8_t*>(&w); }

// A WQE slot holding stale bytes: every builder must overwrite all 64.
Wqe64 staleWqe() {
  Wqe64 w;
  std::memset(&w, 0xa5, sizeof(w));
  return w;
}

// The reference WQE, composed with mlx5dv structs and helpers.
struct RefWqe {
  alignas(64) uint8_t b[64] = {};
  template <typename Seg>
  Seg* at(size_t offset) {
    return reinterpret_cast<Seg*>(b + offset);
  }
};

// Distinctive inputs: every byte differs, so a swapped or shifted field shows.
constexpr uint16_t kIdx = 0x1234;
constexpr uint32_t kQpn = 0xabcde;
constexpr uint64_t kRaddr = 0x1122334455667788ull;
constexpr uint32_t kRkey = 0xa1b2c3d4u;
constexpr uint64_t kLaddr = 0xcafebabe00c0ffeeull;
constexpr uint32_t kLkey = 0x0f1e2d3cu;
constexpr uint32_t kBytes = 0x00012345u;
constexpr uint32_t kImm = 0xdeadbeefu;
constexpr uint64_t kAdd64 = 0x0a0b0c0d0e0f1011ull;
constexpr uint32_t kAdd32 = 0x07654321u;
constexpr uint8_t kInline8[8] = {0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};

// Fields of the ctrl, raddr and data segments decoded through the mlx5dv
// structs and be*toh, independently of our accessors.
struct CtrlFields {
  uint8_t opmod, opcode, signature, fm_ce_se, ds;
  uint16_t idx, dci_stream;
  uint32_t qpn, imm_be;
};
CtrlFields decodeCtrl(const uint8_t* wqe) {
  mlx5_wqe_ctrl_seg c;
  std::memcpy(&c, wqe, sizeof(c));
  const uint32_t w0 = be32toh(c.opmod_idx_opcode);
  const uint32_t w1 = be32toh(c.qpn_ds);
  return CtrlFields{static_cast<uint8_t>(w0 >> 24),
                    static_cast<uint8_t>(w0 & 0xff),
                    c.signature,
                    c.fm_ce_se,
                    static_cast<uint8_t>(w1 & 0x3f),
                    static_cast<uint16_t>((w0 >> 8) & 0xffff),
                    be16toh(c.dci_stream_channel_id),
                    w1 >> 8,
                    c.imm};
}

void expectCtrl(const uint8_t* wqe, uint8_t opmod, uint8_t opcode, uint8_t ds, uint8_t flags,
                uint32_t imm_host) {
  const CtrlFields c = decodeCtrl(wqe);
  EXPECT_EQ(c.opmod, opmod);
  EXPECT_EQ(c.opcode, opcode);
  EXPECT_EQ(c.idx, kIdx);
  EXPECT_EQ(c.qpn, kQpn);
  EXPECT_EQ(c.ds, ds);
  EXPECT_EQ(c.signature, 0);
  EXPECT_EQ(c.dci_stream, 0);
  EXPECT_EQ(c.fm_ce_se, flags);
  EXPECT_EQ(be32toh(c.imm_be), imm_host);
}

void expectRaddr(const uint8_t* wqe) {
  mlx5_wqe_raddr_seg r;
  std::memcpy(&r, wqe + 16, sizeof(r));
  EXPECT_EQ(be64toh(r.raddr), kRaddr);
  EXPECT_EQ(be32toh(r.rkey), kRkey);
  EXPECT_EQ(r.reserved, 0u);
}

void expectData(const uint8_t* wqe, size_t offset, uint32_t bytes) {
  mlx5_wqe_data_seg d;
  std::memcpy(&d, wqe + offset, sizeof(d));
  EXPECT_EQ(be32toh(d.byte_count), bytes);
  EXPECT_EQ(be32toh(d.lkey), kLkey);
  EXPECT_EQ(be64toh(d.addr), kLaddr);
}

void expectZero(const uint8_t* wqe, size_t from, size_t to) {
  for (size_t i = from; i < to; ++i) EXPECT_EQ(wqe[i], 0) << "byte " << i;
}

// ---- layout: sizeof, offsetof and width of every field ------------------------------------

TEST(Mlx5PrmLayout, CtrlSegMatchesMlx5WqeCtrlSeg) {
  EXPECT_EQ(sizeof(WqeCtrlSeg), sizeof(mlx5_wqe_ctrl_seg));
  EXPECT_EQ(sizeof(WqeCtrlSeg), 16u);
  EXPECT_FIELD_AT(WqeCtrlSeg, opmod_idx_opcode_be, mlx5_wqe_ctrl_seg, opmod_idx_opcode, 0);
  EXPECT_FIELD_AT(WqeCtrlSeg, qpn_ds_be, mlx5_wqe_ctrl_seg, qpn_ds, 4);
  EXPECT_FIELD_AT(WqeCtrlSeg, signature, mlx5_wqe_ctrl_seg, signature, 8);
  EXPECT_FIELD_AT(WqeCtrlSeg, dci_stream_channel_id_be, mlx5_wqe_ctrl_seg, dci_stream_channel_id,
                  9);
  EXPECT_FIELD_AT(WqeCtrlSeg, fm_ce_se, mlx5_wqe_ctrl_seg, fm_ce_se, 11);
  EXPECT_FIELD_AT(WqeCtrlSeg, imm_be, mlx5_wqe_ctrl_seg, imm, 12);
}

TEST(Mlx5PrmLayout, RaddrSegMatchesMlx5WqeRaddrSeg) {
  EXPECT_EQ(sizeof(WqeRaddrSeg), sizeof(mlx5_wqe_raddr_seg));
  EXPECT_EQ(sizeof(WqeRaddrSeg), 16u);
  EXPECT_FIELD_AT(WqeRaddrSeg, raddr_be, mlx5_wqe_raddr_seg, raddr, 0);
  EXPECT_FIELD_AT(WqeRaddrSeg, rkey_be, mlx5_wqe_raddr_seg, rkey, 8);
  EXPECT_FIELD_AT(WqeRaddrSeg, reserved, mlx5_wqe_raddr_seg, reserved, 12);
}

TEST(Mlx5PrmLayout, DataSegMatchesMlx5WqeDataSeg) {
  EXPECT_EQ(sizeof(WqeDataSeg), sizeof(mlx5_wqe_data_seg));
  EXPECT_EQ(sizeof(WqeDataSeg), 16u);
  EXPECT_FIELD_AT(WqeDataSeg, byte_count_be, mlx5_wqe_data_seg, byte_count, 0);
  EXPECT_FIELD_AT(WqeDataSeg, lkey_be, mlx5_wqe_data_seg, lkey, 4);
  EXPECT_FIELD_AT(WqeDataSeg, addr_be, mlx5_wqe_data_seg, addr, 8);
}

TEST(Mlx5PrmLayout, AtomicSegMatchesMlx5WqeAtomicSeg) {
  EXPECT_EQ(sizeof(WqeAtomicSeg), sizeof(mlx5_wqe_atomic_seg));
  EXPECT_EQ(sizeof(WqeAtomicSeg), 16u);
  EXPECT_FIELD_AT(WqeAtomicSeg, swap_add_be, mlx5_wqe_atomic_seg, swap_add, 0);
  EXPECT_FIELD_AT(WqeAtomicSeg, compare_be, mlx5_wqe_atomic_seg, compare, 8);
}

TEST(Mlx5PrmLayout, MaskedFa32SegFollowsPrmFourByteForm) {
  // mlx5dv.h has no struct for it. PRM, extended atomic, 4-byte operand
  // masked fetch-add: add_data (be32) at 0, field_boundary (be32) at 4, then
  // 8 reserved bytes; it takes the atomic segment's 16-byte slot.
  EXPECT_EQ(sizeof(WqeMaskedFa32Seg), sizeof(mlx5_wqe_atomic_seg));
  EXPECT_EQ(offsetof(WqeMaskedFa32Seg, add_be), 0u);
  EXPECT_EQ(sizeof(WqeMaskedFa32Seg::add_be), 4u);
  EXPECT_EQ(offsetof(WqeMaskedFa32Seg, field_boundary_be), 4u);
  EXPECT_EQ(sizeof(WqeMaskedFa32Seg::field_boundary_be), 4u);
  EXPECT_EQ(offsetof(WqeMaskedFa32Seg, reserved), 8u);
  EXPECT_EQ(sizeof(WqeMaskedFa32Seg::reserved), 8u);
}

TEST(Mlx5PrmLayout, InlineSegMatchesMlx5WqeInlDataSeg) {
  EXPECT_EQ(sizeof(WqeInlineSeg), sizeof(mlx5_wqe_inl_data_seg));
  EXPECT_EQ(sizeof(WqeInlineSeg), 4u);
  EXPECT_FIELD_AT(WqeInlineSeg, byte_count_be, mlx5_wqe_inl_data_seg, byte_count, 0);
}

TEST(Mlx5PrmLayout, Wqe64IsOneSendBasicBlock) {
  EXPECT_EQ(sizeof(Wqe64), static_cast<size_t>(MLX5_SEND_WQE_BB));
  // The poster stores it with four 16-byte stores.
  EXPECT_GE(alignof(Wqe64), 16u);
}

TEST(Mlx5PrmLayout, Cqe64MatchesMlx5Cqe64) {
  EXPECT_EQ(sizeof(Cqe64), sizeof(mlx5_cqe64));
  EXPECT_EQ(sizeof(Cqe64), 64u);
  EXPECT_FIELD_AT(Cqe64, srqn_uidx_be, mlx5_cqe64, srqn_uidx, 32);
  EXPECT_FIELD_AT(Cqe64, imm_inval_pkey_be, mlx5_cqe64, imm_inval_pkey, 36);
  EXPECT_EQ(offsetof(Cqe64, reserved1), offsetof(mlx5_cqe64, app));
  EXPECT_FIELD_AT(Cqe64, byte_cnt_be, mlx5_cqe64, byte_cnt, 44);
  EXPECT_FIELD_AT(Cqe64, timestamp_be, mlx5_cqe64, timestamp, 48);
  EXPECT_FIELD_AT(Cqe64, sop_drop_qpn_be, mlx5_cqe64, sop_drop_qpn, 56);
  EXPECT_FIELD_AT(Cqe64, wqe_counter_be, mlx5_cqe64, wqe_counter, 60);
  EXPECT_FIELD_AT(Cqe64, signature, mlx5_cqe64, signature, 62);
  EXPECT_FIELD_AT(Cqe64, op_own, mlx5_cqe64, op_own, 63);
}

TEST(Mlx5PrmLayout, ErrorCqeBytesMatchMlx5ErrCqe) {
  EXPECT_EQ(sizeof(mlx5_err_cqe), sizeof(Cqe64));
  EXPECT_EQ(static_cast<size_t>(kCqeVendorSyndromeByte), offsetof(mlx5_err_cqe, vendor_err_synd));
  EXPECT_EQ(kCqeVendorSyndromeByte, 54);
  EXPECT_EQ(static_cast<size_t>(kCqeSyndromeByte), offsetof(mlx5_err_cqe, syndrome));
  EXPECT_EQ(kCqeSyndromeByte, 55);
  // The syndrome bytes sit inside the timestamp of a successful CQE.
  EXPECT_GE(static_cast<size_t>(kCqeVendorSyndromeByte), offsetof(Cqe64, timestamp_be));
  EXPECT_LT(static_cast<size_t>(kCqeSyndromeByte),
            offsetof(Cqe64, timestamp_be) + sizeof(Cqe64::timestamp_be));
  EXPECT_EQ(offsetof(Cqe64, srqn_uidx_be), offsetof(mlx5_err_cqe, srqn));
  EXPECT_EQ(offsetof(Cqe64, sop_drop_qpn_be), offsetof(mlx5_err_cqe, s_wqe_opcode_qpn));
  EXPECT_EQ(offsetof(mlx5_err_cqe, s_wqe_opcode_qpn), 56u);
  EXPECT_EQ(offsetof(Cqe64, wqe_counter_be), offsetof(mlx5_err_cqe, wqe_counter));
  EXPECT_EQ(offsetof(Cqe64, signature), offsetof(mlx5_err_cqe, signature));
  EXPECT_EQ(offsetof(Cqe64, op_own), offsetof(mlx5_err_cqe, op_own));
}

// Byte order of each segment field: written through our struct with our
// accessors, read back through the mlx5dv struct with be*toh.
TEST(Mlx5PrmLayout, SegmentFieldsAreBigEndian) {
  WqeCtrlSeg ctrl{};
  ctrl.opmod_idx_opcode_be = ctrl_opmod_idx_opcode(kOpmodExtAtomic32, kIdx, kOpAtomicMaskedFa);
  ctrl.qpn_ds_be = ctrl_qpn_ds(kQpn, 4);
  ctrl.fm_ce_se = kCtrlCqUpdate;
  ctrl.imm_be = be32(kImm);
  mlx5_wqe_ctrl_seg c;
  std::memcpy(&c, &ctrl, sizeof(c));
  EXPECT_EQ(be32toh(c.opmod_idx_opcode), 0x08123415u);
  EXPECT_EQ(be32toh(c.qpn_ds), 0x0abcde04u);
  EXPECT_EQ(c.fm_ce_se, MLX5_WQE_CTRL_CQ_UPDATE);
  EXPECT_EQ(be32toh(c.imm), kImm);

  WqeRaddrSeg raddr{be64(kRaddr), be32(kRkey), 0};
  mlx5_wqe_raddr_seg r;
  std::memcpy(&r, &raddr, sizeof(r));
  EXPECT_EQ(be64toh(r.raddr), kRaddr);
  EXPECT_EQ(be32toh(r.rkey), kRkey);

  WqeDataSeg data{be32(kBytes), be32(kLkey), be64(kLaddr)};
  mlx5_wqe_data_seg d;
  std::memcpy(&d, &data, sizeof(d));
  EXPECT_EQ(be32toh(d.byte_count), kBytes);
  EXPECT_EQ(be32toh(d.lkey), kLkey);
  EXPECT_EQ(be64toh(d.addr), kLaddr);

  WqeAtomicSeg atomic{be64(kAdd64), be64(0x1020304050607080ull)};
  mlx5_wqe_atomic_seg a;
  std::memcpy(&a, &atomic, sizeof(a));
  EXPECT_EQ(be64toh(a.swap_add), kAdd64);
  EXPECT_EQ(be64toh(a.compare), 0x1020304050607080ull);

  WqeInlineSeg inl{be32(kInlineSeg | 28)};
  mlx5_wqe_inl_data_seg i;
  std::memcpy(&i, &inl, sizeof(i));
  EXPECT_EQ(be32toh(i.byte_count), MLX5_INLINE_SEG | 28u);

  WqeMaskedFa32Seg mfa{be32(kAdd32), be32(0x80000000u), 0};
  const auto* m = reinterpret_cast<const uint8_t*>(&mfa);
  const uint8_t expect_mfa[16] = {0x07, 0x65, 0x43, 0x21, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_TRUE(sameBytes(expect_mfa, m, 16));
}

// ---- constants ----------------------------------------------------------------------------

TEST(Mlx5PrmConstants, SendOpcodesMatch) {
  EXPECT_CONST(kOpNop, MLX5_OPCODE_NOP);
  EXPECT_CONST(kOpRdmaWrite, MLX5_OPCODE_RDMA_WRITE);
  EXPECT_CONST(kOpRdmaWriteImm, MLX5_OPCODE_RDMA_WRITE_IMM);
  EXPECT_CONST(kOpRdmaRead, MLX5_OPCODE_RDMA_READ);
  EXPECT_CONST(kOpAtomicFa, MLX5_OPCODE_ATOMIC_FA);
  EXPECT_CONST(kOpAtomicMaskedFa, MLX5_OPCODE_ATOMIC_MASKED_FA);
  // Not in mlx5dv.h. PRM, extended atomics: opmod 0x08 selects 4-byte
  // operands (the value upstream Mooncake and NVSHMEM put in opmod).
  EXPECT_CONST(kOpmodExtAtomic32, 0x08);
}

TEST(Mlx5PrmConstants, CtrlFlagsMatch) {
  EXPECT_CONST(kCtrlCqUpdate, MLX5_WQE_CTRL_CQ_UPDATE);
  EXPECT_CONST(kCtrlSolicited, MLX5_WQE_CTRL_SOLICITED);
  EXPECT_CONST(kCtrlFence, MLX5_WQE_CTRL_FENCE);
  EXPECT_CONST(kCtrlSmallFence, MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE);
}

TEST(Mlx5PrmConstants, SizesAndInlineFlagMatch) {
  EXPECT_CONST(kSendWqeBb, MLX5_SEND_WQE_BB);
  EXPECT_CONST(kInlineSeg, MLX5_INLINE_SEG);
  EXPECT_CONST(kCqeBytes, sizeof(mlx5_cqe64));
  // ds counts 16-byte units, the size of one data segment.
  EXPECT_CONST(kDsBytes, sizeof(mlx5_wqe_data_seg));
  EXPECT_CONST(kMaxInlineBytes, 28);
  EXPECT_CONST(kMaxInlineBytes, MLX5_SEND_WQE_BB - sizeof(mlx5_wqe_ctrl_seg) -
                                    sizeof(mlx5_wqe_raddr_seg) - sizeof(mlx5_wqe_inl_data_seg));
}

TEST(Mlx5PrmConstants, DoorbellRecordIndicesMatch) {
  EXPECT_CONST(kRcvDbr, MLX5_RCV_DBR);
  EXPECT_CONST(kSndDbr, MLX5_SND_DBR);
  // The CQ doorbell record is not in mlx5dv.h: PRM (and rdma-core's
  // providers/mlx5/mlx5.h MLX5_CQ_SET_CI = 0, MLX5_CQ_ARM_DB = 1; cq.c writes
  // cons_index & 0xffffff) put the 24-bit consumer index in word 0, arm in 1.
  EXPECT_CONST(kCqSetCi, 0);
  EXPECT_CONST(kCqArm, 1);
  EXPECT_CONST(kCqCiMask, 0xffffff);
}

TEST(Mlx5PrmConstants, CqeOpcodesMatch) {
  EXPECT_CONST(kCqeReq, MLX5_CQE_REQ);
  EXPECT_CONST(kCqeRespWrImm, MLX5_CQE_RESP_WR_IMM);
  EXPECT_CONST(kCqeReqErr, MLX5_CQE_REQ_ERR);
  EXPECT_CONST(kCqeRespErr, MLX5_CQE_RESP_ERR);
  EXPECT_CONST(kCqeInvalid, MLX5_CQE_INVALID);
  EXPECT_CONST(kCqeOwnerMask, MLX5_CQE_OWNER_MASK);
}

TEST(Mlx5PrmConstants, CqeSyndromesMatch) {
  EXPECT_CONST(kSyndLocalLengthErr, MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
  EXPECT_CONST(kSyndLocalQpOpErr, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
  EXPECT_CONST(kSyndLocalProtErr, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
  EXPECT_CONST(kSyndWrFlushErr, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
  EXPECT_CONST(kSyndBadRespErr, MLX5_CQE_SYNDROME_BAD_RESP_ERR);
  EXPECT_CONST(kSyndLocalAccessErr, MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR);
  EXPECT_CONST(kSyndRemoteInvalReqErr, MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR);
  EXPECT_CONST(kSyndRemoteAccessErr, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
  EXPECT_CONST(kSyndRemoteOpErr, MLX5_CQE_SYNDROME_REMOTE_OP_ERR);
  EXPECT_CONST(kSyndTransportRetryExcErr, MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
  EXPECT_CONST(kSyndRnrRetryExcErr, MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR);
}

// ---- builders against the same WQE composed with mlx5dv ------------------------------------

TEST(Mlx5WqeBuilders, CtrlPackingMatchesMlx5dvSetCtrlSeg) {
  struct Case {
    uint8_t opmod, opcode, ds;
    uint16_t idx;
    uint32_t qpn;
  };
  const Case cases[] = {{0, kOpNop, 1, 0, 0},
                        {0, kOpRdmaWrite, 3, kIdx, kQpn},
                        {kOpmodExtAtomic32, kOpAtomicMaskedFa, 4, 0xffff, 0xffffff},
                        {0, kOpRdmaWriteImm, 0x3f, 0x8001, 0x800001}};
  for (const Case& k : cases) {
    RefWqe ref;
    mlx5dv_set_ctrl_seg(ref.at<mlx5_wqe_ctrl_seg>(0), k.idx, k.opcode, k.opmod, k.qpn, 0, k.ds, 0,
                        0);
    const uint32_t w0 = ctrl_opmod_idx_opcode(k.opmod, k.idx, k.opcode);
    const uint32_t w1 = ctrl_qpn_ds(k.qpn, k.ds);
    EXPECT_TRUE(sameBytes(ref.b, &w0, 4)) << "opmod_idx_opcode, idx " << k.idx;
    EXPECT_TRUE(sameBytes(ref.b + 4, &w1, 4)) << "qpn_ds, qpn " << k.qpn;
  }
}

TEST(Mlx5WqeBuilders, RdmaWriteMatchesMlx5dv) {
  Wqe64 w = staleWqe();
  build_rdma_write(&w, kIdx, kQpn, kCtrlCqUpdate, kRaddr, kRkey, kLaddr, kLkey, kBytes);

  RefWqe ref;
  mlx5dv_set_ctrl_seg(ref.at<mlx5_wqe_ctrl_seg>(0), kIdx, MLX5_OPCODE_RDMA_WRITE, 0, kQpn,
                      MLX5_WQE_CTRL_CQ_UPDATE, 3, 0, 0);
  auto* r = ref.at<mlx5_wqe_raddr_seg>(16);
  r->raddr = htobe64(kRaddr);
  r->rkey = htobe32(kRkey);
  mlx5dv_set_data_seg(ref.at<mlx5_wqe_data_seg>(32), kBytes, kLkey, kLaddr);
  EXPECT_TRUE(sameBytes(ref.b, bytesOf(w), 64));

  const uint8_t* b = bytesOf(w);
  expectCtrl(b, 0, MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
  expectRaddr(b);
  expectData(b, 32, kBytes);
  expectZero(b, 48, 64);
}

TEST(Mlx5WqeBuilders, RdmaWriteImmMatchesMlx5dv) {
  const uint8_t flags = kCtrlCqUpdate | kCtrlSolicited;
  Wqe64 w = staleWqe();
  build_rdma_write_imm(&w, kIdx, kQpn, flags, kRaddr, kRkey, kLaddr, kLkey, kBytes, kImm);

  RefWqe ref;
  // mlx5dv_set_ctrl_seg stores imm as given: for WRITE_WITH_IMM that is the
  // big-endian ibv_send_wr::imm_data.
  mlx5dv_set_ctrl_seg(ref.at<mlx5_wqe_ctrl_seg>(0), kIdx, MLX5_OPCODE_RDMA_WRITE_IMM, 0, kQpn,
                      MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_SOLICITED, 3, 0, htobe32(kImm));
  auto* r = ref.at<mlx5_wqe_raddr_seg>(16);
  r->raddr = htobe64(kRaddr);
  r->rkey = htobe32(kRkey);
  mlx5dv_set_data_seg(ref.at<mlx5_wqe_data_seg>(32), kBytes, kLkey, kLaddr);
  EXPECT_TRUE(sameBytes(ref.b, bytesOf(w), 64));

  const uint8_t* b = bytesOf(w);
  expectCtrl(b, 0, MLX5_OPCODE_RDMA_WRITE_IMM, 3, flags, kImm);
  expectRaddr(b);
  expectData(b, 32, kBytes);
  expectZero(b, 48, 64);
}

TEST(Mlx5WqeBuilders, RdmaWriteInlineMatchesMlx5dv) {
  struct Case {
    uint32_t bytes;
    uint8_t ds;  // 2 + ceil((4 + bytes) / 16), worked out by hand
  };
  const Case cases[] = {{1, 3}, {8, 3}, {12, 3}, {13, 4}, {28, 4}};
  uint8_t src[kMaxInlineBytes];
  for (uint32_t i = 0; i < kMaxInlineBytes; ++i) src[i] = static_cast<uint8_t>(0xc0 + i);

  for (const Case& k : cases) {
    SCOPED_TRACE(::testing::Message() << "inline bytes " << k.bytes);
    EXPECT_EQ(k.ds, 2 + (4 + k.bytes + 15) / 16);
    Wqe64 w = staleWqe();
    build_rdma_write_inline(&w, kIdx, kQpn, kCtrlCqUpdate, kRaddr, kRkey, src, k.bytes);

    RefWqe ref;
    mlx5dv_set_ctrl_seg(ref.at<mlx5_wqe_ctrl_seg>(0), kIdx, MLX5_OPCODE_RDMA_WRITE, 0, kQpn,
                        MLX5_WQE_CTRL_CQ_UPDATE, k.ds, 0, 0);
    auto* r = ref.at<mlx5_wqe_raddr_seg>(16);
    r->raddr = htobe64(kRaddr);
    r->rkey = htobe32(kRkey);
    ref.at<mlx5_wqe_inl_data_seg>(32)->byte_count = htobe32(k.bytes | MLX5_INLINE_SEG);
    std::memcpy(ref.b + 32 + sizeof(mlx5_wqe_inl_data_seg), src, k.bytes);
    EXPECT_TRUE(sameBytes(ref.b, bytesOf(w), 64));

    const uint8_t* b = bytesOf(w);
    expectCtrl(b, 0, MLX5_OPCODE_RDMA_WRITE, k.ds, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    expectRaddr(b);
    mlx5_wqe_inl_data_seg inl;
    std::memcpy(&inl, b + 32, sizeof(inl));
    EXPECT_EQ(be32toh(inl.byte_count), MLX5_INLINE_SEG | k.bytes);
    // The payload starts right after the 4-byte header, at byte 36.
    EXPECT_TRUE(sameBytes(src, b + 36, k.bytes));
    expectZero(b, 36 + k.bytes, 64);
    // ds covers the payload and stays inside one basic block.
    EXPECT_GE(k.ds * kDsBytes, 36 + k.bytes);
    EXPECT_LE(k.ds * kDsBytes, kSendWqeBb);
  }
}

TEST(Mlx5WqeBuilders, MaxInlineFillsTheBlockExactly) {
  EXPECT_EQ(kMaxInlineBytes, 28u);
  uint8_t src[kMaxInlineBytes];
  std::memset(src, 0x5a, sizeof(src));
  Wqe64 w = staleWqe();
  build_rdma_write_inline(&w, kIdx, kQpn, kCtrlCqUpdate, kRaddr, kRkey, src, kMaxInlineBytes);
  EXPECT_EQ(decodeCtrl(bytesOf(w)).ds, 4);
  EXPECT_EQ(36 + kMaxInlineBytes, kSendWqeBb);
  EXPECT_TRUE(sameBytes(src, bytesOf(w) + 36, kMaxInlineBytes));
}

TEST(Mlx5WqeBuilders, AtomicFa64MatchesMlx5dv) {
  const uint8_t flags = kCtrlCqUpdate | kCtrlFence;
  Wqe64 w = staleWqe();
  build_atomic_fa64(&w, kIdx, kQpn, flags, kRaddr, kRkey, kAdd64, kLaddr, kLkey);

  RefWqe ref;
  mlx5dv_set_ctrl_seg(ref.at<mlx5_wqe_ctrl_seg>(0), kIdx, MLX5_OPCODE_ATOMIC_FA, 0, kQpn,
                      MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_FENCE, 4, 0, 0);
  auto* r = ref.at<mlx5_wqe_raddr_seg>(16);
  r->raddr = htobe64(kRaddr);
  r->rkey = htobe32(kRkey);
  auto* a = ref.at<mlx5_wqe_atomic_seg>(32);
  a->swap_add = htobe64(kAdd64);
  a->compare = 0;
  mlx5dv_set_data_seg(ref.at<mlx5_wqe_data_seg>(48), 8, kLkey, kLaddr);
  EXPECT_TRUE(sameBytes(ref.b, bytesOf(w), 64));

  const uint8_t* b = bytesOf(w);
  expectCtrl(b, 0, MLX5_OPCODE_ATOMIC_FA, 4, flags, 0);
  expectRaddr(b);
  mlx5_wqe_atomic_seg got;
  std::memcpy(&got, b + 32, sizeof(got));
  EXPECT_EQ(be64toh(got.swap_add), kAdd64);
  EXPECT_EQ(got.compare, 0u);
  expectData(b, 48, 8);
}

TEST(Mlx5WqeBuilders, MaskedFa32MatchesPrm) {
  const uint8_t flags = kCtrlCqUpdate | kCtrlFence;
  Wqe64 w = staleWqe();
  build_masked_fa32(&w, kIdx, kQpn, flags, kRaddr, kRkey, kAdd32, kLaddr, kLkey);

  RefWqe ref;
  // PRM extended atomic, opmod 0x08 = 4-byte operands.
  mlx5dv_set_ctrl_seg(ref.at<mlx5_wqe_ctrl_seg>(0), kIdx, MLX5_OPCODE_ATOMIC_MASKED_FA, 0x08, kQpn,
                      MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_FENCE, 4, 0, 0);
  auto* r = ref.at<mlx5_wqe_raddr_seg>(16);
  r->raddr = htobe64(kRaddr);
  r->rkey = htobe32(kRkey);
  // PRM 4-byte masked fetch-add operand: add_data (be32), field_boundary
  // (be32, 0 = one 32-bit field), 8 reserved bytes.
  const uint32_t add_be = htobe32(kAdd32);
  const uint32_t boundary_be = htobe32(0);
  std::memcpy(ref.b + 32, &add_be, 4);
  std::memcpy(ref.b + 36, &boundary_be, 4);
  mlx5dv_set_data_seg(ref.at<mlx5_wqe_data_seg>(48), 4, kLkey, kLaddr);
  EXPECT_TRUE(sameBytes(ref.b, bytesOf(w), 64));

  const uint8_t* b = bytesOf(w);
  expectCtrl(b, 0x08, MLX5_OPCODE_ATOMIC_MASKED_FA, 4, flags, 0);
  expectRaddr(b);
  uint32_t got_add, got_boundary;
  std::memcpy(&got_add, b + 32, 4);
  std::memcpy(&got_boundary, b + 36, 4);
  EXPECT_EQ(be32toh(got_add), kAdd32);
  EXPECT_EQ(be32toh(got_boundary), 0u);
  expectZero(b, 40, 48);
  expectData(b, 48, 4);
}

TEST(Mlx5WqeBuilders, NopMatchesMlx5dv) {
  Wqe64 w = staleWqe();
  build_nop(&w, kIdx, kQpn, kCtrlCqUpdate);
  RefWqe ref;
  mlx5dv_set_ctrl_seg(ref.at<mlx5_wqe_ctrl_seg>(0), kIdx, MLX5_OPCODE_NOP, 0, kQpn,
                      MLX5_WQE_CTRL_CQ_UPDATE, 1, 0, 0);
  EXPECT_TRUE(sameBytes(ref.b, bytesOf(w), 64));
  expectCtrl(bytesOf(w), 0, MLX5_OPCODE_NOP, 1, MLX5_WQE_CTRL_CQ_UPDATE, 0);
  expectZero(bytesOf(w), 16, 64);
}

TEST(Mlx5WqeBuilders, FlagsLandInFmCeSeOnly) {
  const uint8_t cases[] = {
      0,
      MLX5_WQE_CTRL_CQ_UPDATE,
      MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_FENCE,
      MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_SOLICITED | MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE,
      0xff,
  };
  for (uint8_t flags : cases) {
    Wqe64 w = staleWqe();
    build_nop(&w, kIdx, kQpn, flags);
    const CtrlFields c = decodeCtrl(bytesOf(w));
    EXPECT_EQ(c.fm_ce_se, flags);
    EXPECT_EQ(c.signature, 0);
    EXPECT_EQ(c.dci_stream, 0);
    EXPECT_EQ(c.opcode, MLX5_OPCODE_NOP);
    EXPECT_EQ(c.qpn, kQpn);
    EXPECT_EQ(c.ds, 1);
  }
}

// ---- golden images -------------------------------------------------------------------------
// Written out by hand from the PRM segment layouts (ctrl | raddr | data or
// inline or atomic+data), with the inputs above: idx 0x1234, qpn 0x0abcde,
// raddr 0x1122334455667788, rkey 0xa1b2c3d4, lkey 0x0f1e2d3c,
// laddr 0xcafebabe00c0ffee, bytes 0x12345, imm 0xdeadbeef.

constexpr uint8_t kGoldenWrite[] = {
    // ctrl: opmod 00 | idx 1234 | opcode 08; qpn 0abcde | ds 3; sig, dci(2), fm_ce_se 08; imm
    0x00, 0x12, 0x34, 0x08, 0x0a, 0xbc, 0xde, 0x03, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00,
    // raddr seg: raddr, rkey, reserved
    0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xa1, 0xb2, 0xc3, 0xd4, 0x00, 0x00, 0x00, 0x00,
    // data seg: byte_count, lkey, addr
    0x00, 0x01, 0x23, 0x45, 0x0f, 0x1e, 0x2d, 0x3c, 0xca, 0xfe, 0xba, 0xbe, 0x00, 0xc0, 0xff, 0xee,
    // unused
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};

constexpr uint8_t kGoldenWriteImm[] = {
    // ctrl: opcode 09; fm_ce_se 0a (CQ_UPDATE | SOLICITED); imm deadbeef as sent
    0x00, 0x12, 0x34, 0x09, 0x0a, 0xbc, 0xde, 0x03, 0x00, 0x00, 0x00, 0x0a, 0xde, 0xad, 0xbe, 0xef,
    0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xa1, 0xb2, 0xc3, 0xd4, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x01, 0x23, 0x45, 0x0f, 0x1e, 0x2d, 0x3c, 0xca, 0xfe, 0xba, 0xbe, 0x00, 0xc0, 0xff, 0xee,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};

constexpr uint8_t kGoldenInline8[] = {
    // ctrl: opcode 08; ds 3 = 2 + ceil((4 + 8) / 16); fm_ce_se 08
    0x00, 0x12, 0x34, 0x08, 0x0a, 0xbc, 0xde, 0x03, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00,
    0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xa1, 0xb2, 0xc3, 0xd4, 0x00, 0x00, 0x00, 0x00,
    // inline header: INLINE_SEG | 8, then the 8 payload bytes from byte 36
    0x80, 0x00, 0x00, 0x08, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};

constexpr uint8_t kGoldenFa64[] = {
    // ctrl: opcode 12; ds 4; fm_ce_se 88 (FENCE | CQ_UPDATE)
    0x00, 0x12, 0x34, 0x12, 0x0a, 0xbc, 0xde, 0x04, 0x00, 0x00, 0x00, 0x88, 0x00, 0x00, 0x00, 0x00,
    0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xa1, 0xb2, 0xc3, 0xd4, 0x00, 0x00, 0x00, 0x00,
    // atomic seg: swap_add 0a0b0c0d0e0f1011, compare 0
    0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    // data seg: 8 bytes fetched into laddr
    0x00, 0x00, 0x00, 0x08, 0x0f, 0x1e, 0x2d, 0x3c, 0xca, 0xfe, 0xba, 0xbe, 0x00, 0xc0, 0xff, 0xee};

constexpr uint8_t kGoldenMaskedFa32[] = {
    // ctrl: opmod 08 (4-byte extended atomic) | idx | opcode 15; ds 4; fm_ce_se 88
    0x08, 0x12, 0x34, 0x15, 0x0a, 0xbc, 0xde, 0x04, 0x00, 0x00, 0x00, 0x88, 0x00, 0x00, 0x00, 0x00,
    0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xa1, 0xb2, 0xc3, 0xd4, 0x00, 0x00, 0x00, 0x00,
    // PRM 4-byte masked FA operand: add_data 07654321, field_boundary 0, 8 reserved
    0x07, 0x65, 0x43, 0x21, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    // data seg: 4 bytes fetched into laddr
    0x00, 0x00, 0x00, 0x04, 0x0f, 0x1e, 0x2d, 0x3c, 0xca, 0xfe, 0xba, 0xbe, 0x00, 0xc0, 0xff, 0xee};

constexpr uint8_t kGoldenNop[] = {
    // ctrl: opcode 00; ds 1; fm_ce_se 08; nothing else
    0x00, 0x12, 0x34, 0x00, 0x0a, 0xbc, 0xde, 0x01, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};

static_assert(sizeof(kGoldenWrite) == 64 && sizeof(kGoldenWriteImm) == 64 &&
                  sizeof(kGoldenInline8) == 64 && sizeof(kGoldenFa64) == 64 &&
                  sizeof(kGoldenMaskedFa32) == 64 && sizeof(kGoldenNop) == 64,
              "each golden image is one 64-byte basic block");

TEST(Mlx5WqeGolden, RdmaWrite) {
  Wqe64 w = staleWqe();
  build_rdma_write(&w, kIdx, kQpn, kCtrlCqUpdate, kRaddr, kRkey, kLaddr, kLkey, kBytes);
  EXPECT_TRUE(sameBytes(kGoldenWrite, bytesOf(w), 64));
}

TEST(Mlx5WqeGolden, RdmaWriteImm) {
  Wqe64 w = staleWqe();
  build_rdma_write_imm(&w, kIdx, kQpn, kCtrlCqUpdate | kCtrlSolicited, kRaddr, kRkey, kLaddr, kLkey,
                       kBytes, kImm);
  EXPECT_TRUE(sameBytes(kGoldenWriteImm, bytesOf(w), 64));
}

TEST(Mlx5WqeGolden, RdmaWriteInline8) {
  Wqe64 w = staleWqe();
  build_rdma_write_inline(&w, kIdx, kQpn, kCtrlCqUpdate, kRaddr, kRkey, kInline8, sizeof(kInline8));
  EXPECT_TRUE(sameBytes(kGoldenInline8, bytesOf(w), 64));
}

TEST(Mlx5WqeGolden, AtomicFa64) {
  Wqe64 w = staleWqe();
  build_atomic_fa64(&w, kIdx, kQpn, kCtrlCqUpdate | kCtrlFence, kRaddr, kRkey, kAdd64, kLaddr,
                    kLkey);
  EXPECT_TRUE(sameBytes(kGoldenFa64, bytesOf(w), 64));
}

TEST(Mlx5WqeGolden, MaskedFa32) {
  Wqe64 w = staleWqe();
  build_masked_fa32(&w, kIdx, kQpn, kCtrlCqUpdate | kCtrlFence, kRaddr, kRkey, kAdd32, kLaddr,
                    kLkey);
  EXPECT_TRUE(sameBytes(kGoldenMaskedFa32, bytesOf(w), 64));
}

TEST(Mlx5WqeGolden, Nop) {
  Wqe64 w = staleWqe();
  build_nop(&w, kIdx, kQpn, kCtrlCqUpdate);
  EXPECT_TRUE(sameBytes(kGoldenNop, bytesOf(w), 64));
}

// ---- CQE -----------------------------------------------------------------------------------

TEST(Mlx5Cqe, OpcodeAndOwnerMatchMlx5dvForEveryOpOwn) {
  for (int v = 0; v < 256; ++v) {
    mlx5_cqe64 cqe;
    std::memset(&cqe, 0, sizeof(cqe));
    cqe.op_own = static_cast<uint8_t>(v);
    EXPECT_EQ(cqe_opcode(cqe.op_own), mlx5dv_get_cqe_opcode(&cqe)) << "op_own " << v;
    EXPECT_EQ(cqe_owner(cqe.op_own), mlx5dv_get_cqe_owner(&cqe)) << "op_own " << v;
  }
  EXPECT_EQ(cqe_opcode(0x00), MLX5_CQE_REQ);
  EXPECT_EQ(cqe_owner(0x00), 0);
  EXPECT_EQ(cqe_opcode(0x01), MLX5_CQE_REQ);
  EXPECT_EQ(cqe_owner(0x01), 1);
  EXPECT_EQ(cqe_opcode(0x10), MLX5_CQE_RESP_WR_IMM);
  EXPECT_EQ(cqe_opcode(0xd0), MLX5_CQE_REQ_ERR);
  EXPECT_EQ(cqe_owner(0xd0), 0);
  EXPECT_EQ(cqe_opcode(0xe1), MLX5_CQE_RESP_ERR);
  EXPECT_EQ(cqe_owner(0xe1), 1);
  // Bits [3:1] (solicited/format/...) do not leak into either.
  EXPECT_EQ(cqe_opcode(0x0e), MLX5_CQE_REQ);
  EXPECT_EQ(cqe_owner(0x0e), 0);
}

TEST(Mlx5Cqe, ExpectedOwnerFlipsEveryRingPassStartingAtZero) {
  for (uint32_t n : {1u, 2u, 8u, 64u, 1024u}) {
    for (uint64_t ci = 0; ci < 4ull * n; ++ci) {
      const uint8_t pass_parity = static_cast<uint8_t>((ci / n) % 2);
      EXPECT_EQ(cqe_expected_owner(ci, n), pass_parity) << "ci " << ci << " n " << n;
    }
    EXPECT_EQ(cqe_expected_owner(0, n), 0);
    EXPECT_EQ(cqe_expected_owner(n - 1, n), 0);
    EXPECT_EQ(cqe_expected_owner(n, n), 1);
    EXPECT_EQ(cqe_expected_owner(2 * n - 1, n), 1);
    EXPECT_EQ(cqe_expected_owner(2 * n, n), 0);
  }
  // A 64-bit consumer index past 2^32 keeps the parity of its pass.
  EXPECT_EQ(cqe_expected_owner((1ull << 32) + 1024, 1024), 1);
  EXPECT_EQ(cqe_expected_owner(1ull << 32, 1024), 0);
}

TEST(Mlx5Cqe, FreshRingReadsInvalidOwnerOne) {
  constexpr uint32_t kEntries = 16;
  std::vector<Cqe64> ring(kEntries);
  std::memset(ring.data(), 0xff, ring.size() * sizeof(Cqe64));
  for (uint32_t i = 0; i < kEntries; ++i) {
    EXPECT_EQ(cqe_opcode(ring[i].op_own), MLX5_CQE_INVALID);
    EXPECT_EQ(cqe_opcode(ring[i].op_own), kCqeInvalid);
    EXPECT_EQ(cqe_owner(ring[i].op_own), 1);
    // First pass expects owner 0: nothing reads as valid until written.
    EXPECT_NE(cqe_owner(ring[i].op_own), cqe_expected_owner(i, kEntries));
  }
  mlx5_cqe64 theirs;
  std::memset(&theirs, 0xff, sizeof(theirs));
  EXPECT_EQ(mlx5dv_get_cqe_opcode(&theirs), MLX5_CQE_INVALID);
  EXPECT_EQ(mlx5dv_get_cqe_owner(&theirs), 1);
}

// A CQE as the NIC writes it (filled through mlx5_cqe64 with htobe*), read
// through our Cqe64 and accessors.
TEST(Mlx5Cqe, FieldsDecodeLikeMlx5dv) {
  mlx5_cqe64 nic;
  std::memset(&nic, 0, sizeof(nic));
  nic.srqn_uidx = htobe32(0x00123456u);
  nic.imm_inval_pkey = htobe32(kImm);
  nic.byte_cnt = htobe32(kBytes);
  nic.timestamp = htobe64(0x0102030405060708ull);
  nic.sop_drop_qpn = htobe32((uint32_t{MLX5_OPCODE_RDMA_WRITE} << 24) | kQpn);
  nic.wqe_counter = htobe16(kIdx);
  nic.signature = 0x5c;
  nic.op_own = (MLX5_CQE_REQ << 4) | 1;

  Cqe64 ours;
  std::memcpy(&ours, &nic, sizeof(ours));
  EXPECT_EQ(be32(ours.srqn_uidx_be), 0x00123456u);
  EXPECT_EQ(be32(ours.imm_inval_pkey_be), kImm);
  EXPECT_EQ(be32(ours.byte_cnt_be), kBytes);
  EXPECT_EQ(be64(ours.timestamp_be), 0x0102030405060708ull);
  EXPECT_EQ(be32(ours.sop_drop_qpn_be) >> 24, MLX5_OPCODE_RDMA_WRITE);
  EXPECT_EQ(be32(ours.sop_drop_qpn_be) & 0xffffffu, kQpn);
  EXPECT_EQ(be16(ours.wqe_counter_be), kIdx);
  EXPECT_EQ(ours.signature, 0x5c);
  EXPECT_EQ(cqe_opcode(ours.op_own), kCqeReq);
  EXPECT_EQ(cqe_owner(ours.op_own), 1);
}

TEST(Mlx5Cqe, ErrorCqeSyndromeBytesDecodeLikeMlx5ErrCqe) {
  mlx5_err_cqe nic;
  std::memset(&nic, 0, sizeof(nic));
  nic.vendor_err_synd = 0x88;
  nic.syndrome = MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR;
  nic.s_wqe_opcode_qpn = htobe32((uint32_t{MLX5_OPCODE_ATOMIC_MASKED_FA} << 24) | kQpn);
  nic.wqe_counter = htobe16(kIdx);
  nic.op_own = (MLX5_CQE_REQ_ERR << 4) | 0;

  Cqe64 ours;
  std::memcpy(&ours, &nic, sizeof(ours));
  const auto* b = reinterpret_cast<const uint8_t*>(&ours);
  EXPECT_EQ(b[kCqeSyndromeByte], kSyndRemoteAccessErr);
  EXPECT_EQ(b[kCqeVendorSyndromeByte], 0x88);
  EXPECT_EQ(cqe_opcode(ours.op_own), kCqeReqErr);
  EXPECT_EQ(cqe_owner(ours.op_own), 0);
  EXPECT_EQ(be32(ours.sop_drop_qpn_be) >> 24, kOpAtomicMaskedFa);
  EXPECT_EQ(be32(ours.sop_drop_qpn_be) & 0xffffffu, kQpn);
  EXPECT_EQ(be16(ours.wqe_counter_be), kIdx);
}

// ---- byte order ----------------------------------------------------------------------------

TEST(Mlx5ByteOrder, MatchesHtobe) {
  const uint64_t fixed[] = {0,
                            1,
                            0x80,
                            0xff,
                            0x1234,
                            0x8000,
                            0xffff,
                            0x12345678,
                            0x80000000,
                            0xffffffff,
                            0x0102030405060708ull,
                            0x8000000000000000ull,
                            0xffffffffffffffffull,
                            kRaddr,
                            kLaddr};
  std::vector<uint64_t> values(std::begin(fixed), std::end(fixed));
  uint64_t x = 0x9e3779b97f4a7c15ull;  // a fixed xorshift sweep: deterministic
  for (int i = 0; i < 4096; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    values.push_back(x);
  }
  for (uint64_t v : values) {
    const auto v16 = static_cast<uint16_t>(v);
    const auto v32 = static_cast<uint32_t>(v);
    EXPECT_EQ(be16(v16), htobe16(v16)) << std::hex << v16;
    EXPECT_EQ(be32(v32), htobe32(v32)) << std::hex << v32;
    EXPECT_EQ(be64(v), htobe64(v)) << std::hex << v;
    EXPECT_EQ(be16(be16(v16)), v16);
    EXPECT_EQ(be32(be32(v32)), v32);
    EXPECT_EQ(be64(be64(v)), v);
  }
  // Memory image: the most significant byte first.
  const uint32_t w = be32(0x11223344u);
  const uint8_t expect[4] = {0x11, 0x22, 0x33, 0x44};
  EXPECT_TRUE(sameBytes(expect, &w, 4));
}

}  // namespace
}  // namespace mooncake::device::mlx5
