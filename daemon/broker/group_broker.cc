#include "broker/group_broker.h"

#include <algorithm>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
  if (r.handle().kind().size() > 64) {
    return absl::InvalidArgumentError("handle kind longer than 64 characters");
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
  j.fd_ticket_ = j.handle_.fd_ticket();
  j.handle_.clear_fd_ticket();
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

void GroupBroker::BuildView(const Group& g, const SessionInfo& receiver, uint32_t rank,
                            v1::JoinGroupResponse* resp) const {
  resp->set_group(g.name);
  resp->set_rank(rank);
  resp->set_world_size(g.world_size);
  resp->set_epoch(g.epoch);
  resp->mutable_members()->Reserve(static_cast<int>(g.members.size()));
  const Member& me = g.members.at(rank);
  for (const auto& [r, m] : g.members) {
    v1::MemberView* v = resp->add_members();
    v->set_rank(r);
    v->set_node_id(node_id_);
    v->set_pid(m.cred.pid);
    v->set_gpu_index(m.gpu_index);
    v->set_gpu_uuid(m.gpu_uuid);
    v->set_gpu_pci_bus_id(m.gpu_pci);
    v->set_handle_kind(m.handle.kind());
    v->set_handle_data(m.handle.data());
    v->set_handle_size(m.handle.size());
    v->set_same_node(true);
    bool atomics = false;
    v->set_p2p_reachable(Reachable(me.gpu_index, m.gpu_index, &atomics));
    v->set_native_atomics(atomics);
    if (m.fds && r != rank) {
      // Fails only when either session just ended: the view goes to a dead
      // RPC, or the owner is about to be reported lost.
      absl::StatusOr<std::string> ticket = fd_tickets_->IssueOutgoing(m.session, receiver, m.fds);
      if (ticket.ok()) {
        v->set_fd_ticket(*std::move(ticket));
        v->set_fd_count(static_cast<uint32_t>(m.fds->fds.size()));
      }
    }
  }
}

void GroupBroker::Complete(std::vector<Completion>* completions) {
  for (Completion& c : *completions) c.done(std::move(c.result));
  completions->clear();
}

void GroupBroker::CompleteFormation(Formation f) const {
  // Views are built outside the lock, each from the same snapshot.
  for (auto& [rank, w] : f.waiters) {
    if (w.out != nullptr) {
      BuildView(*f.group, w.caller, rank, w.out);
      w.done(v1::JoinGroupResponse());
    } else {
      v1::JoinGroupResponse view;
      BuildView(*f.group, w.caller, rank, &view);
      w.done(std::move(view));
    }
  }
}

absl::Status GroupBroker::DeadlineError(const Group& g, uint32_t rank, uint32_t timeout_ms) const {
  std::vector<uint32_t> missing;
  size_t missing_total = 0;
  for (uint32_t r = 0; r < g.world_size; ++r) {
    if (g.members.contains(r) || r == rank) continue;
    ++missing_total;
    if (missing.size() < 16) missing.push_back(r);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "group '", g.name, "': ", g.world_size - missing_total, " of ", g.world_size,
      " ranks joined within ", timeout_ms, " ms (missing ranks: ", absl::StrJoin(missing, ","),
      missing_total > missing.size() ? ",..." : "",
      "); is every rank started with the same group name, world size and user?"));
}

