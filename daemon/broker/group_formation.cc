// GroupBroker, formation: when a group forms (every rank present, claimed
// where a directory is set, every remote endpoint fetched), and what each
// member then receives: the view, encoded once per group and receiving GPU
// (EncodedView), with fd tickets for the local members' handles.
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "broker/group_broker.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon {

uint64_t GroupBroker::EntryBytes(const Member& m) const {
  // The member's MemberView as encoded (strings plus tags and varints),
  // and its ticket.
  return m.handle.data().size() + m.handle.kind().size() + m.gpu_uuid.size() + m.gpu_pci.size() +
         node_id_.size() + 96 + (m.rdma ? 5u * m.rdma->qpns_size() + m.rdma->nic().size() + 32 : 0);
}

void GroupBroker::FillLocalView(const Member& m, int receiver_gpu, const std::string& ticket,
                                v1::MemberView* v) const {
  v->set_rank(m.rank);
  v->set_node_id(node_id_);
  v->set_pid(m.cred.pid);
  v->set_gpu_index(m.gpu_index);
  v->set_gpu_uuid(m.gpu_uuid);
  v->set_gpu_pci_bus_id(m.gpu_pci);
  v->set_handle_kind(m.handle.kind());
  v->set_handle_data(m.handle.data());
  v->set_handle_size(m.handle.size());
  if (m.rdma) *v->mutable_rdma() = *m.rdma;
  v->set_same_node(true);
  bool atomics = false;
  v->set_p2p_reachable(Reachable(receiver_gpu, m.gpu_index, &atomics));
  v->set_native_atomics(atomics);
  if (!ticket.empty()) {
    v->set_fd_ticket(ticket);
    v->set_fd_count(static_cast<uint32_t>(m.fds->fds.size()));
  }
}

void GroupBroker::FillRemoteView(const ClusterMember& c, v1::MemberView* v) {
  v->set_rank(c.rank);
  v->set_node_id(c.node_id);
  v->set_pid(c.pid);
  v->set_gpu_index(c.gpu_index);
  v->set_gpu_uuid(c.gpu_uuid);
  v->set_gpu_pci_bus_id(c.gpu_pci);
  v->set_handle_kind(c.handle_kind);
  v->set_handle_size(c.handle_size);
  if (c.rdma) *v->mutable_rdma() = *c.rdma;
  // Another node: no handle bytes, no fds, no load/store path.
  v->set_same_node(false);
  v->set_p2p_reachable(false);
}

std::shared_ptr<const std::string> GroupBroker::EncodeShared(
    const Group& g, int receiver_gpu, const std::vector<std::string>& tickets) const {
  v1::JoinGroupResponse resp;
  resp.set_group(g.name);
  resp.set_world_size(g.world_size);
  resp.set_epoch(g.epoch);
  resp.mutable_members()->Reserve(static_cast<int>(g.members.size() + g.remote.size()));
  size_t i = 0;
  auto remote = g.remote.begin();
  // Members in rank order: remote ranks interleave with this node's.
  auto add_remote_before = [&](uint32_t limit) {
    for (; remote != g.remote.end() && remote->first < limit; ++remote) {
      FillRemoteView(remote->second, resp.add_members());
    }
  };
  for (const auto& [r, m] : g.members) {
    add_remote_before(r);
    FillLocalView(m, receiver_gpu, tickets[i], resp.add_members());
    ++i;
  }
  add_remote_before(g.world_size);
  auto bytes = std::make_shared<std::string>();
  resp.SerializeToString(bytes.get());
  return bytes;
}

void GroupBroker::Complete(std::vector<Completion>* completions) {
  for (Completion& c : *completions) c.done(std::move(c.result));
  completions->clear();
}

void GroupBroker::CompleteFormation(Formation f) const {
  const Group& g = *f.group;
  // Outside the lock, from one snapshot: one ticket per member's fds for
  // the whole group, then one encoding per receiving GPU.
  auto audience = std::make_shared<std::vector<uint64_t>>();
  for (const auto& [r, m] : g.members) audience->push_back(m.session);
  std::sort(audience->begin(), audience->end());
  audience->erase(std::unique(audience->begin(), audience->end()), audience->end());
  std::vector<std::string> tickets;
  tickets.reserve(g.members.size());
  for (const auto& [r, m] : g.members) {
    std::string t;
    if (m.fds && g.world_size > 1) {
      // Fails only when the owner's session just ended: it is about to be
      // reported lost, and its peers get no ticket for it.
      absl::StatusOr<std::string> issued =
          fd_tickets_->IssueForGroup(m.session, g.uid, m.fds, audience, g.world_size - 1);
      if (issued.ok()) t = *std::move(issued);
    }
    tickets.push_back(std::move(t));
  }
  std::map<int, std::shared_ptr<const std::string>> by_gpu;
  for (auto& [rank, w] : f.waiters) {
    int gpu = g.members.at(rank).gpu_index;
    std::shared_ptr<const std::string>& shared = by_gpu[gpu];
    if (!shared) shared = EncodeShared(g, gpu, tickets);
    EncodedView view;
    view.shared = shared;
    v1::JoinGroupResponse own;
    own.set_rank(rank);
    own.SerializeToString(&view.own);
    w.done(std::move(view));
  }
  if (!f.reform) return;
  // Re-formation: every survivor learns each newcomer's entry, as its own
  // view would hold it, after the newcomers have theirs (so a survivor that
  // connects at once finds the newcomer's queue pairs there).
  std::set<uint32_t> newcomers;
  for (const auto& [rank, w] : f.waiters) newcomers.insert(rank);
  std::map<uint32_t, size_t> ticket_of;
  size_t i = 0;
  for (const auto& [r, m] : g.members) ticket_of[r] = i++;
  auto joined_event = [&g](uint32_t rank, int32_t pid, const std::string& where) {
    v1::SessionEvent ev;
    v1::MemberEvent* me = ev.mutable_member();
    me->set_group(g.name);
    me->set_rank(rank);
    me->set_kind(v1::MemberEvent::JOINED);
    me->set_pid(pid);
    me->set_epoch(g.epoch);
    me->set_detail(absl::StrCat("pid ", pid, where, " took rank ", rank, " (epoch ", g.epoch, ")"));
    return ev;
  };
  for (const auto& [r, survivor] : g.members) {
    if (newcomers.count(r) != 0) continue;
    for (uint32_t n : newcomers) {
      const Member& joined = g.members.at(n);
      v1::SessionEvent ev = joined_event(n, joined.cred.pid, "");
      FillLocalView(joined, survivor.gpu_index, tickets[ticket_of.at(n)],
                    ev.mutable_member()->mutable_member());
      sessions_->Post(survivor.session, std::move(ev));
    }
    // Replacements on other nodes: their entry as the records give it.
    for (uint32_t n : f.remote_newcomers) {
      const ClusterMember& joined = g.remote.at(n);
      v1::SessionEvent ev = joined_event(n, joined.pid, absl::StrCat(" on node ", joined.node_id));
      FillRemoteView(joined, ev.mutable_member()->mutable_member());
      sessions_->Post(survivor.session, std::move(ev));
    }
  }
}

