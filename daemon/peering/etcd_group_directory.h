// EtcdGroupDirectory: the GroupDirectory of a daemon in a cluster (issue 9
// item 3): groups whose ranks join on several nodes meet in etcd.
//
//   <prefix>/groups/<scope>/<group>/meta          world size, decimal; created once
//   <prefix>/groups/<scope>/<group>/ranks/<rank>  GroupRankRecord as JSON
// where <scope> is the uid, or <uid>@<tenant> for a tenant's socket.
//
// Both are written under the node's lease (NodeRegistry's): a node that
// dies or is cut off loses its lease, etcd deletes its keys, and every other
// node's watch sees its ranks go. When a node withdraws its last rank of a
// group it deletes meta if no rank of any node is left (one Txn with a
// compare over the ranks' prefix), whichever node created it.
//
// Claims. One worker thread does all writes, in the order they were asked
// for. Claims of one group that are queued together go in one Txn: "meta
// holds this world size and none of these ranks exists" then create them
// all (a 256-rank job over 4 nodes costs each node one or two Txns, not 64).
// When the Txn fails the worker reads what is there: a different world size
// fails every claim (InvalidArgument); a rank held by another node fails
// that claim (AlreadyExists, naming node and pid); the rest are tried again.
// A rank already holding this daemon's own record (an earlier attempt whose
// answer was lost) counts as claimed. etcd unreachable: the claim is
// answered kUnreachable once and retried, backing off to 1 s, until it
// succeeds or is withdrawn.
//
// Elastic groups. ClaimVacant writes a replacement's JOINING record over a
// LOST or LEFT one (comparing its mod_revision) or where none is left, one
// claim per Txn; Release and MarkState rewrite this node's own records
// (the released ranks, the fresh RDMA endpoint, the epoch), only while they
// are still under the node's lease.
//
// Reads. One Watcher on <prefix>/groups/ keeps a cache of every group's
// ranks (RemoteMembers answers from it without asking etcd), and every
// change to another node's rank goes to the sink (GroupBroker::RemoteChanged)
// on the watcher's thread. A watch etcd cancels (compaction) is replaced by
// a fresh read and watch, with the differences delivered. What etcd holds is
// checked before use (sizes, ranks, names): a malformed record is ignored
// with one warning per key.
//
// RDMA endpoints (issue 23 item 2). A record never carries one (raddr, rkey
// and QPNs are capabilities); it announces its version, rdma_generation,
// and the rank's node serves it over the peer channel (OwnEndpoints, behind
// Peer.FetchRankEndpoints). A remote record with a generation this node has
// not fetched goes to the broker at once, marked endpoint_pending (the
// broker forms no group around it), and again with its endpoint once the
// EndpointFetcher has it from the rank's node. Only a node holding a rank
// of the group asks (only such a node is answered), retrying with back-off
// for as long as the record stands. Without a peer channel (no peer TLS)
// records go to the broker without endpoints, logged once per group.
//
// Groups are scoped by uid in the key: a uid must mean the same user on
// every node (docs/cluster.md). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "admission/rate_limited_log.h"
#include "broker/group_directory.h"
#include "etcd/etcd_client.h"
#include "etcd/etcd_watch.h"
#include "mooncake/v1/peer.pb.h"
#include "peering/endpoint_fetcher.h"
#include "peering/rank_endpoints.h"

