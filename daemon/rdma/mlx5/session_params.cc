#include "rdma/mlx5/session_params.h"

#include <algorithm>
#include <cerrno>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace mooncake::daemon::mlx5 {

namespace {

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

bool SuitsLinkLayer(GidType type, LinkLayer link_layer) {
  return link_layer == LinkLayer::kInfiniBand ? type == GidType::kIb : type != GidType::kIb;
}

const char* LinkLayerName(LinkLayer link_layer) {
  return link_layer == LinkLayer::kEthernet ? "Ethernet" : "InfiniBand";
}

// Lower is better; RoCE GIDs only (ChooseGid).
int RoceRank(const GidEntry& e) {
  if (e.type == GidType::kRoceV2) {
    if (IsIpv4MappedGid(e.gid)) return 0;
    if (!IsLinkLocalGid(e.gid)) return 1;
    return 2;
  }
  return 3;
}

}  // namespace

// ---- GIDs ---------------------------------------------------------------------------------------

const char* GidTypeName(GidType type) {
  switch (type) {
    case GidType::kIb: return "IB";
    case GidType::kRoceV1: return "RoCE v1";
    case GidType::kRoceV2: return "RoCE v2";
  }
  return "unknown";
}

bool IsZeroGid(const Gid& gid) {
  return std::all_of(gid.begin(), gid.end(), [](uint8_t b) { return b == 0; });
}

bool IsIpv4MappedGid(const Gid& gid) {
  for (int i = 0; i < 10; ++i) {
    if (gid[i] != 0) return false;
  }
  return gid[10] == 0xff && gid[11] == 0xff;
}

bool IsLinkLocalGid(const Gid& gid) { return gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80; }

std::string FormatGid(const Gid& gid) {
  std::string out;
  for (int i = 0; i < 16; i += 2) {
    if (i != 0) out.push_back(':');
    absl::StrAppendFormat(&out, "%02x%02x", gid[i], gid[i + 1]);
  }
  return out;
}

absl::StatusOr<GidEntry> ChooseGid(const std::vector<GidEntry>& port_gids, LinkLayer link_layer,
                                   std::optional<uint32_t> override_index) {
  if (override_index.has_value()) {
    for (const GidEntry& e : port_gids) {
      if (e.index != *override_index || IsZeroGid(e.gid)) continue;
      if (!SuitsLinkLayer(e.type, link_layer)) {
        return Invalid(absl::StrCat("GID index ", e.index, " (", FormatGid(e.gid), ") is a ",
                                    GidTypeName(e.type), " GID, not usable on an ",
                                    LinkLayerName(link_layer), " port"));
      }
      return e;
    }
    std::vector<uint32_t> indices;
    for (const GidEntry& e : port_gids) {
      if (!IsZeroGid(e.gid)) indices.push_back(e.index);
    }
    std::sort(indices.begin(), indices.end());
    return absl::NotFoundError(absl::StrCat(
        "configured GID index ", *override_index, " is not populated on this port",
        indices.empty() ? std::string("; the port has no GIDs")
                        : absl::StrCat("; populated indices: ", absl::StrJoin(indices, ", "))));
  }

  const GidEntry* best = nullptr;
  int best_rank = std::numeric_limits<int>::max();
  for (const GidEntry& e : port_gids) {
    if (IsZeroGid(e.gid) || !SuitsLinkLayer(e.type, link_layer)) continue;
    const int rank = link_layer == LinkLayer::kEthernet ? RoceRank(e) : 0;
    if (best == nullptr || rank < best_rank || (rank == best_rank && e.index < best->index)) {
      best = &e;
      best_rank = rank;
    }
  }
  if (best != nullptr) return *best;
  if (link_layer == LinkLayer::kEthernet) {
    return absl::NotFoundError(
        "no RoCE GID on this port: its netdev has no IP address or is down (assign an address "
        "to the netdev, or set the GID index explicitly)");
  }
  return absl::NotFoundError("no InfiniBand GID on this port (is the port initialized?)");
}

// ---- MTU ----------------------------------------------------------------------------------------

