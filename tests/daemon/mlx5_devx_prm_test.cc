// Conformance of the mlx5 DevX command layouts (daemon/rdma/mlx5/) with the
// PRM, with no NIC: every field of our tables against an independent table,
// the bit writer against literal bytes and a bit-at-a-time reference, one
// golden byte image per command, the builders' parameter checks, and the
// parsing of command outputs.
//
// Where the facts come from (read, not copied; the expectations below are
// written out by hand in the form the kernel's MLX5_SET uses: the byte
// offset of the big-endian dword holding the field, the field's shift above
// that dword's least significant bit, and its width):
//   [K]  Linux include/linux/mlx5/mlx5_ifc.h: structs mlx5_ifc_cqc_bits,
//        create_cq_in/out_bits, destroy_cq_in_bits, and the 2021 change of
//        cqc c_eqn (8 bits at 0xb8) into c_eqn_or_apu_element (32 at 0xa0);
//        include/linux/mlx5/qp.h (MLX5_ZERO_LEN_RQ), driver.h
//        (MLX5_ATOMIC_MODE_*), drivers/infiniband/hw/mlx5/qp.c
//        mlx5_set_path (RoCE: eth_prio and dscp; IB: rlid, grh, sl) and
//        devx.c (DevX supported iff log_max_uctx != 0; uid stamped by the
//        kernel).
//   [R]  rdma-core providers/mlx5/mlx5_ifc.h: mlx5_ifc_ads_bits, qpc_bits,
//        create_qp_in/out_bits, destroy_qp_in_bits, rst2init/init2rtr/
//        rtr2rts_qp_in/out_bits, cmd_hca_cap_bits, query_hca_cap_in/out_bits,
//        the MLX5_CMD_OP_* opcodes and MLX5_CMD_STAT_* statuses.
//   [RT] rdma-core tests/mlx5_prm_structs.py: SwCqc (dbr_umem_id at 0x20),
//        CreateCqIn (cq_umem_* fields), CreateQpIn (wq_umem_offset at 0x800),
//        CmdHcaCap (log_max_uctx, log_max_umem), DevxOps (st, pm_state).
// The two rdma-core sources and the kernel agree on every offset used here.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "rdma/mlx5/devx_commands.h"
#include "rdma/mlx5/devx_ifc.h"
#include "rdma/mlx5/devx_layout.h"

namespace mooncake::daemon::mlx5 {
namespace {

// ---- helpers ------------------------------------------------------------------------------------

// One expected PRM field: byte offset of its dword, shift of its least
// significant bit inside that dword, width. Fields wider than 32 bits (and
// whole contexts) start on a dword boundary: shift 0, byte = first byte.
struct Expected {
  const char* name;
  Field ours;
  uint32_t dword_byte;
  uint32_t shift;
  uint32_t width;
};

uint32_t ExpectedBit(const Expected& e) {
  if (e.width > 32) return e.dword_byte * 8;
  return e.dword_byte * 8 + (32 - e.shift - e.width);
}

void ExpectTable(const char* table, const std::vector<Expected>& rows) {
  for (const Expected& e : rows) {
    EXPECT_EQ(e.ours.bit_offset, ExpectedBit(e)) << table << "." << e.name << " bit offset";
    EXPECT_EQ(e.ours.bit_width, e.width) << table << "." << e.name << " width";
  }
}

std::string Hex(const std::vector<uint8_t>& b) {
  std::string s;
  char buf[8];
  for (size_t i = 0; i < b.size(); ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", b[i]);
    s += (i == 0) ? "" : (i % 16 == 0 ? "\n  " : " ");
    s += buf;
  }
  return s;
}

// Byte-for-byte comparison naming every differing offset.
::testing::AssertionResult SameBytes(const std::vector<uint8_t>& expected,
                                     const std::vector<uint8_t>& actual) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << ", expected " << expected.size();
  }
  std::string diffs;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] != actual[i]) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "  byte %zu: expected 0x%02x, actual 0x%02x\n", i,
                    expected[i], actual[i]);
      diffs += buf;
    }
  }
  if (diffs.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\n" << diffs << "actual:\n  " << Hex(actual);
}

// A golden image: `size` zero bytes except runs written at given offsets.
using Run = std::pair<size_t, std::vector<uint8_t>>;
std::vector<uint8_t> Image(size_t size, const std::vector<Run>& runs) {
  std::vector<uint8_t> b(size, 0);
  for (const auto& [offset, bytes] : runs) {
    for (size_t i = 0; i < bytes.size(); ++i) b.at(offset + i) = bytes[i];
  }
  return b;
}

// Bit `i` of a PRM buffer, counted from the most significant bit of byte 0:
// the reference the bit writer is checked against, one bit at a time.
bool RefBit(const std::vector<uint8_t>& b, uint32_t i) { return (b[i / 8] >> (7 - i % 8)) & 1; }
void RefSetBit(std::vector<uint8_t>& b, uint32_t i, bool v) {
  const auto mask = static_cast<uint8_t>(0x80u >> (i % 8));
  b[i / 8] = static_cast<uint8_t>(v ? (b[i / 8] | mask) : (b[i / 8] & ~mask));
}

// ---- (1) our tables against the PRM facts -------------------------------------------------------

TEST(Mlx5DevxIfc, OpcodesAndValues) {
  // [R] MLX5_CMD_OP_*.
  EXPECT_EQ(kCmdQueryHcaCap, 0x100);
  EXPECT_EQ(kCmdCreateCq, 0x400);
  EXPECT_EQ(kCmdDestroyCq, 0x401);
  EXPECT_EQ(kCmdCreateQp, 0x500);
  EXPECT_EQ(kCmdDestroyQp, 0x501);
  EXPECT_EQ(kCmdRst2InitQp, 0x502);
  EXPECT_EQ(kCmdInit2RtrQp, 0x503);
  EXPECT_EQ(kCmdRtr2RtsQp, 0x504);
  // [R] MLX5_QPC_ST_RC, MLX5_QPC_PM_STATE_MIGRATED, MLX5_CAP_PORT_TYPE_*,
  // HCA_CAP_OPMOD_GET_*; [K] qp.h MLX5_ZERO_LEN_RQ.
  EXPECT_EQ(kQpcStRc, 0x0u);
  EXPECT_EQ(kQpcPmStateMigrated, 0x3u);
  EXPECT_EQ(kQpcRqTypeZeroSize, 0x3u);
  EXPECT_EQ(kCapPortTypeIb, 0x0u);
  EXPECT_EQ(kCapPortTypeEth, 0x1u);
  EXPECT_EQ(kHcaCapModeMax, 0x0);
  EXPECT_EQ(kHcaCapModeCurrent, 0x1);
  // [K] driver.h MLX5_ATOMIC_MODE_IB_COMP .. _256B (qpc.atomic_mode values).
  EXPECT_EQ(static_cast<int>(AtomicMode::kIbCompatible), 1);
  EXPECT_EQ(static_cast<int>(AtomicMode::kUpTo8Bytes), 3);
  EXPECT_EQ(static_cast<int>(AtomicMode::kUpTo256Bytes), 8);
  // [K] MLX5_QPC_MTU_256_BYTES .. _4K_BYTES.
  EXPECT_EQ(static_cast<int>(PathMtu::k256), 1);
  EXPECT_EQ(static_cast<int>(PathMtu::k4096), 5);
  // [R] MLX5_QPC_TIMESTAMP_FORMAT_*.
  EXPECT_EQ(static_cast<int>(TimestampFormat::kFreeRunning), 0);
  EXPECT_EQ(static_cast<int>(TimestampFormat::kDefault), 1);
  EXPECT_EQ(static_cast<int>(TimestampFormat::kRealTime), 2);
}

