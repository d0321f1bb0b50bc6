// GroupBroker: named groups of ranks and their rendezvous.
//
// A member joins group G as rank r of n with an opaque handle (bytes and/or
// fds) and a deadline. When all n ranks are in, the group forms and every
// member receives the full view: each rank's node, GPU, handle, and whether
// the receiver can reach it directly (P2P). Members that leave or whose
// session ends are reported to the others as events.
//
// Elastic groups: a formed group's rank that was lost or left is vacant;
// each surviving member releases it (ReleaseRank, with its fresh RDMA
// endpoint), and a replacement's join of that rank completes once all have:
// the group re-forms at epoch + 1, the replacement gets the view and the
// survivors a JOINED event with its entry (docs/architecture.md, "Elastic
// groups"). Across nodes the same steps travel through the directory: the
// replacement claims the vacant rank (ClaimVacant, a JOINING record), each
// survivor's release is written into its record, and every node re-forms
// on its own once its view holds a replacement for every vacant rank and
// every release.
//
// Groups are scoped by the caller's uid and tenant (the tenant socket its
// session came through; "" for the main socket): the same name under two
// uids, or two tenants of one uid, is two unrelated groups, and no caller
// can see or join another user's or another tenant's group.
// Thread-safe. JoinAsync never blocks: the daemon's RPC threads are not
// held while a rendezvous waits (a 256-rank join would otherwise park 256
// threads); deadlines are enforced by one timer thread from an index
// ordered by deadline, so expiring k joins costs O(k log n).
//
// Memory is O(n) per group of n ranks: the view is encoded once per group
// and receiving GPU and shared by every rank's reply (EncodedView), and each
// member's fds get one ticket for the whole group. What one uid may make
// the broker hold is bounded (BrokerLimits: ranks, waiting joins, view
// bytes, join timeout); a join past a limit fails with ResourceExhausted
// naming the config key. Root and the daemon's own uid are not limited.
//
// Across nodes (set_directory, with etcd): every local rank is claimed in
// the GroupDirectory before it counts, the ranks other nodes claimed come in
// through RemoteChanged, and the group forms when local and remote ranks
// together fill the world. Remote members appear in the view with their
// node, GPU and RDMA endpoint (never P2P-reachable, no handle bytes or
// fds). What becomes of a rank after formation travels the same way, so a
// rank left or lost on one node, or a whole node gone, is reported to the
// members on every other node. While the directory cannot be reached a
// group whose ranks all join here still forms (node-local work never waits
// on etcd); one with remote ranks waits, and its joins time out naming
// the directory's trouble.
//
// The code, by concern: group_broker.cc (joins, leaves, sessions, budgets,
// deadlines, listings), group_formation.cc (when a group forms and the views
// its members receive), group_elastic.cc (vacating, releasing, re-forming),
// group_cluster.cc (claims, other nodes' ranks, who counts as a member
// across nodes, who may fetch endpoints).
//
// A join is validated once, by ValidateJoin, which yields the ValidatedJoin
// that JoinAsync requires. The broker sees the rest of the daemon through
// the SessionRegistry (liveness, events) and an FdTicketIssuer (members'
// fds); both are not owned and must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "admission/principal.h"
#include "admission/rate_limited_log.h"
#include "broker/group_directory.h"
#include "broker/group_events.h"
#include "broker/group_summary.h"
#include "broker/tenant_span_policy.h"
#include "broker/validated_join.h"
#include "fdchannel/fd_ticket_issuer.h"
#include "fdchannel/ticket_store.h"
#include "metrics/event_counters.h"
#include "mooncake/v1/local.pb.h"
#include "mooncake/v1/node.pb.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

struct BrokerLimits {
  uint32_t max_world_size = 65536;
  uint32_t default_timeout_ms = 30000;
  uint32_t max_timeout_ms = 600000;  // max_join_timeout_ms
  size_t max_handle_bytes = 4096;
  // Per unprivileged uid, over all its groups on this node.
  uint64_t max_ranks_per_uid = 8192;
  uint64_t max_waiting_joins_per_uid = 4096;
  uint64_t max_view_bytes_per_uid = 256u << 20;
};

// One rank's view of a formed group: `shared` (the members, encoded once
// for every receiver on the same GPU) followed by `own` (the receiver's
// rank) is a serialized v1::JoinGroupResponse — protobuf merges
// concatenated messages, so the RPC layer sends the two as slices and the
// client parses one message.
struct EncodedView {
  std::shared_ptr<const std::string> shared;
  std::string own;
  size_t size() const { return (shared ? shared->size() : 0) + own.size(); }
  absl::StatusOr<v1::JoinGroupResponse> Decode() const;
};

