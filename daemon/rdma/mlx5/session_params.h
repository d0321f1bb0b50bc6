// The decisions the mlx5 DevX session makes, apart from the calls that act
// on them: which local GID to use, the path MTU, the RoCE UDP source port,
// access flags, where a QP's rings may lie in client memory, and the three
// QP transitions' parameters from what both ends know (PlanConnect).
// mlx5_session.cc feeds these with what ibv_query_port, ibv_query_gid_table
// and QUERY_HCA_CAP return; the tests feed them by hand.
//
// Pure functions and plain structs: no verbs headers, no device,
// thread-safe. Errors are InvalidArgument (a bad parameter, named with its
// value and the allowed range), NotFound (no GID fits) or FailedPrecondition
// (the two ends cannot talk: different link layers or RoCE versions).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rdma/mlx5/devx_commands.h"

namespace mooncake::daemon::mlx5 {

// ---- GIDs ---------------------------------------------------------------------------------------

using Gid = std::array<uint8_t, 16>;  // network order, as ibv_gid.raw

// The values of rdma-core's enum ibv_gid_type (verbs.h), which
// ibv_query_gid_table reports per entry.
enum class GidType : uint8_t { kIb = 0, kRoceV1 = 1, kRoceV2 = 2 };
const char* GidTypeName(GidType type);  // "IB", "RoCE v1", "RoCE v2"

// One populated entry of a port's GID table (ibv_gid_entry).
struct GidEntry {
  uint32_t index = 0;
  Gid gid{};
  GidType type = GidType::kIb;
  uint32_t ndev_ifindex = 0;  // RoCE: the netdev the address belongs to
};

bool IsZeroGid(const Gid& gid);
// ::ffff:a.b.c.d, the form a RoCE GID takes for an IPv4 address.
bool IsIpv4MappedGid(const Gid& gid);
// fe80::/10: an IPv6 link-local address (RoCE) or the IB default GID prefix.
bool IsLinkLocalGid(const Gid& gid);
// "fe80:0000:0000:0000:0202:c9ff:fe00:0001", as sysfs prints GIDs.
std::string FormatGid(const Gid& gid);

// The local GID a session's QPs use on a port, from that port's populated
// entries (unordered; zero GIDs are skipped):
//  - `override_index` set: that entry, which must exist (NotFound listing
//    the indices there are) and suit the link layer (InvalidArgument: an IB
//    GID on Ethernet or a RoCE GID on InfiniBand);
//  - InfiniBand: the lowest-index IB GID (index 0 is the port's default GID);
//  - Ethernet, best first: RoCE v2 with an IPv4-mapped address (routable,
//    what RoCE fabrics are configured for), RoCE v2 with a global IPv6
//    address, RoCE v2 link-local, then RoCE v1; the lowest index within a
//    class. NotFound when the port has no RoCE GID at all (its netdev has no
//    address or is down).
absl::StatusOr<GidEntry> ChooseGid(const std::vector<GidEntry>& port_gids, LinkLayer link_layer,
                                   std::optional<uint32_t> override_index);

// ---- MTU ----------------------------------------------------------------------------------------

// Both ends' active MTUs in the ibv_mtu encoding (1 = 256 ... 5 = 4096,
// which PathMtu shares); the path MTU is the smaller. InvalidArgument names
// the side whose value is outside 1..5.
absl::StatusOr<PathMtu> NegotiatePathMtu(uint32_t local_active_mtu, uint32_t remote_mtu);
uint32_t PathMtuBytes(PathMtu mtu);  // 256 .. 4096

// ---- RoCE v2 UDP source port --------------------------------------------------------------------

// The flow label the kernel derives for an RC connection with no label of
// its own (Linux include/rdma/ib_verbs.h, rdma_calc_flow_label): both ends
// compute the same 20-bit value from the QPN pair.
uint32_t RoceFlowLabel(uint32_t local_qpn, uint32_t remote_qpn);
// The UDP source port for a flow label, as rdma-core's
// ibv_flow_label_to_udp_sport (verbs.h) and the kernel's
// rdma_flow_label_to_udp_sport map it: 0xC000..0xFFFF, so ECMP spreads
// connections over paths.
uint16_t RoceUdpSourcePort(uint32_t flow_label);

// ---- memory access ------------------------------------------------------------------------------

// Region access rights; the same bits as IBV_ACCESS_* (verbs.h) and
// softnic::Access (softnic/types.h).
enum MrAccess : uint32_t {
  kMrLocalWrite = 1u << 0,
  kMrRemoteWrite = 1u << 1,
  kMrRemoteRead = 1u << 2,
  kMrRemoteAtomic = 1u << 3,
};
inline constexpr uint32_t kMrAccessAll =
    kMrLocalWrite | kMrRemoteWrite | kMrRemoteRead | kMrRemoteAtomic;

// The access to register with: `access` plus local write, which verbs
// requires with remote write or atomics (ibv_reg_mr(3)) and which softnic
// grants every region anyway, so a request means the same on both
// providers. InvalidArgument for bits outside kMrAccessAll.
absl::StatusOr<uint32_t> RegistrationAccess(uint32_t access);

// What ibv_reg_dmabuf_mr(3) requires of a range, checked before the call so
// the error names the parameter: length > 0, no overflow of offset + length
// or iova + length, and iova with the same offset into a page of
// `page_size` bytes as `offset`.
absl::Status CheckDmabufRange(uint64_t offset, uint64_t length, uint64_t iova, uint64_t page_size);

// Whether ibv_reg_dmabuf_mr's `err` means "this system cannot register a
// dmabuf" (EOPNOTSUPP, EPROTONOSUPPORT, ENOSYS: no dmabuf support in libibverbs,
// the kernel or the NIC driver; EINVAL: also what an exporter that cannot
// pin its pages answers), so that registering the same bytes by address
// (nvidia-peermem) is worth a try. Other errors (EBADF, ENOMEM, EPERM) would
// fail the same way again.
bool DmabufRefusalAllowsFallback(int err);

// ---- umem and rings -----------------------------------------------------------------------------

// A umem is registered with only this page size (pgsz_bitmap), so any
// object starting on a multiple of it inside the umem is addressable: the
// kernel lets umem_offset != 0 be used only with a pgsz_bitmap, whose
// largest page bounds the alignment objects need (Linux
// drivers/infiniband/hw/mlx5/devx.c, devx_umem_reg_cmd_alloc).
inline constexpr uint64_t kUmemPageSize = 4096;

// The start of a umem (a host address of the daemon's mapping, or an
// offset into a dmabuf) and its size: both multiples of kUmemPageSize and
// the size not 0. InvalidArgument naming `what` otherwise.
absl::Status CheckUmemRange(absl::string_view what, uint64_t start, uint64_t bytes);

// Where one ring or doorbell record lies: a umem of the session and the
// byte offset into it.
struct RingPlacement {
  uint32_t umem_id = 0;
  uint64_t offset = 0;
};

// The rings of one send-only RC QP and its CQ, in client memory registered
// as umem (one umem for all, or one per ring).
struct QpRings {
  RingPlacement sq;         // sq_wqe_cnt * 64 bytes; offset a multiple of kUmemPageSize
  uint32_t sq_wqe_cnt = 0;  // 64-byte WQE basic blocks: a power of two, 1 .. 32768
  RingPlacement sq_dbrec;   // 8 bytes, offset a multiple of 8: [0] receive, [1] send counter
  RingPlacement cq;         // cq_cqe_cnt * 64 bytes; offset a multiple of kUmemPageSize
  uint32_t cq_cqe_cnt = 0;  // 64-byte CQEs: a power of two, >= sq_wqe_cnt (one CQE
                            // per WQE can never overrun it)
  RingPlacement cq_dbrec;   // 8 bytes, offset a multiple of 8: [0] consumer index, [1] arm
};
inline constexpr uint32_t kMaxSqWqeCnt = 1u << 15;  // log_sq_size is a 4-bit field
inline constexpr uint32_t kWqeBasicBlockBytes = 64;
inline constexpr uint32_t kCqeBytes = 64;
inline constexpr uint32_t kDbrecBytes = 8;

// Checks `rings` against the umems they name (`umem_bytes`: umem id ->
// size): every umem known, every ring and record inside its umem, aligned,
// sized as above, and no two overlapping in the same umem. InvalidArgument
// naming the ring, its offset and size, and the umem's size.
absl::Status ValidateQpRings(const QpRings& rings,
                             const absl::flat_hash_map<uint32_t, uint64_t>& umem_bytes);

// log2 of a power of two (0 for 0).
uint32_t Log2(uint64_t power_of_two);

// The CREATE_CQ and CREATE_QP parameters for validated `rings`: 64-byte
// CQEs, overrun ignore set (a CQ that can hold one CQE per outstanding WQE
// cannot overrun; the PRM moves an overrun CQ to error otherwise), one CQ
// for sends (the only completions a send-only QP gets) and, as the context
// needs one, for receives too. ts_format is the device default, as
// rdma-core's own DevX RC tests set it (tests/mlx5_base.py) and as the
// kernel picks on devices without timestamp-format caps; log_msg_max is
// the device's.
CreateCqParams MakeCreateCqParams(const QpRings& rings, uint32_t uar_page, uint32_t eqn);
CreateQpParams MakeCreateQpParams(const QpRings& rings, uint32_t pdn, uint32_t uar_page,
                                  uint32_t cqn, const HcaGeneralCaps& caps);

// ---- connecting ---------------------------------------------------------------------------------

// What the session knows of its own port (ibv_query_port, the chosen GID).
struct LocalPort {
  uint32_t port = 1;
  LinkLayer link_layer = LinkLayer::kInfiniBand;
  uint32_t lid = 0;         // InfiniBand
  uint32_t active_mtu = 5;  // ibv_mtu encoding
  GidEntry gid;
};

// What the peer tells about its QP (over the daemons' peering).
struct RemoteQp {
  uint32_t qpn = 0;                 // 24 bits, not 0
  uint32_t psn = 0;                 // the peer's initial send PSN (24 bits)
  uint32_t lid = 0;                 // InfiniBand: the peer port's LID
  Gid gid{};                        // RoCE (and IB across subnets): the peer's GID
  std::optional<GidType> gid_type;  // when known: must be our RoCE version
  uint32_t mtu = 5;                 // the peer port's active MTU (ibv_mtu encoding)
};

// How the connection behaves; the defaults suit an RC QP of the IBGDA path.
struct ConnectTuning {
  uint32_t traffic_class = 0;  // 0..255; RoCE v2: DSCP << 2 | ECN
  uint32_t service_level = 0;  // InfiniBand SL 0..15; Ethernet 802.1p priority 0..7
  uint32_t hop_limit = 64;     // GRH hop limit / IP TTL, 1..255
  // 4.096 us * 2^n, 0..31 (0: wait forever). 17 (~0.54 s): with 7 retries
  // the NIC reports a lost peer after ~4.3 s, well inside the device's
  // default 10 s timeout, so the user sees the NIC's named error
  // (NicRetryBudget; mooncake/device/qp_error.h). 20, NVSHMEM's, would take
  // ~34 s: the device would give up first and the reason be lost.
  uint32_t ack_timeout = 17;
  uint32_t retry_count = 7;      // transport retries, 0..7
  uint32_t rnr_retry = 7;        // RNR retries, 0..7 (7: without limit)
  uint32_t min_rnr_nak = 12;     // RNR NAK timer code, 0..31 (12: 0.64 ms)
  uint32_t pkey_index = 0;       // InfiniBand partition key index, 0..65535
  uint32_t udp_sport = 0;        // RoCE v2: 0 = derived from the QPN pair, else 0xC000..0xFFFF
  uint32_t flow_label = 0;       // GRH flow label, 20 bits
  bool ib_global_route = false;  // InfiniBand: send a GRH (a peer in another subnet)
  // log2 of RDMA reads/atomics outstanding per QP, both directions; unset:
  // what the device allows (log_max_ra_req_qp / log_max_ra_res_qp).
  std::optional<uint32_t> log_max_rd_atomic;
  // Responder atomic operand sizes (mc_red_add uses 8-byte fetch-add).
  AtomicMode atomic_mode = AtomicMode::kUpTo8Bytes;
};

// How long the NIC retries an unacknowledged packet before it fails the QP
// with a transport-retry-exceeded CQE: (retry_count + 1) * 4.096 us *
// 2^ack_timeout; infinite for ack_timeout 0.
absl::Duration NicRetryBudget(const ConnectTuning& tuning);

// Every field in its range (service_level by link layer).
absl::Status ValidateConnectTuning(const ConnectTuning& tuning, LinkLayer link_layer);

// The three transitions, ready for BuildRst2Init / BuildInit2Rtr /
// BuildRtr2Rts. On Ethernet the next hop's MAC is not known here: the
// session resolves it (needs_remote_mac) and fills init2rtr.rmac.
struct ConnectPlan {
  Rst2InitParams rst2init;
  Init2RtrParams init2rtr;
  Rtr2RtsParams rtr2rts;
  bool needs_remote_mac = false;
};

// The plan for connecting local QP `local_qpn` (sending from PSN
// `local_psn`) to `remote`: remote read, write and atomics enabled, path
// MTU negotiated, IB by LID (and GRH when asked), RoCE by GID with the
// local GID's version (v2: UDP source port from tuning or the QPN pair,
// traffic class as DSCP), outstanding reads/atomics clamped to the device
// unless given. Every value is checked against the builders' ranges and
// the device's caps (CheckAgainstCaps), so a plan that comes back builds.
absl::StatusOr<ConnectPlan> PlanConnect(uint32_t local_qpn, uint32_t local_psn,
                                        const LocalPort& local, const HcaGeneralCaps& caps,
                                        const RemoteQp& remote, const ConnectTuning& tuning);

}  // namespace mooncake::daemon::mlx5
