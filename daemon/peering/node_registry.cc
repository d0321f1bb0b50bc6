#include "peering/node_registry.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"
#include "mooncake/common/status.h"

namespace mooncake::daemon::peering {

namespace {

std::string ToJson(const v1::NodeRecord& r) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(r, &out, o);
  return out;
}

// A record another version wrote may carry fields this one does not know.
absl::StatusOr<v1::NodeRecord> FromJson(const std::string& json) {
  v1::NodeRecord r;
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(json, &r, o).ok()) {
    return absl::InvalidArgumentError("a node record that is not NodeRecord JSON");
  }
  return r;
}

std::string NodeIdOfKey(const std::string& nodes_prefix, const std::string& key) {
  return absl::StartsWith(key, nodes_prefix) ? key.substr(nodes_prefix.size()) : std::string();
}

}  // namespace

std::string NodesPrefix(const std::string& prefix) { return absl::StrCat(prefix, "/nodes/"); }

std::string NodeKey(const std::string& prefix, const std::string& node_id) {
  return absl::StrCat(NodesPrefix(prefix), node_id);
}

absl::Status ValidateNodeId(const std::string& node_id) {
  const bool ok = !node_id.empty() && node_id.size() <= 64 &&
                  std::all_of(node_id.begin(), node_id.end(), [](char c) {
                    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
                           c == '_' || c == '-';
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "node id '", EscapeForDisplay(node_id, 80),
      "' cannot name a node in etcd: use 1 to 64 letters, digits, '.', '_' or '-' (node_id)"));
}

NodeRegistry::NodeRegistry(etcd::EtcdClient* etcd, NodeRegistryOptions options, v1::NodeRecord self)
    : etcd_(etcd),
      options_(std::move(options)),
      self_(std::move(self)),
      key_(NodeKey(options_.prefix, self_.node_id())) {}

absl::StatusOr<std::unique_ptr<NodeRegistry>> NodeRegistry::Start(etcd::EtcdClient* etcd,
                                                                  NodeRegistryOptions options,
                                                                  v1::NodeRecord self) {
  MC_RETURN_IF_ERROR(ValidateNodeId(self.node_id()));
  if (options.prefix.empty() || options.prefix.front() != '/' || options.prefix.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd_prefix '", EscapeForDisplay(options.prefix, 80),
                     "' must start with '/' and not end with one (e.g. /mooncake)"));
  }
  if (options.lease_ttl < absl::Seconds(2)) {
    return absl::InvalidArgumentError("the etcd lease TTL must be at least 2 s");
  }
  std::unique_ptr<NodeRegistry> r(new NodeRegistry(etcd, std::move(options), std::move(self)));
  // Waiting out a previous instance's lease: one TTL and a margin.
  MC_RETURN_IF_ERROR(r->Register(r->options_.lease_ttl + absl::Seconds(1)));
  MC_RETURN_IF_ERROR(r->StartWatch());
  r->reregister_ = std::thread([raw = r.get()] { raw->Reregister(); });
  return r;
}

NodeRegistry::~NodeRegistry() { Stop(); }

