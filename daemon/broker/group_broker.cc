#include "broker/group_broker.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "admission/admission_counter.h"
#include "broker/group_secret.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"
#include "mooncake/common/status.h"

namespace mooncake::daemon {
namespace {

bool ValidGroupName(absl::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
           c == ':';
  });
}

std::string NormalizePci(absl::string_view pci) {
  std::string p = absl::AsciiStrToLower(pci);
  // "00000000:1b:00.0" (CUDA's 8-digit domain) and "0000:1b:00.0" are the same bus id.
  if (size_t colon = p.find(':'); colon != std::string::npos && colon > 4) {
    p = p.substr(colon - 4);
  }
  return p;
}

}  // namespace

GroupBroker::GroupBroker(std::string node_id, v1::Topology topology, BrokerLimits limits,
                         SessionRegistry* sessions, FdTicketIssuer* fd_tickets)
    : node_id_(std::move(node_id)),
      topology_(std::move(topology)),
      limits_(limits),
      sessions_(sessions),
      fd_tickets_(fd_tickets) {
  timer_ = std::thread([this] { TimerLoop(); });
}

GroupBroker::~GroupBroker() {
  Shutdown();
  if (timer_.joinable()) timer_.join();
}

absl::StatusOr<ValidatedJoin> GroupBroker::ValidateJoin(const v1::JoinGroupRequest& r) const {
  if (!ValidGroupName(r.group())) {
    return absl::InvalidArgumentError(
        absl::StrCat("group name '", r.group().substr(0, 64),
                     "' is invalid: use 1-128 characters of [A-Za-z0-9._:-]"));
  }
  if (r.world_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("group '", r.group(), "': world size 0"));
  }
  if (r.world_size() > limits_.max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat("group '", r.group(), "': world size ",
                                                   r.world_size(), " exceeds the limit of ",
                                                   limits_.max_world_size, " (max_world_size)"));
  }
  if (r.rank() >= r.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group '", r.group(), "': rank ", r.rank(), " is out of range for world size ",
                     r.world_size(), " (ranks are 0..", r.world_size() - 1, ")"));
  }
  if (r.handle().data().size() > limits_.max_handle_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("group '", r.group(), "': handle of ",
                                                   r.handle().data().size(), " bytes exceeds ",
                                                   limits_.max_handle_bytes));
  }
  if (r.has_rdma()) {
    const v1::RdmaEndpoint& e = r.rdma();
    if (e.qps_per_peer() == 0 || e.qps_per_peer() > kMaxQpsPerPeer) {
      return absl::InvalidArgumentError(absl::StrCat("group '", r.group(), "': rdma.qps_per_peer ",
                                                     e.qps_per_peer(), " is not in 1..",
                                                     kMaxQpsPerPeer));
    }
    if (!e.qpns().empty() && static_cast<uint64_t>(e.qpns_size()) !=
                                 static_cast<uint64_t>(r.world_size()) * e.qps_per_peer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("group '", r.group(), "': rdma.qpns has ", e.qpns_size(),
                       " entries; it must be empty or world_size * qps_per_peer = ",
                       static_cast<uint64_t>(r.world_size()) * e.qps_per_peer()));
    }
    if (e.nic().size() > 64)
      return absl::InvalidArgumentError("rdma.nic longer than 64 characters");
  }
  if (r.handle().kind().size() > 64) {
    return absl::InvalidArgumentError("handle kind longer than 64 characters");
  }
  if (r.timeout_ms() > limits_.max_timeout_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group '", r.group(), "': timeout_ms ", r.timeout_ms(), " exceeds the limit of ",
        limits_.max_timeout_ms, " ms (max_join_timeout_ms in mooncaked.conf)"));
  }
  if (absl::Status s = ValidateGroupSecret(r.group_secret()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("group '", r.group(), "': ", s.message()));
  }
  ValidatedJoin j;
  absl::StatusOr<int> gpu = ResolveGpu(r.device(), &j.gpu_uuid_, &j.gpu_pci_);
  if (!gpu.ok()) return gpu.status();
  j.gpu_index_ = *gpu;
  j.group_ = r.group();
  j.rank_ = r.rank();
  j.world_size_ = r.world_size();
  j.timeout_ms_ = r.timeout_ms() == 0 ? limits_.default_timeout_ms : r.timeout_ms();
  j.handle_ = r.handle();
  if (r.has_rdma()) j.rdma_ = r.rdma();
  j.fd_ticket_ = j.handle_.fd_ticket();
  j.handle_.clear_fd_ticket();
  j.group_secret_ = r.group_secret();
  return j;
}

