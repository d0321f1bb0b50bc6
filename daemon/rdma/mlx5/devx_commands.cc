#include "rdma/mlx5/devx_commands.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "rdma/mlx5/devx_ifc.h"

namespace mooncake::daemon::mlx5 {

namespace {

constexpr absl::string_view kQueryHcaCapName = "QUERY_HCA_CAP";
constexpr absl::string_view kCreateCqName = "CREATE_CQ";
constexpr absl::string_view kDestroyCqName = "DESTROY_CQ";
constexpr absl::string_view kCreateQpName = "CREATE_QP";
constexpr absl::string_view kDestroyQpName = "DESTROY_QP";
constexpr absl::string_view kRst2InitName = "RST2INIT_QP";
constexpr absl::string_view kInit2RtrName = "INIT2RTR_QP";
constexpr absl::string_view kRtr2RtsName = "RTR2RTS_QP";

// An input mailbox being filled. A value that does not fit its field is the
// caller's parameter out of the PRM range: the first one is kept and
// reported, named, by Finish.
class Mailbox {
 public:
  Mailbox(absl::string_view command, uint16_t opcode, size_t in_bytes, size_t out_bytes)
      : command_(command), in_(in_bytes, 0), out_bytes_(out_bytes) {
    Put("opcode", kCmdIn.opcode, opcode);
  }

  void Put(absl::string_view parameter, Field f, uint64_t value) {
    if (!status_.ok() || Set(in_, f, value)) return;
    if (!f.FitsIn(in_.size())) {
      // Our table, not the caller: a field past the end of its command.
      status_ = absl::InternalError(absl::StrCat(command_, ": field for ", parameter, " at bit ",
                                                 f.bit_offset, " lies outside the ", in_.size(),
                                                 "-byte mailbox"));
      return;
    }
    status_ = absl::InvalidArgumentError(absl::StrCat(command_, ": ", parameter, " = ", value,
                                                      " does not fit its ", f.bit_width,
                                                      "-bit PRM field (0..", f.max_value(), ")"));
  }
  void PutBool(absl::string_view parameter, Field f, bool value) {
    Put(parameter, f, value ? 1 : 0);
  }
  void PutBytes(absl::string_view parameter, Field f, std::span<const uint8_t> bytes) {
    // Byte arrays (GIDs, MACs) are stored as written, most significant first.
    if (!status_.ok()) return;
    const size_t first = f.bit_offset / 8;
    if (f.bit_offset % 8 != 0 || f.bit_width != bytes.size() * 8 ||
        first + bytes.size() > in_.size()) {
      status_ = absl::InternalError(
          absl::StrCat(command_, ": field for ", parameter, " is not a byte run of the mailbox"));
      return;
    }
    std::copy(bytes.begin(), bytes.end(), in_.begin() + static_cast<ptrdiff_t>(first));
  }

  absl::StatusOr<DevxCommand> Finish() && {
    if (!status_.ok()) return status_;
    return DevxCommand{command_, std::move(in_), std::vector<uint8_t>(out_bytes_, 0)};
  }

