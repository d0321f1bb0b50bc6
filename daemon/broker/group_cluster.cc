// GroupBroker, across nodes: the directory's answers to this node's claims,
// other nodes' ranks as their records change, which of them count as
// members (the tenant span policy and the group secret), and which node may
// fetch this node's ranks' RDMA endpoints.
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "broker/group_broker.h"
#include "broker/group_secret.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon {

void GroupBroker::ClaimAnswered(const GroupKey& key, uint32_t rank, uint64_t session,
                                ClaimOutcome outcome, const absl::Status& status) {
  std::optional<Formation> formation;
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(key);
    if (it == groups_.end()) return;
    Group& g = *it->second;
    auto m = g.members.find(rank);
    if (m == g.members.end() || m->second.session != session) return;  // gone meanwhile
    switch (outcome) {
      case ClaimOutcome::kClaimed:
        if (m->second.claim == Member::Claim::kUnreachable && g.formed &&
            g.waiters.count(rank) == 0 && directory_ != nullptr) {
          // Formed (or re-formed) here while the directory was away: the
          // record written at the claim says JOINED (or JOINING) at an old
          // epoch; what this node knows since goes in now, or other nodes
          // keep reading the rank as a newcomer.
          directory_->MarkState(g.uid, g.tenant, g.name, rank, m->second.state, g.epoch);
        }
        m->second.claim = Member::Claim::kClaimed;
        break;
      case ClaimOutcome::kUnreachable:
        if (m->second.claim == Member::Claim::kPending) {
          m->second.claim = Member::Claim::kUnreachable;
        }
        break;
      case ClaimOutcome::kFailed:
        if (auto w = g.waiters.find(rank); g.formed && w != g.waiters.end()) {
          // A replacement the cluster refused (another took the rank first).
          // Another node's replacement may be the one (kept aside).
          m->second.claim = Member::Claim::kNone;
          completions.push_back({TakeWaiterLocked(g, w), status});
          EraseMemberLocked(g, rank);
          formation = MaybeReformLocked(g);
          if (!formation) EraseIfEmpty(key);
          break;
        }
        if (g.formed) {
          // Formed on this node alone while the directory was away, and
          // another node holds the rank now: the cluster disagrees.
          MC_LOG(kWarning, "group '", g.name, "' (uid ", g.uid, "): rank ", rank,
                 " formed here while the cluster directory was unreachable, and the cluster "
                 "refuses it now: ",
                 status.message());
          return;
        }
        m->second.claim = Member::Claim::kNone;  // nothing of ours to withdraw
        if (auto w = g.waiters.find(rank); w != g.waiters.end()) {
          completions.push_back({TakeWaiterLocked(g, w), status});
        }
        EraseMemberLocked(g, rank);
        EraseIfEmpty(key);
        break;
    }
    if (outcome != ClaimOutcome::kFailed) {
      formation = g.formed ? MaybeReformLocked(g) : MaybeFormLocked(g);
    }
  }
  Complete(&completions);
  if (formation) CompleteFormation(std::move(*formation));
}

// Another node's rank of formed `g` left or was lost (`state`): this
// node's members hear of it, and the rank is vacant until replaced.
void GroupBroker::RemoteGoneLocked(Group& g, uint32_t rank, MemberState state,
                                   const std::string& detail) {
  ClusterMember& c = g.remote.at(rank);
  c.state = state;
  c.joining = false;
  const bool lost = state == MemberState::kLost;
  NotifyOthers(g, rank, lost ? v1::MemberEvent::LOST : v1::MemberEvent::LEFT, detail);
  MC_LOG(kInfo, "group '", g.name, "': rank ", rank, " on node ", c.node_id,
         lost ? " lost" : " left");
  if (lost && counters_ != nullptr) counters_->RecordLost();
  VacateLocked(g, rank);
}