// What CompleteFormation needs of a group that (re-)formed: its identity,
// epoch, members and the remote ranks that are present, with none of its
// waiters or bookkeeping.
std::shared_ptr<GroupBroker::Group> GroupBroker::FormedSnapshotLocked(const Group& g) {
  auto snapshot = std::make_shared<Group>();
  snapshot->name = g.name;
  snapshot->uid = g.uid;
  snapshot->tenant = g.tenant;
  snapshot->world_size = g.world_size;
  snapshot->formed = true;
  snapshot->epoch = g.epoch;
  snapshot->members = g.members;
  for (const auto& [r, c] : g.remote) {
    if (IsJoinedNow(c.state) && g.members.count(r) == 0) snapshot->remote.emplace(r, c);
  }
  return snapshot;
}

std::optional<GroupBroker::Formation> GroupBroker::MaybeFormLocked(Group& g) {
  if (g.formed) return std::nullopt;
  size_t remote_joined = 0;
  for (const auto& [r, c] : g.remote) {
    if (IsJoinedNow(c.state) && g.members.count(r) == 0) ++remote_joined;
  }
  if (g.members.size() + remote_joined < g.world_size) return std::nullopt;
  if (EndpointsPendingLocked(g)) return std::nullopt;  // formed once they have come
  bool all_claimed = true;
  for (const auto& [r, m] : g.members) {
    if (m.claim == Member::Claim::kPending) return std::nullopt;
    all_claimed &= m.claim != Member::Claim::kUnreachable;
  }
  // Ranks on other nodes count only once every local rank is agreed; a
  // group entirely on this node forms even while the directory is away.
  if (remote_joined > 0 && !all_claimed) return std::nullopt;
  g.formed = true;
  g.epoch += 1;
  MC_LOG(kInfo, "group '", g.name, "' (uid ", g.uid, ") formed with ", g.world_size, " ranks",
         remote_joined > 0 ? absl::StrCat(" (", remote_joined, " on other nodes)") : "",
         !all_claimed ? " on this node alone: the cluster directory is unreachable" : "",
         ", epoch ", g.epoch);
  Emit(g, GroupEvent::Kind::kFormed, 0, 0, absl::StrCat("all ", g.world_size, " ranks in"));
  if (directory_ != nullptr && remote_joined > 0) {
    // The records say the group formed (its epoch) from now on, not only
    // once ranks report ready: a replacement on a node new to the group
    // then re-joins it instead of forming it afresh.
    for (const auto& [r, m] : g.members) {
      if (m.claim == Member::Claim::kClaimed) {
        directory_->MarkState(g.uid, g.tenant, g.name, r, MemberState::kJoined, g.epoch);
      }
    }
  }
  Formation f;
  std::shared_ptr<Group> snapshot = FormedSnapshotLocked(g);
  for (auto it = g.waiters.begin(); it != g.waiters.end();) {
    uint32_t r = it->first;
    SessionInfo who = it->second.caller;
    uint32_t t = it->second.timeout_ms;
    JoinDone d = TakeWaiterLocked(g, it++);
    f.waiters.emplace_back(r, Waiter{std::move(who), std::move(d), t, {}});
  }
  f.group = std::move(snapshot);
  return f;
}

bool GroupBroker::EndpointsPendingLocked(const Group& g) {
  return std::any_of(g.remote.begin(), g.remote.end(), [&g](const auto& entry) {
    const auto& [r, c] = entry;
    return c.endpoint_pending && IsJoinedNow(c.state) && g.members.count(r) == 0;
  });
}

bool GroupBroker::PresentLocked(const Group& g, uint32_t rank) {
  if (auto m = g.members.find(rank); m != g.members.end()) return IsJoinedNow(m->second.state);
  auto c = g.remote.find(rank);
  return c != g.remote.end() && IsJoinedNow(c->second.state);
}

}  // namespace mooncake::daemon