TEST(Mlx5DevxIfc, MailboxHeaders) {
  // [R] every *_in_bits starts opcode[0x10] uid[0x10] reserved[0x10]
  // op_mod[0x10]; every *_out_bits status[0x8] reserved[0x18] syndrome[0x20].
  ExpectTable("cmd_in", {
                            {"opcode", kCmdIn.opcode, 0, 16, 16},
                            {"uid", kCmdIn.uid, 0, 0, 16},
                            {"op_mod", kCmdIn.op_mod, 4, 0, 16},
                        });
  ExpectTable("cmd_out", {
                             {"status", kCmdOut.status, 0, 24, 8},
                             {"syndrome", kCmdOut.syndrome, 4, 0, 32},
                         });
  EXPECT_EQ(kCmdOutBytes, 16u);
}

TEST(Mlx5DevxIfc, Cqc) {
  // [K] mlx5_ifc_cqc_bits; dbr_umem_id from [RT] SwCqc (reserved in older
  // kernel headers); c_eqn as [K]'s c_eqn_or_apu_element.
  ExpectTable("cqc", {
                         {"dbr_umem_valid", kCqc.dbr_umem_valid, 0, 25, 1},
                         {"cqe_sz", kCqc.cqe_sz, 0, 21, 3},
                         {"oi", kCqc.oi, 0, 17, 1},
                         {"dbr_umem_id", kCqc.dbr_umem_id, 4, 0, 32},
                         {"log_cq_size", kCqc.log_cq_size, 12, 24, 5},
                         {"uar_page", kCqc.uar_page, 12, 0, 24},
                         {"c_eqn", kCqc.c_eqn, 20, 0, 32},
                         {"dbr_addr", kCqc.dbr_addr, 56, 0, 64},
                     });
  EXPECT_EQ(kCqc.bits.bit_width, 64u * 8);
}

TEST(Mlx5DevxIfc, Ads) {
  // [R] mlx5_ifc_ads_bits (same offsets in [RT] SwAds).
  ExpectTable("ads", {
                         {"pkey_index", kAds.pkey_index, 0, 0, 16},
                         {"grh", kAds.grh, 4, 23, 1},
                         {"rlid", kAds.rlid, 4, 0, 16},
                         {"ack_timeout", kAds.ack_timeout, 8, 27, 5},
                         {"src_addr_index", kAds.src_addr_index, 8, 16, 8},
                         {"hop_limit", kAds.hop_limit, 8, 0, 8},
                         {"tclass", kAds.tclass, 12, 20, 8},
                         {"flow_label", kAds.flow_label, 12, 0, 20},
                         {"rgid_rip", kAds.rgid_rip, 16, 0, 128},
                         {"dscp", kAds.dscp, 32, 16, 6},
                         {"udp_sport", kAds.udp_sport, 32, 0, 16},
                         {"eth_prio", kAds.eth_prio, 36, 28, 3},
                         {"sl", kAds.sl, 36, 24, 4},
                         {"vhca_port_num", kAds.vhca_port_num, 36, 16, 8},
                         {"rmac_47_32", kAds.rmac_47_32, 36, 0, 16},
                         {"rmac_31_0", kAds.rmac_31_0, 40, 0, 32},
                     });
  EXPECT_EQ(kAds.bits.bit_width, 44u * 8);
}

TEST(Mlx5DevxIfc, Qpc) {
  // [R] mlx5_ifc_qpc_bits (same offsets in [RT] SwQpc).
  ExpectTable("qpc", {
                         {"st", kQpc.st, 0, 16, 8},
                         {"pm_state", kQpc.pm_state, 0, 11, 2},
                         {"pd", kQpc.pd, 4, 0, 24},
                         {"mtu", kQpc.mtu, 8, 29, 3},
                         {"log_msg_max", kQpc.log_msg_max, 8, 24, 5},
                         {"log_rq_size", kQpc.log_rq_size, 8, 19, 4},
                         {"log_rq_stride", kQpc.log_rq_stride, 8, 16, 3},
                         {"no_sq", kQpc.no_sq, 8, 15, 1},
                         {"log_sq_size", kQpc.log_sq_size, 8, 11, 4},
                         {"ts_format", kQpc.ts_format, 8, 6, 2},
                         {"uar_page", kQpc.uar_page, 12, 0, 24},
                         {"user_index", kQpc.user_index, 16, 0, 24},
                         {"remote_qpn", kQpc.remote_qpn, 20, 0, 24},
                         {"primary_address_path", kQpc.primary_address_path, 24, 0, 44 * 8},
                         {"log_sra_max", kQpc.log_sra_max, 112, 21, 3},
                         {"retry_count", kQpc.retry_count, 112, 16, 3},
                         {"rnr_retry", kQpc.rnr_retry, 112, 13, 3},
                         {"next_send_psn", kQpc.next_send_psn, 120, 0, 24},
                         {"cqn_snd", kQpc.cqn_snd, 124, 0, 24},
                         {"log_rra_max", kQpc.log_rra_max, 144, 21, 3},
                         {"atomic_mode", kQpc.atomic_mode, 144, 16, 4},
                         {"rre", kQpc.rre, 144, 15, 1},
                         {"rwe", kQpc.rwe, 144, 14, 1},
                         {"rae", kQpc.rae, 144, 13, 1},
                         {"min_rnr_nak", kQpc.min_rnr_nak, 148, 24, 5},
                         {"next_rcv_psn", kQpc.next_rcv_psn, 148, 0, 24},
                         {"cqn_rcv", kQpc.cqn_rcv, 156, 0, 24},
                         {"dbr_addr", kQpc.dbr_addr, 160, 0, 64},
                         {"rq_type", kQpc.rq_type, 172, 24, 3},
                         {"dbr_umem_valid", kQpc.dbr_umem_valid, 208, 28, 1},
                         {"dbr_umem_id", kQpc.dbr_umem_id, 228, 0, 32},
                     });
  EXPECT_EQ(kQpc.bits.bit_width, 232u * 8);
}

TEST(Mlx5DevxIfc, CmdHcaCap) {
  // [R] mlx5_ifc_cmd_hca_cap_bits; log_max_uctx / log_max_umem from [RT]
  // CmdHcaCap.
  ExpectTable("cmd_hca_cap", {
                                 {"log_max_qp_sz", kCmdHcaCap.log_max_qp_sz, 16, 16, 8},
                                 {"log_max_cq_sz", kCmdHcaCap.log_max_cq_sz, 24, 16, 8},
                                 {"log_max_ra_req_qp", kCmdHcaCap.log_max_ra_req_qp, 40, 16, 6},
                                 {"log_max_ra_res_qp", kCmdHcaCap.log_max_ra_res_qp, 40, 0, 6},
                                 {"gid_table_size", kCmdHcaCap.gid_table_size, 44, 0, 16},
                                 {"port_type", kCmdHcaCap.port_type, 52, 8, 2},
                                 {"num_ports", kCmdHcaCap.num_ports, 52, 0, 8},
                                 {"log_max_msg", kCmdHcaCap.log_max_msg, 56, 24, 5},
                                 {"cqe_version", kCmdHcaCap.cqe_version, 60, 0, 4},
                                 {"roce", kCmdHcaCap.roce, 64, 2, 1},
                                 {"atomic", kCmdHcaCap.atomic, 64, 1, 1},
                                 {"rc", kCmdHcaCap.rc, 68, 0, 1},
                                 {"log_max_uctx", kCmdHcaCap.log_max_uctx, 140, 24, 5},
                                 {"log_max_umem", kCmdHcaCap.log_max_umem, 140, 16, 5},
                             });
  EXPECT_EQ(kCmdHcaCap.bits.bit_width, 256u * 8);
}