 private:
  absl::string_view command_;
  std::vector<uint8_t> in_;
  size_t out_bytes_;
  absl::Status status_;
};

absl::Status Invalid(absl::string_view command, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(command, ": ", what));
}

// Doorbell records are two big-endian dwords the NIC reads as one; the CQ
// context even reserves dbr_addr[2:0]. Keep both 8-byte aligned.
absl::Status CheckDbrOffset(absl::string_view command, uint64_t offset) {
  if (offset % 8 == 0) return absl::OkStatus();
  return Invalid(command, absl::StrCat("dbr_offset = ", offset,
                                       " is not a multiple of 8 (the doorbell record is "
                                       "8-byte aligned)"));
}

bool AllZero(std::span<const uint8_t> bytes) {
  for (uint8_t b : bytes) {
    if (b != 0) return false;
  }
  return true;
}

// Fields of a context inside a command.
Field InCreateCq(Field cqc_field) { return cqc_field.In(kCreateCqIn.cq_context); }
Field InCreateQp(Field qpc_field) { return qpc_field.In(kCreateQpIn.qpc); }
Field InModify(Field qpc_field) { return qpc_field.In(kModifyQpIn.qpc); }
Field InModifyPath(Field ads_field) {
  return ads_field.In(kQpc.primary_address_path).In(kModifyQpIn.qpc);
}

struct StatusInfo {
  const char* name;
  absl::StatusCode code;
};
StatusInfo DescribeStatus(uint8_t status) {
  switch (status) {
    case 0x01: return {"internal error", absl::StatusCode::kInternal};
    case 0x02: return {"bad opcode", absl::StatusCode::kInvalidArgument};
    case 0x03: return {"bad parameter", absl::StatusCode::kInvalidArgument};
    case 0x04: return {"bad system state", absl::StatusCode::kFailedPrecondition};
    case 0x05: return {"bad resource", absl::StatusCode::kInvalidArgument};
    case 0x06: return {"resource busy", absl::StatusCode::kUnavailable};
    case 0x08: return {"limits exceeded", absl::StatusCode::kResourceExhausted};
    case 0x09: return {"bad resource state", absl::StatusCode::kFailedPrecondition};
    case 0x0a: return {"bad index", absl::StatusCode::kInvalidArgument};
    case 0x0f: return {"no resources", absl::StatusCode::kResourceExhausted};
    case 0x10: return {"bad QP state", absl::StatusCode::kFailedPrecondition};
    case 0x30: return {"bad packet", absl::StatusCode::kInvalidArgument};
    case 0x40: return {"bad size of outstanding CQEs", absl::StatusCode::kInvalidArgument};
    case 0x50: return {"bad input length", absl::StatusCode::kInvalidArgument};
    case 0x51: return {"bad output length", absl::StatusCode::kInvalidArgument};
    default: return {"unknown status", absl::StatusCode::kInternal};
  }
}

}  // namespace

// ---- outputs ------------------------------------------------------------------------------------

absl::Status CheckCommandOut(absl::string_view command, std::span<const uint8_t> out) {
  if (out.size() < kCmdOutBytes) {
    return Invalid(command, absl::StrCat("output mailbox of ", out.size(), " bytes, need at least ",
                                         kCmdOutBytes));
  }
  const auto status = static_cast<uint8_t>(Get(out, kCmdOut.status));
  if (status == 0) return absl::OkStatus();
  const auto syndrome = static_cast<uint32_t>(Get(out, kCmdOut.syndrome));
  const StatusInfo info = DescribeStatus(status);
  return absl::Status(info.code, absl::StrFormat("%s failed: status 0x%02x (%s), syndrome 0x%08x",
                                                 command, status, info.name, syndrome));
}

// ---- QUERY_HCA_CAP ------------------------------------------------------------------------------

namespace {

// QUERY_HCA_CAP of capability `type` (op_mod = type << 1 | mode).
DevxCommand BuildQueryHcaCap(uint16_t type, HcaCapMode mode) {
  std::vector<uint8_t> in(kQueryHcaCapInBytes, 0);
  const auto op_mod = static_cast<uint16_t>(
      (type << 1) | (mode == HcaCapMode::kMax ? kHcaCapModeMax : kHcaCapModeCurrent));
  // Both fields are in the table and inside 16 bytes (devx_ifc.h asserts it).
  (void)Set(in, kCmdIn.opcode, kCmdQueryHcaCap);
  (void)Set(in, kCmdIn.op_mod, op_mod);
  return DevxCommand{kQueryHcaCapName, std::move(in),
                     std::vector<uint8_t>(kQueryHcaCapOut.bytes, 0)};
}

}  // namespace

DevxCommand BuildQueryGeneralCaps(HcaCapMode mode) {
  return BuildQueryHcaCap(kHcaCapTypeGeneralDevice, mode);
}