absl::StatusOr<PathMtu> NegotiatePathMtu(uint32_t local_active_mtu, uint32_t remote_mtu) {
  constexpr auto kMin = static_cast<uint32_t>(PathMtu::k256);
  constexpr auto kMax = static_cast<uint32_t>(PathMtu::k4096);
  if (local_active_mtu < kMin || local_active_mtu > kMax) {
    return Invalid(absl::StrCat("local active MTU code ", local_active_mtu,
                                " is not one of 1..5 (256..4096 bytes)"));
  }
  if (remote_mtu < kMin || remote_mtu > kMax) {
    return Invalid(
        absl::StrCat("remote MTU code ", remote_mtu, " is not one of 1..5 (256..4096 bytes)"));
  }
  return static_cast<PathMtu>(std::min(local_active_mtu, remote_mtu));
}

uint32_t PathMtuBytes(PathMtu mtu) { return 128u << static_cast<uint32_t>(mtu); }

// ---- RoCE v2 UDP source port --------------------------------------------------------------------

uint32_t RoceFlowLabel(uint32_t local_qpn, uint32_t remote_qpn) {
  uint64_t v = uint64_t{local_qpn} * remote_qpn;
  v ^= v >> 20;
  v ^= v >> 40;
  return static_cast<uint32_t>(v & 0xfffff);
}

uint16_t RoceUdpSourcePort(uint32_t flow_label) {
  uint32_t low = flow_label & 0x03fff;
  const uint32_t high = flow_label & 0xfc000;
  low ^= high >> 14;
  return static_cast<uint16_t>(low | 0xc000);
}

// ---- memory access ------------------------------------------------------------------------------

absl::StatusOr<uint32_t> RegistrationAccess(uint32_t access) {
  if ((access & ~kMrAccessAll) != 0) {
    return Invalid(absl::StrFormat(
        "access 0x%x has bits outside local write, remote write, remote read and remote "
        "atomic (0x%x)",
        access, kMrAccessAll));
  }
  return access | kMrLocalWrite;
}

absl::Status CheckDmabufRange(uint64_t offset, uint64_t length, uint64_t iova, uint64_t page_size) {
  if (length == 0) return Invalid("dmabuf registration of 0 bytes");
  if (!IsPowerOfTwo(page_size)) {
    return Invalid(absl::StrCat("page size ", page_size, " is not a power of two"));
  }
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  if (offset > kMax - length) {
    return Invalid(absl::StrCat("dmabuf offset ", offset, " + length ", length, " overflows"));
  }
  if (iova > kMax - length) {
    return Invalid(absl::StrFormat("iova 0x%x + length %d overflows", iova, length));
  }
  if (iova % page_size != offset % page_size) {
    return Invalid(absl::StrFormat(
        "iova 0x%x and dmabuf offset 0x%x lie at different offsets into a %d-byte page "
        "(0x%x and 0x%x); ibv_reg_dmabuf_mr needs them equal",
        iova, offset, page_size, iova % page_size, offset % page_size));
  }
  return absl::OkStatus();
}

bool DmabufRefusalAllowsFallback(int err) {
  return err == EOPNOTSUPP || err == EPROTONOSUPPORT || err == ENOSYS || err == EINVAL;
}

// ---- umem and rings -----------------------------------------------------------------------------

absl::Status CheckUmemRange(absl::string_view what, uint64_t start, uint64_t bytes) {
  if (bytes == 0) return Invalid(absl::StrCat(what, ": umem of 0 bytes"));
  if (start % kUmemPageSize != 0 || bytes % kUmemPageSize != 0) {
    return Invalid(absl::StrFormat("%s: umem start 0x%x and size %d must be multiples of %d", what,
                                   start, bytes, kUmemPageSize));
  }
  if (start > std::numeric_limits<uint64_t>::max() - bytes) {
    return Invalid(absl::StrFormat("%s: umem start 0x%x + size %d overflows", what, start, bytes));
  }
  return absl::OkStatus();
}

uint32_t Log2(uint64_t power_of_two) {
  uint32_t log = 0;
  while (power_of_two > 1) {
    power_of_two >>= 1;
    ++log;
  }
  return log;
}

namespace {

struct Span {
  const char* name;
  RingPlacement at;
  uint64_t bytes;
  uint64_t alignment;
};

}  // namespace

