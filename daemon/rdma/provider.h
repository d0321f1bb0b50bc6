// RdmaProvider: who does the object work behind RdmaResources — memory
// regions and queue pairs on one NIC. Two implementations:
//   SoftnicProvider (rdma/softnic_provider.h)  mooncaked's software NIC
//   Mlx5Provider (rdma/mlx5/mlx5_provider.h)   a ConnectX NIC through DevX
//
// RdmaResources keeps what is common: which session owns what, budgets,
// authorization (a QP connects only to a QP of the same uid) and the
// validation that needs no provider. It maps client memory before calling
// (RegionMemory, the control mapping), so a provider only registers what it
// is given. Calls for one session never overlap (RdmaResources serializes
// them, and SessionEnded waits for them); calls for different sessions may
// run at once, with no lock of RdmaResources held, so a slow NIC call
// stalls only its own session: a provider guards its shared state itself.
// A provider must not call back into RdmaResources. ListQps/ListRegions
// may be called from any thread at any time.
//
// Keys and QPNs are the provider's own (softnic: lkey == rkey; mlx5: the
// NIC's). A provider that refuses a call leaves nothing of it behind.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "mooncake/common/unique_fd.h"
#include "softnic/copy_agent_link.h"
#include "softnic/shared_mapping.h"
#include "softnic/types.h"

namespace mooncake::daemon {

// Where a QP's rings lie in the client's control memory (byte offsets into
// the control memfd; sizes in entries, powers of two).
struct QpLayout {
  uint64_t sq_offset = 0;
  uint32_t sq_wqe_cnt = 0;
  uint64_t sq_dbrec_offset = 0;
  uint64_t cq_offset = 0;
  uint32_t cq_cqe_cnt = 0;
  uint64_t cq_dbrec_offset = 0;
};

// Client memory to register, already reached by the daemon. Exactly one of
// `host`, `cuda`, `dmabuf_fd` names it, by the request's kind:
//   "memfd"        host: the daemon's mapping of the sealed memfd
//   "cuda-vmm-fd"  cuda: the cuMem allocation imported in the daemon's context
//   "dmabuf"       dmabuf_fd: the client's dmabuf fd (borrowed for the call)
// The region is bytes [offset, offset + length) of that memory.
struct RegionMemory {
  uint64_t session = 0;  // the protection domain
  std::string kind;
  uint64_t iova = 0;  // the client's address of the region
  uint64_t length = 0;
  uint32_t access = 0;  // softnic::Access bits (the same as IBV_ACCESS_*)
  uint64_t offset = 0;
  std::shared_ptr<softnic::SharedMapping> host;
  std::shared_ptr<softnic::CudaBuffer> cuda;
  int dmabuf_fd = -1;
};

struct ProviderRegion {
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  std::string listed_kind;  // mcctl mrs: "host", "cuda-vmm", "dmabuf", "peermem"
};

// What the doorbell hand-off gives a client (rdma.proto DoorbellAccess).
struct DoorbellAccess {
  UniqueFd command_fd;  // a duplicate of the session's verbs command fd
  std::string device;
  int64_t uar_mmap_offset = 0;
  uint64_t uar_reg_offset = 0;
  uint64_t uar_page_bytes = 0;
  bool uar_non_cached = false;
};

// The link a session's QPs use (rdma.proto RdmaInfo is_roce, gid_index):
// mlx5, the port's link layer (Ethernet: RoCE) and the GID table index the
// session's context chose (ChooseGid by type, or the configured index);
// softnic has no link: not RoCE, GID index 0.
struct SessionLink {
  bool is_roce = false;
  uint32_t gid_index = 0;
  std::string gid_type;  // "IB", "RoCE v1", "RoCE v2"; "" for softnic
};

// What another node needs of one QP here to connect its own QP to it
// (issue 24 item 1), exchanged between the two daemons over the
// authenticated peer channel (Peer.OfferConnection), never through etcd:
// the provider, and for a NIC the port's address (LID, GID), the path MTU's
// half and the QP's initial send PSN. softnic fills only `provider`.
struct QpEndpoint {
  std::string provider;  // RdmaProvider::name(): both ends must match
  bool is_roce = false;  // the port's link layer is Ethernet
  uint32_t lid = 0;      // InfiniBand: the port's LID
  std::array<uint8_t, 16> gid{};
  uint32_t gid_index = 0;
  std::string gid_type;  // "IB", "RoCE v1", "RoCE v2"
  uint32_t mtu = 0;      // the port's active MTU, ibv_mtu encoding (1..5)
  uint32_t psn = 0;      // the QP's initial send PSN (24 bits, random per QP)
};

// A QP's doorbell records as its client last wrote them (mcctl qps): read
// when listed, with relaxed loads of client memory, so a snapshot that
// proves nothing (the client may write anything there; the figures only
// describe what it claims). Both counters wrap.
struct QpRingCounters {
  uint32_t qpn = 0;
  // The send doorbell record's counter ([1], big-endian, low 16 bits):
  // the index of the next WQE the client posted and announced, i.e. WQEs
  // posted modulo 65536.
  uint32_t sq_posted = 0;
  // The CQ doorbell record's consumer index ([0], big-endian, 24 bits):
  // CQEs the client consumed, modulo 2^24.
  uint32_t cq_consumed = 0;
};

// Reads the two records (8 bytes each, 4-byte aligned, in a mapping that
// stays valid: a sealed memfd cannot shrink under it).
inline QpRingCounters ReadRingCounters(uint32_t qpn, const uint8_t* sq_dbrec,
                                       const uint8_t* cq_dbrec) {
  auto be32 = [](const uint8_t* p) {
    return __builtin_bswap32(
        __atomic_load_n(reinterpret_cast<const uint32_t*>(p), __ATOMIC_RELAXED));
  };
  QpRingCounters c;
  c.qpn = qpn;
  c.sq_posted = be32(sq_dbrec + 4) & 0xffffu;
  c.cq_consumed = be32(cq_dbrec) & 0xffffffu;
  return c;
}

class RdmaProvider {
 public:
  virtual ~RdmaProvider() = default;

