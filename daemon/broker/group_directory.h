// GroupDirectory: where the ranks of one group meet when they join on
// different nodes (issue 9 item 3). The broker keeps forming groups itself;
// with a directory it also
//   - claims each local rank cluster-wide before the rank counts (two nodes
//     cannot both hold a rank, and the world size agrees everywhere),
//   - learns the ranks that other nodes claimed (RemoteMember), and forms
//     the group when local and remote ranks together are all present,
//   - publishes what becomes of its ranks after formation (left, lost), and
//     withdraws them when they go before it.
// Without one (no etcd configured) a group lives on one daemon, as before.
//
// The implementation over etcd is peering::EtcdGroupDirectory; tests may
// use an in-memory one. Calls from the broker may come with the broker's
// lock held: they must only queue work and read the directory's own state,
// never call back into the broker on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "broker/group_summary.h"
#include "mooncake/v1/local.pb.h"

namespace mooncake::daemon {

// A rank as the cluster knows it (held by this node or another).
struct ClusterMember {
  uint32_t rank = 0;
  uint32_t world_size = 0;
  std::string node_id;
  int32_t pid = 0;
  int gpu_index = -1;
  std::string gpu_uuid, gpu_pci;
  std::string handle_kind;
  uint64_t handle_size = 0;
  std::shared_ptr<const v1::RdmaEndpoint> rdma;  // null: no RDMA route to it (known)
  // 0: no RDMA route. Else the version of its endpoint: a record in etcd
  // announces it, and the endpoint itself comes from the rank's node over
  // the peer channel (issue 23 item 2).
  uint64_t rdma_generation = 0;
  // A remote member whose endpoint is being fetched: it is delivered again
  // with `rdma` once it has come, and no group forms around it meanwhile.
  bool endpoint_pending = false;
  int endpoint_failures = 0;                 // the directory's retry count
  MemberState state = MemberState::kJoined;  // as its node last published it
  // The group's epoch on its node when the record was written (0: not
  // formed yet).
  uint64_t epoch = 0;
  // A replacement of a vacant rank, waiting for the group to re-form
  // (elastic groups; state is kJoined).
  bool joining = false;
  // Vacant ranks it released, each with the epoch at which it did.
  std::vector<std::pair<uint32_t, uint64_t>> released;
  // GroupProof of its claim when its group has a secret (group_secret.h);
  // empty otherwise.
  std::string proof;

  // Whether it released `rank` at `epoch` or later.
  bool Released(uint32_t rank, uint64_t epoch) const {
    for (const auto& [r, e] : released) {
      if (r == rank && e >= epoch) return true;
    }
    return false;
  }
};

// How a claim went. The callback may run more than once: kUnreachable (the
// directory cannot be reached; it keeps trying) may precede kClaimed or a
// final error.
enum class ClaimOutcome { kClaimed, kUnreachable, kFailed };
using ClaimDone = std::function<void(ClaimOutcome outcome, const absl::Status& status)>;

class GroupDirectory {
 public:
  virtual ~GroupDirectory() = default;

  // Groups are scoped by (uid, tenant) as on one node (tenant "" = the
  // main socket's).
  //
  // Claims `me.rank` of the group for this node. `done` runs on the
  // directory's thread, never under the broker's lock.
  virtual void Claim(uint32_t uid, const std::string& tenant, const std::string& group,
                     const ClusterMember& me, ClaimDone done) = 0;
  // Elastic groups: claims vacant rank `me.rank` of a formed group for a
  // replacement (a record in state JOINING at `me.epoch`). It takes the
  // rank over a LOST or LEFT record, comparing that record's revision so
  // two replacements cannot both win, or where no record is left (its
  // node's lease expired); a live holder fails it with AlreadyExists.
  virtual void ClaimVacant(uint32_t uid, const std::string& tenant, const std::string& group,
                           const ClusterMember& me, ClaimDone done) = 0;
  // A claimed rank of a formed group reported ready or failed, left or was
  // lost, or (kJoined) the group re-formed around it: the other nodes report
  // it to their members (and count it toward the group's READY). `epoch`
  // is the group's epoch now; releases older than it are dropped.
  virtual void MarkState(uint32_t uid, const std::string& tenant, const std::string& group,
                         uint32_t rank, MemberState state, uint64_t epoch) = 0;
  // Elastic groups: claimed rank `rank` released vacant `released_rank` at
  // `epoch`, with its fresh RDMA endpoint (null: unchanged). The node of the
  // rank's replacement waits for every survivor's release.
  virtual void Release(uint32_t uid, const std::string& tenant, const std::string& group,
                       uint32_t rank, uint32_t released_rank, uint64_t epoch,
                       std::shared_ptr<const v1::RdmaEndpoint> rdma) = 0;
  // The rank is no longer this node's (a join that failed, timed out or was
  // cancelled, or a released group): its claim goes, and a pending claim is
  // dropped.
  virtual void Withdraw(uint32_t uid, const std::string& tenant, const std::string& group,
                        uint32_t rank) = 0;
  // The ranks other nodes hold in the group now, those whose endpoint is
  // still being fetched included (endpoint_pending).
  virtual std::vector<ClusterMember> RemoteMembers(uint32_t uid, const std::string& tenant,
                                                   const std::string& group) const = 0;
  // One line for error messages ("etcd unreachable since ...", "" when fine).
  virtual std::string Trouble() const = 0;
};

}  // namespace mooncake::daemon