absl::StatusOr<int> GroupBroker::ResolveGpu(const v1::DeviceSelector& d, std::string* uuid,
                                            std::string* pci) const {
  if (d.gpu_uuid().empty() && d.gpu_pci_bus_id().empty()) return -1;
  for (const v1::Gpu& g : topology_.gpus()) {
    bool match = (!d.gpu_uuid().empty() &&
                  absl::AsciiStrToLower(d.gpu_uuid()) == absl::AsciiStrToLower(g.uuid())) ||
                 (!d.gpu_pci_bus_id().empty() &&
                  NormalizePci(d.gpu_pci_bus_id()) == NormalizePci(g.pci_bus_id()));
    if (match) {
      *uuid = g.uuid();
      *pci = g.pci_bus_id();
      return g.index();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "GPU '", d.gpu_uuid().empty() ? d.gpu_pci_bus_id() : d.gpu_uuid(), "' is not on this node (",
      topology_.gpus_size(), " GPUs found; `mcctl gpus` lists them)"));
}

bool GroupBroker::Reachable(int from, int to, bool* native_atomics) const {
  *native_atomics = false;
  if (from < 0 && to < 0) {  // host platform: shared memory on one node
    *native_atomics = true;
    return true;
  }
  if (from < 0 || to < 0) return false;
  if (from == to) {
    *native_atomics = true;
    return true;
  }
  for (const v1::GpuPair& p : topology_.gpu_pairs()) {
    if (p.src() == from && p.dst() == to) {
      *native_atomics = p.native_atomics();
      return p.access_supported();
    }
  }
  return false;
}

absl::StatusOr<v1::JoinGroupResponse> EncodedView::Decode() const {
  v1::JoinGroupResponse view;
  std::string bytes = shared ? *shared : std::string();
  bytes += own;
  if (!view.ParseFromString(bytes)) return absl::InternalError("group view does not parse");
  return view;
}

absl::Status GroupBroker::CheckBudget(const Principal& who, uint64_t view_bytes, bool waits) const {
  if (AdmissionCounter::Privileged(who)) return absl::OkStatus();
  auto it = usage_.find(who);
  Usage u = it == usage_.end() ? Usage{} : it->second;
  auto exhausted = [&who](absl::string_view what, uint64_t held, uint64_t limit,
                          absl::string_view key) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who.Describe(), " holds ", held, " ", what, " in groups on this node; the limit is ", limit,
        " (", key, " in mooncaked.conf): leave or end groups that are done"));
  };
  if (u.ranks + 1 > limits_.max_ranks_per_uid) {
    return exhausted("ranks", u.ranks, limits_.max_ranks_per_uid, "max_ranks_per_uid");
  }
  if (waits && u.waiting + 1 > limits_.max_waiting_joins_per_uid) {
    return exhausted("waiting joins", u.waiting, limits_.max_waiting_joins_per_uid,
                     "max_waiting_joins_per_uid");
  }
  if (u.view_bytes + view_bytes > limits_.max_view_bytes_per_uid) {
    return exhausted("bytes of group views", u.view_bytes, limits_.max_view_bytes_per_uid,
                     "max_view_bytes_per_uid");
  }
  return absl::OkStatus();
}

void GroupBroker::AddMemberLocked(Group& g, Member m) {
  EraseMemberLocked(g, m.rank);  // none there in practice; keeps usage exact
  Usage& u = usage_[Principal{g.uid, g.tenant}];
  u.ranks += 1;
  u.view_bytes += m.view_bytes;
  by_session_[m.session].insert(MemberRef{&g, m.rank});
  uint32_t rank = m.rank;
  Emit(g, GroupEvent::Kind::kJoined, rank, m.cred.pid, "");
  g.members.insert_or_assign(rank, std::move(m));
}

// The event feed (mcctl watch): one report per group event, under mu_.
void GroupBroker::Emit(const Group& g, GroupEvent::Kind kind, uint32_t rank, int pid,
                       std::string detail) const {
  if (events_ == nullptr) return;
  GroupEvent ev;
  ev.kind = kind;
  ev.uid = g.uid;
  ev.tenant = g.tenant;  // watchers see only their tenant's groups
  ev.group = g.name;
  ev.rank = rank;
  ev.pid = pid;
  ev.world_size = g.world_size;
  ev.epoch = g.epoch;
  ev.detail = std::move(detail);
  events_->OnGroupEvent(ev);
}

void GroupBroker::EraseMemberLocked(Group& g, uint32_t rank) {
  auto it = g.members.find(rank);
  if (it == g.members.end()) return;
  if (directory_ != nullptr && it->second.claim != Member::Claim::kNone) {
    directory_->Withdraw(g.uid, g.tenant, g.name, rank);
  }
  if (auto u = usage_.find(Principal{g.uid, g.tenant}); u != usage_.end()) {
    u->second.ranks -= std::min<uint64_t>(1, u->second.ranks);
    u->second.view_bytes -= std::min(it->second.view_bytes, u->second.view_bytes);
    if (u->second.ranks == 0 && u->second.waiting == 0) usage_.erase(u);
  }
  if (auto s = by_session_.find(it->second.session); s != by_session_.end()) {
    s->second.erase(MemberRef{&g, rank});
    if (s->second.empty()) by_session_.erase(s);
  }
  if (!g.formed) Emit(g, GroupEvent::Kind::kWithdrew, rank, it->second.cred.pid, "");
  g.members.erase(it);
}