absl::StatusOr<HcaGeneralCaps> ParseQueryGeneralCapsOut(std::span<const uint8_t> out) {
  if (absl::Status s = CheckCommandOut(kQueryHcaCapName, out); !s.ok()) return s;
  const Field caps_area = kCmdHcaCap.bits.In(kQueryHcaCapOut.capability);
  if (uint64_t{out.size()} * 8 < caps_area.end_bit()) {
    return Invalid(kQueryHcaCapName, absl::StrCat("output mailbox of ", out.size(),
                                                  " bytes ends inside the general caps (need ",
                                                  caps_area.end_bit() / 8, ")"));
  }
  auto cap = [&](Field f) {
    return static_cast<uint32_t>(Get(out, f.In(kQueryHcaCapOut.capability)));
  };
  HcaGeneralCaps c;
  c.log_max_qp_sz = cap(kCmdHcaCap.log_max_qp_sz);
  c.log_max_cq_sz = cap(kCmdHcaCap.log_max_cq_sz);
  c.log_max_msg = cap(kCmdHcaCap.log_max_msg);
  c.log_max_ra_req_qp = cap(kCmdHcaCap.log_max_ra_req_qp);
  c.log_max_ra_res_qp = cap(kCmdHcaCap.log_max_ra_res_qp);
  // The field holds a code: entries = 8 << code, codes above 4 reserved
  // (Linux mlx5_get_gid_table_len). RoCE ports size their table by the RoCE
  // caps instead; Mlx5Session takes ibv_port_attr.gid_tbl_len, which the
  // kernel decodes right for either.
  const uint32_t gid_code = cap(kCmdHcaCap.gid_table_size);
  c.gid_table_size = gid_code <= 4 ? 8u << gid_code : 0u;
  c.port_type = cap(kCmdHcaCap.port_type);
  c.num_ports = cap(kCmdHcaCap.num_ports);
  c.cqe_version = cap(kCmdHcaCap.cqe_version);
  c.roce = cap(kCmdHcaCap.roce) != 0;
  c.atomic = cap(kCmdHcaCap.atomic) != 0;
  c.rc = cap(kCmdHcaCap.rc) != 0;
  c.log_max_uctx = cap(kCmdHcaCap.log_max_uctx);
  c.log_max_umem = cap(kCmdHcaCap.log_max_umem);
  return c;
}

absl::Status CheckRcOverDevx(const HcaGeneralCaps& caps) {
  std::vector<std::string> missing;
  if (!caps.rc) missing.push_back("no RC transport (cmd_hca_cap.rc = 0)");
  // The kernel's own test for DevX support.
  if (caps.log_max_uctx == 0) missing.push_back("no DevX user contexts (log_max_uctx = 0)");
  if (!caps.atomic) missing.push_back("no RDMA atomics (cmd_hca_cap.atomic = 0)");
  if (caps.port_type == kCapPortTypeEth && !caps.roce) {
    missing.push_back("RoCE disabled on an Ethernet port (enable it: devlink/mlxconfig)");
  } else if (caps.port_type != kCapPortTypeEth && caps.port_type != kCapPortTypeIb) {
    missing.push_back(absl::StrCat("unknown port_type ", caps.port_type));
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("mlx5 device cannot run RC QPs over DevX: ", absl::StrJoin(missing, "; ")));
}

DevxCommand BuildQueryAtomicCaps(HcaCapMode mode) {
  return BuildQueryHcaCap(kHcaCapTypeAtomic, mode);
}

