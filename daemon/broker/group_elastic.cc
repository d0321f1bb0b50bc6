// GroupBroker, elastic replacement: a formed group's rank that was lost or
// left is vacant; survivors release it (ReleaseRank), a replacement waits
// for it, and the group re-forms at epoch + 1 once every vacant rank has a
// replacement and every release (docs/architecture.md, "Elastic groups").
// Across nodes the same steps are read from the directory's records.
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "broker/group_broker.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon {

// Whether the records of another node's ranks say the group formed: a
// record written after formation carries its epoch, and only a formed
// group's ranks are LOST or LEFT.
bool GroupBroker::FormedInRecords(const std::vector<ClusterMember>& records) {
  return std::any_of(records.begin(), records.end(),
                     [](const ClusterMember& c) { return c.epoch > 0 || !IsJoinedNow(c.state); });
}

// A group this node first sees formed (a replacement joins here, the other
// ranks are elsewhere): its epoch and its vacant ranks, with the survivors
// that have not released each, from the records.
void GroupBroker::AdoptFormationLocked(Group& g) {
  g.formed = true;
  g.epoch = 1;
  for (const auto& [r, c] : g.remote) {
    if (!c.joining) g.epoch = std::max(g.epoch, c.epoch);
  }
  for (uint32_t v = 0; v < g.world_size; ++v) {
    if (PresentLocked(g, v)) continue;
    std::set<uint32_t>& waiting_on = g.unreleased[v];
    for (const auto& [r, c] : g.remote) {
      if (IsJoinedNow(c.state) && !c.joining && !c.Released(v, g.epoch)) waiting_on.insert(r);
    }
  }
}

// A formed group whose vacated ranks all have a replacement (a waiting join
// here, or a JOINING record of another node), and whose survivors all
// released them, re-forms: epoch + 1, the newcomers here get the whole
// view, the survivors here a JOINED event per newcomer (CompleteFormation)
// and report ready again once they have connected them. Every node of the
// group decides this on its own from the same records, so each re-forms
// once the last release it needs has reached it.
std::optional<GroupBroker::Formation> GroupBroker::MaybeReformLocked(Group& g) {
  if (!g.formed) return std::nullopt;
  std::vector<uint32_t> remote_newcomers;
  bool remote_ranks = false;
  for (const auto& [r, c] : g.remote) {
    if (!IsJoinedNow(c.state) || g.members.count(r) != 0) continue;
    remote_ranks = true;
    if (c.joining) remote_newcomers.push_back(r);
  }
  if (g.waiters.empty() && remote_newcomers.empty()) return std::nullopt;
  for (uint32_t r = 0; r < g.world_size; ++r) {
    if (!PresentLocked(g, r)) return std::nullopt;
  }
  if (EndpointsPendingLocked(g)) return std::nullopt;  // re-formed once they have come
  auto released = [&g](uint32_t r) {
    auto u = g.unreleased.find(r);
    return u == g.unreleased.end() || u->second.empty();
  };
  for (const auto& [r, w] : g.waiters) {
    // With a directory the replacement's claim must be in first (with
    // other nodes in the group; alone here, as at formation, it need not).
    const Member::Claim claim = g.members.at(r).claim;
    if (claim == Member::Claim::kPending) return std::nullopt;
    if (claim == Member::Claim::kUnreachable && remote_ranks) return std::nullopt;
    if (!released(r)) return std::nullopt;
  }
  for (uint32_t r : remote_newcomers) {
    if (!released(r)) return std::nullopt;
  }
  g.epoch += 1;
  const size_t newcomers = g.waiters.size() + remote_newcomers.size();
  MC_LOG(kInfo, "group '", g.name, "' (uid ", g.uid, ") re-formed with ", newcomers,
         " replacement rank(s)",
         remote_newcomers.empty() ? ""
                                  : absl::StrCat(" (", remote_newcomers.size(), " on other nodes)"),
         ", epoch ", g.epoch);
  Emit(g, GroupEvent::Kind::kFormed,
       g.waiters.empty() ? remote_newcomers.front() : g.waiters.begin()->first, 0,
       absl::StrCat("re-formed with ", newcomers, " replacement rank(s)"));
  for (auto& [r, m] : g.members) {
    // Survivors verify the newcomers and report again; READY follows.
    if (g.waiters.count(r) == 0) m.state = MemberState::kJoined;
  }
  for (auto& [r, c] : g.remote) {
    if (!IsJoinedNow(c.state) || g.members.count(r) != 0) continue;
    c.joining = false;
    // Survivors on other nodes report again too, unless their node
    // re-formed first and the report for this epoch is in already.
    if (c.epoch < g.epoch) c.state = MemberState::kJoined;
  }
  Formation f;
  f.reform = true;
  f.remote_newcomers = std::move(remote_newcomers);
  std::shared_ptr<Group> snapshot = FormedSnapshotLocked(g);
  for (uint32_t r : f.remote_newcomers) g.unreleased.erase(r);
  for (auto it = g.waiters.begin(); it != g.waiters.end();) {
    uint32_t r = it->first;
    g.unreleased.erase(r);
    Member& m = g.members.at(r);
    if (directory_ != nullptr && m.claim == Member::Claim::kClaimed) {
      // JOINING -> JOINED at the new epoch.
      directory_->MarkState(g.uid, g.tenant, g.name, r, MemberState::kJoined, g.epoch);
    }
    SessionInfo who = it->second.caller;
    uint32_t t = it->second.timeout_ms;
    JoinDone d = TakeWaiterLocked(g, it++);
    f.waiters.emplace_back(r, Waiter{std::move(who), std::move(d), t, {}});
  }
  f.group = std::move(snapshot);
  return f;
}