void GroupBroker::AddWaiterLocked(Group& g, uint32_t rank, const SessionInfo& caller, JoinDone done,
                                  uint32_t timeout_ms) {
  usage_[Principal{g.uid, g.tenant}].waiting += 1;
  auto deadline =
      deadlines_.emplace(absl::Now() + absl::Milliseconds(timeout_ms), DeadlineRef{&g, rank});
  g.waiters.emplace(rank, Waiter{caller, std::move(done), timeout_ms, deadline});
}

GroupBroker::JoinDone GroupBroker::TakeWaiterLocked(Group& g,
                                                    std::map<uint32_t, Waiter>::iterator it) {
  if (auto u = usage_.find(Principal{g.uid, g.tenant}); u != usage_.end()) {
    u->second.waiting -= std::min<uint64_t>(1, u->second.waiting);
    if (u->second.ranks == 0 && u->second.waiting == 0) usage_.erase(u);
  }
  deadlines_.erase(it->second.deadline);
  JoinDone done = std::move(it->second.done);
  g.waiters.erase(it);
  return done;
}

namespace {

// "k of n ranks joined ... (missing ranks: a,b,...)" without walking all n:
// the gaps among the first members, at most 16 of them.
template <typename MemberMap>
std::string MissingRanks(const MemberMap& members, uint32_t world_size, size_t* missing_total) {
  *missing_total = world_size - members.size();
  std::vector<uint32_t> missing;
  uint32_t expect = 0;
  for (auto it = members.begin(); missing.size() < 16 && expect < world_size;) {
    if (it != members.end() && it->first == expect) {
      ++it;
    } else {
      missing.push_back(expect);
    }
    ++expect;
  }
  return absl::StrCat(absl::StrJoin(missing, ","), *missing_total > missing.size() ? ",..." : "");
}

}  // namespace