absl::StatusOr<HcaAtomicCaps> ParseQueryAtomicCapsOut(std::span<const uint8_t> out) {
  if (absl::Status s = CheckCommandOut(kQueryHcaCapName, out); !s.ok()) return s;
  const Field last = kAtomicCaps.atomic_size_dc.In(kQueryHcaCapOut.capability);
  if (uint64_t{out.size()} * 8 < last.end_bit()) {
    return Invalid(kQueryHcaCapName, absl::StrCat("output mailbox of ", out.size(),
                                                  " bytes ends inside the atomic caps"));
  }
  auto cap = [&](Field f) {
    return static_cast<uint32_t>(Get(out, f.In(kQueryHcaCapOut.capability)));
  };
  HcaAtomicCaps c;
  c.operations = cap(kAtomicCaps.atomic_operations);
  c.size_qp = cap(kAtomicCaps.atomic_size_qp);
  c.req_8b_endianness_mode = cap(kAtomicCaps.atomic_req_8b_endianness_mode);
  c.endianness_mode_1_supported = cap(kAtomicCaps.supported_atomic_req_8b_endianness_mode_1) != 0;
  return c;
}

absl::Status CheckAtomics(const HcaAtomicCaps& caps) {
  std::vector<std::string> missing;
  if ((caps.operations & kAtomicOpsFetchAdd) == 0) {
    missing.push_back("8-byte fetch-add (atomic_operations lacks FETCH_ADD)");
  }
  if ((caps.operations & kAtomicOpsMaskedFetchAdd) == 0) {
    missing.push_back("4-byte masked fetch-add (atomic_operations lacks EXTENDED_FETCH_ADD)");
  }
  if ((caps.size_qp & kAtomicSize8Bytes) == 0) {
    missing.push_back("8-byte operands on RC QPs (atomic_size_qp lacks 8 bytes)");
  }
  if ((caps.size_qp & kAtomicSize4Bytes) == 0) {
    missing.push_back("4-byte operands on RC QPs (atomic_size_qp lacks 4 bytes)");
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the NIC's atomics do not cover what kernels post: ", absl::StrJoin(missing, "; "),
      ". Enable them in the firmware (mlxconfig: the PCI atomic mode, e.g. "
      "PCI_ATOMIC_MODE, and a reset), or update the firmware"));
}

std::string DescribeAtomics(const HcaAtomicCaps& caps) {
  std::vector<std::string> parts;
  if (caps.operations & kAtomicOpsFetchAdd) parts.push_back("fetch-add");
  if (caps.operations & kAtomicOpsCmpSwap) parts.push_back("cmp-swap");
  if (caps.operations & kAtomicOpsMaskedFetchAdd) parts.push_back("masked-fetch-add");
  if (caps.operations & kAtomicOpsMaskedCmpSwap) parts.push_back("masked-cmp-swap");
  std::vector<std::string> sizes;
  for (uint32_t b = 1; b <= 256; b <<= 1) {
    if (caps.size_qp & b) sizes.push_back(absl::StrCat(b));
  }
  return absl::StrCat(parts.empty() ? "none" : absl::StrJoin(parts, ","), "; sizes ",
                      sizes.empty() ? "none" : absl::StrJoin(sizes, ","), " B; 8-byte replies ",
                      caps.req_8b_endianness_mode != 0 ? "host order" : "big-endian");
}

// ---- CQ -----------------------------------------------------------------------------------------