absl::Status ValidateQpRings(const QpRings& rings,
                             const absl::flat_hash_map<uint32_t, uint64_t>& umem_bytes) {
  if (!IsPowerOfTwo(rings.sq_wqe_cnt) || rings.sq_wqe_cnt > kMaxSqWqeCnt) {
    return Invalid(absl::StrCat("sq_wqe_cnt ", rings.sq_wqe_cnt, " is not a power of two in 1..",
                                kMaxSqWqeCnt));
  }
  // The CQE count's own limit is the device's (log_max_cq_sz, checked
  // against the caps when the CQ is built); here only its relation to the SQ.
  if (!IsPowerOfTwo(rings.cq_cqe_cnt) || rings.cq_cqe_cnt < rings.sq_wqe_cnt) {
    return Invalid(absl::StrCat("cq_cqe_cnt ", rings.cq_cqe_cnt,
                                " is not a power of two >= sq_wqe_cnt (", rings.sq_wqe_cnt, ")"));
  }
  const Span spans[] = {
      {"sq", rings.sq, uint64_t{rings.sq_wqe_cnt} * kWqeBasicBlockBytes, kUmemPageSize},
      {"sq_dbrec", rings.sq_dbrec, kDbrecBytes, kDbrecBytes},
      {"cq", rings.cq, uint64_t{rings.cq_cqe_cnt} * kCqeBytes, kUmemPageSize},
      {"cq_dbrec", rings.cq_dbrec, kDbrecBytes, kDbrecBytes},
  };
  for (const Span& s : spans) {
    auto it = umem_bytes.find(s.at.umem_id);
    if (it == umem_bytes.end()) {
      return Invalid(
          absl::StrCat(s.name, ": umem ", s.at.umem_id, " is not registered in this session"));
    }
    if (s.at.offset % s.alignment != 0) {
      return Invalid(
          absl::StrCat(s.name, ": offset ", s.at.offset, " is not a multiple of ", s.alignment));
    }
    if (s.at.offset > it->second || s.bytes > it->second - s.at.offset) {
      return Invalid(absl::StrCat(s.name, ": ", s.bytes, " bytes at offset ", s.at.offset,
                                  " do not fit umem ", s.at.umem_id, " of ", it->second, " bytes"));
    }
  }
  for (size_t i = 0; i < std::size(spans); ++i) {
    for (size_t j = i + 1; j < std::size(spans); ++j) {
      const Span& a = spans[i];
      const Span& b = spans[j];
      if (a.at.umem_id != b.at.umem_id) continue;
      if (a.at.offset < b.at.offset + b.bytes && b.at.offset < a.at.offset + a.bytes) {
        return Invalid(absl::StrCat(a.name, " [", a.at.offset, ", ", a.at.offset + a.bytes,
                                    ") overlaps ", b.name, " [", b.at.offset, ", ",
                                    b.at.offset + b.bytes, ") in umem ", a.at.umem_id));
      }
    }
  }
  return absl::OkStatus();
}

CreateCqParams MakeCreateCqParams(const QpRings& rings, uint32_t uar_page, uint32_t eqn) {
  CreateCqParams p;
  p.log_cq_size = Log2(rings.cq_cqe_cnt);
  p.cqe_size = CqeSize::k64Bytes;
  p.uar_page = uar_page;
  p.eqn = eqn;
  p.overrun_ignore = true;
  p.cq_umem_id = rings.cq.umem_id;
  p.cq_umem_offset = rings.cq.offset;
  p.dbr_umem_id = rings.cq_dbrec.umem_id;
  p.dbr_offset = rings.cq_dbrec.offset;
  return p;
}

CreateQpParams MakeCreateQpParams(const QpRings& rings, uint32_t pdn, uint32_t uar_page,
                                  uint32_t cqn, const HcaGeneralCaps& caps) {
  CreateQpParams p;
  p.pd = pdn;
  p.uar_page = uar_page;
  p.cqn_snd = cqn;
  p.cqn_rcv = cqn;
  p.log_sq_size = Log2(rings.sq_wqe_cnt);
  p.log_msg_max = caps.log_max_msg;
  p.user_index = 0;
  p.ts_format = TimestampFormat::kDefault;
  p.wq_umem_id = rings.sq.umem_id;
  p.wq_umem_offset = rings.sq.offset;
  p.dbr_umem_id = rings.sq_dbrec.umem_id;
  p.dbr_offset = rings.sq_dbrec.offset;
  return p;
}