TEST(Mlx5DevxIfc, Commands) {
  // [K] create_cq_in/out_bits, destroy_cq_in_bits ([RT] CreateCqIn agrees).
  EXPECT_EQ(kCreateCqIn.bytes, 272u);
  ExpectTable("create_cq_in", {
                                  {"cq_context", kCreateCqIn.cq_context, 16, 0, 64 * 8},
                                  {"cq_umem_offset", kCreateCqIn.cq_umem_offset, 80, 0, 64},
                                  {"cq_umem_id", kCreateCqIn.cq_umem_id, 88, 0, 32},
                                  {"cq_umem_valid", kCreateCqIn.cq_umem_valid, 92, 31, 1},
                              });
  ExpectTable("create_cq_out/destroy_cq_in", {{"cqn", kCqnField, 8, 0, 24}});
  EXPECT_EQ(kDestroyCqInBytes, 16u);
  // [R] create_qp_in/out_bits, destroy_qp_in_bits; wq_umem_offset from [K]
  // and [RT] (reserved in [R]).
  EXPECT_EQ(kCreateQpIn.bytes, 272u);
  ExpectTable("create_qp_in", {
                                  {"qpc", kCreateQpIn.qpc, 24, 0, 232 * 8},
                                  {"wq_umem_offset", kCreateQpIn.wq_umem_offset, 256, 0, 64},
                                  {"wq_umem_id", kCreateQpIn.wq_umem_id, 264, 0, 32},
                                  {"wq_umem_valid", kCreateQpIn.wq_umem_valid, 268, 31, 1},
                              });
  ExpectTable("create_qp_out/destroy_qp_in", {{"qpn", kQpnField, 8, 0, 24}});
  EXPECT_EQ(kDestroyQpInBytes, 16u);
  // [R] rst2init_qp_in_bits = init2rtr_qp_in_bits = rtr2rts_qp_in_bits.
  EXPECT_EQ(kModifyQpIn.bytes, 272u);
  ExpectTable("modify_qp_in", {
                                  {"qpn", kModifyQpIn.qpn, 8, 0, 24},
                                  {"opt_param_mask", kModifyQpIn.opt_param_mask, 16, 0, 32},
                                  {"qpc", kModifyQpIn.qpc, 24, 0, 232 * 8},
                              });
  // [R] query_hca_cap_in/out_bits: the capability union is 0x8000 bits.
  EXPECT_EQ(kQueryHcaCapInBytes, 16u);
  EXPECT_EQ(kQueryHcaCapOut.bytes, 4112u);
  ExpectTable("query_hca_cap_out", {{"capability", kQueryHcaCapOut.capability, 16, 0, 4096 * 8}});
}

// ---- (2) the bit writer -------------------------------------------------------------------------

TEST(Mlx5DevxLayout, SetWritesBigEndianBytes) {
  std::vector<uint8_t> b(96, 0);
  ASSERT_TRUE(Set(b, Field{0x00, 16}, 0x0400));                  // opcode
  ASSERT_TRUE(Set(b, Field{0x63, 5}, 0x11));                     // 5 bits at the bottom of byte 12
  ASSERT_TRUE(Set(b, Field{0x68, 24}, 0xabcdef));                // bytes 13..15
  ASSERT_TRUE(Set(b, Field{0x1c0, 64}, 0x0123456789abcdefull));  // bytes 56..63
  ASSERT_TRUE(Set(b, Field{0x60, 1}, 1));  // top bit of byte 12, beside log_cq_size
  EXPECT_TRUE(SameBytes(Image(96, {{0, {0x04, 0x00}},
                                   {12, {0x91, 0xab, 0xcd, 0xef}},
                                   {56, {0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}}}),
                        b));
}

TEST(Mlx5DevxLayout, SetAcrossDwordBoundaries) {
  std::vector<uint8_t> b(24, 0);
  // Bits 28..35: the low nibble of byte 3 and the high nibble of byte 4.
  ASSERT_TRUE(Set(b, Field{0x1c, 8}, 0xa5));
  // Bits 84..103: 20 bits over bytes 10..12.
  ASSERT_TRUE(Set(b, Field{0x54, 20}, 0xfedcb));
  EXPECT_TRUE(SameBytes(Image(24, {{3, {0x0a, 0x50}}, {10, {0x0f, 0xed, 0xcb}}}), b));
  EXPECT_EQ(Get(b, Field{0x1c, 8}), 0xa5u);
  EXPECT_EQ(Get(b, Field{0x54, 20}), 0xfedcbu);

  // A 64-bit field off any byte boundary: Set takes it, Set64 (the
  // DEVX_SET64 rule: dword-aligned) refuses it.
  std::vector<uint8_t> c(24, 0);
  ASSERT_TRUE(Set(c, Field{0x44, 64}, 0x0123456789abcdefull));
  EXPECT_TRUE(
      SameBytes(Image(24, {{8, {0x00, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0}}}), c));
  EXPECT_EQ(Get(c, Field{0x44, 64}), 0x0123456789abcdefull);
  std::vector<uint8_t> d(24, 0);
  EXPECT_FALSE(Set64(d, Field{0x44, 64}, 1));
  EXPECT_FALSE(Set64(d, Field{0x40, 32}, 1));
  EXPECT_EQ(d, std::vector<uint8_t>(24, 0));
  ASSERT_TRUE(Set64(d, Field{0x40, 64}, 0x1122334455667788ull));
  EXPECT_TRUE(SameBytes(Image(24, {{8, {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88}}}), d));
  EXPECT_EQ(Get64(d, Field{0x40, 64}), 0x1122334455667788ull);
}

TEST(Mlx5DevxLayout, SetLeavesOtherBitsAlone) {
  std::vector<uint8_t> b(16, 0xff);
  ASSERT_TRUE(Set(b, Field{0x63, 5}, 0));
  ASSERT_TRUE(Set(b, Field{0x1c, 8}, 0x00));
  std::vector<uint8_t> want(16, 0xff);
  want[12] = 0xe0;
  want[3] = 0xf0;
  want[4] = 0x0f;
  EXPECT_TRUE(SameBytes(want, b));
}

TEST(Mlx5DevxLayout, RefusesWhatDoesNotFit) {
  std::vector<uint8_t> b(16, 0x5a);
  const std::vector<uint8_t> before = b;
  EXPECT_FALSE(Set(b, Field{0x68, 24}, 0x1000000));  // value wider than the field
  EXPECT_FALSE(Set(b, Field{0x7c, 8}, 1));           // ends past byte 15
  EXPECT_FALSE(Set(b, Field{0x00, 0}, 0));           // no width
  EXPECT_FALSE(Set(b, Field{0x00, 65}, 0));          // wider than 64
  EXPECT_EQ(b, before);
  EXPECT_EQ(Get(b, Field{0x7c, 8}), 0u);
  EXPECT_TRUE((Field{0, 64}.Holds(~uint64_t{0})));
  EXPECT_FALSE((Field{0, 3}.Holds(8)));
}