absl::Status NodeRegistry::Register(absl::Duration wait_out) {
  const int64_t ttl_s = absl::ToInt64Seconds(options_.lease_ttl);
  MC_ASSIGN_OR_RETURN(etcd::Lease lease, etcd_->GrantLease(ttl_s));
  const std::string record = ToJson(self_);
  const absl::Time give_up = absl::Now() + wait_out;
  while (true) {
    etcd::Txn txn;
    txn.IfCreateRevision(key_, etcd::CompareOp::kEqual, 0)
        .ThenPut(key_, record, lease.id)
        .ElseGet(key_);
    absl::StatusOr<etcd::TxnResult> done = etcd_->Commit(txn);
    if (!done.ok()) {
      (void)etcd_->RevokeLease(lease.id);
      return done.status();
    }
    if (done->succeeded) break;
    // Someone holds the node id: who?
    std::string holder = "another daemon";
    if (!done->responses.empty() && !done->responses[0].kvs.empty()) {
      absl::StatusOr<v1::NodeRecord> other = FromJson(done->responses[0].kvs[0].value);
      if (other.ok() && other->instance_id() == self_.instance_id()) {
        // Our own key under the lease we lost (etcd had not expired it
        // yet): move it to the new lease.
        const int64_t old_lease = done->responses[0].kvs[0].lease;
        absl::StatusOr<int64_t> put = etcd_->Put(key_, record, lease.id);
        if (!put.ok()) {
          (void)etcd_->RevokeLease(lease.id);
          return put.status();
        }
        if (old_lease != 0 && old_lease != lease.id) (void)etcd_->RevokeLease(old_lease);
        break;
      }
      if (other.ok()) {
        holder = absl::StrCat("instance ", EscapeForDisplay(other->instance_id(), 64), " (host ",
                              EscapeForDisplay(other->hostname(), 64), ", peer ",
                              EscapeForDisplay(other->peer_address(), 80), ")");
      }
    }
    if (absl::Now() >= give_up) {
      (void)etcd_->RevokeLease(lease.id);
      return absl::AlreadyExistsError(
          absl::StrCat("node id '", self_.node_id(), "' is registered in etcd (", key_, ") by ",
                       holder, ", which is still alive: give every node its own node_id"));
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  KeepLease(lease);
  return absl::OkStatus();
}

void NodeRegistry::KeepLease(const etcd::Lease& lease) {
  auto keeper = std::make_unique<etcd::LeaseKeeper>(etcd_, lease, [this](const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    lease_lost_ = true;
    state_ = absl::StrCat("lease lost (", why.message(), "): registering again");
  });
  // The old keeper (a re-registration) stops before the new one is kept.
  keeper_ = std::move(keeper);
  absl::MutexLock lock(&mu_);
  lease_ = lease.id;
  lease_lost_ = false;
  state_ = "registered";
}

absl::Status NodeRegistry::StartWatch() {
  const std::string prefix = NodesPrefix(options_.prefix);
  MC_ASSIGN_OR_RETURN(etcd::RangeResult now, etcd_->GetPrefix(prefix));
  {
    absl::MutexLock lock(&mu_);
    for (const etcd::KeyValue& kv : now.kvs) {
      absl::StatusOr<v1::NodeRecord> r = FromJson(kv.value);
      const std::string id = NodeIdOfKey(prefix, kv.key);
      if (r.ok() && r->node_id() == id) nodes_[id] = *std::move(r);
    }
  }
  MC_ASSIGN_OR_RETURN(
      watcher_, etcd::Watcher::Start(
                    etcd_, prefix, now.revision + 1,
                    [this](const std::vector<etcd::WatchEvent>& events) { ApplyEvents(events); },
                    [this](const absl::Status& error) {
                      // Compaction past our revision, typically: the view may have
                      // missed changes; say so (the watcher resumes by itself).
                      MC_LOG(kWarning, "etcd: watching the nodes: ", error.message());
                    }));
  return absl::OkStatus();
}

void NodeRegistry::ApplyEvents(const std::vector<etcd::WatchEvent>& events) {
  const std::string prefix = NodesPrefix(options_.prefix);
  const std::string mine = ToJson(self_);
  std::vector<NodeEvent> out;
  std::function<void(const NodeEvent&)> callback;
  // This node's record written or deleted by someone else (etcd is input,
  // not authority: issue 23 item 2): what happened, and the lease to put it
  // back under (0: none alive, the lease keeper's re-registration will).
  std::string tampered;
  int64_t restore_under = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const etcd::WatchEvent& e : events) {
      const std::string id = NodeIdOfKey(prefix, e.kv.key);
      if (id.empty()) continue;
      if (id == self_.node_id() && !stopping_ && !lease_lost_ && lease_ != 0) {
        const bool ours =
            e.type == etcd::WatchEvent::Type::kPut && e.kv.value == mine && e.kv.lease == lease_;
        if (!ours) {
          tampered = e.type == etcd::WatchEvent::Type::kPut ? "rewritten" : "deleted";
          restore_under = lease_;
          nodes_.insert_or_assign(id, self_);
          continue;
        }
      }
      if (e.type == etcd::WatchEvent::Type::kPut) {
        absl::StatusOr<v1::NodeRecord> r = FromJson(e.kv.value);
        if (!r.ok() || r->node_id() != id) {
          malformed_log_.Log(LogLevel::kWarning,
                             absl::StrCat("etcd: ignoring a malformed node record at ",
                                          EscapeForDisplay(e.kv.key, 160)));
          continue;
        }
        auto [it, added] = nodes_.insert_or_assign(id, *r);
        (void)it;
        if (added && id != self_.node_id()) {
          out.push_back(NodeEvent{NodeEvent::Kind::kJoined, id, r->instance_id()});
        }
      } else {
        auto it = nodes_.find(id);
        if (it == nodes_.end()) continue;
        if (id != self_.node_id()) {
          out.push_back(NodeEvent{NodeEvent::Kind::kLost, id, it->second.instance_id()});
        }
        nodes_.erase(it);
      }
    }
    callback = on_event_;
  }
  if (!tampered.empty()) {
    tamper_log_.Log(LogLevel::kWarning,
                    absl::StrCat("etcd: this node's record ", key_, " was ", tampered,
                                 " by another writer of the prefix; restoring it (limit who "
                                 "may write ",
                                 options_.prefix, "/: docs/cluster.md, RBAC)"));
    absl::StatusOr<int64_t> put = etcd_->Put(key_, mine, restore_under);
    if (!put.ok()) {
      // The lease may be gone (revoked or expired): the lease keeper notices
      // and registers again.
      tamper_log_.Log(LogLevel::kWarning,
                      absl::StrCat("etcd: restoring ", key_, " failed: ", put.status().message()));
    }
  }
  for (const NodeEvent& e : out) {
    MC_LOG(kInfo, "cluster: node ", e.node_id,
           e.kind == NodeEvent::Kind::kJoined ? " joined" : " lost", " (instance ", e.instance_id,
           ")");
    if (callback) callback(e);
  }
}