bool GroupBroker::AdmitsRemoteLocked(const std::string& secret, uint32_t uid,
                                     const std::string& tenant, const std::string& group,
                                     uint32_t rank, const ClusterMember& c) {
  if (span_policy_ != nullptr && !span_policy_->MayMeet(tenant, node_id_, c.node_id)) {
    const bool here = span_policy_->MaySpan(tenant, node_id_);
    policy_refusals_.Log(
        LogLevel::kWarning,
        absl::StrCat("group '", EscapeForDisplay(group, 128), "' (uid ", uid,
                     tenant.empty() ? " on the main socket" : " of tenant '", tenant,
                     tenant.empty() ? "" : "'", "): rank ", rank, " on node ",
                     EscapeForDisplay(c.node_id, 64),
                     " is not counted as a member: the tenant policy (", span_policy_->source(),
                     ") does not let ",
                     tenant.empty() ? std::string("@main") : "tenant '" + tenant + "'", " span ",
                     here ? "that node" : "this node (" + node_id_ + ")"));
    return false;
  }
  if (secret.empty()) return true;
  if (ProvesGroupSecret(secret, uid, tenant, group, rank, c.node_id, c.world_size, c.proof)) {
    return true;
  }
  secret_refusals_.Log(
      LogLevel::kWarning,
      absl::StrCat(
          "group '", EscapeForDisplay(group, 128), "' (uid ", uid,
          tenant.empty() ? "" : " of tenant '", tenant, tenant.empty() ? "" : "'", "): rank ", rank,
          " on node ", EscapeForDisplay(c.node_id, 64),
          c.proof.empty() ? " joined without the group secret" : " does not prove the group secret",
          "; it is not counted as a member (MC_GROUP_SECRET must match on every rank)"));
  return false;
}

void GroupBroker::RemoteChanged(uint32_t uid, const std::string& tenant, const std::string& group,
                                uint32_t rank, std::optional<ClusterMember> member) {
  std::optional<Formation> formation;
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(GroupKey{uid, tenant, group});
  if (it == groups_.end()) return;
  Group& g = *it->second;
  if (member && (member->world_size != g.world_size || rank >= g.world_size)) {
    // Not a member of this group as it stands (a stale record of an older
    // group of the same name): it must not count toward formation.
    return;
  }
  if (member && !AdmitsRemoteLocked(g.secret, uid, tenant, group, rank, *member)) {
    // A rank of the same uid on another node that cannot show the group's
    // secret: not this group's member (and its record changes nothing).
    return;
  }
  auto known = g.remote.find(rank);
  if (!g.formed) {
    // Forming: only who holds which rank matters.
    // (A member may already have verified its peers: its node formed first.)
    if (member && member->state != MemberState::kLeft && member->state != MemberState::kLost) {
      g.remote.insert_or_assign(rank, *std::move(member));
      formation = MaybeFormLocked(g);
    } else if (known != g.remote.end()) {
      g.remote.erase(known);
    }
  } else if (auto local = g.members.find(rank);
             local != g.members.end() && IsJoinedNow(local->second.state)) {
    // Held here. A replacement of ours still waiting for its claim may
    // lose it to this other node's replacement: kept aside, so the group
    // re-forms with that one if ours is refused.
    if (member && IsJoinedNow(member->state) && g.waiters.count(rank) != 0) {
      ClusterMember other = *std::move(member);
      other.joining = true;
      g.remote.insert_or_assign(rank, std::move(other));
    }
  } else if (!member) {
    // The rank's claim vanished: it was withdrawn, or its node's lease
    // expired (the node died or was cut off).
    if (known != g.remote.end() && IsJoinedNow(known->second.state)) {
      if (known->second.joining) {
        // A replacement waiting on another node gave up (or its node went):
        // the rank is vacant again; the survivors' releases stand.
        known->second.joining = false;
        known->second.state = MemberState::kLost;
      } else {
        RemoteGoneLocked(g, rank, MemberState::kLost,
                         absl::StrCat("node ", known->second.node_id,
                                      " is gone from the cluster (its lease expired)"));
      }
    }
  } else if (known == g.remote.end() || !IsJoinedNow(known->second.state) ||
             known->second.node_id != member->node_id || known->second.pid != member->pid) {
    // Another holder than the one this node knows.
    if (known != g.remote.end() && IsJoinedNow(known->second.state)) {
      // The old one's end was not seen on its own (a watch resynced): it
      // is lost all the same.
      RemoteGoneLocked(g, rank, MemberState::kLost,
                       absl::StrCat("pid ", known->second.pid, " on node ", known->second.node_id,
                                    " was replaced"));
    }
    if (!IsJoinedNow(member->state)) {
      // A record of a vacant rank (its holder was lost or left).
      g.remote.insert_or_assign(rank, *std::move(member));
    } else {
      // A replacement claimed the vacant rank on its node. A holder lost
      // or departed here is replaced: its record was taken over.
      if (local != g.members.end()) EraseMemberLocked(g, rank);
      ClusterMember joining = *std::move(member);
      joining.joining = true;  // until this node re-forms
      g.remote.insert_or_assign(rank, std::move(joining));
      formation = MaybeReformLocked(g);
    }
  } else {
    // The holder this node knows: what its node published about it now.
    ClusterMember& k = known->second;
    const bool endpoint_came = k.endpoint_pending && !member->endpoint_pending;
    k.rdma = member->rdma;
    k.rdma_generation = member->rdma_generation;
    k.endpoint_pending = member->endpoint_pending;
    k.epoch = member->epoch;
    k.released = member->released;
    bool released_any = false;
    for (auto& [vacant, waiting_on] : g.unreleased) {
      if (k.Released(vacant, g.epoch) && waiting_on.erase(rank) != 0) released_any = true;
    }
    const MemberState now = member->state;
    if (now == k.state) {
      // nothing new
    } else if (now == MemberState::kReady) {
      k.state = now;
      MaybeAllReadyLocked(g, rank);
    } else if (now == MemberState::kFailed) {
      k.state = now;
      NotifyOthers(g, rank, v1::MemberEvent::FAILED,
                   absl::StrCat("its peer verification failed on node ", k.node_id));
    } else if (now != MemberState::kJoined) {
      const bool lost = now == MemberState::kLost;
      RemoteGoneLocked(
          g, rank, now,
          lost ? absl::StrCat("pid ", k.pid, " exited or lost its session on node ", k.node_id)
               : absl::StrCat("left the group (node ", k.node_id, ")"));
    } else {
      k.state = now;
    }
    if (released_any || endpoint_came) formation = MaybeReformLocked(g);
  }
  if (formation) {
    mu_.Unlock();
    CompleteFormation(std::move(*formation));
    mu_.Lock();
  }
}