// Every width at every offset of a 3-dword window, against the bit-at-a-time
// reference, over a background of noise: the field reads back and nothing
// else moves.
TEST(Mlx5DevxLayout, RoundTripsAgainstBitReference) {
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  auto next = [&seed] {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return seed;
  };
  for (uint32_t width = 1; width <= 64; ++width) {
    for (uint32_t offset = 0; offset < 96; ++offset) {
      std::vector<uint8_t> b(24);
      for (auto& x : b) x = static_cast<uint8_t>(next());
      const Field f{offset, width};
      const uint64_t value = next() & f.max_value();
      std::vector<uint8_t> want = b;
      for (uint32_t i = 0; i < width; ++i) {
        RefSetBit(want, offset + i, (value >> (width - 1 - i)) & 1);
      }
      ASSERT_TRUE(Set(b, f, value)) << "offset " << offset << " width " << width;
      ASSERT_EQ(b, want) << "offset " << offset << " width " << width;
      ASSERT_EQ(Get(b, f), value) << "offset " << offset << " width " << width;
      for (uint32_t i = 0; i < width; ++i) {
        ASSERT_EQ(RefBit(b, offset + i), ((value >> (width - 1 - i)) & 1) != 0);
      }
    }
  }
}

TEST(Mlx5DevxLayout, NestedFieldsAddOffsets) {
  const Field rlid = kAds.rlid.In(kQpc.primary_address_path).In(kModifyQpIn.qpc);
  // 24 (qpc in the command) + 24 (primary path in qpc) + 4 (rlid's dword).
  EXPECT_EQ(rlid.bit_offset, (24u + 24u + 4u) * 8 + 16);
  EXPECT_EQ(rlid.bit_width, 16u);
}

// ---- (3) golden byte images ---------------------------------------------------------------------

TEST(Mlx5DevxGolden, QueryHcaCap) {
  const DevxCommand cur = BuildQueryGeneralCaps(HcaCapMode::kCurrent);
  EXPECT_EQ(cur.name, "QUERY_HCA_CAP");
  EXPECT_TRUE(SameBytes(Image(16, {{0, {0x01, 0x00}}, {6, {0x00, 0x01}}}), cur.in));
  EXPECT_EQ(cur.out, std::vector<uint8_t>(4112, 0));
  const DevxCommand max = BuildQueryGeneralCaps(HcaCapMode::kMax);
  EXPECT_TRUE(SameBytes(Image(16, {{0, {0x01, 0x00}}}), max.in));
}

// Issue 24 item 2: the atomic caps ([K]/[R] mlx5_ifc_atomic_caps_bits;
// op_mod type MLX5_CAP_ATOMIC = 3, as NVSHMEM's
// nvshmemt_ib_common_check_nic_ext_atomic_support queries them).
TEST(Mlx5DevxIfc, AtomicCaps) {
  ExpectTable("atomic_caps", {
                                 {"atomic_req_8B_endianness_mode",
                                  kAtomicCaps.atomic_req_8b_endianness_mode, 8, 30, 2},
                                 {"supported_atomic_req_8B_endianness_mode_1",
                                  kAtomicCaps.supported_atomic_req_8b_endianness_mode_1, 8, 25, 1},
                                 {"atomic_operations", kAtomicCaps.atomic_operations, 16, 0, 16},
                                 {"atomic_size_qp", kAtomicCaps.atomic_size_qp, 20, 0, 16},
                                 {"atomic_size_dc", kAtomicCaps.atomic_size_dc, 24, 0, 16},
                             });
  // [K] include/linux/mlx5/device.h MLX5_ATOMIC_OPS_*; mlx5_ifc.h
  // MLX5_ATOMIC_CAPS_ATOMIC_SIZE_QP_4_BYTES / _8_BYTES.
  EXPECT_EQ(kAtomicOpsCmpSwap, 1u);
  EXPECT_EQ(kAtomicOpsFetchAdd, 2u);
  EXPECT_EQ(kAtomicOpsMaskedCmpSwap, 4u);
  EXPECT_EQ(kAtomicOpsMaskedFetchAdd, 8u);
  EXPECT_EQ(kAtomicSize4Bytes, 0x4u);
  EXPECT_EQ(kAtomicSize8Bytes, 0x8u);
}

TEST(Mlx5DevxGolden, QueryAtomicCaps) {
  // op_mod = MLX5_CAP_ATOMIC << 1 | HCA_CAP_OPMOD_GET_CUR = 7.
  const DevxCommand cur = BuildQueryAtomicCaps(HcaCapMode::kCurrent);
  EXPECT_TRUE(SameBytes(Image(16, {{0, {0x01, 0x00}}, {6, {0x00, 0x07}}}), cur.in));
  EXPECT_EQ(cur.out.size(), 4112u);
}

TEST(Mlx5DevxOutput, AtomicCapsAndWhatKernelsNeed) {
  // Capability bytes at 16 + their offset in atomic_caps: byte 8 holds the
  // endianness mode (top 2 bits) and its support bit (bit 1 of the byte);
  // atomic_operations at 18..19, atomic_size_qp at 22..23.
  const std::vector<uint8_t> out =
      Image(4112, {{16 + 8, {0x42}}, {16 + 18, {0x00, 0x0f}}, {16 + 22, {0x00, 0x0c}}});
  absl::StatusOr<HcaAtomicCaps> caps = ParseQueryAtomicCapsOut(out);
  ASSERT_TRUE(caps.ok()) << caps.status();
  EXPECT_EQ(caps->operations, 0xfu);
  EXPECT_EQ(caps->size_qp, 0xcu);
  EXPECT_EQ(caps->req_8b_endianness_mode, 1u);
  EXPECT_TRUE(caps->endianness_mode_1_supported);
  EXPECT_TRUE(CheckAtomics(*caps).ok());
  EXPECT_EQ(DescribeAtomics(*caps),
            "fetch-add,cmp-swap,masked-fetch-add,masked-cmp-swap; sizes 4,8 B; 8-byte replies "
            "host order");

  // No masked fetch-add, and 8-byte operands only: both named, with the
  // firmware setting.
  HcaAtomicCaps thin = *caps;
  thin.operations = kAtomicOpsCmpSwap | kAtomicOpsFetchAdd;
  thin.size_qp = kAtomicSize8Bytes;
  const absl::Status refused = CheckAtomics(thin);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  for (const char* part :
       {"4-byte masked fetch-add", "atomic_size_qp lacks 4 bytes", "PCI_ATOMIC_MODE"}) {
    EXPECT_NE(refused.message().find(part), std::string::npos) << part << ": " << refused;
  }
  EXPECT_EQ(refused.message().find("8-byte fetch-add"), std::string::npos) << refused;
  // A failed command is the command's error.
  std::vector<uint8_t> failed = out;
  failed[0] = 0x03;  // BAD_PARAM
  EXPECT_FALSE(ParseQueryAtomicCapsOut(failed).ok());
}

TEST(Mlx5DevxGolden, CreateCq) {
  CreateCqParams p;
  p.log_cq_size = 10;
  p.cqe_size = CqeSize::k64Bytes;
  p.uar_page = 0x012345;
  p.eqn = 0x2b;
  p.overrun_ignore = true;
  p.cq_umem_id = 0x11223344;
  p.cq_umem_offset = 0x0000000100002000ull;
  p.dbr_umem_id = 0x55667788;
  p.dbr_offset = 0x40;
  absl::StatusOr<DevxCommand> c = BuildCreateCq(p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "CREATE_CQ");
  // cqc starts at byte 16: dbr_umem_valid (0x02) in its byte 0, oi (0x02)
  // in byte 1, dbr_umem_id in 4..7, log_cq_size in byte 12, uar_page in
  // 13..15, c_eqn in 20..23, dbr_addr in 56..63.
  EXPECT_TRUE(SameBytes(Image(272, {{0, {0x04, 0x00}},
                                    {16, {0x02, 0x02}},
                                    {20, {0x55, 0x66, 0x77, 0x88}},
                                    {28, {0x0a, 0x01, 0x23, 0x45}},
                                    {36, {0x00, 0x00, 0x00, 0x2b}},
                                    {72, {0, 0, 0, 0, 0, 0, 0, 0x40}},
                                    {80, {0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x20, 0x00}},
                                    {88, {0x11, 0x22, 0x33, 0x44}},
                                    {92, {0x80}}}),
                        c->in));
  EXPECT_EQ(c->out, std::vector<uint8_t>(16, 0));
}