void NodeRegistry::Reregister() {
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || lease_lost_; };
      mu_.Await(absl::Condition(&wake));
      if (stopping_) return;
    }
    if (backoff == absl::Milliseconds(100)) {
      MC_LOG(kWarning, "etcd: this node's lease was lost; registering ", self_.node_id(), " again");
    }
    // etcd restarted or was out of reach for a while: a restarted etcd
    // keeps its leases (and renews them), so the old one may still hold
    // this node's keys. Keeping it spares every other node a LOST for ranks
    // that never went away. A new lease only once etcd said the old one is
    // gone: registering while the answer is unknown would revoke it.
    absl::StatusOr<bool> resumed = ResumeLease();
    if (resumed.ok() && *resumed) {
      MC_LOG(kInfo, "etcd: reached etcd again; node ", self_.node_id(),
             " kept its lease (its keys never expired)");
      backoff = absl::Milliseconds(100);
      continue;
    }
    absl::Status s = resumed.ok() ? absl::OkStatus() : resumed.status();
    if (s.ok()) s = Register(absl::ZeroDuration());
    if (s.ok()) {
      MC_LOG(kInfo, "etcd: node ", self_.node_id(), " registered again");
      backoff = absl::Milliseconds(100);
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      state_ = absl::StrCat("etcd unreachable or refusing (", s.message(), "): registering again");
      // Sleep, waking early on Stop.
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), backoff)) return;
    }
    // At most a quarter of the TTL: a restarted etcd keeps the old lease for
    // about one TTL (plus an election), and ResumeLease must ask within it.
    backoff = std::min({backoff * 2, absl::Seconds(2), options_.lease_ttl / 4});
  }
}

void NodeRegistry::Stop() {
  int64_t lease = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    lease = lease_;
  }
  if (reregister_.joinable()) reregister_.join();
  if (watcher_) watcher_->Cancel();
  if (keeper_) keeper_->Stop();
  // The node leaves now rather than after the TTL.
  if (lease != 0) {
    if (absl::Status s = etcd_->RevokeLease(lease); !s.ok() && !absl::IsNotFound(s)) {
      MC_LOG(kWarning, "etcd: revoking this node's lease: ", s.message(),
             " (its key goes when the lease expires)");
    }
  }
}

std::vector<v1::NodeRecord> NodeRegistry::Nodes() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::NodeRecord> out;
  out.reserve(nodes_.size());
  for (const auto& [id, r] : nodes_) out.push_back(r);
  return out;
}

std::optional<v1::NodeRecord> NodeRegistry::Node(const std::string& node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return std::nullopt;
  return it->second;
}

std::string NodeRegistry::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

int64_t NodeRegistry::lease_id() const {
  absl::MutexLock lock(&mu_);
  // A lease the keeper gave up on may have expired in etcd: nothing may be
  // written under it until it is known alive again (ResumeLease) or replaced.
  return lease_lost_ ? 0 : lease_;
}

absl::StatusOr<bool> NodeRegistry::ResumeLease() {
  int64_t old = 0;
  {
    absl::MutexLock lock(&mu_);
    old = lease_;
  }
  if (old == 0) return false;
  const absl::Time asked = absl::Now();
  absl::StatusOr<etcd::LeaseInfo> alive = etcd_->LeaseTimeToLive(old);
  if (absl::IsNotFound(alive.status())) return false;  // expired: its keys are gone
  MC_ASSIGN_OR_RETURN(etcd::LeaseInfo info, std::move(alive));
  if (info.ttl_seconds <= 0) return false;
  // The node's key is attached to the lease while it lives; check anyway
  // (another instance could have taken the node id after a revoke).
  MC_ASSIGN_OR_RETURN(std::optional<etcd::KeyValue> mine, etcd_->Get(key_));
  if (!mine.has_value() || mine->lease != old) return false;
  etcd::Lease lease;
  lease.id = old;
  // The keeper paces its refreshes by the granted TTL; known alive until
  // granted_at + TTL = the time asked + what was left.
  lease.ttl_seconds = std::max<int64_t>(info.granted_ttl_seconds, info.ttl_seconds);
  lease.granted_at = asked - absl::Seconds(lease.ttl_seconds - info.ttl_seconds);
  KeepLease(lease);
  return true;
}

void NodeRegistry::OnNodeEvent(std::function<void(const NodeEvent&)> callback) {
  absl::MutexLock lock(&mu_);
  on_event_ = std::move(callback);
}

}  // namespace mooncake::daemon::peering