void GroupBroker::VacateLocked(Group& g, uint32_t rank) {
  for (auto& [r, waiting_on] : g.unreleased) waiting_on.erase(rank);
  std::set<uint32_t>& survivors = g.unreleased[rank];
  survivors.clear();
  for (const auto& [r, m] : g.members) {
    if (r == rank || g.waiters.count(r) != 0 || m.state == MemberState::kLeft ||
        m.state == MemberState::kLost) {
      continue;
    }
    survivors.insert(r);
  }
  // Survivors on other nodes release on their nodes; their records say so.
  for (const auto& [r, c] : g.remote) {
    if (r == rank || c.joining || !IsJoinedNow(c.state) || g.members.count(r) != 0) continue;
    if (!c.Released(rank, g.epoch)) survivors.insert(r);
  }
}

absl::Status GroupBroker::ReleaseRank(const SessionInfo& caller, const v1::ReleaseRankRequest& r) {
  std::optional<Formation> formation;
  {
    absl::MutexLock lock(&mu_);
    GroupKey key = KeyOf(caller, r.group());
    auto it = groups_.find(key);
    if (it == groups_.end()) {
      return absl::NotFoundError(absl::StrCat("no group '", r.group(), "' for this user"));
    }
    Group& g = *it->second;
    auto m = g.members.find(r.rank());
    if (m == g.members.end() || m->second.session != caller.id ||
        m->second.state == MemberState::kLeft || m->second.state == MemberState::kLost) {
      return absl::NotFoundError(
          absl::StrCat("this session holds no rank ", r.rank(), " in group '", r.group(), "'"));
    }
    if (r.released_rank() == r.rank()) {
      // Not vacant: the caller holds it (the same code as any rank that is
      // not vacant).
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", r.rank(), " is the caller's own, not vacant: release the lost or left rank"));
    }
    if (g.waiters.count(r.rank()) != 0) {
      // A replacement still waiting to re-join: it holds no endpoint toward
      // anyone yet, and its own rank is among the vacant ones.
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", r.rank(), " of group '", r.group(),
                       "' has not joined yet: release ranks once JoinGroup has returned"));
    }
    auto vacant = g.unreleased.find(r.released_rank());
    if (!g.formed || vacant == g.unreleased.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", r.released_rank(), " of group '", r.group(),
                       "' is not vacant: release a rank after it was reported LOST or LEFT"));
    }
    if (r.has_rdma()) {
      const v1::RdmaEndpoint& e = r.rdma();
      if (e.qps_per_peer() == 0 || e.qps_per_peer() > kMaxQpsPerPeer ||
          (!e.qpns().empty() && static_cast<uint64_t>(e.qpns_size()) !=
                                    static_cast<uint64_t>(g.world_size) * e.qps_per_peer()) ||
          e.nic().size() > 64) {
        return absl::InvalidArgumentError(
            absl::StrCat("group '", r.group(), "': the released endpoint needs qps_per_peer in 1..",
                         kMaxQpsPerPeer, " and world_size * qps_per_peer queue pair numbers"));
      }
      m->second.rdma = std::make_shared<const v1::RdmaEndpoint>(e);
    }
    vacant->second.erase(r.rank());
    if (directory_ != nullptr && m->second.claim == Member::Claim::kClaimed) {
      // The replacement's node (maybe another) waits for this release.
      directory_->Release(g.uid, g.tenant, g.name, r.rank(), r.released_rank(), g.epoch,
                          r.has_rdma() ? m->second.rdma : nullptr);
    }
    formation = MaybeReformLocked(g);
  }
  if (formation) CompleteFormation(std::move(*formation));
  return absl::OkStatus();
}

}  // namespace mooncake::daemon