TEST(Mlx5DevxGolden, DestroyCq) {
  absl::StatusOr<DevxCommand> c = BuildDestroyCq(0x0abcde);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(SameBytes(Image(16, {{0, {0x04, 0x01}}, {9, {0x0a, 0xbc, 0xde}}}), c->in));
  EXPECT_EQ(c->out.size(), 16u);
}

TEST(Mlx5DevxGolden, CreateQp) {
  CreateQpParams p;
  p.pd = 0x00a1b2;
  p.uar_page = 0x000c0d;
  p.cqn_snd = 0x000123;
  p.cqn_rcv = 0x000456;
  p.log_sq_size = 9;
  p.log_msg_max = 30;
  p.user_index = 0x00beef;
  p.ts_format = TimestampFormat::kDefault;
  p.wq_umem_id = 0x01020304;
  p.wq_umem_offset = 0x1000;
  p.dbr_umem_id = 0x0a0b0c0d;
  p.dbr_offset = 0x88;
  absl::StatusOr<DevxCommand> c = BuildCreateQp(p);
  ASSERT_TRUE(c.ok()) << c.status();
  // qpc starts at byte 24. Its dword 0: st = RC (0), pm_state = 3 in bits
  // 11..12 -> byte 2 = 0x18. Dword 2 (bytes 32..35): mtu 0 | log_msg_max 30
  // = 0x1e; log_sq_size 9 above reserved bits = 0x48; ts_format 1 = 0x40.
  // rq_type 3 in qpc byte 172 (0x03), dbr_umem_valid in qpc byte 208 (0x10).
  EXPECT_TRUE(SameBytes(Image(272, {{0, {0x05, 0x00}},
                                    {26, {0x18}},
                                    {29, {0x00, 0xa1, 0xb2}},
                                    {32, {0x1e, 0x00, 0x48, 0x40}},
                                    {37, {0x00, 0x0c, 0x0d}},
                                    {41, {0x00, 0xbe, 0xef}},
                                    {149, {0x00, 0x01, 0x23}},
                                    {181, {0x00, 0x04, 0x56}},
                                    {184, {0, 0, 0, 0, 0, 0, 0, 0x88}},
                                    {196, {0x03}},
                                    {232, {0x10}},
                                    {252, {0x0a, 0x0b, 0x0c, 0x0d}},
                                    {256, {0, 0, 0, 0, 0, 0, 0x10, 0x00}},
                                    {264, {0x01, 0x02, 0x03, 0x04}},
                                    {268, {0x80}}}),
                        c->in));
  EXPECT_EQ(c->out, std::vector<uint8_t>(16, 0));
}

TEST(Mlx5DevxGolden, DestroyQp) {
  absl::StatusOr<DevxCommand> c = BuildDestroyQp(0x0d0e0f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(SameBytes(Image(16, {{0, {0x05, 0x01}}, {9, {0x0d, 0x0e, 0x0f}}}), c->in));
}

TEST(Mlx5DevxGolden, Rst2Init) {
  Rst2InitParams p;
  p.qpn = 0x00c0de;
  p.port = 1;
  p.pkey_index = 5;
  p.remote_read = p.remote_write = p.remote_atomic = true;
  p.atomic_mode = AtomicMode::kUpTo8Bytes;
  absl::StatusOr<DevxCommand> c = BuildRst2Init(p);
  ASSERT_TRUE(c.ok()) << c.status();
  // The primary path starts at byte 48 (qpc 24 + 24): pkey_index in its
  // bytes 2..3, vhca_port_num in byte 37. qpc byte 145: log_rra_max 0 |
  // atomic_mode 3 = 0x03; byte 146: rre rwe rae = 0xe0. opt_param_mask 0.
  EXPECT_TRUE(SameBytes(Image(272, {{0, {0x05, 0x02}},
                                    {9, {0x00, 0xc0, 0xde}},
                                    {26, {0x18}},
                                    {50, {0x00, 0x05}},
                                    {85, {0x01}},
                                    {169, {0x03, 0xe0}}}),
                        c->in));
  EXPECT_EQ(c->out, std::vector<uint8_t>(16, 0));
}

Init2RtrParams RoceRtr() {
  Init2RtrParams p;
  p.qpn = 0x000777;
  p.mtu = PathMtu::k1024;
  p.log_msg_max = 30;
  p.remote_qpn = 0x0abcde;
  p.next_rcv_psn = 0x123456;
  p.log_rra_max = 4;
  p.min_rnr_nak = 12;
  p.port = 1;
  p.link_layer = LinkLayer::kEthernet;
  p.sl = 3;
  p.rgid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xc0, 0xa8, 0x01, 0x02};
  p.gid_index = 3;
  p.hop_limit = 64;
  p.traffic_class = 0x68;  // DSCP 26
  p.flow_label = 0x12345;
  p.rmac = {0x02, 0x11, 0x22, 0x33, 0x44, 0x55};
  p.roce_v2 = true;
  p.udp_sport = 0xc000;
  return p;
}

TEST(Mlx5DevxGolden, Init2RtrRoce) {
  absl::StatusOr<DevxCommand> c = BuildInit2Rtr(RoceRtr());
  ASSERT_TRUE(c.ok()) << c.status();
  // qpc dword 2: mtu 3 | log_msg_max 30 = 0x7e. Path (byte 48): its dword 2
  // (56..59) src_addr_index 3, hop_limit 64; dword 3 (60..63) tclass 0x68 <<
  // 20 | flow_label 0x12345 = 0x06812345; rgid in 64..79; dword 8 (80..83)
  // dscp 26 -> 0x1a, udp_sport 0xc000; dword 9 (84..87) eth_prio 3 -> 0x30,
  // vhca_port_num 1, rmac[0..1]; rmac[2..5] in 88..91. qpc byte 145:
  // log_rra_max 4 -> 0x80; byte 148: min_rnr_nak 12 -> 0x0c, then the PSN.
  EXPECT_TRUE(SameBytes(Image(272, {{0, {0x05, 0x03}},
                                    {9, {0x00, 0x07, 0x77}},
                                    {32, {0x7e}},
                                    {45, {0x0a, 0xbc, 0xde}},
                                    {57, {0x03, 0x00, 0x40}},
                                    {60, {0x06, 0x81, 0x23, 0x45}},
                                    {74, {0xff, 0xff, 0xc0, 0xa8, 0x01, 0x02}},
                                    {81, {0x1a, 0xc0, 0x00}},
                                    {84, {0x30, 0x01, 0x02, 0x11}},
                                    {88, {0x22, 0x33, 0x44, 0x55}},
                                    {169, {0x80}},
                                    {172, {0x0c, 0x12, 0x34, 0x56}}}),
                        c->in));
}

TEST(Mlx5DevxGolden, Init2RtrRoceV1HasNoUdpFields) {
  Init2RtrParams p = RoceRtr();
  p.roce_v2 = false;
  p.udp_sport = 0;
  absl::StatusOr<DevxCommand> c = BuildInit2Rtr(p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->in[81], 0x00);  // no dscp
  EXPECT_EQ(c->in[82], 0x00);  // no udp_sport
  EXPECT_EQ(c->in[60], 0x06);  // the GRH traffic class stays
}

