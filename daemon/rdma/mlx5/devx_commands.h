// Builders and parsers of the mlx5 DevX commands mooncaked uses to run an RC
// QP on a ConnectX NIC from memory the client provides (umem):
//   QUERY_HCA_CAP (general caps) -> can this device do it at all, and how big
//   CREATE_CQ / DESTROY_CQ        -> the completion ring and its doorbell record
//   CREATE_QP / DESTROY_QP        -> a send-only RC QP (zero-size RQ)
//   RST2INIT / INIT2RTR / RTR2RTS -> connect it to the peer QP
//
// A builder takes a typed parameter struct, checks every value against what
// its PRM field can hold and against the rules of the command, and returns
// the input mailbox and a zeroed output mailbox of the right sizes, ready
// for mlx5dv_devx_obj_create / obj_modify / general_cmd. Bad parameters are
// an InvalidArgument naming the command, the parameter and the allowed
// range; nothing aborts. Values that depend on the device (log sizes, GID
// table) are checked separately by CheckAgainstCaps, once QUERY_HCA_CAP's
// answer is parsed.
//
// After the call, ParseXxxOut / CheckCommandOut read the output mailbox: a
// non-zero status is an error naming the command with the status and the
// firmware syndrome in hex (mlx5dv_devx_* then also fails with EREMOTEIO;
// the syndrome is what tells why). QUERY_HCA_CAP goes through
// mlx5dv_devx_general_cmd; the CREATE_* through mlx5dv_devx_obj_create and
// the transitions through mlx5dv_devx_obj_modify. mlx5dv_devx_obj_destroy
// needs no mailbox: the kernel derives DESTROY_* from the create command, so
// our DESTROY builders only give the same bytes for logs and tests.
//
// Pure functions over bytes: no verbs headers, no device, thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mooncake::daemon::mlx5 {

// An input mailbox to send and an output mailbox (zeroed) to receive into.
struct DevxCommand {
  absl::string_view name;  // "CREATE_QP", ... (static): names the command in errors
  std::vector<uint8_t> in;
  std::vector<uint8_t> out;
};

// ---- QUERY_HCA_CAP (general device caps) --------------------------------------------------------

// Current caps are what this function may use now; max caps are what the
// device could be configured to.
enum class HcaCapMode : uint8_t { kMax = 0, kCurrent = 1 };
DevxCommand BuildQueryGeneralCaps(HcaCapMode mode = HcaCapMode::kCurrent);

// The few general caps that decide whether and how we create QPs.
struct HcaGeneralCaps {
  uint32_t log_max_qp_sz = 0;      // log2 of the most WQEs in one SQ
  uint32_t log_max_cq_sz = 0;      // log2 of the most CQEs in one CQ
  uint32_t log_max_msg = 0;        // log2 of the largest message
  uint32_t log_max_ra_req_qp = 0;  // log2 of outstanding RDMA reads/atomics we may initiate
  uint32_t log_max_ra_res_qp = 0;  // ... and may answer as responder
  uint32_t gid_table_size = 0;     // GID entries per port (IB; decoded from the code)
  uint32_t port_type = 0;          // kCapPortTypeIb or kCapPortTypeEth (devx_ifc.h)
  uint32_t num_ports = 0;
  uint32_t cqe_version = 0;
  bool roce = false;  // RoCE enabled (meaningful on Ethernet ports)
  bool atomic = false;
  bool rc = false;
  uint32_t log_max_uctx = 0;  // DevX user contexts (0: no DevX)
  uint32_t log_max_umem = 0;  // DevX umem registrations
};
absl::StatusOr<HcaGeneralCaps> ParseQueryGeneralCapsOut(std::span<const uint8_t> out);

// OK when the device can run our RC QPs over DevX: RC transport, DevX user
// contexts, RDMA atomics (mc_red_add), and RoCE enabled when the port is
// Ethernet. FailedPrecondition listing what is missing otherwise.
absl::Status CheckRcOverDevx(const HcaGeneralCaps& caps);

// ---- QUERY_HCA_CAP (atomic caps; issue 24 item 2)
// -------------------------------------------------

DevxCommand BuildQueryAtomicCaps(HcaCapMode mode = HcaCapMode::kCurrent);

struct HcaAtomicCaps {
  uint32_t operations = 0;  // kAtomicOps* (devx_ifc.h)
  uint32_t size_qp = 0;     // kAtomicSize*: operand sizes on RC QPs
  uint32_t req_8b_endianness_mode = 0;
  bool endianness_mode_1_supported = false;
};
absl::StatusOr<HcaAtomicCaps> ParseQueryAtomicCapsOut(std::span<const uint8_t> out);

