// RdmaResources: the one owner of the RDMA objects mooncaked holds for
// sessions — memory regions and queue pairs — on top of a provider
// (rdma/provider.h: softnic, or mlx5 DevX), which does the object work.
// This class keeps the bookkeeping the providers share: ownership, budgets,
// authorization, listings, and mapping the client memory a call names.
//
// Ownership: every region and QP belongs to exactly one session (its
// protection domain is the session id) and is destroyed with it, by
// SessionEnded, which SessionLifecycle::End calls after closing the session
// in the registry. Every creating call checks, under the same lock
// SessionEnded takes, that the session is still open, so nothing is created
// for a session that has already been cleaned up.
//
// Authorization: a QP may only be connected to a QP owned by a session of
// the same uid (groups are per-uid too). Keys are checked by the provider
// against the protection domain of the QP that uses them.
//
// Limits per session and per uid (RdmaBudget, rdma_budget.h; config keys in
// docs/limits.md): ResourceExhausted names the key. Only the part of client
// memory a region or a QP's rings use is mapped, and that part is charged.
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "fdchannel/ticket_store.h"
#include "mooncake/common/unique_fd.h"
#include "rdma/nic_choice.h"
#include "rdma/provider.h"
#include "rdma/rdma_budget.h"
#include "rdma/remote_connections.h"
#include "rdma/sealed_memfd_mappings.h"
#include "session/session_registry.h"
#include "softnic/cuda_memory.h"
#include "softnic/engine.h"

namespace mooncake::daemon {

struct QpConnection {
  uint32_t qpn = 0;
  uint32_t remote_qpn = 0;
  std::string remote_node;  // "" = this node; else a node of the cluster
};

struct QpRow {
  softnic::QpInfo info;
  uint64_t session = 0;
  uint32_t uid = 0;
  int32_t pid = 0;
  // What the client last wrote in the QP's doorbell records (provider.h
  // QpRingCounters); unset where the provider does not read them.
  std::optional<QpRingCounters> rings;
};

struct MrRow {
  softnic::RegionInfo info;
  uint64_t session = 0;
  uint32_t uid = 0;
  int32_t pid = 0;
  std::string kind;  // "host", "cuda-vmm", "dmabuf" or "peermem"
};

class RdmaResources {
 public:
  // Over `provider` (not null). `cuda_options`: how GPU memory
  // ("cuda-vmm-fd") is reached (the CUDA library to load when the first
  // GPU region is registered; tests pass a fake driver).
  RdmaResources(const SessionRegistry* sessions, RdmaLimits limits,
                std::unique_ptr<RdmaProvider> provider,
                softnic::CudaMemoryOptions cuda_options = {});
  // Over a SoftnicProvider named `nic_name`.
  RdmaResources(const SessionRegistry* sessions, std::string nic_name, RdmaLimits limits,
                softnic::EngineOptions engine_options,
                softnic::CudaMemoryOptions cuda_options = {});
  ~RdmaResources();

  const std::string& provider() const { return provider_->name(); }
  const std::string& nic() const { return provider_->nic(); }
  // The atomics `nic` answers, in words (RdmaProvider::AtomicsOf).
  std::string NicAtomics(const std::string& nic) const { return provider_->AtomicsOf(nic); }
  std::vector<std::string> served_nics() const { return provider_->served_nics(); }
  // How doorbells reach the provider (see rdma.proto RdmaInfo).
  const std::string& doorbell_mode() const { return provider_->doorbell_mode(); }
  const RdmaLimits& limits() const { return limits_; }

  struct Registered {
    uint32_t lkey = 0;
    uint32_t rkey = 0;
    std::string kind;
  };
  // Registers [offset, offset + length) of the memory behind the one fd in
  // `fds` at `iova`, listed with the returned kind:
  //   "memfd"        a memfd sealed against shrinking (host memory; "host")
  //   "cuda-vmm-fd"  the POSIX fd of a cuMem VMM allocation holding at least
  //                  offset + length bytes (GPU memory; "cuda-vmm", or
  //                  "peermem" on mlx5), mapped in the daemon's CUDA context
  //                  (softnic/cuda_memory.h)
  //   "dmabuf"       (mlx5 only) a dmabuf fd of GPU memory, registered with
  //                  ibv_reg_dmabuf_mr; nothing is mapped in the daemon
  // InvalidArgument for a kind the provider does not take (its
  // CheckMemoryKind), a bad fd or range; ResourceExhausted
  // past a limit (a host region charges the bytes from the start of its
  // first page, a GPU one its whole mapping); GPU memory also fails when
  // this node has no CUDA driver or GPU (NotFound / FailedPrecondition),
  // when mooncaked was built without CUDA (FailedPrecondition), or with the
  // CUDA error of the import, named.
  absl::StatusOr<Registered> RegisterMemory(const SessionInfo& session, FdBundlePtr fds,
                                            const std::string& kind, uint64_t iova, uint64_t length,
                                            uint64_t offset, uint32_t access,
                                            uint64_t allocation_bytes = 0);
  absl::Status DeregisterMemory(const SessionInfo& session, uint32_t lkey);
  // What RegisterMemory checks before it touches the fd (InvalidArgument),
  // so that the service can refuse a bad request without taking its ticket.
  absl::Status ValidateRegistration(const std::string& kind, uint64_t iova, uint64_t length,
                                    uint64_t offset) const;