TEST(Mlx5DevxGolden, Init2RtrInfiniBand) {
  Init2RtrParams p;
  p.qpn = 0x000777;
  p.mtu = PathMtu::k4096;
  p.log_msg_max = 30;
  p.remote_qpn = 0x0abcde;
  p.next_rcv_psn = 0x123456;
  p.log_rra_max = 4;
  p.min_rnr_nak = 12;
  p.port = 2;
  p.link_layer = LinkLayer::kInfiniBand;
  p.rlid = 0x0042;
  p.sl = 5;
  p.grh = false;
  p.gid_index = 7;  // ignored without a GRH
  absl::StatusOr<DevxCommand> c = BuildInit2Rtr(p);
  ASSERT_TRUE(c.ok()) << c.status();
  // mtu 5 | log_msg_max 30 = 0xbe. Path dword 1 (52..55): grh 0, rlid;
  // dword 9 byte 84: sl 5 in the low nibble; port 2 in byte 85.
  EXPECT_TRUE(SameBytes(Image(272, {{0, {0x05, 0x03}},
                                    {9, {0x00, 0x07, 0x77}},
                                    {32, {0xbe}},
                                    {45, {0x0a, 0xbc, 0xde}},
                                    {54, {0x00, 0x42}},
                                    {84, {0x05, 0x02}},
                                    {169, {0x80}},
                                    {172, {0x0c, 0x12, 0x34, 0x56}}}),
                        c->in));

  // With a GRH: the grh bit (path byte 5 -> 0x80 at byte 53) and the GRH fields.
  p.grh = true;
  p.rgid = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01};
  p.hop_limit = 1;
  absl::StatusOr<DevxCommand> g = BuildInit2Rtr(p);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->in[53], 0x80);
  EXPECT_EQ(g->in[57], 0x07);  // src_addr_index
  EXPECT_EQ(g->in[59], 0x01);  // hop_limit
  EXPECT_EQ(g->in[64], 0xfe);
  EXPECT_EQ(g->in[79], 0x01);
}

TEST(Mlx5DevxGolden, Rtr2Rts) {
  Rtr2RtsParams p;
  p.qpn = 0x000777;
  p.next_send_psn = 0x654321;
  p.log_sra_max = 4;
  p.retry_count = 7;
  p.rnr_retry = 6;
  p.ack_timeout = 14;
  p.port = 1;
  absl::StatusOr<DevxCommand> c = BuildRtr2Rts(p);
  ASSERT_TRUE(c.ok()) << c.status();
  // Path byte 8 (56): ack_timeout 14 << 3 = 0x70. qpc byte 113 (137):
  // log_sra_max 4 | retry_count 7 = 0x87; byte 114: rnr_retry 6 = 0xc0.
  EXPECT_TRUE(SameBytes(Image(272, {{0, {0x05, 0x04}},
                                    {9, {0x00, 0x07, 0x77}},
                                    {56, {0x70}},
                                    {85, {0x01}},
                                    {137, {0x87, 0xc0}},
                                    {145, {0x65, 0x43, 0x21}}}),
                        c->in));
}

// ---- (4) parameter checks -----------------------------------------------------------------------

void ExpectInvalid(const absl::Status& s, const std::string& command, const std::string& detail) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(command), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find(detail), absl::string_view::npos) << s;
}

CreateCqParams GoodCq() {
  CreateCqParams p;
  p.log_cq_size = 8;
  p.dbr_offset = 64;
  return p;
}

CreateQpParams GoodQp() {
  CreateQpParams p;
  p.log_sq_size = 8;
  p.log_msg_max = 30;
  return p;
}

TEST(Mlx5DevxValidation, CreateCq) {
  CreateCqParams p = GoodCq();
  ASSERT_TRUE(BuildCreateCq(p).ok());
  p.log_cq_size = 32;
  ExpectInvalid(BuildCreateCq(p).status(), "CREATE_CQ",
                "log_cq_size = 32 does not fit its 5-bit PRM field (0..31)");
  p = GoodCq();
  p.uar_page = 1u << 24;
  ExpectInvalid(BuildCreateCq(p).status(), "CREATE_CQ", "uar_page = 16777216");
  p = GoodCq();
  p.dbr_offset = 4;
  ExpectInvalid(BuildCreateCq(p).status(), "CREATE_CQ", "dbr_offset = 4 is not a multiple of 8");
  p = GoodCq();
  p.cqe_size = static_cast<CqeSize>(2);
  ExpectInvalid(BuildCreateCq(p).status(), "CREATE_CQ", "cqe_size enum value 2");
  ExpectInvalid(BuildDestroyCq(1u << 24).status(), "DESTROY_CQ", "cqn = 16777216");
}

TEST(Mlx5DevxValidation, CreateQp) {
  CreateQpParams p = GoodQp();
  ASSERT_TRUE(BuildCreateQp(p).ok());
  p.log_sq_size = 16;
  ExpectInvalid(BuildCreateQp(p).status(), "CREATE_QP",
                "log_sq_size = 16 does not fit its 4-bit PRM field (0..15)");
  p = GoodQp();
  p.log_msg_max = 32;
  ExpectInvalid(BuildCreateQp(p).status(), "CREATE_QP", "log_msg_max = 32");
  p = GoodQp();
  p.pd = 1u << 24;
  ExpectInvalid(BuildCreateQp(p).status(), "CREATE_QP", "pd = 16777216");
  p = GoodQp();
  p.cqn_snd = 0xffffffffu;
  ExpectInvalid(BuildCreateQp(p).status(), "CREATE_QP", "cqn_snd = 4294967295");
  p = GoodQp();
  p.ts_format = static_cast<TimestampFormat>(3);
  ExpectInvalid(BuildCreateQp(p).status(), "CREATE_QP", "ts_format enum value 3");
  p = GoodQp();
  p.dbr_offset = 12;
  ExpectInvalid(BuildCreateQp(p).status(), "CREATE_QP", "dbr_offset = 12");
  ExpectInvalid(BuildDestroyQp(1u << 24).status(), "DESTROY_QP", "qpn = 16777216");
}

TEST(Mlx5DevxValidation, Rst2Init) {
  Rst2InitParams p;
  p.qpn = 1;
  p.remote_atomic = true;
  ExpectInvalid(BuildRst2Init(p).status(), "RST2INIT_QP",
                "remote_atomic needs an atomic_mode of 1..8, got 0");
  p.atomic_mode = static_cast<AtomicMode>(9);
  ExpectInvalid(BuildRst2Init(p).status(), "RST2INIT_QP", "got 9");
  p.remote_atomic = false;
  p.atomic_mode = AtomicMode::kUpTo8Bytes;
  ExpectInvalid(BuildRst2Init(p).status(), "RST2INIT_QP", "atomic_mode 3 without remote_atomic");
  p.atomic_mode = AtomicMode::kNone;
  p.port = 0;
  ExpectInvalid(BuildRst2Init(p).status(), "RST2INIT_QP", "port = 0");
  p.port = 256;
  ExpectInvalid(BuildRst2Init(p).status(), "RST2INIT_QP", "port = 256");
  p.port = 1;
  p.pkey_index = 0x10000;
  ExpectInvalid(BuildRst2Init(p).status(), "RST2INIT_QP", "pkey_index = 65536");
}