void GroupBroker::JoinAsync(const SessionInfo& caller, ValidatedJoin req, FdBundlePtr fds,
                            JoinDone done) {
  if (counters_ != nullptr) {
    // Counted wherever the join ends (formation, deadline, error, cancel).
    done = [counters = counters_, start = absl::Now(),
            inner = std::move(done)](absl::StatusOr<EncodedView> r) {
      counters->RecordJoin(r.ok() ? metrics::JoinResult::kFormed
                           : r.status().code() == absl::StatusCode::kDeadlineExceeded
                               ? metrics::JoinResult::kTimedOut
                               : metrics::JoinResult::kFailed,
                           absl::Now() - start);
      inner(std::move(r));
    };
  }
  Member m;
  m.rank = req.rank();
  m.session = caller.id;
  m.cred = caller.cred;
  m.gpu_index = req.gpu_index_;
  m.gpu_uuid = std::move(req.gpu_uuid_);
  m.gpu_pci = std::move(req.gpu_pci_);
  m.handle = std::move(req.handle_);
  if (req.rdma_) m.rdma = std::make_shared<const v1::RdmaEndpoint>(std::move(*req.rdma_));
  m.fds = std::move(fds);
  m.view_bytes = EntryBytes(m);

  const uint32_t timeout_ms = req.timeout_ms_;
  const GroupKey key = KeyOf(caller, req.group());
  std::optional<Formation> formation;
  // Registers under the lock; completions run after it is released.
  absl::Status error = [&]() -> absl::Status {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("mooncaked is shutting down");
    // EndSession closes the session before SessionEnded takes mu_: either
    // the session is seen closed here, or SessionEnded runs after us and
    // removes this member. Without the check a rank of a dead session could
    // complete a group and never be reported lost.
    if (!sessions_->Find(caller.id)) {
      return absl::FailedPreconditionError(absl::StrCat("session ", caller.id,
                                                        " ended while joining group '", req.group(),
                                                        "'; reconnect and rejoin"));
    }
    auto found = groups_.find(key);
    Group* g = found == groups_.end() ? nullptr : found->second.get();
    if (g != nullptr && g->secret != req.group_secret_) {
      // Compared in the clear: both are this node's, given by local ranks.
      return absl::PermissionDeniedError(
          absl::StrCat("group '", g->name, "' was joined on this node ",
                       g->secret.empty() ? "without a group secret" : "with another group secret",
                       ": every rank of a group must be started with the same MC_GROUP_SECRET"));
    }
    if (g != nullptr) {
      if (g->world_size != req.world_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "group '", g->name, "' has world size ", g->world_size, " but rank ", req.rank(),
            " asked for ", req.world_size(), ": start every rank with the same world size"));
      }
      if (auto it = g->members.find(req.rank()); it != g->members.end() &&
                                                 it->second.state != MemberState::kLeft &&
                                                 it->second.state != MemberState::kLost) {
        return absl::AlreadyExistsError(absl::StrCat("rank ", req.rank(), " of group '", g->name,
                                                     "' is already taken by pid ",
                                                     it->second.cred.pid));
      }
      if (auto it = g->remote.find(req.rank());
          it != g->remote.end() && IsJoinedNow(it->second.state)) {
        return absl::AlreadyExistsError(absl::StrCat("rank ", req.rank(), " of group '", g->name,
                                                     "' is already taken by pid ", it->second.pid,
                                                     " on node ", it->second.node_id));
      }
    }
    std::vector<ClusterMember> remote;
    if (g == nullptr && directory_ != nullptr) {
      remote = directory_->RemoteMembers(caller.cred.uid, caller.tenant, req.group());
      // With a secret, other nodes' ranks count only when they prove it.
      std::erase_if(remote, [&](const ClusterMember& c) {
        return !AdmitsRemoteLocked(req.group_secret_, caller.cred.uid, caller.tenant, req.group(),
                                   c.rank, c);
      });
    }
    // A rank of a formed group is vacant (its holder was lost or left):
    // the caller is its replacement. The group may have formed on other
    // nodes only (a replacement on a node new to it).
    const bool rejoin = g != nullptr ? g->formed : FormedInRecords(remote);
    const size_t joined = g == nullptr ? 0 : g->members.size() + g->remote.size();
    const bool completes = !rejoin && joined + 1 == req.world_size() && directory_ == nullptr;
    if (absl::Status s =
            CheckBudget(Principal{caller.cred.uid, caller.tenant}, m.view_bytes, !completes);
        !s.ok()) {
      return s;
    }
    if (g == nullptr) {
      for (const ClusterMember& c : remote) {
        if (c.world_size != req.world_size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("group '", req.group(), "' has world size ", c.world_size, " (rank ",
                           c.rank, " on node ", c.node_id, ") but rank ", req.rank(), " asked for ",
                           req.world_size(), ": start every rank with the same world size"));
        }
        if (c.rank == req.rank() && IsJoinedNow(c.state)) {
          return absl::AlreadyExistsError(absl::StrCat("rank ", req.rank(), " of group '",
                                                       req.group(), "' is already taken by pid ",
                                                       c.pid, " on node ", c.node_id));
        }
      }
      auto fresh = std::make_shared<Group>();
      fresh->name = req.group();
      fresh->uid = caller.cred.uid;
      fresh->tenant = caller.tenant;
      fresh->world_size = req.world_size();
      fresh->secret = req.group_secret_;
      fresh->created = absl::Now();
      for (ClusterMember& c : remote) {
        const uint32_t r = c.rank;
        fresh->remote.emplace(r, std::move(c));
      }
      if (rejoin) AdoptFormationLocked(*fresh);
      g = fresh.get();
      groups_.emplace(key, std::move(fresh));
    }
    const uint32_t rank = req.rank();
    std::optional<ClusterMember> claim;
    if (directory_ != nullptr) {
      m.claim = Member::Claim::kPending;
      claim.emplace();
      claim->rank = rank;
      claim->world_size = req.world_size();
      claim->pid = m.cred.pid;
      claim->gpu_index = m.gpu_index;
      claim->gpu_uuid = m.gpu_uuid;
      claim->gpu_pci = m.gpu_pci;
      claim->handle_kind = m.handle.kind();
      claim->handle_size = m.handle.size();
      claim->rdma = m.rdma;
      claim->epoch = rejoin ? g->epoch : 0;
      if (!g->secret.empty()) {
        claim->proof =
            GroupProof(g->secret, g->uid, g->tenant, g->name, rank, node_id_, req.world_size());
      }
    }
    if (rejoin) {
      // The lost or departed holder, here or on another node.
      EraseMemberLocked(*g, rank);
      g->remote.erase(rank);
    }
    AddMemberLocked(*g, std::move(m));
    AddWaiterLocked(*g, rank, caller, std::move(done), timeout_ms);
    if (absl::Time d = g->waiters.at(rank).deadline->first; d < timer_next_) {
      // Only an earlier deadline needs the timer thread awake now.
      timer_next_ = d;
      timer_kick_ = true;
    }
    if (claim) {
      // Queued only; the answer comes on the directory's thread.
      ClaimDone answered = [this, key, rank, session = caller.id](ClaimOutcome outcome,
                                                                  const absl::Status& status) {
        ClaimAnswered(key, rank, session, outcome, status);
      };
      if (rejoin) {
        directory_->ClaimVacant(g->uid, g->tenant, g->name, *claim, std::move(answered));
      } else {
        directory_->Claim(g->uid, g->tenant, g->name, *claim, std::move(answered));
      }
      return absl::OkStatus();
    }
    formation = rejoin ? MaybeReformLocked(*g) : MaybeFormLocked(*g);
    return absl::OkStatus();
  }();
  if (!error.ok()) return done(error);
  if (formation) CompleteFormation(std::move(*formation));
}