  // Creates one QP per layout, with rings in the control memfd (one fd of
  // at least `control_bytes`; only the span the rings use is mapped, and it
  // counts as one memory region until the last of these QPs is destroyed).
  // All or nothing. `control_kind` "dmabuf": the fd is instead the dmabuf
  // of GPU memory the client allocated for its rings; nothing is mapped in
  // the daemon and the provider places the rings there or refuses
  // (RdmaProvider::CreateQueuePairsInGpuMemory).
  absl::StatusOr<std::vector<uint32_t>> CreateQueuePairs(const SessionInfo& session,
                                                         FdBundlePtr control,
                                                         uint64_t control_bytes,
                                                         const std::vector<QpLayout>& layouts,
                                                         const std::string& control_kind = "memfd");
  // The session's copy agent (mooncake/common/copy_agent_channel.h): the
  // one fd in `fds` is the channel memfd (sealed, populated) of
  // kHeaderBytes + `staging_bytes`; it is mapped, charged to the session's
  // mapped bytes, and handed to the provider (softnic; a NIC refuses with
  // FailedPrecondition). InvalidArgument for a size or header that does not
  // fit; AlreadyExists for a second agent of the session.
  absl::Status AttachCopyAgent(const SessionInfo& session, FdBundlePtr fds, uint64_t staging_bytes);
  // How long softnic waits for one answer of a copy agent.
  void set_copy_agent_timeout(absl::Duration timeout) { copy_agent_timeout_ = timeout; }

  // InvalidArgument unless `kind` is a control memory kind: "memfd" (or
  // empty) or "dmabuf".
  static absl::Status ValidateControlKind(const std::string& kind);
  // What CreateQueuePairs checks of the layouts before it touches the fd.
  absl::Status ValidateQueuePairs(uint64_t control_bytes,
                                  const std::vector<QpLayout>& layouts) const;
  // Every pair is checked first, and nothing is connected when one fails
  // a check (the QP is the session's, in RESET, not failed before, named
  // once; the remote QP is of the same uid; a remote node is one that
  // RemoteConnections::CheckNode accepts). Then the pairs are connected
  // in request order. When the provider refuses pair i (a NIC can: port
  // down, firmware refusal), the call stops there and nothing is undone
  // (a QP in RTS goes back only by being destroyed, which would change its
  // number): pairs before i are connected (RTS), pairs after i untouched
  // (RESET), and pair i's QP is either still in RESET (refused before any
  // transition: it may be connected again) or in ERROR (refused half way:
  // it must be destroyed; connecting it again is FailedPrecondition). The
  // error keeps the provider's code and names all of this, by request
  // index and QPN. A client recovers by connecting the rest again, or by
  // DestroyQueuePairs on everything and creating them anew. A pair to
  // another node first offers its connection secret to that node
  // (RemoteConnections::Offer); a refused offer stops the call like a
  // provider's refusal, with that QP still in RESET.
  absl::Status Connect(const SessionInfo& session, const std::vector<QpConnection>& pairs);
  // All or nothing: NotFound unless every QP is the session's,
  // InvalidArgument when one is named twice.
  absl::Status DestroyQueuePairs(const SessionInfo& session, const std::vector<uint32_t>& qpns);

  // The doorbell hand-off (rdma.proto GetDoorbellAccess): at most once per
  // session, before it holds regions or QPs (FailedPrecondition otherwise,
  // and from a provider without a UAR). Release undoes it (OK when nothing
  // was handed out); the session cannot take it again.
  absl::StatusOr<DoorbellAccess> OpenDoorbellAccess(const SessionInfo& session);
  absl::Status ReleaseDoorbellAccess(const SessionInfo& session);