  virtual const std::string& name() const = 0;           // "softnic", "mlx5"
  virtual const std::string& nic() const = 0;            // "softnic0", "mlx5_0"
  virtual const std::string& doorbell_mode() const = 0;  // rdma.proto RdmaInfo
  // Every NIC it serves, the default (nic()) first.
  virtual std::vector<std::string> served_nics() const { return {nic()}; }
  // Puts `session`'s objects on `nic` (one of served_nics()). Called
  // before the session's first object; FailedPrecondition once the session
  // holds something on another NIC.
  virtual absl::Status BindSessionNic(uint64_t session, const std::string& nic) {
    (void)session;
    if (nic == this->nic()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("the ", name(), " provider serves only ", this->nic(), ", not ", nic));
  }
  // The NIC `session`'s objects go on (nic() until bound).
  virtual std::string SessionNic(uint64_t session) const {
    (void)session;
    return nic();
  }
  // The link `session`'s QPs use (on its NIC, SessionNic). mlx5: what its
  // context chose when it opened; before that, what a context opened now
  // on that NIC would choose (the GID table can change in between; the
  // session's own choice is final once it holds anything). Errors: the
  // NIC's, when it cannot be queried. Session 0 (no session; ids count
  // from 1): the default NIC.
  virtual absl::StatusOr<SessionLink> LinkOf(uint64_t session) {
    (void)session;
    return SessionLink{};
  }
  // The atomics NIC `nic` answers, in words, for mcctl nics (issue 24 item
  // 2): mlx5, what QUERY_HCA_CAP says (or why a context refused to open);
  // softnic, how it models them. Empty: unknown.
  virtual std::string AtomicsOf(const std::string& nic) {
    (void)nic;
    return "";
  }
  // Largest CQ the provider accepts (entries).
  virtual uint32_t max_cq_cqe_cnt() const = 0;