void GroupBroker::CancelJoin(const SessionInfo& caller, const std::string& group, uint32_t rank) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    GroupKey key = KeyOf(caller, group);
    auto it = groups_.find(key);
    if (it == groups_.end()) return;
    Group& g = *it->second;
    auto w = g.waiters.find(rank);
    if (w == g.waiters.end() || w->second.caller.id != caller.id) return;
    completions.push_back(
        {TakeWaiterLocked(g, w), absl::CancelledError("JoinGroup cancelled by the client")});
    EraseMemberLocked(g, rank);
    EraseIfEmpty(key);
  }
  Complete(&completions);
}

void GroupBroker::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!shut_down_) {
    absl::Time now = absl::Now();
    std::vector<Completion> expired;
    // Each group's missing ranks are worked out once per pass, however
    // many of its joins expire in it.
    std::map<Group*, std::pair<std::string, size_t>> missing;
    std::vector<GroupKey> touched;
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      DeadlineRef ref = deadlines_.begin()->second;
      Group& g = *ref.group;
      auto m = missing.find(&g);
      if (m == missing.end()) {
        size_t total = 0;
        std::string list;
        if (g.remote.empty()) {
          list = MissingRanks(g.members, g.world_size, &total);
        } else {
          std::map<uint32_t, bool> present;
          for (const auto& [r, mem] : g.members) present.emplace(r, true);
          for (const auto& [r, c] : g.remote) present.emplace(r, true);
          list = MissingRanks(present, g.world_size, &total);
        }
        if (directory_ != nullptr) {
          if (std::string trouble = directory_->Trouble(); !trouble.empty()) {
            absl::StrAppend(&list, "; ", trouble);
          }
        }
        m = missing.emplace(&g, std::make_pair(std::move(list), total)).first;
        touched.push_back(KeyOf(g));
      }
      auto w = g.waiters.find(ref.rank);
      uint32_t timeout_ms = w->second.timeout_ms;
      JoinDone done = TakeWaiterLocked(g, w);
      const auto& [list, total] = m->second;
      if (g.formed) {
        std::string why;
        for (const auto& [vacant, waiting_on] : g.unreleased) {
          if (!waiting_on.empty()) {
            absl::StrAppend(&why, why.empty() ? "" : "; ", "rank ", vacant,
                            " not yet released by ranks ", absl::StrJoin(waiting_on, ","));
          }
        }
        for (uint32_t r = 0; r < g.world_size; ++r) {
          if (!PresentLocked(g, r)) {
            absl::StrAppend(&why, why.empty() ? "" : "; ", "rank ", r, " still vacant");
          }
        }
        if (auto mem = g.members.find(ref.rank);
            mem != g.members.end() && mem->second.claim == Member::Claim::kPending) {
          absl::StrAppend(&why, why.empty() ? "" : "; ",
                          "its claim in the cluster directory is not answered");
        }
        expired.push_back(
            {std::move(done),
             absl::DeadlineExceededError(absl::StrCat(
                 "group '", g.name, "': rank ", ref.rank, " could not re-enter the group (epoch ",
                 g.epoch, ") within ", timeout_ms, " ms: ", why,
                 " (survivors release a lost rank with Communicator::handleEvent)"))});
        EraseMemberLocked(g, ref.rank);
        continue;
      }
      if (total == 0 && EndpointsPendingLocked(g)) {
        // Every rank holds its claim, but another node would not serve the
        // RDMA endpoints of its ranks (it does not count this node's ranks
        // as members: another group secret, its tenant policy) or could
        // not be reached. Its refusal is in this daemon's log.
        std::string pending;
        for (const auto& [r, c] : g.remote) {
          if (c.endpoint_pending && IsJoinedNow(c.state)) {
            absl::StrAppend(&pending, pending.empty() ? "" : ", ", r, " on node ",
                            EscapeForDisplay(c.node_id, 64));
          }
        }
        expired.push_back(
            {std::move(done), absl::DeadlineExceededError(absl::StrCat(
                                  "group '", g.name,
                                  "': every rank joined, but the RDMA endpoints "
                                  "of rank ",
                                  pending, " did not arrive within ", timeout_ms,
                                  " ms (that node does not count this node's ranks as members, or "
                                  "cannot be reached: the daemon's log says which)"))});
        EraseMemberLocked(g, ref.rank);
        continue;
      }
      expired.push_back(
          {std::move(done),
           absl::DeadlineExceededError(absl::StrCat(
               "group '", g.name, "': ", g.world_size - total, " of ", g.world_size,
               " ranks joined within ", timeout_ms, " ms (missing ranks: ", list,
               "); is every rank started with the same group name, world size and user?"))});
      EraseMemberLocked(g, ref.rank);
    }
    for (const GroupKey& k : touched) EraseIfEmpty(k);
    if (!expired.empty()) {
      mu_.Unlock();
      Complete(&expired);
      mu_.Lock();
    }
    // Passes are at least 5 ms apart, so joins whose deadlines are close
    // expire together and a group's missing ranks are not recounted each time.
    absl::Time next = deadlines_.empty() ? absl::InfiniteFuture() : deadlines_.begin()->first;
    if (!expired.empty()) next = std::max(next, now + absl::Milliseconds(5));
    timer_kick_ = false;
    timer_next_ = next;
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shut_down_ || timer_kick_; };
    mu_.AwaitWithDeadline(absl::Condition(&woken), next);
  }
}