absl::StatusOr<DevxCommand> BuildCreateCq(const CreateCqParams& p) {
  constexpr absl::string_view cmd = kCreateCqName;
  if (p.cqe_size != CqeSize::k64Bytes && p.cqe_size != CqeSize::k128Bytes) {
    return Invalid(cmd, absl::StrCat("cqe_size enum value ", static_cast<int>(p.cqe_size),
                                     " is neither 64 (0) nor 128 (1) bytes"));
  }
  if (absl::Status s = CheckDbrOffset(cmd, p.dbr_offset); !s.ok()) return s;

  Mailbox m(cmd, kCmdCreateCq, kCreateCqIn.bytes, kCmdOutBytes);
  m.Put("log_cq_size", InCreateCq(kCqc.log_cq_size), p.log_cq_size);
  m.Put("cqe_size", InCreateCq(kCqc.cqe_sz), static_cast<uint64_t>(p.cqe_size));
  m.Put("uar_page", InCreateCq(kCqc.uar_page), p.uar_page);
  m.Put("eqn", InCreateCq(kCqc.c_eqn), p.eqn);
  m.PutBool("overrun_ignore", InCreateCq(kCqc.oi), p.overrun_ignore);
  // Both rings live in umem the client registered: no pas list follows.
  m.PutBool("dbr_umem_valid", InCreateCq(kCqc.dbr_umem_valid), true);
  m.Put("dbr_umem_id", InCreateCq(kCqc.dbr_umem_id), p.dbr_umem_id);
  m.Put("dbr_offset", InCreateCq(kCqc.dbr_addr), p.dbr_offset);
  m.PutBool("cq_umem_valid", kCreateCqIn.cq_umem_valid, true);
  m.Put("cq_umem_id", kCreateCqIn.cq_umem_id, p.cq_umem_id);
  m.Put("cq_umem_offset", kCreateCqIn.cq_umem_offset, p.cq_umem_offset);
  return std::move(m).Finish();
}

absl::StatusOr<uint32_t> ParseCreateCqOut(std::span<const uint8_t> out) {
  if (absl::Status s = CheckCommandOut(kCreateCqName, out); !s.ok()) return s;
  return static_cast<uint32_t>(Get(out, kCqnField));
}

absl::StatusOr<DevxCommand> BuildDestroyCq(uint32_t cqn) {
  Mailbox m(kDestroyCqName, kCmdDestroyCq, kDestroyCqInBytes, kCmdOutBytes);
  m.Put("cqn", kCqnField, cqn);
  return std::move(m).Finish();
}

// ---- QP -----------------------------------------------------------------------------------------

absl::StatusOr<DevxCommand> BuildCreateQp(const CreateQpParams& p) {
  constexpr absl::string_view cmd = kCreateQpName;
  if (p.ts_format != TimestampFormat::kFreeRunning && p.ts_format != TimestampFormat::kDefault &&
      p.ts_format != TimestampFormat::kRealTime) {
    return Invalid(cmd, absl::StrCat("ts_format enum value ", static_cast<int>(p.ts_format),
                                     " is not free-running (0), default (1) or real-time (2)"));
  }
  if (absl::Status s = CheckDbrOffset(cmd, p.dbr_offset); !s.ok()) return s;

  Mailbox m(cmd, kCmdCreateQp, kCreateQpIn.bytes, kCmdOutBytes);
  m.Put("st", InCreateQp(kQpc.st), kQpcStRc);
  // No alternate path is ever loaded, so the QP starts (and stays) migrated.
  m.Put("pm_state", InCreateQp(kQpc.pm_state), kQpcPmStateMigrated);
  m.Put("pd", InCreateQp(kQpc.pd), p.pd);
  m.Put("uar_page", InCreateQp(kQpc.uar_page), p.uar_page);
  m.Put("user_index", InCreateQp(kQpc.user_index), p.user_index);
  m.Put("log_msg_max", InCreateQp(kQpc.log_msg_max), p.log_msg_max);
  m.Put("log_sq_size", InCreateQp(kQpc.log_sq_size), p.log_sq_size);
  m.Put("ts_format", InCreateQp(kQpc.ts_format), static_cast<uint64_t>(p.ts_format));
  // Send-only: a zero-size RQ (log_rq_size and log_rq_stride stay 0) and
  // no_sq stays 0.
  m.Put("rq_type", InCreateQp(kQpc.rq_type), kQpcRqTypeZeroSize);
  m.Put("cqn_snd", InCreateQp(kQpc.cqn_snd), p.cqn_snd);
  m.Put("cqn_rcv", InCreateQp(kQpc.cqn_rcv), p.cqn_rcv);
  m.PutBool("dbr_umem_valid", InCreateQp(kQpc.dbr_umem_valid), true);
  m.Put("dbr_umem_id", InCreateQp(kQpc.dbr_umem_id), p.dbr_umem_id);
  m.Put("dbr_offset", InCreateQp(kQpc.dbr_addr), p.dbr_offset);
  m.PutBool("wq_umem_valid", kCreateQpIn.wq_umem_valid, true);
  m.Put("wq_umem_id", kCreateQpIn.wq_umem_id, p.wq_umem_id);
  m.Put("wq_umem_offset", kCreateQpIn.wq_umem_offset, p.wq_umem_offset);
  return std::move(m).Finish();
}