namespace mooncake::daemon::peering {

struct GroupDirectoryOptions {
  std::string prefix = "/mooncake";  // no trailing '/'
  std::string node_id;
  std::string instance_id;
  // The node's lease now (0 while it is not registered); claims go under it.
  std::function<int64_t()> lease;
  // Where other nodes' rank changes go (nullopt: the rank's claim is gone).
  std::function<void(uint32_t uid, const std::string& tenant, const std::string& group,
                     uint32_t rank, std::optional<ClusterMember> member)>
      sink;
  // Longest wait between retries while etcd is unreachable.
  absl::Duration max_backoff = absl::Seconds(1);
  // Fetches the RDMA endpoints of `ranks` of a group from `node` over the
  // authenticated peer channel (FetchRankEndpointsFrom). Null: this node
  // has none (no peer TLS): other nodes' members come without their
  // endpoints, and their views show no RDMA route.
  EndpointFetcher::Fetch fetch_endpoints;
};

// Keys (exposed for tests and tools).
std::string GroupsPrefix(const std::string& prefix);
std::string GroupMetaKey(const std::string& prefix, uint32_t uid, const std::string& tenant,
                         const std::string& group);
std::string GroupRankKey(const std::string& prefix, uint32_t uid, const std::string& tenant,
                         const std::string& group, uint32_t rank);

// One rank's record as another node wrote it (GroupRankRecord as JSON),
// checked as the directory checks every record it reads: InvalidArgument
// when this daemon does not accept it (such a record is ignored). Exposed
// for tests and the fuzzer.
absl::StatusOr<ClusterMember> ParseGroupRankRecord(const std::string& json, uint32_t rank);

class EtcdGroupDirectory final : public GroupDirectory {
 public:
  // Reads the current groups and starts the watch and the worker.
  // Unavailable when etcd cannot be reached. `etcd` is not owned and must
  // outlive the directory.
  static absl::StatusOr<std::unique_ptr<EtcdGroupDirectory>> Start(etcd::EtcdClient* etcd,
                                                                   GroupDirectoryOptions options);
  ~EtcdGroupDirectory() override;  // Stop()
  // Stops the watch and the worker; queued claims are dropped unanswered
  // (the broker is shutting down too). Idempotent.
  void Stop();

  void Claim(uint32_t uid, const std::string& tenant, const std::string& group,
             const ClusterMember& me, ClaimDone done) override;
  void ClaimVacant(uint32_t uid, const std::string& tenant, const std::string& group,
                   const ClusterMember& me, ClaimDone done) override;
  void MarkState(uint32_t uid, const std::string& tenant, const std::string& group, uint32_t rank,
                 MemberState state, uint64_t epoch) override;
  void Release(uint32_t uid, const std::string& tenant, const std::string& group, uint32_t rank,
               uint32_t released_rank, uint64_t epoch,
               std::shared_ptr<const v1::RdmaEndpoint> rdma) override;
  void Withdraw(uint32_t uid, const std::string& tenant, const std::string& group,
                uint32_t rank) override;
  std::vector<ClusterMember> RemoteMembers(uint32_t uid, const std::string& tenant,
                                           const std::string& group) const override;
  std::string Trouble() const override;

  // The endpoints of `ranks` of a group that this node holds now, with the
  // generation their records announce (Peer.FetchRankEndpoints; the caller
  // checked who asks). Ranks not held here, or without an endpoint, are
  // left out, as are those past kMaxEndpointBytesPerAnswer.
  std::vector<FetchedEndpoint> OwnEndpoints(uint32_t uid, const std::string& tenant,
                                            const std::string& group,
                                            const std::vector<uint32_t>& ranks) const;

  // Groups in the cache and ranks this node holds (mcctl, tests).
  size_t cached_groups() const;
  size_t own_ranks() const;

 private:
  using Key = std::tuple<uint32_t, std::string, std::string>;  // (uid, tenant, group)
  struct Op {
    enum class Kind { kClaim, kMarkState, kRelease, kWithdraw } kind = Kind::kClaim;
    Key group;
    uint32_t rank = 0;
    ClusterMember me;                              // kClaim
    ClaimDone done;                                // kClaim
    bool vacant = false;                           // kClaim: ClaimVacant (one at a time)
    MemberState state = MemberState::kJoined;      // kMarkState
    uint64_t epoch = 0;                            // kMarkState, kRelease
    uint32_t released_rank = 0;                    // kRelease
    std::shared_ptr<const v1::RdmaEndpoint> rdma;  // kRelease (null: unchanged)
    bool told_unreachable = false;
    absl::Time not_before = absl::InfinitePast();
    uint64_t seq = 0;  // kClaim: order of the Claim() calls
  };
  struct Cached {
    // Every node's ranks, this one's included; `mine` marks ours.
    std::map<uint32_t, std::pair<ClusterMember, bool>> ranks;
  };