  // InvalidArgument, naming the kinds it takes, for a kind it cannot
  // register (checked before the request's fds are taken).
  virtual absl::Status CheckMemoryKind(const std::string& kind) const = 0;
  // InvalidArgument for layouts it cannot place, beyond RdmaResources'
  // bounds checks (also before the fds are taken).
  virtual absl::Status CheckLayouts(const std::vector<QpLayout>& layouts) const = 0;

  virtual absl::StatusOr<ProviderRegion> RegisterMemory(RegionMemory memory) = 0;
  // NotFound unless `lkey` is a region of `session`.
  virtual absl::Status DeregisterMemory(uint64_t session, uint32_t lkey) = 0;

  // One QP per layout, in RESET, all or nothing. `control` maps the control
  // memfd from byte `control_offset` (page aligned): a layout's ring at file
  // offset x is at control->data() + (x - control_offset).
  virtual absl::StatusOr<std::vector<uint32_t>> CreateQueuePairs(
      uint64_t session, std::shared_ptr<softnic::SharedMapping> control, uint64_t control_offset,
      const std::vector<QpLayout>& layouts) = 0;
  // The same, with the rings in GPU memory: `dmabuf_fd` (borrowed for the
  // call) is the dmabuf of the client's control allocation, and a layout's
  // ring at offset x is at byte x of it; [control_offset, control_offset +
  // control_bytes) is the span the rings use (control_offset page aligned).
  // The daemon cannot read that memory: a provider that reads rings or
  // doorbell records with the CPU refuses (FailedPrecondition, the
  // default), and so does one that could place them but was refused by the
  // NIC or the kernel (the provider's code, with the reason): the client
  // then keeps its rings in host memory (the memfd form above).
  virtual absl::StatusOr<std::vector<uint32_t>> CreateQueuePairsInGpuMemory(
      uint64_t session, int dmabuf_fd, uint64_t control_offset, uint64_t control_bytes,
      const std::vector<QpLayout>& layouts) {
    (void)session, (void)dmabuf_fd, (void)control_offset, (void)control_bytes, (void)layouts;
    return absl::FailedPreconditionError(
        absl::StrCat("the ", name(),
                     " provider reads queue rings with the CPU: keep them in host memory (a "
                     "sealed memfd, control_kind \"memfd\")"));
  }
  // Connects QP `qpn` of `session` to `remote_qpn` of `remote_session` on
  // this node and moves it to RTS (RdmaResources checked both exist, the
  // uids match and `qpn` is in RESET). On an error the QP is listed either
  // in RESET (refused before any transition: it may be connected again) or
  // in ERROR (a transition was made: it must be destroyed).
  virtual absl::Status Connect(uint64_t session, uint32_t qpn, uint64_t remote_session,
                               uint32_t remote_qpn) = 0;
  // Cross-node connections (issue 24 item 1). Node A connects its QP a to
  // node B's QP b: A's RdmaResources asks its provider for a's endpoint
  // (EndpointOf), offers it with a's connection secret to B
  // (Peer.OfferConnection), where B's provider takes the offer for b
  // (AcceptRemote) and B answers with b's endpoint, and then A's provider
  // connects a with it (ConnectRemote). B's own client connects b the same
  // way, in the other direction.
  //
  // What another node needs of `qpn` to connect to it. Any thread, any time
  // (a peer asks while the session's own calls run). NotFound unless `qpn`
  // is a QP of `session`.
  virtual absl::StatusOr<QpEndpoint> EndpointOf(uint64_t session, uint32_t qpn) {
    (void)session, (void)qpn;
    QpEndpoint e;
    e.provider = name();
    return e;
  }
  // Node `node`'s QP `remote_qpn` will connect to `qpn` of `session` and
  // offered `secret` (what `qpn`'s traffic to it must carry where the
  // provider carries it itself: softnic's batches; a NIC's packets are
  // matched by QPN, GID and PSN instead). Any thread, any time. NotFound for
  // a QP that is neither open nor connected to that QP of that node.
  virtual absl::Status AcceptRemote(uint64_t session, uint32_t qpn, const std::string& node,
                                    uint32_t remote_qpn, std::string secret) {
    (void)session, (void)qpn, (void)remote_qpn, (void)secret;
    return absl::UnimplementedError(absl::StrCat(
        "the ", name(), " provider cannot take connections from another node (", node, ")"));
  }
  // Connects QP `qpn` of `session` to QP `remote_qpn` on node `node`, whose
  // endpoint is `peer` (that node's answer), and moves it to RTS.
  // `secret`: what the peer's traffic carries (already offered to it).
  // FailedPrecondition for a peer this provider cannot reach (another
  // provider, another link layer), naming both ends.
  virtual absl::Status ConnectRemote(uint64_t session, uint32_t qpn, const std::string& node,
                                     uint32_t remote_qpn, std::string secret,
                                     const QpEndpoint& peer) {
    (void)session, (void)qpn, (void)remote_qpn, (void)secret, (void)peer;
    return absl::UnimplementedError(absl::StrCat(
        "the ", name(), " provider cannot connect queue pairs to another node (", node, ")"));
  }
  virtual absl::Status DestroyQueuePair(uint64_t session, uint32_t qpn) = 0;
  // Everything of `session`; returns once nothing of it is touched again.
  virtual void SessionEnded(uint64_t session) = 0;
  // Who `session` belongs to (a number per uid and tenant), told before its
  // first queue pair (the work a session brings comes through its queue
  // pairs): a provider that shares threads between
  // sessions (softnic's GPU workers) keeps one user from taking them all.
  virtual void SessionOwner(uint64_t session, uint64_t owner) {
    (void)session;
    (void)owner;
  }