class GroupBroker {
 public:
  // Most RDMA queue pairs one member may publish per peer.
  static constexpr uint32_t kMaxQpsPerPeer = 64;
  using JoinDone = std::function<void(absl::StatusOr<EncodedView>)>;

  GroupBroker(std::string node_id, v1::Topology topology, BrokerLimits limits,
              SessionRegistry* sessions, FdTicketIssuer* fd_tickets);
  ~GroupBroker();

  // Every check of a join that needs only the request and this node: group
  // name, world size, rank, handle size and kind, and the GPU selector
  // (InvalidArgument with what to fix). Reads no group state.
  absl::StatusOr<ValidatedJoin> ValidateJoin(const v1::JoinGroupRequest& request) const;

  // Registers a join. `done` runs exactly once, never under the broker's
  // lock: at once when the join conflicts with its group (world size,
  // taken rank, formed group) or the session is gone, when the group forms
  // (with the caller's view), when the deadline passes, on CancelJoin,
  // when the caller's session ends, or on Shutdown. On any error the
  // caller's rank is not left behind in the group.
  void JoinAsync(const SessionInfo& caller, ValidatedJoin join, FdBundlePtr fds, JoinDone done);
  // The caller's RPC went away: drops a still-waiting rank (done gets
  // Cancelled). No-op when the join already completed.
  void CancelJoin(const SessionInfo& caller, const std::string& group, uint32_t rank);

  // Blocking form of ValidateJoin + JoinAsync (tests, tools): waits for
  // `done`, polling `cancelled` every 100 ms and cancelling the join when
  // it returns true. Returns the decoded view.
  absl::StatusOr<v1::JoinGroupResponse> Join(const SessionInfo& caller,
                                             const v1::JoinGroupRequest& request, FdBundlePtr fds,
                                             const std::function<bool()>& cancelled);
  absl::Status Leave(const SessionInfo& caller, const std::string& group, uint32_t rank);
  absl::Status ReportReady(const SessionInfo& caller, const v1::ReportReadyRequest& request);
  // Elastic groups: the caller's rank dropped `released_rank` (reported
  // LOST or LEFT) and, with `rdma` set, publishes a new endpoint (fresh
  // queue pairs toward that rank). NotFound when the caller holds no such
  // rank; FailedPrecondition when the released rank is not vacant.
  absl::Status ReleaseRank(const SessionInfo& caller, const v1::ReleaseRankRequest& request);

  // The session is gone: its ranks become `lost` (or vanish while forming).
  void SessionEnded(uint64_t session_id);
  // Fails every waiting Join with Unavailable.
  void Shutdown();

  // Groups `scope` sees (session_registry.h: Scope, ScopeOf).
  std::vector<GroupSummary> List(const Scope& scope) const;
  size_t CountVisible(const Scope& scope) const;
  // The main socket's groups of `uid` (every group for root when `all` is
  // set): List(Scope{uid, "", all, all}).
  std::vector<GroupSummary> List(uint32_t uid, bool all) const;
  size_t CountVisible(uint32_t uid, bool all) const;
  // Whether the session holds a live rank of a group that has a live rank
  // on `node` (issue 23 item 6: queue pairs go only to such nodes).
  bool SharesGroupWithNode(uint64_t session_id, const std::string& node) const;
  // Whether `node` may fetch the RDMA endpoints of this node's ranks of a
  // group (Peer.FetchRankEndpoints; issue 23 item 2): the group has a rank
  // here, and `node` holds a live claim of it in the cluster's records,
  // proving the group's secret when the group has one. Pending claims
  // count (each side fetches before its group forms). NotFound: no rank
  // here; PermissionDenied: `node` is not a member.
  absl::Status MayFetchEndpoints(uint32_t uid, const std::string& tenant, const std::string& group,
                                 const std::string& node);
  // "name/rank" for each live membership of the session.
  std::vector<std::string> MembershipsOf(uint64_t session_id) const;

  // What a principal (a uid on one tenant's socket) holds against its
  // limits (tests, diagnostics).
  struct Usage {
    uint64_t ranks = 0;
    uint64_t waiting = 0;
    uint64_t view_bytes = 0;
  };
  Usage UsageOf(const Principal& who) const;

