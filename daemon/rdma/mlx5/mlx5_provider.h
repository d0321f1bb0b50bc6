// Mlx5Provider: RdmaProvider over one ConnectX NIC through DevX. Each client
// session gets its own Mlx5Session (verbs context, PD, UAR; opened on the
// session's first RDMA call, destroyed by SessionEnded, which frees every
// object it holds); nothing is shared between sessions.
//
//   memory   "memfd": ibv_reg_mr on the daemon's mapping (iova = client VA);
//            "dmabuf": ibv_reg_dmabuf_mr on the client's dmabuf fd;
//            "cuda-vmm-fd": the daemon's CUDA mapping of the allocation,
//            registered by address through nvidia-peermem (listed "peermem").
//   rings    one umem per CreateQueuePairs call, deregistered with its
//            last QP; rings 4 KiB aligned. Host memory: the daemon's
//            mapping of the control memfd. GPU memory
//            (CreateQueuePairsInGpuMemory): the client's dmabuf, for a
//            "gpu-uar" session only (the CPU-assisted doorbell and the ring
//            counters read the records, which the daemon cannot reach
//            there); a refused umem or QP is the client's cue to fall back.
//   connect  Every QP sends from a random initial PSN. QPs of this node:
//            loopback on the same port, the peer built from the other
//            session's endpoint. QPs of another node (ConnectRemote): the
//            peer's endpoint as its daemon answered the offer (LID, GID
//            and type, MTU, PSN; rdma/provider.h QpEndpoint), refused when
//            the providers or link layers differ; on RoCE the next hop's
//            MAC is resolved here from the peer's GID, as rdma-core does.
//            Both with Mlx5ProviderOptions::tuning (traffic class, service
//            level...). A connect the NIC refuses half way leaves the QP
//            listed in ERROR (destroy it); one refused before any
//            transition leaves it in RESET.
//   link     LinkOf: the session's endpoint (link layer, the GID its
//            context chose); before it opens, a context opened and closed
//            on its NIC says what it would choose. Any caller may ask
//            (GetRdmaInfo needs no session), so such probes run one at a
//            time and an answer is reused for kLinkProbeReuse: a loop of
//            calls cannot keep the daemon opening device contexts.
//   counters ListRingCounters reads each QP's doorbell records in the
//            client's control memory (relaxed loads; provider.h).
//   failures ListQps reads each QP's CQ ring there for an error CQE, so
//            `mcctl qps` names a NIC's error as it does softnic's; the first
//            sighting, or the QP's end in error, is logged with the
//            syndrome's name and hint (cq_error_scan.h).
//   doorbell "cpu-assisted" (rdma/mlx5/cpu_doorbell.h) by default: a daemon
//            thread rings for every connected QP; "gpu-uar" for a session
//            that took its command fd and UAR (OpenDoorbellAccess): its
//            kernels ring, and the daemon never writes that UAR again (the
//            client may free objects of a context it holds, so the daemon
//            must not store through a mapping the client can revoke).
//
// Keys are the NIC's (lkey != rkey). Locking: RdmaResources never overlaps
// two calls of one session (rdma/provider.h), so a session's slow verbs
// calls (a context open, pinning a large region, firmware commands) run
// with no lock of this provider held: mu_ guards only the maps, held for
// lookups and updates, so one user's slow call never stalls another's, nor
// mcctl's listings. Sessions are shared_ptr: a peer's Connect may still
// read a session that is ending. Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rdma/mlx5/cpu_doorbell.h"
#include "rdma/mlx5/handoff_rights.h"
#include "rdma/mlx5/mlx5_session.h"
#include "rdma/provider.h"

namespace mooncake::daemon::mlx5 {

// Opens one session's objects on a NIC: Mlx5Session::Open, or a fake.
using NicSessionOpener =
    std::function<absl::StatusOr<std::unique_ptr<NicSession>>(const Mlx5SessionOptions&)>;

struct Mlx5ProviderOptions {
  // Every connection's (PlanConnect checks the ranges per link layer).
  ConnectTuning tuning;
  // Null: Mlx5Session::Open (tests give a fake).
  NicSessionOpener open;
  // Whether a context may be handed to a client (OpenDoorbellAccess).
  // Null: CheckHandOffRights (tests give their own).
  HandOffRightsCheck handoff_rights;
};

class Mlx5Provider final : public RdmaProvider {
 public:
  // `nics`: the device and port of each NIC served (not empty; distinct
  // devices), the default first. A session opens on the NIC bound to it
  // (BindSessionNic), else on the default.
  explicit Mlx5Provider(std::vector<Mlx5SessionOptions> nics, Mlx5ProviderOptions options = {});
  explicit Mlx5Provider(Mlx5SessionOptions nic, Mlx5ProviderOptions options = {})
      : Mlx5Provider(std::vector<Mlx5SessionOptions>{std::move(nic)}, std::move(options)) {}
  ~Mlx5Provider() override;