  // The doorbell hand-off ("gpu-uar"): the session's command fd and UAR,
  // after which the provider never writes that session's UAR (the client
  // can destroy objects of a context it holds; the daemon must not depend
  // on them). FailedPrecondition once the session holds regions or QPs, and
  // for a provider without a UAR (the default).
  virtual absl::StatusOr<DoorbellAccess> OpenDoorbellAccess(uint64_t session) {
    (void)session;
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", name(), " provider has no UAR to hand out: its doorbells are ", doorbell_mode()));
  }
  // Undoes OpenDoorbellAccess: the exposed context is closed (a fresh one
  // serves the session) and its doorbells are the provider's again. Same
  // precondition; OK when nothing was handed out.
  virtual absl::Status ReleaseDoorbellAccess(uint64_t session) {
    (void)session;
    return absl::OkStatus();
  }

  // A client process's copy agent (softnic/copy_agent_link.h): softnic
  // moves the bytes of `session`'s GPU regions through it. One per session
  // (AlreadyExists). A NIC moves GPU bytes itself (FailedPrecondition, the
  // default).
  virtual absl::Status AttachCopyAgent(uint64_t session,
                                       std::shared_ptr<softnic::CopyAgentLink> agent) {
    (void)session, (void)agent;
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", name(), " provider moves GPU memory in the NIC: it needs no copy agent"));
  }

  virtual std::vector<softnic::QpInfo> ListQps() const = 0;
  virtual std::vector<softnic::RegionInfo> ListRegions() const = 0;
  // Whether QpInfo::wqes_done counts completions (a provider that executes
  // the WQEs itself); a NIC's are not seen by the daemon.
  virtual bool counts_wqes() const { return false; }
  // Every QP's ring counters (mcctl qps); any thread.
  virtual std::vector<QpRingCounters> ListRingCounters() const { return {}; }
  // Payload bytes the provider moved itself (softnic, for the metrics);
  // -1 for a NIC, which moves them in hardware. Cheap; any thread.
  virtual int64_t bytes_moved() const { return -1; }
  // Threads moving GPU memory for the provider (softnic's GPU workers) and
  // the WQEs waiting for one (the metrics); nullopt for a NIC. Cheap; any
  // thread.
  struct GpuWork {
    uint64_t workers = 0;
    uint64_t waiting = 0;
  };
  virtual std::optional<GpuWork> gpu_work() const { return std::nullopt; }
};

}  // namespace mooncake::daemon