// OK when the responder runs what the device API posts: 8-byte fetch-add
// (mc_red_add, upstream's atomics) and 4-byte masked fetch-add (mc_signal),
// on RC QPs (atomic_size_qp 4 and 8 bytes, which the QP's atomic mode "up
// to 8 bytes" needs). FailedPrecondition naming each missing capability
// and the firmware setting behind it; a NIC that lacks them cannot serve
// a session.
absl::Status CheckAtomics(const HcaAtomicCaps& caps);
// "FA8 MFA4 CAS ..." for listings.
std::string DescribeAtomics(const HcaAtomicCaps& caps);

// ---- CREATE_CQ ----------------------------------------------------------------------------------

enum class CqeSize : uint8_t { k64Bytes = 0, k128Bytes = 1 };

struct CreateCqParams {
  uint32_t log_cq_size = 0;  // log2 of the ring's CQEs: 0..31 (the device caps it lower)
  CqeSize cqe_size = CqeSize::k64Bytes;  // device/mlx5/prm.h polls 64-byte CQEs
  uint32_t uar_page = 0;                 // UAR page index for arming (24 bits)
  uint32_t eqn = 0;                      // completion EQ (mlx5dv_devx_query_eqn)
  bool overrun_ignore = false;           // oi: do not move the CQ to error on overrun
  uint32_t cq_umem_id = 0;               // umem holding the CQE ring
  uint64_t cq_umem_offset = 0;           // ring start inside that umem
  uint32_t dbr_umem_id = 0;              // umem holding the doorbell record
  uint64_t dbr_offset = 0;               // record offset inside it; multiple of 8
};
absl::StatusOr<DevxCommand> BuildCreateCq(const CreateCqParams& p);
absl::StatusOr<uint32_t> ParseCreateCqOut(std::span<const uint8_t> out);  // the CQN

absl::StatusOr<DevxCommand> BuildDestroyCq(uint32_t cqn);

// ---- CREATE_QP: RC, send queue only -------------------------------------------------------------

// qpc.ts_format. The kernel picks kDefault where the RoCE caps report
// qp_ts_format support and kFreeRunning otherwise; the caller decides.
enum class TimestampFormat : uint8_t { kFreeRunning = 0, kDefault = 1, kRealTime = 2 };

struct CreateQpParams {
  uint32_t pd = 0;           // protection domain number (24 bits)
  uint32_t uar_page = 0;     // UAR page the SQ doorbell is rung on (24 bits)
  uint32_t cqn_snd = 0;      // CQ for send completions (24 bits)
  uint32_t cqn_rcv = 0;      // CQ for receive completions; none arrive without an RQ,
                             // but the context wants a valid CQ (24 bits)
  uint32_t log_sq_size = 0;  // log2 of the SQ's 64-byte WQE basic blocks: 0..15
  uint32_t log_msg_max = 0;  // log2 of the largest message: 0..31
  uint32_t user_index = 0;   // reported in CQEs instead of the QPN with cqe_version 1 (24 bits)
  TimestampFormat ts_format = TimestampFormat::kFreeRunning;
  uint32_t wq_umem_id = 0;      // umem holding the SQ ring
  uint64_t wq_umem_offset = 0;  // ring start inside that umem
  uint32_t dbr_umem_id = 0;     // umem holding the doorbell record
  uint64_t dbr_offset = 0;      // record offset inside it; multiple of 8
};
absl::StatusOr<DevxCommand> BuildCreateQp(const CreateQpParams& p);
absl::StatusOr<uint32_t> ParseCreateQpOut(std::span<const uint8_t> out);  // the QPN

absl::StatusOr<DevxCommand> BuildDestroyQp(uint32_t qpn);

// ---- RST2INIT -----------------------------------------------------------------------------------

// qpc.atomic_mode when remote atomics are enabled: the operand sizes the
// responder accepts (Linux: MLX5_ATOMIC_MODE_*); kNone without remote atomics.
enum class AtomicMode : uint8_t {
  kNone = 0,
  kIbCompatible = 1,
  kCx = 2,
  kUpTo8Bytes = 3,
  kUpTo16Bytes = 4,
  kUpTo32Bytes = 5,
  kUpTo64Bytes = 6,
  kUpTo128Bytes = 7,
  kUpTo256Bytes = 8,
};