absl::StatusOr<uint32_t> ParseCreateQpOut(std::span<const uint8_t> out) {
  if (absl::Status s = CheckCommandOut(kCreateQpName, out); !s.ok()) return s;
  return static_cast<uint32_t>(Get(out, kQpnField));
}

absl::StatusOr<DevxCommand> BuildDestroyQp(uint32_t qpn) {
  Mailbox m(kDestroyQpName, kCmdDestroyQp, kDestroyQpInBytes, kCmdOutBytes);
  m.Put("qpn", kQpnField, qpn);
  return std::move(m).Finish();
}

// The three transitions carry only required fields, so opt_param_mask
// stays 0 (as in rdma-core's own DevX RC tests).

absl::StatusOr<DevxCommand> BuildRst2Init(const Rst2InitParams& p) {
  constexpr absl::string_view cmd = kRst2InitName;
  const auto mode = static_cast<uint32_t>(p.atomic_mode);
  if (p.remote_atomic && (mode < static_cast<uint32_t>(AtomicMode::kIbCompatible) ||
                          mode > static_cast<uint32_t>(AtomicMode::kUpTo256Bytes))) {
    return Invalid(cmd, absl::StrCat("remote_atomic needs an atomic_mode of 1..8, got ", mode));
  }
  if (!p.remote_atomic && p.atomic_mode != AtomicMode::kNone) {
    return Invalid(cmd, absl::StrCat("atomic_mode ", mode, " without remote_atomic"));
  }
  if (p.port == 0) return Invalid(cmd, "port = 0: ports are numbered from 1");

  Mailbox m(cmd, kCmdRst2InitQp, kModifyQpIn.bytes, kCmdOutBytes);
  m.Put("qpn", kModifyQpIn.qpn, p.qpn);
  m.Put("pm_state", InModify(kQpc.pm_state), kQpcPmStateMigrated);
  m.PutBool("remote_read", InModify(kQpc.rre), p.remote_read);
  m.PutBool("remote_write", InModify(kQpc.rwe), p.remote_write);
  m.PutBool("remote_atomic", InModify(kQpc.rae), p.remote_atomic);
  m.Put("atomic_mode", InModify(kQpc.atomic_mode), mode);
  m.Put("pkey_index", InModifyPath(kAds.pkey_index), p.pkey_index);
  m.Put("port", InModifyPath(kAds.vhca_port_num), p.port);
  return std::move(m).Finish();
}