// ---- connecting ---------------------------------------------------------------------------------

absl::Status ValidateConnectTuning(const ConnectTuning& t, LinkLayer link_layer) {
  auto at_most = [](const char* name, uint32_t value, uint32_t max) -> absl::Status {
    if (value <= max) return absl::OkStatus();
    return Invalid(absl::StrCat(name, " = ", value, " is outside 0..", max));
  };
  const bool ethernet = link_layer == LinkLayer::kEthernet;
  absl::Status s = at_most("traffic_class", t.traffic_class, 255);
  if (s.ok()) {
    s = ethernet ? at_most("service_level (Ethernet priority)", t.service_level, 7)
                 : at_most("service_level", t.service_level, 15);
  }
  if (s.ok() && (t.hop_limit == 0 || t.hop_limit > 255)) {
    s = Invalid(absl::StrCat("hop_limit = ", t.hop_limit, " is outside 1..255"));
  }
  if (s.ok()) s = at_most("ack_timeout", t.ack_timeout, 31);
  if (s.ok()) s = at_most("retry_count", t.retry_count, 7);
  if (s.ok()) s = at_most("rnr_retry", t.rnr_retry, 7);
  if (s.ok()) s = at_most("min_rnr_nak", t.min_rnr_nak, 31);
  if (s.ok()) s = at_most("pkey_index", t.pkey_index, 0xffff);
  if (s.ok()) s = at_most("flow_label", t.flow_label, 0xfffff);
  if (s.ok() && t.udp_sport != 0 && (t.udp_sport < 0xc000 || t.udp_sport > 0xffff)) {
    s = Invalid(absl::StrFormat("udp_sport = %d is neither 0 (derived) nor in 0xc000..0xffff",
                                t.udp_sport));
  }
  if (s.ok() && t.log_max_rd_atomic.has_value()) {
    s = at_most("log_max_rd_atomic", *t.log_max_rd_atomic, 7);
  }
  if (s.ok() && t.atomic_mode == AtomicMode::kNone) {
    s = Invalid("atomic_mode none: the QPs answer remote atomics (mc_red_add), pick a size");
  }
  return s;
}

absl::Duration NicRetryBudget(const ConnectTuning& tuning) {
  if (tuning.ack_timeout == 0) return absl::InfiniteDuration();
  const double per_try_us = 4.096 * static_cast<double>(uint64_t{1} << tuning.ack_timeout);
  return absl::Microseconds(per_try_us * (tuning.retry_count + 1));
}