absl::StatusOr<v1::JoinGroupResponse> GroupBroker::Join(const SessionInfo& caller,
                                                        const v1::JoinGroupRequest& req,
                                                        FdBundlePtr fds,
                                                        const std::function<bool()>& cancelled) {
  struct Result {
    absl::Mutex mu;
    std::optional<absl::StatusOr<EncodedView>> value ABSL_GUARDED_BY(mu);
  };
  absl::StatusOr<ValidatedJoin> join = ValidateJoin(req);
  if (!join.ok()) return join.status();
  auto result = std::make_shared<Result>();
  JoinAsync(caller, *std::move(join), std::move(fds), [result](absl::StatusOr<EncodedView> r) {
    absl::MutexLock lock(&result->mu);
    result->value = std::move(r);
  });
  bool cancel_sent = false;
  absl::MutexLock lock(&result->mu);
  auto has = [&result]()
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(result->mu) { return result->value.has_value(); };
  while (!result->value) {
    result->mu.AwaitWithTimeout(absl::Condition(&has), absl::Milliseconds(100));
    if (!result->value && !cancel_sent && cancelled()) {
      cancel_sent = true;
      result->mu.Unlock();
      CancelJoin(caller, req.group(), req.rank());
      result->mu.Lock();
    }
  }
  if (!result->value->ok()) return result->value->status();
  return (*result->value)->Decode();
}

void GroupBroker::NotifyOthers(const Group& g, uint32_t about_rank, v1::MemberEvent::Kind kind,
                               const std::string& detail) {
  int32_t pid = 0;
  if (auto local = g.members.find(about_rank); local != g.members.end()) {
    pid = local->second.cred.pid;
  } else if (auto remote = g.remote.find(about_rank); remote != g.remote.end()) {
    pid = remote->second.pid;
  }
  Emit(g,
       kind == v1::MemberEvent::LEFT   ? GroupEvent::Kind::kLeft
       : kind == v1::MemberEvent::LOST ? GroupEvent::Kind::kLost
                                       : GroupEvent::Kind::kFailed,
       about_rank, pid, detail);
  for (const auto& [r, m] : g.members) {
    if (r == about_rank || m.state == MemberState::kLeft || m.state == MemberState::kLost) continue;
    v1::SessionEvent ev;
    v1::MemberEvent* me = ev.mutable_member();
    me->set_group(g.name);
    me->set_rank(about_rank);
    me->set_kind(kind);
    me->set_pid(pid);
    me->set_detail(detail);
    sessions_->Post(m.session, std::move(ev));
  }
}

void GroupBroker::EraseIfEmpty(const GroupKey& key) {
  auto it = groups_.find(key);
  if (it == groups_.end()) return;
  bool any_alive =
      std::any_of(it->second->members.begin(), it->second->members.end(), [](const auto& kv) {
        return kv.second.state != MemberState::kLeft && kv.second.state != MemberState::kLost;
      });
  if (!any_alive) {
    Group& g = *it->second;
    if (g.formed) MC_LOG(kInfo, "group '", g.name, "' (uid ", g.uid, ") released");
    while (!g.members.empty()) EraseMemberLocked(g, g.members.begin()->first);
    Emit(g, GroupEvent::Kind::kReleased, 0, 0, "");
    groups_.erase(it);
  }
}