  // Groups per state (GroupStateName), for the metrics: no names, no copies.
  std::map<std::string, uint64_t> CountByState() const;
  // Where joins and lost members are counted (metrics on; null: off). Set
  // before serving; not owned, outlives the broker.
  void set_counters(metrics::EventCounters* counters) { counters_ = counters; }
  // Where every group event is reported (the admin event feed behind
  // `mcctl watch`; null: nowhere). Not owned; called under the broker's
  // lock (GroupEventSink). Set it to null before the sink goes away.
  void set_event_sink(GroupEventSink* sink) {
    absl::MutexLock lock(&mu_);
    events_ = sink;
  }
  // Which nodes each tenant's groups may span (tenant_policy_file; null:
  // no policy, every node). Replaced on SIGHUP: members counted before
  // stay; what is counted, and which node may fetch endpoints, from then
  // on follows the new one.
  void set_span_policy(std::shared_ptr<const TenantSpanPolicy> policy) {
    absl::MutexLock lock(&mu_);
    span_policy_ = std::move(policy);
  }
  // Where groups meet across nodes (null: this node alone). Set before
  // serving; not owned, outlives the broker.
  // Null detaches it (the daemon's shutdown, before the directory goes).
  void set_directory(GroupDirectory* directory) {
    absl::MutexLock lock(&mu_);
    directory_ = directory;
  }

  // From the directory: rank `rank` of (uid, tenant, group) on another node is now
  // `member` (nullopt: its claim is gone: withdrawn, or its node's lease
  // expired). Ignored for groups with no local member.
  void RemoteChanged(uint32_t uid, const std::string& tenant, const std::string& group,
                     uint32_t rank, std::optional<ClusterMember> member);

 private:
  struct Group;
  struct Member {
    uint32_t rank = 0;
    uint64_t session = 0;
    PeerCred cred;
    int gpu_index = -1;
    std::string gpu_uuid, gpu_pci;
    v1::MemberHandle handle;                       // fd_ticket cleared
    std::shared_ptr<const v1::RdmaEndpoint> rdma;  // null: no RDMA route to it
    FdBundlePtr fds;
    MemberState state = MemberState::kJoined;
    uint64_t view_bytes = 0;  // its entry in the view, charged to the uid
    // With a directory: whether the cluster agreed this rank is ours.
    enum class Claim { kNone, kPending, kUnreachable, kClaimed } claim = Claim::kNone;
  };
  // A waiting join's place in the deadline index.
  struct DeadlineRef {
    Group* group;
    uint32_t rank;
  };
  using DeadlineIndex = std::multimap<absl::Time, DeadlineRef>;
  struct Waiter {
    SessionInfo caller;
    JoinDone done;
    uint32_t timeout_ms = 0;
    DeadlineIndex::iterator deadline;
  };
  struct Group {
    std::string name;
    uint32_t uid = 0;
    std::string tenant;  // the creating session's; part of its GroupKey
    uint32_t world_size = 0;
    std::string secret;  // the group secret its local ranks gave ("" none)
    bool formed = false;
    uint64_t epoch = 0;
    absl::Time created;
    std::map<uint32_t, Member> members;        // this node's ranks
    std::map<uint32_t, ClusterMember> remote;  // other nodes' ranks (with a directory)
    std::map<uint32_t, Waiter> waiters;        // ranks whose JoinAsync has not completed
    // Formed groups (elastic): each vacated (lost or left) rank and the
    // survivors (here and on other nodes) that have not released it yet.
    // A replacement waits for its set to empty.
    std::map<uint32_t, std::set<uint32_t>> unreleased;
  };
  // A completion to run once the lock is released.
  struct Completion {
    JoinDone done;
    absl::StatusOr<EncodedView> result;
  };
  // What every member's view is built from, once per formation.
  struct Formation {
    std::shared_ptr<const Group> group;  // immutable snapshot (no waiters)
    std::vector<std::pair<uint32_t, Waiter>> waiters;
    // A formed group taken again: the waiters are replacements, and every
    // other member gets a JOINED event per replacement, here and on other
    // nodes (remote_newcomers, entries of group->remote).
    bool reform = false;
    std::vector<uint32_t> remote_newcomers;
  };
  // (uid, tenant, name). A tuple, not a struct, so that a key built
  // without the tenant does not compile.
  using GroupKey = std::tuple<uint32_t, std::string, std::string>;
  static GroupKey KeyOf(const SessionInfo& caller, const std::string& group) {
    return GroupKey{caller.cred.uid, caller.tenant, group};
  }
  static GroupKey KeyOf(const Group& g) { return GroupKey{g.uid, g.tenant, g.name}; }
  using MemberRef = std::pair<Group*, uint32_t>;