void GroupBroker::JoinAsync(const SessionInfo& caller, ValidatedJoin req, FdBundlePtr fds,
                            JoinDone done, v1::JoinGroupResponse* out) {
  Member m;
  m.rank = req.rank();
  m.session = caller.id;
  m.cred = caller.cred;
  m.gpu_index = req.gpu_index_;
  m.gpu_uuid = std::move(req.gpu_uuid_);
  m.gpu_pci = std::move(req.gpu_pci_);
  m.handle = std::move(req.handle_);
  m.fds = std::move(fds);

  const uint32_t timeout_ms = req.timeout_ms_;
  const GroupKey key{caller.cred.uid, req.group()};
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
    std::shared_ptr<Group>& slot = groups_[key];
    if (!slot) {
      slot = std::make_shared<Group>();
      slot->name = req.group();
      slot->uid = caller.cred.uid;
      slot->world_size = req.world_size();
      slot->created = absl::Now();
    }
    Group& g = *slot;
    absl::Status error;
    if (g.world_size != req.world_size()) {
      error = absl::InvalidArgumentError(absl::StrCat(
          "group '", g.name, "' has world size ", g.world_size, " but rank ", req.rank(),
          " asked for ", req.world_size(), ": start every rank with the same world size"));
    } else if (auto it = g.members.find(req.rank()); it != g.members.end() &&
                                                     it->second.state != MemberState::kLeft &&
                                                     it->second.state != MemberState::kLost) {
      error =
          absl::AlreadyExistsError(absl::StrCat("rank ", req.rank(), " of group '", g.name,
                                                "' is already taken by pid ", it->second.cred.pid));
    } else if (g.formed) {
      error = absl::FailedPreconditionError(absl::StrCat(
          "group '", g.name, "' already formed (epoch ", g.epoch, ") and rank ", req.rank(),
          " left it; a formed group is not re-entered: wait until every member has left, "
          "or use a new group name"));
    }
    if (!error.ok()) {
      EraseIfEmpty(key);
      return error;
    }
    const uint32_t rank = req.rank();
    g.members.emplace(rank, std::move(m));
    g.waiters.emplace(rank, Waiter{caller, std::move(done),
                                   absl::Now() + absl::Milliseconds(timeout_ms), timeout_ms, out});
    if (g.members.size() == g.world_size) {
      g.formed = true;
      g.epoch += 1;
      MC_LOG(kInfo, "group '", g.name, "' (uid ", g.uid, ") formed with ", g.world_size,
             " ranks, epoch ", g.epoch);
      Formation f;
      auto snapshot = std::make_shared<Group>();
      snapshot->name = g.name;
      snapshot->uid = g.uid;
      snapshot->world_size = g.world_size;
      snapshot->formed = true;
      snapshot->epoch = g.epoch;
      snapshot->members = g.members;
      f.group = std::move(snapshot);
      f.waiters.assign(std::make_move_iterator(g.waiters.begin()),
                       std::make_move_iterator(g.waiters.end()));
      g.waiters.clear();
      formation = std::move(f);
    } else if (absl::Time d = g.waiters.at(rank).deadline; d < timer_next_) {
      // Only an earlier deadline needs the timer thread awake now.
      timer_next_ = d;
      timer_kick_ = true;
    }
    return absl::OkStatus();
  }();
  if (!error.ok()) return done(error);
  if (formation) CompleteFormation(std::move(*formation));
}

void GroupBroker::CancelJoin(const SessionInfo& caller, const std::string& group, uint32_t rank) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    GroupKey key{caller.cred.uid, group};
    auto it = groups_.find(key);
    if (it == groups_.end()) return;
    Group& g = *it->second;
    auto w = g.waiters.find(rank);
    if (w == g.waiters.end() || w->second.caller.id != caller.id) return;
    completions.push_back(
        {std::move(w->second.done), absl::CancelledError("JoinGroup cancelled by the client")});
    g.waiters.erase(w);
    g.members.erase(rank);
    EraseIfEmpty(key);
  }
  Complete(&completions);
}