absl::StatusOr<ConnectPlan> PlanConnect(uint32_t local_qpn, uint32_t local_psn,
                                        const LocalPort& local, const HcaGeneralCaps& caps,
                                        const RemoteQp& remote, const ConnectTuning& tuning) {
  if (absl::Status s = ValidateConnectTuning(tuning, local.link_layer); !s.ok()) return s;
  if (local_qpn == 0 || local_qpn > 0xffffff) {
    return Invalid(absl::StrCat("local QPN ", local_qpn, " is outside 1..0xffffff"));
  }
  if (remote.qpn == 0 || remote.qpn > 0xffffff) {
    return Invalid(absl::StrCat("remote QPN ", remote.qpn, " is outside 1..0xffffff"));
  }
  if (local_psn > 0xffffff) {
    return Invalid(absl::StrCat("local PSN ", local_psn, " does not fit 24 bits"));
  }
  if (remote.psn > 0xffffff) {
    return Invalid(absl::StrCat("remote PSN ", remote.psn, " does not fit 24 bits"));
  }
  absl::StatusOr<PathMtu> mtu = NegotiatePathMtu(local.active_mtu, remote.mtu);
  if (!mtu.ok()) return mtu.status();

  const bool ethernet = local.link_layer == LinkLayer::kEthernet;
  const bool grh = ethernet || tuning.ib_global_route;
  if (grh && IsZeroGid(remote.gid)) {
    return Invalid(ethernet ? "the peer sent no GID: RoCE addresses QPs by GID"
                            : "ib_global_route is set but the peer sent no GID");
  }
  if (grh && !SuitsLinkLayer(local.gid.type, local.link_layer)) {
    return Invalid(absl::StrCat("local GID index ", local.gid.index, " is a ",
                                GidTypeName(local.gid.type), " GID on an ",
                                LinkLayerName(local.link_layer), " port"));
  }
  if (ethernet && remote.gid_type.has_value() && *remote.gid_type != local.gid.type) {
    return absl::FailedPreconditionError(absl::StrCat(
        "RoCE version mismatch: this end uses a ", GidTypeName(local.gid.type), " GID (index ",
        local.gid.index, ") and the peer a ", GidTypeName(*remote.gid_type),
        " GID; configure both ends for the same version"));
  }
  if (!ethernet && (remote.lid == 0 || remote.lid > 0xbfff)) {
    return Invalid(absl::StrFormat(
        "the peer's LID 0x%x is not a unicast LID (0x0001..0xbfff): InfiniBand addresses QPs by "
        "LID (is the peer's port active and its subnet manager running?)",
        remote.lid));
  }

  const uint32_t rd_atomic_req = tuning.log_max_rd_atomic.value_or(caps.log_max_ra_req_qp);
  const uint32_t rd_atomic_res = tuning.log_max_rd_atomic.value_or(caps.log_max_ra_res_qp);

  ConnectPlan plan;
  Rst2InitParams& init = plan.rst2init;
  init.qpn = local_qpn;
  init.port = local.port;
  init.pkey_index = tuning.pkey_index;
  init.remote_read = true;
  init.remote_write = true;
  init.remote_atomic = true;
  init.atomic_mode = tuning.atomic_mode;

  Init2RtrParams& rtr = plan.init2rtr;
  rtr.qpn = local_qpn;
  rtr.mtu = *mtu;
  rtr.log_msg_max = caps.log_max_msg;
  rtr.remote_qpn = remote.qpn;
  rtr.next_rcv_psn = remote.psn;
  rtr.log_rra_max = std::min<uint32_t>(rd_atomic_res, 7);
  rtr.min_rnr_nak = tuning.min_rnr_nak;
  rtr.port = local.port;
  rtr.link_layer = local.link_layer;
  rtr.sl = tuning.service_level;
  if (ethernet) {
    plan.needs_remote_mac = true;
    rtr.roce_v2 = local.gid.type == GidType::kRoceV2;
    if (rtr.roce_v2) {
      rtr.udp_sport = tuning.udp_sport != 0
                          ? tuning.udp_sport
                          : RoceUdpSourcePort(RoceFlowLabel(local_qpn, remote.qpn));
    }
  } else {
    rtr.rlid = remote.lid;
    rtr.grh = tuning.ib_global_route;
  }
  if (grh) {
    rtr.rgid = remote.gid;
    rtr.gid_index = local.gid.index;
    rtr.hop_limit = tuning.hop_limit;
    rtr.traffic_class = tuning.traffic_class;
    rtr.flow_label = tuning.flow_label;
  }

  Rtr2RtsParams& rts = plan.rtr2rts;
  rts.qpn = local_qpn;
  rts.next_send_psn = local_psn;
  rts.log_sra_max = std::min<uint32_t>(rd_atomic_req, 7);
  rts.retry_count = tuning.retry_count;
  rts.rnr_retry = tuning.rnr_retry;
  rts.ack_timeout = tuning.ack_timeout;
  rts.port = local.port;

  if (local.port == 0 || (caps.num_ports != 0 && local.port > caps.num_ports)) {
    return Invalid(absl::StrCat("port ", local.port, " is outside 1..", caps.num_ports));
  }
  if (absl::Status s = CheckAgainstCaps(rtr, caps); !s.ok()) return s;
  if (absl::Status s = CheckAgainstCaps(rts, caps); !s.ok()) return s;
  // A dry run of the builders: whatever they would refuse is refused here,
  // before the session resolves a MAC or touches the QP. The MAC is not
  // known yet; a placeholder stands in for it.
  Init2RtrParams dry = rtr;
  if (plan.needs_remote_mac) dry.rmac = {0x02, 0, 0, 0, 0, 1};
  for (absl::Status s :
       {BuildRst2Init(init).status(), BuildInit2Rtr(dry).status(), BuildRtr2Rts(rts).status()}) {
    if (!s.ok()) return s;
  }
  return plan;
}

}  // namespace mooncake::daemon::mlx5