  // Which NIC the session's QPs and regions go on (nic_choice.h), before
  // its first object: FailedPrecondition after one, InvalidArgument for a
  // NIC the provider does not serve. Affinity comes from set_topology.
  absl::StatusOr<NicChoice> SelectNic(const SessionInfo& session, const NicRequest& request);
  // The link the session's QPs use on its NIC (RdmaProvider::LinkOf).
  // FailedPrecondition for a session that has ended.
  absl::StatusOr<SessionLink> LinkOf(const SessionInfo& session);
  // The default NIC's link, for a caller without a session.
  absl::StatusOr<SessionLink> LinkOfDefaultNic() { return provider_->LinkOf(kNoSession); }
  static constexpr uint64_t kNoSession = 0;  // session ids count from 1
  // The NIC the session's objects go on.
  std::string SessionNic(uint64_t session) const { return provider_->SessionNic(session); }
  // Discovery's view of this node (GPU-NIC affinity), set once before the
  // daemon serves.
  void set_topology(v1::Topology topology) { topology_ = std::move(topology); }
  // Node `node` (authenticated by the peer channel) offers the connection
  // of its QP `their_qpn`, whose endpoint is `theirs`, to this node's QP
  // `qpn`, for a session of `uid` on the socket of `tenant`. NotFound
  // unless `qpn` is a QP of that owner (a node vouches for its own
  // sessions) and a group of that QP's session has a live rank on `node`
  // (RemoteConnections::AcceptsOfferFrom, waiting up to kOfferMemberWait
  // for it to show): the same answer for a missing QP, another owner's and
  // a node outside the session's groups. FailedPrecondition when the two
  // ends are on different providers. The
  // provider takes the offer (AcceptRemote) and the answer is `qpn`'s
  // endpoint, which `node` connects with.
  static constexpr absl::Duration kOfferMemberWait = absl::Seconds(2);
  absl::StatusOr<QpEndpoint> AcceptOffer(const std::string& node, uint32_t their_qpn, uint32_t qpn,
                                         uint32_t uid, const std::string& tenant,
                                         std::string secret, const QpEndpoint& theirs);
  // How queue pairs reach other nodes (null: they are refused). Set once
  // before the daemon serves.
  void set_remote_connections(std::shared_ptr<RemoteConnections> remote) {
    remote_ = std::move(remote);
  }

  // Everything the session owned.
  void SessionEnded(uint64_t session);

  // Listings for mcctl: the caller's own (or everything for `all`).
  std::vector<QpRow> ListQps(uint32_t uid, bool all) const;
  std::vector<MrRow> ListMrs(uint32_t uid, bool all) const;
  size_t QpCountOf(uint64_t session) const;
  // What a session or a uid holds against its limits (tests, the fuzzer).
  RdmaUsage UsageOfSession(uint64_t session) const;
  RdmaUsage UsageOf(const Principal& who) const;
  // Sessions holding anything; control mappings alive (tests, the fuzzer).
  size_t SessionsHolding() const;
  size_t ControlMappings() const;
  // Memfds mapped and sealed now (sealed_memfd_mappings.h; tests).
  size_t SealedMemfdsMapped() { return sealed_.mapped(); }
  // Over every session (the metrics): qps, mrs = registered regions (not
  // QP control memory), bytes = what those regions map.
  RdmaUsage Totals() const;
  // RdmaProvider::bytes_moved (-1: a NIC moves the bytes).
  int64_t provider_bytes_moved() const { return provider_->bytes_moved(); }
  // RdmaProvider::gpu_work (nullopt: a NIC).
  std::optional<RdmaProvider::GpuWork> provider_gpu_work() const { return provider_->gpu_work(); }
  // RdmaProvider::counts_wqes (QpRow::info.wqes_done means something).
  bool provider_counts_wqes() const { return provider_->counts_wqes(); }