absl::StatusOr<DevxCommand> BuildInit2Rtr(const Init2RtrParams& p) {
  constexpr absl::string_view cmd = kInit2RtrName;
  const auto mtu = static_cast<uint32_t>(p.mtu);
  if (mtu < static_cast<uint32_t>(PathMtu::k256) || mtu > static_cast<uint32_t>(PathMtu::k4096)) {
    return Invalid(cmd, absl::StrCat("mtu enum value ", mtu, " is not one of 256..4096 (1..5)"));
  }
  if (p.port == 0) return Invalid(cmd, "port = 0: ports are numbered from 1");
  const bool ethernet = p.link_layer == LinkLayer::kEthernet;
  if (!ethernet && p.link_layer != LinkLayer::kInfiniBand) {
    return Invalid(cmd, absl::StrCat("link_layer enum value ", static_cast<int>(p.link_layer),
                                     " is neither InfiniBand nor Ethernet"));
  }
  if (!ethernet && (p.rlid == 0 || p.rlid > 0xbfff)) {
    return Invalid(cmd, absl::StrFormat("rlid = 0x%x is not a unicast LID (0x0001..0xbfff); "
                                        "InfiniBand needs the peer port's LID",
                                        p.rlid));
  }
  if (ethernet && p.sl > 7) {
    return Invalid(cmd, absl::StrCat("sl = ", p.sl, " is not an Ethernet priority (0..7)"));
  }
  const bool grh = ethernet || p.grh;
  if (grh && AllZero(p.rgid)) {
    return Invalid(cmd, ethernet ? "rgid is all zero: RoCE needs the peer's GID"
                                 : "grh set but rgid is all zero");
  }
  if (ethernet && AllZero(p.rmac)) {
    return Invalid(cmd, "rmac is all zero: RoCE needs the next hop's MAC address");
  }
  if (ethernet && !p.roce_v2 && p.udp_sport != 0) {
    return Invalid(cmd, absl::StrCat("udp_sport = ", p.udp_sport,
                                     " with a RoCE v1 GID: the field is reserved there (use 0)"));
  }

  Mailbox m(cmd, kCmdInit2RtrQp, kModifyQpIn.bytes, kCmdOutBytes);
  m.Put("qpn", kModifyQpIn.qpn, p.qpn);
  m.Put("mtu", InModify(kQpc.mtu), mtu);
  m.Put("log_msg_max", InModify(kQpc.log_msg_max), p.log_msg_max);
  m.Put("remote_qpn", InModify(kQpc.remote_qpn), p.remote_qpn);
  m.Put("next_rcv_psn", InModify(kQpc.next_rcv_psn), p.next_rcv_psn);
  m.Put("log_rra_max", InModify(kQpc.log_rra_max), p.log_rra_max);
  m.Put("min_rnr_nak", InModify(kQpc.min_rnr_nak), p.min_rnr_nak);
  m.Put("port", InModifyPath(kAds.vhca_port_num), p.port);
  if (ethernet) {
    // RoCE: no LID and no grh bit (the GRH is implied); the L2 next hop
    // and the 802.1p priority go in the Ethernet fields.
    m.Put("sl", InModifyPath(kAds.eth_prio), p.sl);
    const uint64_t rmac_47_32 = (uint64_t{p.rmac[0]} << 8) | p.rmac[1];
    const uint64_t rmac_31_0 = (uint64_t{p.rmac[2]} << 24) | (uint64_t{p.rmac[3]} << 16) |
                               (uint64_t{p.rmac[4]} << 8) | p.rmac[5];
    m.Put("rmac", InModifyPath(kAds.rmac_47_32), rmac_47_32);
    m.Put("rmac", InModifyPath(kAds.rmac_31_0), rmac_31_0);
    if (p.roce_v2) {
      // RoCE v2 packets are UDP/IP: the source port spreads flows over ECMP
      // paths and the IP DSCP is the traffic class without its ECN bits.
      m.Put("udp_sport", InModifyPath(kAds.udp_sport), p.udp_sport);
      m.Put("traffic_class", InModifyPath(kAds.dscp), (p.traffic_class >> 2) & 0x3f);
    }
  } else {
    m.Put("rlid", InModifyPath(kAds.rlid), p.rlid);
    m.Put("sl", InModifyPath(kAds.sl), p.sl);
    m.PutBool("grh", InModifyPath(kAds.grh), p.grh);
  }
  if (grh) {
    m.Put("gid_index", InModifyPath(kAds.src_addr_index), p.gid_index);
    m.Put("hop_limit", InModifyPath(kAds.hop_limit), p.hop_limit);
    m.Put("traffic_class", InModifyPath(kAds.tclass), p.traffic_class);
    m.Put("flow_label", InModifyPath(kAds.flow_label), p.flow_label);
    m.PutBytes("rgid", InModifyPath(kAds.rgid_rip), p.rgid);
  }
  return std::move(m).Finish();
}