  const std::string& name() const override { return name_; }
  const std::string& nic() const override { return nics_.front().device; }
  std::vector<std::string> served_nics() const override;
  absl::Status BindSessionNic(uint64_t session, const std::string& nic) override;
  std::string SessionNic(uint64_t session) const override;
  absl::StatusOr<SessionLink> LinkOf(uint64_t session) override;
  // An open session's answer on that NIC, else a probe (as LinkOf's, and
  // reused with it); a NIC that refuses to open says why.
  std::string AtomicsOf(const std::string& nic) override;
  const std::string& doorbell_mode() const override { return doorbell_mode_; }
  uint32_t max_cq_cqe_cnt() const override { return kMaxCqCqeCnt; }
  static constexpr uint32_t kMaxCqCqeCnt = 65536;
  // How long a probed link (LinkOf before the session's context opens) is
  // reused for the same NIC.
  static constexpr absl::Duration kLinkProbeReuse = absl::Seconds(1);

  absl::Status CheckMemoryKind(const std::string& kind) const override;
  // Every ring at a multiple of kUmemPageSize of the control memfd (the
  // mapping starts on a page, so the umem offsets keep the alignment).
  absl::Status CheckLayouts(const std::vector<QpLayout>& layouts) const override;
  absl::StatusOr<ProviderRegion> RegisterMemory(RegionMemory memory) override;
  absl::Status DeregisterMemory(uint64_t session, uint32_t lkey) override;
  absl::StatusOr<std::vector<uint32_t>> CreateQueuePairs(
      uint64_t session, std::shared_ptr<softnic::SharedMapping> control, uint64_t control_offset,
      const std::vector<QpLayout>& layouts) override;
  absl::StatusOr<std::vector<uint32_t>> CreateQueuePairsInGpuMemory(
      uint64_t session, int dmabuf_fd, uint64_t control_offset, uint64_t control_bytes,
      const std::vector<QpLayout>& layouts) override;
  absl::Status Connect(uint64_t session, uint32_t qpn, uint64_t remote_session,
                       uint32_t remote_qpn) override;
  absl::StatusOr<QpEndpoint> EndpointOf(uint64_t session, uint32_t qpn) override;
  absl::Status AcceptRemote(uint64_t session, uint32_t qpn, const std::string& node,
                            uint32_t remote_qpn, std::string secret) override;
  absl::Status ConnectRemote(uint64_t session, uint32_t qpn, const std::string& node,
                             uint32_t remote_qpn, std::string secret,
                             const QpEndpoint& peer) override;
  absl::Status DestroyQueuePair(uint64_t session, uint32_t qpn) override;
  void SessionEnded(uint64_t session) override;
  absl::StatusOr<DoorbellAccess> OpenDoorbellAccess(uint64_t session) override;
  absl::Status ReleaseDoorbellAccess(uint64_t session) override;
  std::vector<softnic::QpInfo> ListQps() const override;
  std::vector<softnic::RegionInfo> ListRegions() const override;
  std::vector<QpRingCounters> ListRingCounters() const override;

  size_t sessions_open() const;
  // QPs the CPU-assisted doorbell watches, and its rings so far (tests).
  size_t doorbells_watched() const { return doorbell_.watched(); }
  uint64_t doorbell_rings() const { return doorbell_.rings(); }