absl::Status GroupBroker::Leave(const SessionInfo& caller, const std::string& group,
                                uint32_t rank) {
  absl::MutexLock lock(&mu_);
  GroupKey key = KeyOf(caller, group);
  auto it = groups_.find(key);
  if (it == groups_.end()) {
    return absl::NotFoundError(absl::StrCat("no group '", group, "' for this user"));
  }
  Group& g = *it->second;
  auto m = g.members.find(rank);
  if (m == g.members.end() || m->second.session != caller.id ||
      m->second.state == MemberState::kLeft || m->second.state == MemberState::kLost) {
    return absl::NotFoundError(
        absl::StrCat("this session holds no rank ", rank, " in group '", group, "'"));
  }
  std::vector<Completion> completions;
  if (auto w = g.waiters.find(rank); !g.formed || w != g.waiters.end()) {
    if (w != g.waiters.end()) {
      completions.push_back({TakeWaiterLocked(g, w),
                             absl::CancelledError(absl::StrCat("rank ", rank, " of group '", group,
                                                               "' left while waiting"))});
    }
    EraseMemberLocked(g, rank);
  } else {
    m->second.state = MemberState::kLeft;
    m->second.fds.reset();
    VacateLocked(g, rank);
    NotifyOthers(g, rank, v1::MemberEvent::LEFT, "left the group");
    if (directory_ != nullptr && m->second.claim == Member::Claim::kClaimed) {
      directory_->MarkState(g.uid, g.tenant, g.name, rank, MemberState::kLeft, g.epoch);
    }
  }
  EraseIfEmpty(key);
  mu_.Unlock();
  Complete(&completions);
  mu_.Lock();
  return absl::OkStatus();
}

absl::Status GroupBroker::ReportReady(const SessionInfo& caller, const v1::ReportReadyRequest& r) {
  absl::MutexLock lock(&mu_);
  GroupKey key = KeyOf(caller, r.group());
  auto it = groups_.find(key);
  if (it == groups_.end()) {
    return absl::NotFoundError(absl::StrCat("no group '", r.group(), "' for this user"));
  }
  Group& g = *it->second;
  auto m = g.members.find(r.rank());
  if (m == g.members.end() || m->second.session != caller.id) {
    return absl::NotFoundError(
        absl::StrCat("this session holds no rank ", r.rank(), " in group '", r.group(), "'"));
  }
  if (!g.formed) {
    return absl::FailedPreconditionError(
        absl::StrCat("group '", r.group(), "' has not formed yet: report after JoinGroup returns"));
  }
  if (m->second.state != MemberState::kJoined) {
    return absl::FailedPreconditionError("readiness was already reported for this rank");
  }
  m->second.state = r.ok() ? MemberState::kReady : MemberState::kFailed;
  if (directory_ != nullptr && m->second.claim == Member::Claim::kClaimed) {
    // The other nodes count it toward READY, or report the failure.
    directory_->MarkState(g.uid, g.tenant, g.name, r.rank(), m->second.state, g.epoch);
  }
  if (!r.ok()) {
    std::string detail = r.detail();
    TruncateUtf8(&detail, 512);
    NotifyOthers(g, r.rank(), v1::MemberEvent::FAILED, detail);
    return absl::OkStatus();
  }
  Emit(g, GroupEvent::Kind::kReady, r.rank(), m->second.cred.pid, "");
  MaybeAllReadyLocked(g, r.rank());
  return absl::OkStatus();
}

void GroupBroker::MaybeAllReadyLocked(const Group& g, uint32_t last_rank) {
  // Every rank, on this node and on others, reported ready: this node tells
  // its own members (each node does, when its view completes).
  const bool all_ready =
      g.members.size() + g.remote.size() == g.world_size &&
      std::all_of(g.members.begin(), g.members.end(),
                  [](const auto& kv) { return kv.second.state == MemberState::kReady; }) &&
      std::all_of(g.remote.begin(), g.remote.end(),
                  [](const auto& kv) { return kv.second.state == MemberState::kReady; });
  if (all_ready) {
    Emit(g, GroupEvent::Kind::kGroupReady, last_rank, 0, "all ranks verified their peers");
    for (const auto& [rank, mem] : g.members) {
      v1::SessionEvent ev;
      ev.mutable_member()->set_group(g.name);
      ev.mutable_member()->set_rank(rank);
      ev.mutable_member()->set_kind(v1::MemberEvent::READY);
      ev.mutable_member()->set_detail("all ranks verified their peers");
      sessions_->Post(mem.session, std::move(ev));
    }
  }
}