bool GroupBroker::SharesGroupWithNode(uint64_t session_id, const std::string& node) const {
  absl::MutexLock lock(&mu_);
  auto index = by_session_.find(session_id);
  if (index == by_session_.end()) return false;
  for (const auto& [g, rank] : index->second) {
    auto m = g->members.find(rank);
    if (m == g->members.end() || !IsJoinedNow(m->second.state)) continue;
    for (const auto& [r, c] : g->remote) {
      if (c.node_id == node && IsJoinedNow(c.state)) return true;
    }
  }
  return false;
}

absl::Status GroupBroker::MayFetchEndpoints(uint32_t uid, const std::string& tenant,
                                            const std::string& group, const std::string& node) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(GroupKey{uid, tenant, group});
  if (it == groups_.end() || directory_ == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no rank of group '", EscapeForDisplay(group, 128), "' is held on this node"));
  }
  const Group& g = *it->second;
  for (const ClusterMember& c : directory_->RemoteMembers(uid, tenant, group)) {
    if (c.node_id != node || c.world_size != g.world_size || c.state == MemberState::kLeft ||
        c.state == MemberState::kLost) {
      continue;
    }
    if (AdmitsRemoteLocked(g.secret, uid, tenant, group, c.rank, c)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "node ", EscapeForDisplay(node, 64), " holds no live rank of group '",
      EscapeForDisplay(group, 128), "'", g.secret.empty() ? "" : " that proves the group's secret",
      span_policy_ == nullptr ? "" : " on a node the tenant policy lets the group span",
      " in this node's view of the cluster"));
}

}  // namespace mooncake::daemon