  EtcdGroupDirectory(etcd::EtcdClient* etcd, GroupDirectoryOptions options);
  absl::Status Resync();  // read the prefix, deliver differences, (re)start the watch
  void ApplyEvents(const std::vector<etcd::WatchEvent>& events);
  // Applies one key's new value (nullopt: deleted) to the cache; returns
  // what to tell the sink, if anything.
  struct Delivery {
    Key group;
    uint32_t rank;
    std::optional<ClusterMember> member;
  };
  std::optional<Delivery> ApplyLocked(const std::string& key, const std::string* value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deliver(std::vector<Delivery> deliveries);
  // A remote record with an RDMA endpoint (`m`, parsed; `before`: the
  // rank's entry until now, if any): the endpoint already known for its
  // generation, or `m` marked endpoint_pending and asked for.
  void ResolveEndpointLocked(const Key& group, const ClusterMember* before, ClusterMember& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether this node holds a rank of `group` (it needs, and is served,
  // the other nodes' endpoints).
  bool HasOwnRankLocked(const Key& group) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks for every endpoint of `group` still pending (a first rank of it
  // was just claimed here).
  void WantPendingLocked(const Key& group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fetcher's answer for `asked` ranks of `group` from `node`.
  void EndpointsFetched(const Key& group, const std::string& node,
                        const std::vector<uint32_t>& asked,
                        absl::StatusOr<std::vector<FetchedEndpoint>> answer);
  uint64_t NextGeneration() { return next_generation_.fetch_add(1) + 1; }

  void Work();  // the worker thread
  // Queues a claim (`vacant`: a replacement's, see ClaimVacant).
  void QueueClaim(Key group, const ClusterMember& me, bool vacant, ClaimDone done);
  // The claims of one group: replacements one by one, the rest in batches.
  void RunClaimBatch(const Key& group, std::vector<Op> batch);
  void RunClaims(const Key& group, std::vector<Op> claims);
  // A replacement's claim of a vacant rank (ClaimVacant).
  void RunClaimVacant(const Key& group, Op claim);
  // Takes the claims of ranks with a withdrawal still to be done out of
  // `claims`: newer ones are queued again, older ones dropped.
  void HoldWithdrawn(const Key& group, std::vector<Op>* claims);
  void RunMarkState(const Op& op);
  void RunRelease(const Op& op);
  // Writes own record `op.rank` of `op.group` after `edit` changed it (under
  // the node's lease, only while the record is still under it); postponed
  // while etcd is away.
  void RewriteOwn(const Op& op, const std::function<void(ClusterMember&)>& edit);
  void RunWithdraw(const Op& op);
  // Writes own_ again under `lease` (a new one: the old lease and every key
  // under it expired). False when etcd could not be reached.
  bool Republish(int64_t lease);
  // Claims that could not reach etcd: answered kUnreachable once, queued again.
  void Postpone(std::vector<Op> ops, const absl::Status& why);
  void NoteTrouble(const absl::Status& status);
  std::string RecordJson(const ClusterMember& m, v1::GroupRankRecord::State state) const;

  etcd::EtcdClient* const etcd_;
  const GroupDirectoryOptions options_;

  mutable absl::Mutex mu_;
  std::map<Key, Cached> cache_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> warned_keys_ ABSL_GUARDED_BY(mu_);
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  // Own records as written (MarkState rewrites them with a new state).
  std::map<std::pair<Key, uint32_t>, ClusterMember> own_ ABSL_GUARDED_BY(mu_);
  // Ranks with a withdrawal not yet done, and the seq of the first claim
  // made after it. An older claim (running on the worker when the
  // withdrawal came) is dropped if it is postponed; a newer one (a new
  // process joining the rank) waits until the withdrawal is done, so the
  // withdrawal can never delete the newcomer's record.
  std::map<std::pair<Key, uint32_t>, uint64_t> withdrawn_ ABSL_GUARDED_BY(mu_);
  uint64_t next_claim_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::string trouble_ ABSL_GUARDED_BY(mu_);
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_) = absl::Milliseconds(50);
  bool resync_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::set<Key> warned_no_channel_ ABSL_GUARDED_BY(mu_);
  RateLimitedLog fetch_failures_;
  // Generations of this node's endpoints: from the start time in ns, so a
  // restarted daemon's never repeat its predecessor's.
  std::atomic<uint64_t> next_generation_;
  std::unique_ptr<EndpointFetcher> fetcher_;  // null without fetch_endpoints

  std::unique_ptr<etcd::Watcher> watcher_;  // replaced only by the worker (or Start)
  int64_t published_lease_ = 0;             // the worker's: own_ is written under it
  std::thread worker_;
};

}  // namespace mooncake::daemon::peering