TEST(Mlx5DevxValidation, Init2Rtr) {
  ASSERT_TRUE(BuildInit2Rtr(RoceRtr()).ok());
  Init2RtrParams p = RoceRtr();
  p.mtu = static_cast<PathMtu>(0);
  ExpectInvalid(BuildInit2Rtr(p).status(), "INIT2RTR_QP", "mtu enum value 0");
  p.mtu = static_cast<PathMtu>(6);
  ExpectInvalid(BuildInit2Rtr(p).status(), "INIT2RTR_QP", "mtu enum value 6");
  p = RoceRtr();
  p.gid_index = 256;
  ExpectInvalid(BuildInit2Rtr(p).status(), "INIT2RTR_QP",
                "gid_index = 256 does not fit its 8-bit PRM field (0..255)");
  p = RoceRtr();
  p.next_rcv_psn = 1u << 24;
  ExpectInvalid(BuildInit2Rtr(p).status(), "INIT2RTR_QP", "next_rcv_psn = 16777216");
  p = RoceRtr();
  p.flow_label = 1u << 20;
  ExpectInvalid(BuildInit2Rtr(p).status(), "INIT2RTR_QP", "flow_label = 1048576");
  p = RoceRtr();
  p.log_rra_max = 8;
  ExpectInvalid(BuildInit2Rtr(p).status(), "INIT2RTR_QP", "log_rra_max = 8");
  p = RoceRtr();
  p.sl = 8;
  ExpectInvalid(BuildInit2Rtr(p).status(), "INIT2RTR_QP", "sl = 8 is not an Ethernet priority");
  p = RoceRtr();
  p.rgid = {};
  ExpectInvalid(BuildInit2Rtr(p).status(), "INIT2RTR_QP", "rgid is all zero");
  p = RoceRtr();
  p.rmac = {};
  ExpectInvalid(BuildInit2Rtr(p).status(), "INIT2RTR_QP", "rmac is all zero");
  p = RoceRtr();
  p.roce_v2 = false;
  ExpectInvalid(BuildInit2Rtr(p).status(), "INIT2RTR_QP", "udp_sport = 49152 with a RoCE v1 GID");
  p = RoceRtr();
  p.traffic_class = 256;
  ExpectInvalid(BuildInit2Rtr(p).status(), "INIT2RTR_QP", "traffic_class = 256");
  p = RoceRtr();
  p.port = 0;
  ExpectInvalid(BuildInit2Rtr(p).status(), "INIT2RTR_QP", "port = 0");

  Init2RtrParams ib;
  ib.link_layer = LinkLayer::kInfiniBand;
  ib.rlid = 0;
  ExpectInvalid(BuildInit2Rtr(ib).status(), "INIT2RTR_QP", "rlid = 0x0 is not a unicast LID");
  ib.rlid = 0xc000;
  ExpectInvalid(BuildInit2Rtr(ib).status(), "INIT2RTR_QP", "rlid = 0xc000");
  ib.rlid = 1;
  ib.sl = 16;
  ExpectInvalid(BuildInit2Rtr(ib).status(), "INIT2RTR_QP", "sl = 16");
  ib.sl = 0;
  ib.grh = true;
  ExpectInvalid(BuildInit2Rtr(ib).status(), "INIT2RTR_QP", "grh set but rgid is all zero");
  ib.grh = false;
  ib.link_layer = static_cast<LinkLayer>(7);
  ExpectInvalid(BuildInit2Rtr(ib).status(), "INIT2RTR_QP", "link_layer enum value 7");
}

TEST(Mlx5DevxValidation, Rtr2Rts) {
  Rtr2RtsParams p;
  ASSERT_TRUE(BuildRtr2Rts(p).ok());
  p.retry_count = 8;
  ExpectInvalid(BuildRtr2Rts(p).status(), "RTR2RTS_QP", "retry_count = 8");
  p = Rtr2RtsParams{};
  p.rnr_retry = 8;
  ExpectInvalid(BuildRtr2Rts(p).status(), "RTR2RTS_QP", "rnr_retry = 8");
  p = Rtr2RtsParams{};
  p.ack_timeout = 32;
  ExpectInvalid(BuildRtr2Rts(p).status(), "RTR2RTS_QP", "ack_timeout = 32");
  p = Rtr2RtsParams{};
  p.log_sra_max = 8;
  ExpectInvalid(BuildRtr2Rts(p).status(), "RTR2RTS_QP", "log_sra_max = 8");
  p = Rtr2RtsParams{};
  p.next_send_psn = 1u << 24;
  ExpectInvalid(BuildRtr2Rts(p).status(), "RTR2RTS_QP", "next_send_psn = 16777216");
}

HcaGeneralCaps RoceCaps() {
  HcaGeneralCaps c;
  c.log_max_qp_sz = 15;
  c.log_max_cq_sz = 22;
  c.log_max_msg = 30;
  c.log_max_ra_req_qp = 4;
  c.log_max_ra_res_qp = 4;
  c.gid_table_size = 128;
  c.port_type = kCapPortTypeEth;
  c.num_ports = 1;
  c.roce = c.atomic = c.rc = true;
  c.log_max_uctx = 8;
  c.log_max_umem = 20;
  return c;
}

TEST(Mlx5DevxValidation, AgainstCaps) {
  const HcaGeneralCaps caps = RoceCaps();
  CreateCqParams cq = GoodCq();
  cq.log_cq_size = 22;
  EXPECT_TRUE(CheckAgainstCaps(cq, caps).ok());
  cq.log_cq_size = 23;
  ExpectInvalid(CheckAgainstCaps(cq, caps), "CREATE_CQ",
                "log_cq_size = 23 exceeds the device's log_max_cq_sz = 22");

  CreateQpParams qp = GoodQp();
  EXPECT_TRUE(CheckAgainstCaps(qp, caps).ok());
  qp.log_sq_size = 15;
  EXPECT_TRUE(CheckAgainstCaps(qp, caps).ok());
  qp.log_msg_max = 31;
  ExpectInvalid(CheckAgainstCaps(qp, caps), "CREATE_QP", "log_msg_max = 31");
  HcaGeneralCaps small = caps;
  small.log_max_qp_sz = 12;
  qp = GoodQp();
  qp.log_sq_size = 13;
  ExpectInvalid(CheckAgainstCaps(qp, small), "CREATE_QP",
                "log_sq_size = 13 exceeds the device's log_max_qp_sz = 12");

  Init2RtrParams rtr = RoceRtr();
  EXPECT_TRUE(CheckAgainstCaps(rtr, caps).ok());
  rtr.gid_index = 128;
  ExpectInvalid(CheckAgainstCaps(rtr, caps), "INIT2RTR_QP",
                "gid_index = 128 is outside the GID table of 128 entries");
  rtr = RoceRtr();
  rtr.log_rra_max = 5;
  ExpectInvalid(CheckAgainstCaps(rtr, caps), "INIT2RTR_QP", "log_max_ra_res_qp = 4");
  rtr = RoceRtr();
  rtr.link_layer = LinkLayer::kInfiniBand;
  ExpectInvalid(CheckAgainstCaps(rtr, caps), "INIT2RTR_QP",
                "link_layer is InfiniBand but the device's port_type is Ethernet");

  Rtr2RtsParams rts;
  rts.log_sra_max = 5;
  ExpectInvalid(CheckAgainstCaps(rts, caps), "RTR2RTS_QP", "log_max_ra_req_qp = 4");
}