void GroupBroker::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!shut_down_) {
    absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    std::vector<Completion> expired;
    std::vector<GroupKey> emptied;
    for (auto& [key, g] : groups_) {
      for (auto w = g->waiters.begin(); w != g->waiters.end();) {
        if (w->second.deadline <= now) {
          expired.push_back(
              {std::move(w->second.done), DeadlineError(*g, w->first, w->second.timeout_ms)});
          g->members.erase(w->first);
          w = g->waiters.erase(w);
          emptied.push_back(key);
        } else {
          next = std::min(next, w->second.deadline);
          ++w;
        }
      }
    }
    for (const GroupKey& k : emptied) EraseIfEmpty(k);
    if (!expired.empty()) {
      mu_.Unlock();
      Complete(&expired);
      mu_.Lock();
      continue;  // the map may have changed while unlocked
    }
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
    std::optional<absl::StatusOr<v1::JoinGroupResponse>> value ABSL_GUARDED_BY(mu);
  };
  absl::StatusOr<ValidatedJoin> join = ValidateJoin(req);
  if (!join.ok()) return join.status();
  auto result = std::make_shared<Result>();
  JoinAsync(caller, *std::move(join), std::move(fds),
            [result](absl::StatusOr<v1::JoinGroupResponse> r) {
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
  return std::move(*result->value);
}

void GroupBroker::NotifyOthers(const Group& g, uint32_t about_rank, v1::MemberEvent::Kind kind,
                               const std::string& detail) {
  const Member& about = g.members.at(about_rank);
  for (const auto& [r, m] : g.members) {
    if (r == about_rank || m.state == MemberState::kLeft || m.state == MemberState::kLost) continue;
    v1::SessionEvent ev;
    v1::MemberEvent* me = ev.mutable_member();
    me->set_group(g.name);
    me->set_rank(about_rank);
    me->set_kind(kind);
    me->set_pid(about.cred.pid);
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
    if (it->second->formed) {
      MC_LOG(kInfo, "group '", it->second->name, "' (uid ", key.first, ") released");
    }
    groups_.erase(it);
  }
}

absl::Status GroupBroker::Leave(const SessionInfo& caller, const std::string& group,
                                uint32_t rank) {
  absl::MutexLock lock(&mu_);
  GroupKey key{caller.cred.uid, group};
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
  if (!g.formed) {
    g.members.erase(m);
    if (auto w = g.waiters.find(rank); w != g.waiters.end()) {
      completions.push_back({std::move(w->second.done),
                             absl::CancelledError(absl::StrCat("rank ", rank, " of group '", group,
                                                               "' left while waiting"))});
      g.waiters.erase(w);
    }
  } else {
    m->second.state = MemberState::kLeft;
    m->second.fds.reset();
    NotifyOthers(g, rank, v1::MemberEvent::LEFT, "left the group");
  }
  EraseIfEmpty(key);
  mu_.Unlock();
  Complete(&completions);
  mu_.Lock();
  return absl::OkStatus();
}

absl::Status GroupBroker::ReportReady(const SessionInfo& caller, const v1::ReportReadyRequest& r) {
  absl::MutexLock lock(&mu_);
  GroupKey key{caller.cred.uid, r.group()};
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
  if (!r.ok()) {
    std::string detail = r.detail();
    TruncateUtf8(&detail, 512);
    NotifyOthers(g, r.rank(), v1::MemberEvent::FAILED, detail);
    return absl::OkStatus();
  }
  bool all_ready = std::all_of(g.members.begin(), g.members.end(), [](const auto& kv) {
    return kv.second.state == MemberState::kReady;
  });
  if (all_ready && g.members.size() == g.world_size) {
    for (const auto& [rank, mem] : g.members) {
      v1::SessionEvent ev;
      ev.mutable_member()->set_group(g.name);
      ev.mutable_member()->set_rank(rank);
      ev.mutable_member()->set_kind(v1::MemberEvent::READY);
      ev.mutable_member()->set_detail("all ranks verified their peers");
      sessions_->Post(mem.session, std::move(ev));
    }
  }
  return absl::OkStatus();
}

void GroupBroker::SessionEnded(uint64_t session_id) {
  std::vector<Completion> completions;
  absl::MutexLock lock(&mu_);
  std::vector<GroupKey> touched;
  for (auto& [key, g] : groups_) {
    for (auto it = g->members.begin(); it != g->members.end();) {
      Member& m = it->second;
      if (m.session != session_id || m.state == MemberState::kLeft ||
          m.state == MemberState::kLost) {
        ++it;
        continue;
      }
      touched.push_back(key);
      if (!g->formed) {
        if (auto w = g->waiters.find(m.rank); w != g->waiters.end()) {
          completions.push_back(
              {std::move(w->second.done), absl::CancelledError("the session ended while waiting")});
          g->waiters.erase(w);
        }
        it = g->members.erase(it);
        continue;
      }
      m.state = MemberState::kLost;
      m.fds.reset();
      NotifyOthers(*g, m.rank, v1::MemberEvent::LOST,
                   absl::StrCat("pid ", m.cred.pid, " exited or lost its session"));
      MC_LOG(kInfo, "group '", g->name, "': rank ", m.rank, " (pid ", m.cred.pid, ") lost");
      ++it;
    }
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
      for (auto& [rank, w] : g->waiters) {
        completions.push_back(
            {std::move(w.done), absl::UnavailableError("mooncaked is shutting down")});
      }
      g->waiters.clear();
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
  return all_ready ? GroupState::kReady : GroupState::kFormed;
}

std::vector<GroupSummary> GroupBroker::List(uint32_t uid, bool all) const {
  absl::MutexLock lock(&mu_);
  std::vector<GroupSummary> out;
  absl::Time now = absl::Now();
  for (const auto& [key, g] : groups_) {
    if (!all && key.first != uid) continue;
    GroupSummary info;
    info.name = g->name;
    info.uid = g->uid;
    info.world_size = g->world_size;
    info.joined = static_cast<uint32_t>(g->members.size());
    info.state = StateOf(*g);
    info.epoch = g->epoch;
    info.age = now - g->created;
    info.members.reserve(g->members.size());
    for (const auto& [r, m] : g->members) {
      info.members.push_back(GroupMemberSummary{r, m.state, m.cred.pid, m.session, m.gpu_index,
                                                m.handle.kind(), m.handle.size()});
    }
    out.push_back(std::move(info));
  }
  return out;
}

size_t GroupBroker::CountVisible(uint32_t uid, bool all) const {
  absl::MutexLock lock(&mu_);
  if (all) return groups_.size();
  return static_cast<size_t>(std::count_if(
      groups_.begin(), groups_.end(), [uid](const auto& kv) { return kv.first.first == uid; }));
}

std::vector<std::string> GroupBroker::MembershipsOf(uint64_t session_id) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [key, g] : groups_) {
    for (const auto& [r, m] : g->members) {
      if (m.session == session_id && m.state != MemberState::kLeft &&
          m.state != MemberState::kLost) {
        out.push_back(absl::StrCat(g->name, "/", r));
      }
    }
  }
  return out;
}

}  // namespace mooncake::daemon