absl::StatusOr<DevxCommand> BuildRtr2Rts(const Rtr2RtsParams& p) {
  constexpr absl::string_view cmd = kRtr2RtsName;
  if (p.port == 0) return Invalid(cmd, "port = 0: ports are numbered from 1");
  Mailbox m(cmd, kCmdRtr2RtsQp, kModifyQpIn.bytes, kCmdOutBytes);
  m.Put("qpn", kModifyQpIn.qpn, p.qpn);
  m.Put("next_send_psn", InModify(kQpc.next_send_psn), p.next_send_psn);
  m.Put("log_sra_max", InModify(kQpc.log_sra_max), p.log_sra_max);
  m.Put("retry_count", InModify(kQpc.retry_count), p.retry_count);
  m.Put("rnr_retry", InModify(kQpc.rnr_retry), p.rnr_retry);
  m.Put("ack_timeout", InModifyPath(kAds.ack_timeout), p.ack_timeout);
  m.Put("port", InModifyPath(kAds.vhca_port_num), p.port);
  return std::move(m).Finish();
}

// ---- device limits ------------------------------------------------------------------------------

namespace {

absl::Status AtMost(absl::string_view command, absl::string_view parameter, uint32_t value,
                    absl::string_view cap_name, uint32_t cap) {
  if (value <= cap) return absl::OkStatus();
  return Invalid(command, absl::StrCat(parameter, " = ", value, " exceeds the device's ", cap_name,
                                       " = ", cap));
}

}  // namespace

absl::Status CheckAgainstCaps(const CreateCqParams& p, const HcaGeneralCaps& caps) {
  return AtMost(kCreateCqName, "log_cq_size", p.log_cq_size, "log_max_cq_sz", caps.log_max_cq_sz);
}

absl::Status CheckAgainstCaps(const CreateQpParams& p, const HcaGeneralCaps& caps) {
  // log_max_qp_sz bounds the SQ in 64-byte basic blocks, our unit.
  if (absl::Status s =
          AtMost(kCreateQpName, "log_sq_size", p.log_sq_size, "log_max_qp_sz", caps.log_max_qp_sz);
      !s.ok()) {
    return s;
  }
  return AtMost(kCreateQpName, "log_msg_max", p.log_msg_max, "log_max_msg", caps.log_max_msg);
}

absl::Status CheckAgainstCaps(const Init2RtrParams& p, const HcaGeneralCaps& caps) {
  constexpr absl::string_view cmd = kInit2RtrName;
  const bool ethernet = p.link_layer == LinkLayer::kEthernet;
  if (ethernet != (caps.port_type == kCapPortTypeEth)) {
    return Invalid(cmd,
                   absl::StrCat("link_layer is ", ethernet ? "Ethernet" : "InfiniBand",
                                " but the device's port_type is ",
                                caps.port_type == kCapPortTypeEth ? "Ethernet" : "InfiniBand"));
  }
  if ((ethernet || p.grh) && p.gid_index >= caps.gid_table_size) {
    return Invalid(cmd, absl::StrCat("gid_index = ", p.gid_index, " is outside the GID table of ",
                                     caps.gid_table_size, " entries"));
  }
  if (absl::Status s = AtMost(cmd, "log_msg_max", p.log_msg_max, "log_max_msg", caps.log_max_msg);
      !s.ok()) {
    return s;
  }
  return AtMost(cmd, "log_rra_max", p.log_rra_max, "log_max_ra_res_qp", caps.log_max_ra_res_qp);
}

absl::Status CheckAgainstCaps(const Rtr2RtsParams& p, const HcaGeneralCaps& caps) {
  return AtMost(kRtr2RtsName, "log_sra_max", p.log_sra_max, "log_max_ra_req_qp",
                caps.log_max_ra_req_qp);
}

}  // namespace mooncake::daemon::mlx5