 private:
  struct Owner {
    uint64_t session = 0;
    uint32_t uid = 0;
    int32_t pid = 0;
    std::string tenant;  // the accepting socket's; QPs connect only within one
  };
  // The mutex that serializes `session`'s calls reaching the provider (and
  // its end, which waits for them); made on first use.
  std::shared_ptr<absl::Mutex> GateOf(uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckOpen(const SessionInfo& session) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CheckOpen, then the budget; for the check before mapping client memory
  // (so a refused call maps nothing) and again, authoritative, after it.
  absl::Status CheckOpenAndBudget(const SessionInfo& session, const RdmaUsage& more) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets QP `qpn` (destroyed), giving back its budget and, with the last
  // QP of its control mapping, the mapping's.
  void ForgetQpLocked(uint32_t qpn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error of a Connect the provider refused at pairs[failed] (see
  // Connect); marks that QP broken when the provider lists it in ERROR.
  absl::Status HalfConnected(const SessionInfo& session, const std::vector<QpConnection>& pairs,
                             size_t failed, const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  const SessionRegistry* const sessions_;
  const RdmaLimits limits_;
  // Before provider_: regions (destroyed with the provider) hold buffers of it.
  const std::shared_ptr<softnic::CudaMemory> cuda_;
  const std::unique_ptr<RdmaProvider> provider_;
  v1::Topology topology_;                                 // set before serving, read-only then
  std::shared_ptr<RemoteConnections> remote_;             // likewise
  absl::Duration copy_agent_timeout_ = absl::Seconds(2);  // likewise

  mutable absl::Mutex mu_;
  struct QpEntry {
    Owner owner;
    uint64_t control = 0;  // key of controls_
    bool connected = false;
    bool broken = false;  // a connect failed half way: only destruction is left
    // The secret of its connection to another node's QP, made at the
    // first attempt and offered again on a retry (RemoteConnections::Offer).
    std::string remote_secret;
  };
  absl::flat_hash_map<uint32_t, QpEntry> qp_owner_ ABSL_GUARDED_BY(mu_);
  struct MrEntry {
    Owner owner;
    uint64_t charged_bytes = 0;  // what is mapped for it
    std::string kind;
  };
  absl::flat_hash_map<uint32_t, MrEntry> mr_owner_ ABSL_GUARDED_BY(mu_);
  // The control memory of one CreateQueuePairs call: one memory region of
  // `bytes`, charged until its last QP is gone.
  struct ControlEntry {
    uint64_t session = 0;
    uint64_t bytes = 0;
    uint32_t qps = 0;
  };
  absl::flat_hash_map<uint64_t, ControlEntry> controls_ ABSL_GUARDED_BY(mu_);
  uint64_t next_control_ ABSL_GUARDED_BY(mu_) = 1;
  // Sessions that reached the provider (told of their end), and those
  // that took the doorbell hand-off.
  absl::flat_hash_set<uint64_t> provider_sessions_ ABSL_GUARDED_BY(mu_);
  // Sessions that took the hand-off (until they end: once per session),
  // with their principal, and how many each principal holds
  // (max_doorbell_handoffs_per_uid).
  absl::flat_hash_map<uint64_t, Principal> doorbell_handed_out_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Principal, uint32_t> handoffs_by_principal_ ABSL_GUARDED_BY(mu_);
  // A hand-off outlives its session: the client's copy of the command fd
  // keeps the verbs context (and its UAR pages) alive. So its charge stays
  // until the process the session belonged to has exited (a pidfd that
  // polls readable), not just the session: a loop of connect, hand-off,
  // disconnect in one process no longer piles up contexts uncounted.
  // A process that passed the fd on before exiting (SCM_RIGHTS, or a
  // child) still escapes the count; docs/limits.md says so.
  struct LingeringHandoff {
    Principal who;
    UniqueFd pidfd;  // invalid: the pid was not visible, released at once
  };
  absl::flat_hash_map<uint64_t, UniqueFd> handoff_pidfds_ ABSL_GUARDED_BY(mu_);
  std::vector<LingeringHandoff> lingering_handoffs_ ABSL_GUARDED_BY(mu_);
  // Releases the charge of lingering hand-offs whose process has exited.
  void ReapHandoffsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A number per principal that ever created a queue pair, for
  // RdmaProvider::SessionOwner (kept: one entry per user of the node).
  absl::flat_hash_map<Principal, uint64_t> owner_ids_ ABSL_GUARDED_BY(mu_);
  uint64_t OwnerIdLocked(const Principal& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Per session: held over its calls into the provider, which run without
  // mu_ (so one user's slow NIC call stalls nobody else, nor the listings).
  absl::flat_hash_map<uint64_t, std::shared_ptr<absl::Mutex>> gates_ ABSL_GUARDED_BY(mu_);
  RdmaBudget budget_ ABSL_GUARDED_BY(mu_);
  // Control memory and copy-agent channels, mapped and sealed once each.
  SealedMemfdMappings sealed_;
};

}  // namespace mooncake::daemon