 private:
  // A QP's CQ ring in the daemon's mapping of host control memory, and
  // the mapping that keeps it readable; empty for rings in GPU memory.
  struct CqView {
    std::shared_ptr<softnic::SharedMapping> control;
    const uint8_t* cq = nullptr;
    uint32_t cqe_cnt = 0;
  };
  struct Qp {
    softnic::QpInfo info;
    uint32_t umem = 0;
    // The daemon's view of the rings: null where they are in GPU memory.
    const uint8_t* sq_dbrec = nullptr;
    const uint8_t* cq_dbrec = nullptr;
    CqView cq;  // its CQ ring: why the NIC failed it
    std::shared_ptr<softnic::SharedMapping> control;
    // Its failure was logged (once: LogFailureOnce, under mu_, or after the
    // QP left the maps).
    mutable bool failure_logged = false;
    uint32_t psn = 0;         // its initial send PSN (random; the peer's next_rcv_psn)
    std::string remote_node;  // connected to another node's QP ("": none, or this node's)
  };
  struct Session {
    std::unique_ptr<NicSession> mlx5;
    absl::flat_hash_map<uint32_t, softnic::RegionInfo> regions;  // by lkey
    absl::flat_hash_map<uint32_t, Qp> qps;                       // by QPN
    absl::flat_hash_map<uint32_t, uint32_t> umem_qps;            // umem id -> live QPs
    bool client_rings = false;  // its command fd was handed out ("gpu-uar")
  };
  // The syndrome of a QP's failure, read from its CQ ring in the client's
  // control memory (cq_error_scan.h): 0 when none (or the ring is in GPU
  // memory, or a page of it is no longer in memory). Needs no lock.
  static uint8_t FailureSyndrome(const CqView& cq);
  // Logs `syndrome` (not 0) for `qp` the first time, `when` saying on which
  // occasion. Under mu_ while the QP is in the maps.
  static void LogFailureOnce(uint64_t session, const Qp& qp, uint8_t syndrome, const char* when);
  // FailedPrecondition when `s` holds regions or QPs (the doorbell hand-off
  // comes first, so no object ever changes hands).
  absl::Status CheckNothingHeld(const Session& s, const char* what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The session's state, opening its Mlx5Session on first use (outside
  // mu_: only this session's calls could race, and they do not overlap).
  absl::StatusOr<std::shared_ptr<Session>> SessionFor(uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);
  // One QP per layout with its rings in `umem` (from `control_offset` of
  // the control memory), all or nothing (the umem is deregistered on a
  // refusal). `control`: the daemon's mapping of host rings; null for
  // rings in GPU memory (nothing of them is read then).
  absl::StatusOr<std::vector<uint32_t>> CreateOnUmem(
      uint64_t session, Session& s, uint32_t umem, uint64_t control_offset,
      const std::vector<QpLayout>& layouts, std::shared_ptr<softnic::SharedMapping> control)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<Session> Find(uint64_t session) const ABSL_LOCKS_EXCLUDED(mu_);
  // Connect's and ConnectRemote's common part: RESET -> RTS towards
  // `remote` from the QP's own PSN, the QP listed in ERROR when the NIC
  // refused half way, and watched by the CPU-assisted doorbell.
  absl::Status ConnectTo(uint64_t session, const std::shared_ptr<Session>& s, uint32_t qpn,
                         const RemoteQp& remote) ABSL_LOCKS_EXCLUDED(mu_);
  static uint64_t DoorbellKey(uint64_t session, uint32_t qpn) {
    return session << 24 ^ qpn;  // sessions count up from 1; QPNs are 24-bit
  }

  const std::vector<Mlx5SessionOptions> nics_;
  const ConnectTuning tuning_;
  const NicSessionOpener open_;
  const HandOffRightsCheck handoff_rights_;
  // The options of the NIC `session` opens on (bound, else the default).
  const Mlx5SessionOptions& NicOptionsOf(uint64_t session) const ABSL_LOCKS_EXCLUDED(mu_);
  // Sessions bound to a NIC other than the default: index into nics_.
  absl::flat_hash_map<uint64_t, size_t> bound_ ABSL_GUARDED_BY(mu_);
  // LinkOf's probes: one at a time (held across the open), answers by
  // device with when they were read. Never taken under mu_.
  struct ProbedLink {
    SessionLink link;
    std::string atomics;
  };
  struct Probe {
    absl::StatusOr<ProbedLink> answer;
    absl::Time at;
  };
  // A context opened and closed on `o`'s NIC, or the answer of one less
  // than kLinkProbeReuse old: a refusal is kept as long, so a NIC that
  // refuses to open is not reopened by every GetTopology or GetRdmaInfo.
  absl::StatusOr<ProbedLink> ProbeLocked(const Mlx5SessionOptions& o)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(probe_mu_);
  absl::Mutex probe_mu_;
  absl::flat_hash_map<std::string, Probe> probed_ ABSL_GUARDED_BY(probe_mu_);
  const std::string name_ = "mlx5";
  const std::string doorbell_mode_ = "cpu-assisted";
  mutable absl::Mutex mu_;
  // A Session's maps and flag are guarded by mu_ too; its NicSession
  // (const pointer, own mutex) is called without mu_.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  // Last: stopped first, before any session's UAR goes.
  CpuDoorbell doorbell_;
};

}  // namespace mooncake::daemon::mlx5