void GroupBroker::SessionEnded(uint64_t session_id) {
  std::vector<Completion> completions;
  absl::MutexLock lock(&mu_);
  auto index = by_session_.find(session_id);
  if (index == by_session_.end()) return;
  // Copied: erasing members edits the index.
  std::vector<MemberRef> refs(index->second.begin(), index->second.end());
  std::vector<GroupKey> touched;
  for (const auto& [gp, rank] : refs) {
    Group& g = *gp;
    auto it = g.members.find(rank);
    if (it == g.members.end() || it->second.session != session_id) continue;
    Member& m = it->second;
    if (m.state == MemberState::kLeft || m.state == MemberState::kLost) continue;
    touched.push_back(KeyOf(g));
    // Forming, or a replacement waiting to re-enter a formed group: the
    // rank was never part of anyone's view, so it just goes.
    if (auto w = g.waiters.find(rank); !g.formed || w != g.waiters.end()) {
      if (w != g.waiters.end()) {
        completions.push_back(
            {TakeWaiterLocked(g, w), absl::CancelledError("the session ended while waiting")});
      }
      EraseMemberLocked(g, rank);
      continue;
    }
    m.state = MemberState::kLost;
    m.fds.reset();
    VacateLocked(g, rank);
    if (directory_ != nullptr && m.claim == Member::Claim::kClaimed) {
      directory_->MarkState(g.uid, g.tenant, g.name, rank, MemberState::kLost, g.epoch);
    }
    NotifyOthers(g, rank, v1::MemberEvent::LOST,
                 absl::StrCat("pid ", m.cred.pid, " exited or lost its session"));
    MC_LOG(kInfo, "group '", g.name, "': rank ", rank, " (pid ", m.cred.pid, ") lost");
    if (counters_ != nullptr) counters_->RecordLost();
  }
  for (const GroupKey& k : touched) EraseIfEmpty(k);
  mu_.Unlock();
  Complete(&completions);
  mu_.Lock();
}

void GroupBroker::Shutdown() {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    for (auto& [key, g] : groups_) {
      while (!g->waiters.empty()) {
        completions.push_back({TakeWaiterLocked(*g, g->waiters.begin()),
                               absl::UnavailableError("mooncaked is shutting down")});
      }
    }
  }
  Complete(&completions);
}

GroupState GroupBroker::StateOf(const Group& g) {
  if (!g.formed) return GroupState::kForming;
  bool all_ready = true;
  for (const auto& [r, m] : g.members) {
    if (m.state == MemberState::kLeft || m.state == MemberState::kLost ||
        m.state == MemberState::kFailed) {
      return GroupState::kDegraded;
    }
    all_ready &= (m.state == MemberState::kReady);
  }
  for (const auto& [r, c] : g.remote) {
    if (c.state != MemberState::kJoined) return GroupState::kDegraded;
  }
  return all_ready ? GroupState::kReady : GroupState::kFormed;
}

std::vector<GroupSummary> GroupBroker::List(uint32_t uid, bool all) const {
  return List(Scope{uid, "", all, all});
}

std::vector<GroupSummary> GroupBroker::List(const Scope& scope) const {
  absl::MutexLock lock(&mu_);
  std::vector<GroupSummary> out;
  absl::Time now = absl::Now();
  for (const auto& [key, g] : groups_) {
    if (!scope.Sees(g->uid, g->tenant)) continue;
    GroupSummary info;
    info.name = g->name;
    info.uid = g->uid;
    info.tenant = g->tenant;
    info.world_size = g->world_size;
    info.state = StateOf(*g);
    info.epoch = g->epoch;
    info.age = now - g->created;
    info.members.reserve(g->members.size());
    for (const auto& [r, m] : g->members) {
      info.members.push_back(GroupMemberSummary{r, m.state, m.cred.pid, m.session, m.gpu_index,
                                                m.handle.kind(), m.handle.size(), ""});
    }
    for (const auto& [r, c] : g->remote) {
      info.members.push_back(GroupMemberSummary{r, c.state, c.pid, 0, c.gpu_index, c.handle_kind,
                                                c.handle_size, c.node_id});
    }
    std::sort(info.members.begin(), info.members.end(),
              [](const auto& a, const auto& b) { return a.rank < b.rank; });
    out.push_back(std::move(info));
  }
  return out;
}

size_t GroupBroker::CountVisible(uint32_t uid, bool all) const {
  return CountVisible(Scope{uid, "", all, all});
}

size_t GroupBroker::CountVisible(const Scope& scope) const {
  absl::MutexLock lock(&mu_);
  return static_cast<size_t>(std::count_if(
      groups_.begin(), groups_.end(),
      [&scope](const auto& kv) { return scope.Sees(kv.second->uid, kv.second->tenant); }));
}

std::vector<std::string> GroupBroker::MembershipsOf(uint64_t session_id) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  auto index = by_session_.find(session_id);
  if (index == by_session_.end()) return out;
  for (const auto& [g, rank] : index->second) {
    auto m = g->members.find(rank);
    if (m != g->members.end() && m->second.state != MemberState::kLeft &&
        m->second.state != MemberState::kLost) {
      out.push_back(absl::StrCat(g->name, "/", rank));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::map<std::string, uint64_t> GroupBroker::CountByState() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, uint64_t> out;
  for (const auto& [key, g] : groups_) out[GroupStateName(StateOf(*g))] += 1;
  return out;
}

GroupBroker::Usage GroupBroker::UsageOf(const Principal& who) const {
  absl::MutexLock lock(&mu_);
  auto it = usage_.find(who);
  return it == usage_.end() ? Usage{} : it->second;
}

}  // namespace mooncake::daemon