TEST(Mlx5DevxValidation, RcOverDevx) {
  EXPECT_TRUE(CheckRcOverDevx(RoceCaps()).ok());
  HcaGeneralCaps ib = RoceCaps();
  ib.port_type = kCapPortTypeIb;
  ib.roce = false;  // RoCE does not matter on an IB port
  EXPECT_TRUE(CheckRcOverDevx(ib).ok());

  HcaGeneralCaps bad = RoceCaps();
  bad.roce = false;
  bad.rc = false;
  bad.log_max_uctx = 0;
  const absl::Status s = CheckRcOverDevx(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("no RC transport"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("log_max_uctx = 0"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("RoCE disabled"), absl::string_view::npos) << s;
}

// ---- (5) outputs --------------------------------------------------------------------------------

std::vector<uint8_t> Out(uint8_t status, uint32_t syndrome, uint32_t object = 0) {
  return Image(16, {{0, {status}},
                    {4,
                     {static_cast<uint8_t>(syndrome >> 24), static_cast<uint8_t>(syndrome >> 16),
                      static_cast<uint8_t>(syndrome >> 8), static_cast<uint8_t>(syndrome)}},
                    {9,
                     {static_cast<uint8_t>(object >> 16), static_cast<uint8_t>(object >> 8),
                      static_cast<uint8_t>(object)}}});
}

TEST(Mlx5DevxOutput, ObjectNumbers) {
  absl::StatusOr<uint32_t> qpn = ParseCreateQpOut(Out(0, 0, 0x00abcd));
  ASSERT_TRUE(qpn.ok()) << qpn.status();
  EXPECT_EQ(*qpn, 0x00abcdu);
  absl::StatusOr<uint32_t> cqn = ParseCreateCqOut(Out(0, 0, 0xfedcba));
  ASSERT_TRUE(cqn.ok()) << cqn.status();
  EXPECT_EQ(*cqn, 0xfedcbau);
  // The byte above the 24-bit number is reserved and not part of it.
  std::vector<uint8_t> out = Out(0, 0, 0x000001);
  out[8] = 0xff;
  EXPECT_EQ(*ParseCreateQpOut(out), 1u);
}

TEST(Mlx5DevxOutput, StatusAndSyndromeNamed) {
  const absl::Status bad = ParseCreateQpOut(Out(0x03, 0x1234abcd)).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "CREATE_QP failed: status 0x03 (bad parameter), syndrome 0x1234abcd");

  const absl::Status limit = ParseCreateCqOut(Out(0x08, 0x00000042)).status();
  EXPECT_EQ(limit.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(limit.message(),
            "CREATE_CQ failed: status 0x08 (limits exceeded), syndrome 0x00000042");

  const absl::Status state = CheckCommandOut("RTR2RTS_QP", Out(0x10, 0xdeadbeef));
  EXPECT_EQ(state.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(state.message(), "RTR2RTS_QP failed: status 0x10 (bad QP state), syndrome 0xdeadbeef");

  EXPECT_EQ(CheckCommandOut("X", Out(0x06, 1)).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CheckCommandOut("X", Out(0x0f, 1)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CheckCommandOut("X", Out(0x01, 1)).code(), absl::StatusCode::kInternal);
  const absl::Status unknown = CheckCommandOut("X", Out(0x77, 0xffffffff));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(unknown.message(), "X failed: status 0x77 (unknown status), syndrome 0xffffffff");

  // A zero status is success whatever the syndrome dword holds.
  EXPECT_TRUE(CheckCommandOut("X", Out(0, 0x12345678)).ok());
  const absl::Status shorter = CheckCommandOut("DESTROY_QP", std::vector<uint8_t>(8, 0));
  EXPECT_EQ(shorter.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shorter.message(), "DESTROY_QP: output mailbox of 8 bytes, need at least 16");
}

TEST(Mlx5DevxOutput, GidTableSizeIsACode) {
  for (uint8_t code : {0, 1, 4, 5, 0xff}) {
    const std::vector<uint8_t> out = Image(4112, {{16 + 47, {code}}});
    absl::StatusOr<HcaGeneralCaps> caps = ParseQueryGeneralCapsOut(out);
    ASSERT_TRUE(caps.ok()) << caps.status();
    EXPECT_EQ(caps->gid_table_size, code <= 4 ? 8u << code : 0u) << "code " << int{code};
  }
}

TEST(Mlx5DevxOutput, GeneralCaps) {
  // Capability bytes at 16 + their offset in cmd_hca_cap (see the Commands
  // and CmdHcaCap tables above).
  const std::vector<uint8_t> out = Image(4112, {{16 + 17, {0x0f}},        // log_max_qp_sz 15
                                                {16 + 25, {0x16}},        // log_max_cq_sz 22
                                                {16 + 41, {0x04}},        // log_max_ra_req_qp 4
                                                {16 + 43, {0x05}},        // log_max_ra_res_qp 5
                                                {16 + 46, {0x00, 0x03}},  // gid code 3: 64
                                                {16 + 54, {0x01, 0x01}},  // port_type ETH, 1 port
                                                {16 + 56, {0x1e}},        // log_max_msg 30
                                                {16 + 63, {0x01}},        // cqe_version 1
                                                {16 + 67, {0x06}},        // roce, atomic
                                                {16 + 71, {0x01}},        // rc
                                                {16 + 140, {0x08, 0x14}}});  // uctx 8, umem 20
  absl::StatusOr<HcaGeneralCaps> caps = ParseQueryGeneralCapsOut(out);
  ASSERT_TRUE(caps.ok()) << caps.status();
  EXPECT_EQ(caps->log_max_qp_sz, 15u);
  EXPECT_EQ(caps->log_max_cq_sz, 22u);
  EXPECT_EQ(caps->log_max_ra_req_qp, 4u);
  EXPECT_EQ(caps->log_max_ra_res_qp, 5u);
  EXPECT_EQ(caps->gid_table_size, 64u);
  EXPECT_EQ(caps->port_type, kCapPortTypeEth);
  EXPECT_EQ(caps->num_ports, 1u);
  EXPECT_EQ(caps->log_max_msg, 30u);
  EXPECT_EQ(caps->cqe_version, 1u);
  EXPECT_TRUE(caps->roce);
  EXPECT_TRUE(caps->atomic);
  EXPECT_TRUE(caps->rc);
  EXPECT_EQ(caps->log_max_uctx, 8u);
  EXPECT_EQ(caps->log_max_umem, 20u);
  EXPECT_TRUE(CheckRcOverDevx(*caps).ok());

  // All ones: every field reads as its own maximum, nothing spills over.
  std::vector<uint8_t> ones(4112, 0xff);
  ones[0] = 0;  // status OK
  absl::StatusOr<HcaGeneralCaps> max = ParseQueryGeneralCapsOut(ones);
  ASSERT_TRUE(max.ok()) << max.status();
  EXPECT_EQ(max->log_max_qp_sz, 255u);
  EXPECT_EQ(max->log_max_ra_req_qp, 63u);
  EXPECT_EQ(max->port_type, 3u);
  EXPECT_EQ(max->log_max_msg, 31u);
  EXPECT_EQ(max->cqe_version, 15u);
  EXPECT_EQ(max->log_max_uctx, 31u);

  const absl::Status failed = ParseQueryGeneralCapsOut(Out(0x02, 7)).status();
  EXPECT_EQ(failed.message(),
            "QUERY_HCA_CAP failed: status 0x02 (bad opcode), syndrome 0x00000007");
  const absl::Status shorter = ParseQueryGeneralCapsOut(std::vector<uint8_t>(100, 0)).status();
  EXPECT_EQ(shorter.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shorter.message().find("ends inside the general caps (need 272)"),
            absl::string_view::npos)
      << shorter;
}

}  // namespace
}  // namespace mooncake::daemon::mlx5