struct Rst2InitParams {
  uint32_t qpn = 0;                            // 24 bits
  uint32_t port = 1;                           // vhca_port_num: 1-based port of this function
  uint32_t pkey_index = 0;                     // IB partition key index (16 bits)
  bool remote_read = false;                    // rre
  bool remote_write = false;                   // rwe
  bool remote_atomic = false;                  // rae
  AtomicMode atomic_mode = AtomicMode::kNone;  // required iff remote_atomic
};
absl::StatusOr<DevxCommand> BuildRst2Init(const Rst2InitParams& p);

// ---- INIT2RTR -----------------------------------------------------------------------------------

// qpc.mtu encoding (same numbers as ibv_mtu).
enum class PathMtu : uint8_t { k256 = 1, k512 = 2, k1024 = 3, k2048 = 4, k4096 = 5 };
enum class LinkLayer : uint8_t { kInfiniBand, kEthernet };

struct Init2RtrParams {
  uint32_t qpn = 0;
  PathMtu mtu = PathMtu::k4096;
  uint32_t log_msg_max = 0;   // 0..31
  uint32_t remote_qpn = 0;    // 24 bits
  uint32_t next_rcv_psn = 0;  // the peer's initial send PSN (24 bits)
  uint32_t log_rra_max = 0;   // log2 of reads/atomics we answer at once: 0..7
  uint32_t min_rnr_nak = 0;   // RNR NAK timer code: 0..31
  uint32_t port = 1;          // vhca_port_num
  LinkLayer link_layer = LinkLayer::kInfiniBand;

  // InfiniBand: the peer port's LID (unicast 0x0001..0xbfff), and whether a
  // GRH is sent (then the GRH fields below apply as for RoCE).
  uint32_t rlid = 0;
  bool grh = false;
  uint32_t sl = 0;  // IB service level 0..15; on Ethernet the 802.1p priority 0..7

  // GRH (IB with grh, always on Ethernet).
  std::array<uint8_t, 16> rgid{};  // remote GID, network order
  uint32_t gid_index = 0;          // local GID table index (src_addr_index), 0..255
  uint32_t hop_limit = 64;         // 0..255
  uint32_t traffic_class = 0;      // 0..255 (RoCE: DSCP << 2 | ECN)
  uint32_t flow_label = 0;         // 20 bits

  // Ethernet (RoCE).
  std::array<uint8_t, 6> rmac{};  // next hop's MAC
  bool roce_v2 = true;            // the GID at gid_index is a RoCE v2 (UDP) GID
  uint32_t udp_sport = 0;         // RoCE v2 UDP source port; must be 0 for RoCE v1
};
absl::StatusOr<DevxCommand> BuildInit2Rtr(const Init2RtrParams& p);

// ---- RTR2RTS ------------------------------------------------------------------------------------

struct Rtr2RtsParams {
  uint32_t qpn = 0;
  uint32_t next_send_psn = 0;  // our initial send PSN (24 bits); the peer's next_rcv_psn
  uint32_t log_sra_max = 0;    // log2 of reads/atomics we keep outstanding: 0..7
  uint32_t retry_count = 7;    // transport retries: 0..7
  uint32_t rnr_retry = 7;      // RNR retries: 0..7 (7: without limit)
  uint32_t ack_timeout = 14;   // 4.096 us * 2^ack_timeout: 0..31
  uint32_t port = 1;           // vhca_port_num
};
absl::StatusOr<DevxCommand> BuildRtr2Rts(const Rtr2RtsParams& p);

// ---- outputs ------------------------------------------------------------------------------------

// OK when `out` (at least 16 bytes) carries status 0. Otherwise a Status
// whose message reads
//   "<command> failed: status 0x03 (bad parameter), syndrome 0x1234abcd"
// with a canonical code matching the status (InvalidArgument for bad
// parameters, ResourceExhausted for limits, FailedPrecondition for a wrong
// object state, Unavailable for busy, Internal otherwise).
absl::Status CheckCommandOut(absl::string_view command, std::span<const uint8_t> out);

// ---- device limits ------------------------------------------------------------------------------

// The device-dependent checks builders cannot make: sizes against the
// log_max_* caps, the GID index against the GID table. InvalidArgument
// naming the parameter, its value and the device's limit.
absl::Status CheckAgainstCaps(const CreateCqParams& p, const HcaGeneralCaps& caps);
absl::Status CheckAgainstCaps(const CreateQpParams& p, const HcaGeneralCaps& caps);
absl::Status CheckAgainstCaps(const Init2RtrParams& p, const HcaGeneralCaps& caps);
absl::Status CheckAgainstCaps(const Rtr2RtsParams& p, const HcaGeneralCaps& caps);

}  // namespace mooncake::daemon::mlx5