  absl::StatusOr<int> ResolveGpu(const v1::DeviceSelector& device, std::string* uuid,
                                 std::string* pci) const;
  bool Reachable(int from_gpu, int to_gpu, bool* native_atomics) const;
  uint64_t EntryBytes(const Member& m) const;
  // The members' part of the view for receivers on `receiver_gpu`.
  // Thread-safe without mu_: reads an immutable snapshot.
  std::shared_ptr<const std::string> EncodeShared(const Group& g, int receiver_gpu,
                                                  const std::vector<std::string>& tickets) const;
  static void Complete(std::vector<Completion>* completions);
  void CompleteFormation(Formation f) const;
  // Whether a remote rank that would be in the group's view still waits for
  // its RDMA endpoint (the group forms, or re-forms, once none does).
  static bool EndpointsPendingLocked(const Group& g);
  // Whether another node's rank `c` counts as a member of the group: the
  // tenant span policy, when set, lets the group's tenant meet `c`'s node
  // here, and `c` proves the group's `secret` when it has one. A refusal
  // is logged (rate limited).
  bool AdmitsRemoteLocked(const std::string& secret, uint32_t uid, const std::string& tenant,
                          const std::string& group, uint32_t rank, const ClusterMember& c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckBudget(const Principal& who, uint64_t view_bytes, bool waits) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();
  void NotifyOthers(const Group& g, uint32_t about_rank, v1::MemberEvent::Kind kind,
                    const std::string& detail) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forms `g` when every rank is present (local, claimed where needed, or
  // remote): marks it formed and takes its waiters.
  std::optional<Formation> MaybeFormLocked(Group& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static std::shared_ptr<Group> FormedSnapshotLocked(const Group& g);
  // Posts READY to this node's members once every rank (here and on other
  // nodes) reported ready; `last_rank` is the report that completed it.
  void MaybeAllReadyLocked(const Group& g, uint32_t last_rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-forms a formed group at epoch + 1 when every vacated rank has a
  // waiting replacement and every survivor released the vacated ranks.
  std::optional<Formation> MaybeReformLocked(Group& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `rank` of formed `g` was lost or left: every live member must release it.
  void VacateLocked(Group& g, uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Another node's rank of formed `g` left or was lost.
  void RemoteGoneLocked(Group& g, uint32_t rank, MemberState state, const std::string& detail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether other nodes' records show their group formed, and setting up a
  // group first seen formed from them (epoch, vacant ranks, releases).
  static bool FormedInRecords(const std::vector<ClusterMember>& records);
  void AdoptFormationLocked(Group& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `rank` has a live holder, here or on another node.
  static bool PresentLocked(const Group& g, uint32_t rank);
  // Another node's member's entry in a view.
  static void FillRemoteView(const ClusterMember& c, v1::MemberView* v);
  // One local member's entry in a view for a receiver on `receiver_gpu`.
  void FillLocalView(const Member& m, int receiver_gpu, const std::string& ticket,
                     v1::MemberView* v) const;
  // The directory's answer to the claim of `rank` made for `session`.
  void ClaimAnswered(const GroupKey& key, uint32_t rank, uint64_t session, ClaimOutcome outcome,
                     const absl::Status& status);
  // Every change to members and waiters goes through these, which keep the
  // per-uid usage, the session index and the deadline index in step.
  void AddMemberLocked(Group& g, Member m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseMemberLocked(Group& g, uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddWaiterLocked(Group& g, uint32_t rank, const SessionInfo& caller, JoinDone done,
                       uint32_t timeout_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JoinDone TakeWaiterLocked(Group& g, std::map<uint32_t, Waiter>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseIfEmpty(const GroupKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static GroupState StateOf(const Group& g);
  // Reports to the event sink, when one is set.
  void Emit(const Group& g, GroupEvent::Kind kind, uint32_t rank, int pid, std::string detail) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string node_id_;
  const v1::Topology topology_;
  const BrokerLimits limits_;
  SessionRegistry* sessions_;
  FdTicketIssuer* fd_tickets_;
  metrics::EventCounters* counters_ = nullptr;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  GroupDirectory* directory_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool timer_kick_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time timer_next_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::map<GroupKey, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  DeadlineIndex deadlines_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::set<MemberRef>> by_session_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Principal, Usage> usage_ ABSL_GUARDED_BY(mu_);
  RateLimitedLog secret_refusals_;
  std::shared_ptr<const TenantSpanPolicy> span_policy_ ABSL_GUARDED_BY(mu_);
  RateLimitedLog policy_refusals_;
  GroupEventSink* events_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread timer_;
};

}  // namespace mooncake::daemon
