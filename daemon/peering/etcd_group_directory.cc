#include "peering/etcd_group_directory.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"
#include "peering/node_registry.h"

namespace mooncake::daemon::peering {
namespace {

// Claims of one group per Txn (etcd refuses more than 128 operations in
// one branch by default; a claim is one compare and one put).
constexpr size_t kClaimsPerTxn = 100;
// What one record may hold (a 65536-rank group's QPN table is ~1 MiB as
// JSON; larger groups of RDMA members do not fit one etcd value anyway).
constexpr size_t kMaxRecordBytes = 1536 * 1024;

bool ValidGroupName(absl::string_view name) {
  return !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
           c == ':';
  });
}

// A uid or rank as this daemon writes it: decimal digits, no sign, no
// leading zero, no space. SimpleAtoi alone also takes "+7", " 7" and "007",
// and two spellings of one rank would alias one cache entry (deleting the
// bogus one would report the real member gone).
bool ParseCanonicalNumber(absl::string_view text, uint32_t* out) {
  if (text.empty() || text.size() > 10 || (text.size() > 1 && text.front() == '0')) return false;
  if (!std::all_of(text.begin(), text.end(),
                   [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); })) {
    return false;
  }
  return absl::SimpleAtoi(text, out);
}

// Whether `s` means "etcd could not be reached or answer": worth retrying.
bool Unreachable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) ||
         absl::IsNotFound(s);  // NotFound: the lease is gone (re-registering)
}

MemberState StateOf(v1::GroupRankRecord::State s) {
  switch (s) {
    case v1::GroupRankRecord::LEFT: return MemberState::kLeft;
    case v1::GroupRankRecord::LOST: return MemberState::kLost;
    case v1::GroupRankRecord::READY: return MemberState::kReady;
    case v1::GroupRankRecord::FAILED: return MemberState::kFailed;
    default: return MemberState::kJoined;  // JOINED, JOINING
  }
}

absl::StatusOr<ClusterMember> ParseRecord(const std::string& json, uint32_t rank) {
  if (json.size() > kMaxRecordBytes) return absl::InvalidArgumentError("record too large");
  v1::GroupRankRecord r;
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;  // written by a newer daemon
  if (!google::protobuf::util::JsonStringToMessage(json, &r, o).ok()) {
    return absl::InvalidArgumentError("not GroupRankRecord JSON");
  }
  if (r.world_size() == 0 || r.world_size() > 65536 || rank >= r.world_size()) {
    return absl::InvalidArgumentError("rank or world size out of range");
  }
  if (!ValidateNodeId(r.node_id()).ok() || r.instance_id().size() > 64 ||
      r.handle_kind().size() > 64 || r.gpu_uuid().size() > 128 || r.gpu_pci_bus_id().size() > 64) {
    return absl::InvalidArgumentError("a field is too long or the node id is invalid");
  }
  // Members see these in their views: -1 is the host platform, no GPU index
  // or pid is negative otherwise.
  if (r.gpu_index() < -1 || r.pid() < 0) {
    return absl::InvalidArgumentError("a negative GPU index or pid");
  }
  ClusterMember m;
  // r.rdma (what records carried before issue 23 item 2) is ignored: an
  // endpoint is believed only from its node, over the peer channel.
  m.rdma_generation = r.rdma_generation();
  if (static_cast<uint64_t>(r.released_size()) > r.world_size()) {
    return absl::InvalidArgumentError("more released ranks than the world size");
  }
  // Epochs count re-formations: far below 2^53, so one more never wraps.
  constexpr uint64_t kMaxEpoch = uint64_t{1} << 53;
  if (r.epoch() > kMaxEpoch) return absl::InvalidArgumentError("an epoch out of range");
  for (const v1::GroupRankRecord::Released& rel : r.released()) {
    if (rel.rank() >= r.world_size() || rel.rank() == rank || rel.epoch() > kMaxEpoch) {
      return absl::InvalidArgumentError("a released rank or its epoch out of range");
    }
    m.released.emplace_back(rel.rank(), rel.epoch());
  }
  std::sort(m.released.begin(), m.released.end());
  if (std::adjacent_find(m.released.begin(), m.released.end(), [](const auto& a, const auto& b) {
        return a.first == b.first;
      }) != m.released.end()) {
    return absl::InvalidArgumentError("a rank released twice");
  }
  if (r.proof().size() > 128) return absl::InvalidArgumentError("a group proof over 128 bytes");
  m.proof = r.proof();
  m.epoch = r.epoch();
  m.joining = r.state() == v1::GroupRankRecord::JOINING;
  m.rank = rank;
  m.world_size = r.world_size();
  m.node_id = r.node_id();
  m.pid = r.pid();
  m.gpu_index = r.gpu_index();
  m.gpu_uuid = r.gpu_uuid();
  m.gpu_pci = r.gpu_pci_bus_id();
  m.handle_kind = r.handle_kind();
  m.handle_size = r.handle_size();
  m.state = StateOf(r.state());
  return m;
}

v1::GroupRankRecord::State RecordState(MemberState s) {
  switch (s) {
    case MemberState::kLeft: return v1::GroupRankRecord::LEFT;
    case MemberState::kLost: return v1::GroupRankRecord::LOST;
    case MemberState::kReady: return v1::GroupRankRecord::READY;
    case MemberState::kFailed: return v1::GroupRankRecord::FAILED;
    default: return v1::GroupRankRecord::JOINED;
  }
}

// Whether `b` tells the broker nothing new about `a`. A release changes
// only `released`, the epoch and the RDMA endpoint (fresh queue pairs).
bool SameRecord(const ClusterMember& a, const ClusterMember& b) {
  return a.node_id == b.node_id && a.pid == b.pid && a.state == b.state &&
         a.world_size == b.world_size && a.epoch == b.epoch && a.joining == b.joining &&
         a.released == b.released && a.proof == b.proof && a.rdma_generation == b.rdma_generation;
}

}  // namespace

absl::StatusOr<ClusterMember> ParseGroupRankRecord(const std::string& json, uint32_t rank) {
  return ParseRecord(json, rank);
}

std::string GroupsPrefix(const std::string& prefix) { return absl::StrCat(prefix, "/groups/"); }

namespace {

std::string Scope(uint32_t uid, const std::string& tenant) {
  return tenant.empty() ? absl::StrCat(uid) : absl::StrCat(uid, "@", tenant);
}

// "<uid>" or "<uid>@<tenant>" (a tenant name as daemon_config allows it).
bool ParseScope(absl::string_view scope, uint32_t* uid, std::string* tenant) {
  const size_t at = scope.find('@');
  if (!ParseCanonicalNumber(scope.substr(0, at), uid)) return false;
  if (at == absl::string_view::npos) {
    tenant->clear();
    return true;
  }
  const absl::string_view t = scope.substr(at + 1);
  if (t.empty() || t.size() > 63 || !absl::ascii_isalnum(static_cast<unsigned char>(t.front())) ||
      !std::all_of(t.begin(), t.end(), [](char ch) {
        return absl::ascii_isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' ||
               ch == '.';
      })) {
    return false;
  }
  *tenant = std::string(t);
  return true;
}

}  // namespace

std::string GroupMetaKey(const std::string& prefix, uint32_t uid, const std::string& tenant,
                         const std::string& group) {
  return absl::StrCat(GroupsPrefix(prefix), Scope(uid, tenant), "/", group, "/meta");
}

std::string GroupRankKey(const std::string& prefix, uint32_t uid, const std::string& tenant,
                         const std::string& group, uint32_t rank) {
  return absl::StrCat(GroupsPrefix(prefix), Scope(uid, tenant), "/", group, "/ranks/", rank);
}

EtcdGroupDirectory::EtcdGroupDirectory(etcd::EtcdClient* etcd, GroupDirectoryOptions options)
    : etcd_(etcd),
      options_(std::move(options)),
      next_generation_(static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))) {
  if (options_.fetch_endpoints) {
    fetcher_ = std::make_unique<EndpointFetcher>(
        options_.fetch_endpoints,
        [this](const EndpointFetcher::GroupKey& group, const std::string& node,
               const std::vector<uint32_t>& asked,
               absl::StatusOr<std::vector<FetchedEndpoint>> answer) {
          EndpointsFetched(group, node, asked, std::move(answer));
        });
  }
}

absl::StatusOr<std::unique_ptr<EtcdGroupDirectory>> EtcdGroupDirectory::Start(
    etcd::EtcdClient* etcd, GroupDirectoryOptions options) {
  std::unique_ptr<EtcdGroupDirectory> d(new EtcdGroupDirectory(etcd, std::move(options)));
  if (absl::Status s = d->Resync(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("reading the cluster's groups: ", s.message()));
  }
  d->worker_ = std::thread([p = d.get()] { p->Work(); });
  return d;
}

EtcdGroupDirectory::~EtcdGroupDirectory() { Stop(); }

void EtcdGroupDirectory::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (worker_.joinable()) worker_.join();
  if (watcher_) watcher_->Cancel();
  fetcher_.reset();  // its answers come to this object: gone first
}

// ---- the broker's calls (queue only) ----------------------------------------------

void EtcdGroupDirectory::Claim(uint32_t uid, const std::string& tenant, const std::string& group,
                               const ClusterMember& me, ClaimDone done) {
  QueueClaim(Key{uid, tenant, group}, me, /*vacant=*/false, std::move(done));
}

void EtcdGroupDirectory::ClaimVacant(uint32_t uid, const std::string& tenant,
                                     const std::string& group, const ClusterMember& me,
                                     ClaimDone done) {
  ClusterMember joining = me;
  joining.joining = true;
  joining.state = MemberState::kJoined;
  joining.released.clear();
  QueueClaim(Key{uid, tenant, group}, joining, /*vacant=*/true, std::move(done));
}

void EtcdGroupDirectory::QueueClaim(Key group, const ClusterMember& me, bool vacant,
                                    ClaimDone done) {
  Op op;
  op.kind = Op::Kind::kClaim;
  op.vacant = vacant;
  op.group = std::move(group);
  op.rank = me.rank;
  op.me = me;
  op.me.node_id = options_.node_id;
  op.me.rdma_generation = op.me.rdma ? NextGeneration() : 0;
  op.done = std::move(done);
  absl::MutexLock lock(&mu_);
  op.seq = next_claim_seq_++;
  queue_.push_back(std::move(op));
}

void EtcdGroupDirectory::Release(uint32_t uid, const std::string& tenant, const std::string& group,
                                 uint32_t rank, uint32_t released_rank, uint64_t epoch,
                                 std::shared_ptr<const v1::RdmaEndpoint> rdma) {
  Op op;
  op.kind = Op::Kind::kRelease;
  op.group = Key{uid, tenant, group};
  op.rank = rank;
  op.released_rank = released_rank;
  op.epoch = epoch;
  op.rdma = std::move(rdma);
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(op));
}

void EtcdGroupDirectory::MarkState(uint32_t uid, const std::string& tenant,
                                   const std::string& group, uint32_t rank, MemberState state,
                                   uint64_t epoch) {
  Op op;
  op.kind = Op::Kind::kMarkState;
  op.group = Key{uid, tenant, group};
  op.rank = rank;
  op.state = state;
  op.epoch = epoch;
  absl::MutexLock lock(&mu_);
  // Only the newest state counts: an older one still queued (postponed
  // while etcd was away) must not be written after it.
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [&](const Op& q) {
                                return q.kind == Op::Kind::kMarkState && q.group == op.group &&
                                       q.rank == rank;
                              }),
               queue_.end());
  queue_.push_back(std::move(op));
}

void EtcdGroupDirectory::Withdraw(uint32_t uid, const std::string& tenant, const std::string& group,
                                  uint32_t rank) {
  Op op;
  op.kind = Op::Kind::kWithdraw;
  op.group = Key{uid, tenant, group};
  op.rank = rank;
  absl::MutexLock lock(&mu_);
  // A claim still queued is dropped: nobody waits for it any more. One the
  // worker is running now must not come back either if it is postponed
  // (etcd unreachable): it would be written after this withdrawal ran and
  // hold the rank under the node's lease with nobody behind it.
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [&](const Op& q) {
                                return q.kind == Op::Kind::kClaim && q.group == op.group &&
                                       q.rank == rank;
                              }),
               queue_.end());
  withdrawn_[{op.group, rank}] = next_claim_seq_;
  queue_.push_back(std::move(op));
}

std::vector<ClusterMember> EtcdGroupDirectory::RemoteMembers(uint32_t uid,
                                                             const std::string& tenant,
                                                             const std::string& group) const {
  std::vector<ClusterMember> out;
  absl::MutexLock lock(&mu_);
  auto it = cache_.find(Key{uid, tenant, group});
  if (it == cache_.end()) return out;
  for (const auto& [rank, entry] : it->second.ranks) {
    if (!entry.second) out.push_back(entry.first);
  }
  return out;
}

std::string EtcdGroupDirectory::Trouble() const {
  absl::MutexLock lock(&mu_);
  return trouble_;
}

size_t EtcdGroupDirectory::cached_groups() const {
  absl::MutexLock lock(&mu_);
  return cache_.size();
}

size_t EtcdGroupDirectory::own_ranks() const {
  absl::MutexLock lock(&mu_);
  return own_.size();
}

// ---- reading: the cache and the watch ----------------------------------------------

std::optional<EtcdGroupDirectory::Delivery> EtcdGroupDirectory::ApplyLocked(
    const std::string& key, const std::string* value) {
  const std::string prefix = GroupsPrefix(options_.prefix);
  if (!absl::StartsWith(key, prefix)) return std::nullopt;
  // <scope>/<group>/meta or <scope>/<group>/ranks/<rank>
  const absl::string_view rest = absl::string_view(key).substr(prefix.size());
  std::vector<absl::string_view> parts = absl::StrSplit(rest, '/');
  uint32_t uid = 0, rank = 0;
  std::string tenant;
  if (parts.size() != 4 || parts[2] != "ranks" || !ParseScope(parts[0], &uid, &tenant) ||
      !ValidGroupName(parts[1]) || !ParseCanonicalNumber(parts[3], &rank)) {
    return std::nullopt;  // meta, or a key this version does not write
  }
  const Key group{uid, std::move(tenant), std::string(parts[1])};
  if (value == nullptr) {
    auto g = cache_.find(group);
    if (g == cache_.end()) return std::nullopt;
    auto r = g->second.ranks.find(rank);
    if (r == g->second.ranks.end()) return std::nullopt;
    const bool mine = r->second.second;
    g->second.ranks.erase(r);
    if (g->second.ranks.empty()) cache_.erase(g);
    if (mine) return std::nullopt;
    return Delivery{group, rank, std::nullopt};
  }
  absl::StatusOr<ClusterMember> m = ParseRecord(*value, rank);
  if (!m.ok()) {
    if (warned_keys_.size() < 1024 && warned_keys_.insert(key).second) {
      MC_LOG(kWarning, "etcd: ignoring group record ", EscapeForDisplay(key, 200), ": ",
             m.status().message());
    }
    return std::nullopt;
  }
  const bool mine = m->node_id == options_.node_id;
  Cached& g = cache_[group];
  auto r = g.ranks.find(rank);
  if (r != g.ranks.end() && SameRecord(r->second.first, *m)) return std::nullopt;
  if (!mine && m->rdma_generation != 0) {
    ResolveEndpointLocked(group, r == g.ranks.end() ? nullptr : &r->second.first, *m);
  }
  g.ranks.insert_or_assign(rank, std::make_pair(*m, mine));
  if (mine) return std::nullopt;
  return Delivery{group, rank, *std::move(m)};
}

bool EtcdGroupDirectory::HasOwnRankLocked(const Key& group) const {
  auto next = own_.lower_bound({group, 0});
  return next != own_.end() && next->first.first == group;
}

void EtcdGroupDirectory::ResolveEndpointLocked(const Key& group, const ClusterMember* before,
                                               ClusterMember& m) {
  const bool same_endpoint = before != nullptr && before->node_id == m.node_id &&
                             before->rdma_generation == m.rdma_generation;
  if (same_endpoint && before->rdma) {
    m.rdma = before->rdma;  // a record that changed only its state or releases
    return;
  }
  if (!fetcher_) {
    // No authenticated channel to fetch it over: the member comes without
    // it (no RDMA route), and the operator learns why once per group.
    if (warned_no_channel_.size() < 1024 && warned_no_channel_.insert(group).second) {
      MC_LOG(kWarning, "group '", std::get<2>(group), "' (uid ", std::get<0>(group), "): rank ",
             m.rank, " on node ", m.node_id,
             " has an RDMA endpoint, but endpoints travel only over the authenticated peer "
             "channel; its members' views show no RDMA route to other nodes (set "
             "peer_tls_ca_file, peer_tls_cert_file and peer_tls_key_file)");
    }
    return;
  }
  m.endpoint_pending = true;
  if (same_endpoint && before->endpoint_pending) {
    m.endpoint_failures = before->endpoint_failures;
    return;  // asked for already
  }
  // Only a node with a rank of the group needs it, and only such a node is
  // answered: the others keep the record pending until they claim a rank
  // (then every pending endpoint of the group is asked for).
  if (HasOwnRankLocked(group)) fetcher_->Want(group, m.node_id, m.world_size, m.rank, absl::Now());
}

void EtcdGroupDirectory::WantPendingLocked(const Key& group) {
  if (!fetcher_) return;
  auto g = cache_.find(group);
  if (g == cache_.end()) return;
  for (const auto& [rank, entry] : g->second.ranks) {
    const ClusterMember& m = entry.first;
    if (m.endpoint_pending) fetcher_->Want(group, m.node_id, m.world_size, rank, absl::Now());
  }
}

void EtcdGroupDirectory::EndpointsFetched(const Key& group, const std::string& node,
                                          const std::vector<uint32_t>& asked,
                                          absl::StatusOr<std::vector<FetchedEndpoint>> answer) {
  std::vector<Delivery> out;
  std::string failure;
  {
    absl::MutexLock lock(&mu_);
    auto g = cache_.find(group);
    if (g == cache_.end()) return;  // every record of the group went meanwhile
    auto& ranks = g->second.ranks;
    if (answer.ok()) {
      for (FetchedEndpoint& f : *answer) {
        auto r = ranks.find(f.rank);
        if (r == ranks.end()) continue;
        ClusterMember& m = r->second.first;
        if (!m.endpoint_pending || m.node_id != node || m.rdma_generation != f.generation) {
          continue;  // the record moved on: what it announces now is asked for
        }
        m.rdma = std::move(f.rdma);
        m.endpoint_pending = false;
        m.endpoint_failures = 0;
        out.push_back(Delivery{group, f.rank, m});
      }
    }
    // What still waits is asked for again, backing off to 2 s, while the
    // record stands, names this node and a rank of the group is held here.
    const bool wanted = HasOwnRankLocked(group);
    for (uint32_t rank : asked) {
      auto r = ranks.find(rank);
      if (r == ranks.end() || !r->second.first.endpoint_pending ||
          r->second.first.node_id != node || !wanted) {
        continue;
      }
      ClusterMember& m = r->second.first;
      ++m.endpoint_failures;
      const absl::Duration delay =
          std::min(absl::Milliseconds(25) * (int64_t{1} << std::min(m.endpoint_failures, 7)),
                   absl::Seconds(2));
      fetcher_->Want(group, node, m.world_size, rank, absl::Now() + delay);
      // A race with the other node's view is normal (its watch has not
      // shown this node's claim yet): said only when it persists.
      if (m.endpoint_failures >= 5 && failure.empty()) {
        failure = absl::StrCat("group '", std::get<2>(group), "' (uid ", std::get<0>(group),
                               "): the RDMA endpoint of rank ", rank, " on node ", node,
                               " could not be fetched ", m.endpoint_failures, " times (",
                               answer.ok() ? std::string("not held there yet")
                                           : std::string(answer.status().message()),
                               "); still trying while its record stands");
      }
    }
  }
  if (!failure.empty()) fetch_failures_.Log(LogLevel::kWarning, failure);
  Deliver(std::move(out));
}

std::vector<FetchedEndpoint> EtcdGroupDirectory::OwnEndpoints(
    uint32_t uid, const std::string& tenant, const std::string& group,
    const std::vector<uint32_t>& ranks) const {
  std::vector<FetchedEndpoint> out;
  size_t bytes = 0;
  const Key key{uid, tenant, group};
  absl::MutexLock lock(&mu_);
  for (uint32_t rank : ranks) {
    auto it = own_.find({key, rank});
    if (it == own_.end() || !it->second.rdma) continue;
    bytes += it->second.rdma->ByteSizeLong() + 16;
    if (bytes > kMaxEndpointBytesPerAnswer) break;
    out.push_back(FetchedEndpoint{rank, it->second.rdma_generation, it->second.rdma});
  }
  return out;
}

void EtcdGroupDirectory::Deliver(std::vector<Delivery> deliveries) {
  if (!options_.sink) return;
  for (Delivery& d : deliveries) {
    options_.sink(std::get<0>(d.group), std::get<1>(d.group), std::get<2>(d.group), d.rank,
                  std::move(d.member));
  }
}

void EtcdGroupDirectory::ApplyEvents(const std::vector<etcd::WatchEvent>& events) {
  std::vector<Delivery> out;
  {
    absl::MutexLock lock(&mu_);
    for (const etcd::WatchEvent& e : events) {
      std::optional<Delivery> d =
          ApplyLocked(e.kv.key, e.type == etcd::WatchEvent::Type::kPut ? &e.kv.value : nullptr);
      if (d) out.push_back(*std::move(d));
    }
  }
  Deliver(std::move(out));
}

absl::Status EtcdGroupDirectory::Resync() {
  if (watcher_) watcher_->Cancel();
  watcher_.reset();
  const std::string prefix = GroupsPrefix(options_.prefix);
  absl::StatusOr<etcd::RangeResult> now = etcd_->GetPrefix(prefix);
  if (!now.ok()) return now.status();
  std::vector<Delivery> out;
  {
    absl::MutexLock lock(&mu_);
    std::set<std::string> present;
    for (const etcd::KeyValue& kv : now->kvs) present.insert(kv.key);
    // Ranks that vanished while no watch ran.
    std::vector<std::string> gone;
    for (const auto& [group, cached] : cache_) {
      for (const auto& [rank, entry] : cached.ranks) {
        std::string key = GroupRankKey(options_.prefix, std::get<0>(group), std::get<1>(group),
                                       std::get<2>(group), rank);
        if (present.count(key) == 0) gone.push_back(std::move(key));
      }
    }
    for (const std::string& key : gone) {
      if (std::optional<Delivery> d = ApplyLocked(key, nullptr)) out.push_back(*std::move(d));
    }
    for (const etcd::KeyValue& kv : now->kvs) {
      if (std::optional<Delivery> d = ApplyLocked(kv.key, &kv.value)) out.push_back(*std::move(d));
    }
  }
  Deliver(std::move(out));
  absl::StatusOr<std::unique_ptr<etcd::Watcher>> w = etcd::Watcher::Start(
      etcd_, prefix, now->revision + 1,
      [this](const std::vector<etcd::WatchEvent>& events) { ApplyEvents(events); },
      [this](const absl::Status& error) {
        MC_LOG(kWarning, "etcd: the watch on the cluster's groups stopped (", error.message(),
               "); reading them again");
        absl::MutexLock lock(&mu_);
        resync_ = true;
      });
  if (!w.ok()) return w.status();
  watcher_ = *std::move(w);
  return absl::OkStatus();
}

// ---- writing: the worker -------------------------------------------------------------

void EtcdGroupDirectory::NoteTrouble(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (status.ok()) {
    trouble_.clear();
    backoff_ = absl::Milliseconds(50);
    return;
  }
  trouble_ = absl::StrCat("the cluster directory (etcd) is unreachable: ", status.message());
}

std::string EtcdGroupDirectory::RecordJson(const ClusterMember& m,
                                           v1::GroupRankRecord::State state) const {
  v1::GroupRankRecord r;
  r.set_node_id(options_.node_id);
  r.set_instance_id(options_.instance_id);
  r.set_pid(m.pid);
  r.set_world_size(m.world_size);
  r.set_gpu_index(m.gpu_index);
  r.set_gpu_uuid(m.gpu_uuid);
  r.set_gpu_pci_bus_id(m.gpu_pci);
  r.set_handle_kind(m.handle_kind);
  r.set_handle_size(m.handle_size);
  r.set_rdma_generation(m.rdma ? m.rdma_generation : 0);  // the endpoint itself: never
  r.set_state(m.joining && state == v1::GroupRankRecord::JOINED ? v1::GroupRankRecord::JOINING
                                                                : state);
  r.set_epoch(m.epoch);
  r.set_proof(m.proof);
  for (const auto& [rank, epoch] : m.released) {
    v1::GroupRankRecord::Released* rel = r.add_released();
    rel->set_rank(rank);
    rel->set_epoch(epoch);
  }
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(r, &out, o);
  return out;
}

void EtcdGroupDirectory::Postpone(std::vector<Op> ops, const absl::Status& why) {
  NoteTrouble(why);
  std::vector<std::pair<ClaimDone, absl::Status>> tell;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time when = absl::Now() + backoff_;
    backoff_ = std::min(backoff_ * 2, options_.max_backoff);
    for (Op& op : ops) {
      if (op.kind == Op::Kind::kClaim) {
        auto w = withdrawn_.find({op.group, op.rank});
        if (w != withdrawn_.end() && op.seq < w->second) continue;  // withdrawn while it ran
      }
      if (op.kind == Op::Kind::kClaim && !op.told_unreachable) {
        op.told_unreachable = true;
        tell.emplace_back(op.done, why);
      }
      op.not_before = when;
      queue_.push_back(std::move(op));
    }
  }
  for (auto& [done, status] : tell) done(ClaimOutcome::kUnreachable, status);
}

void EtcdGroupDirectory::Work() {
  while (true) {
    std::vector<Op> ready;
    bool resync = false;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_ || resync_) return true;
        const absl::Time now = absl::Now();
        return std::any_of(queue_.begin(), queue_.end(),
                           [now](const Op& op) { return op.not_before <= now; });
      };
      absl::Time next = absl::InfiniteFuture();
      for (const Op& op : queue_) next = std::min(next, op.not_before);
      // Wakes for new work at once (the condition is re-checked whenever
      // mu_ is released); a postponed op wakes it at its time.
      mu_.AwaitWithDeadline(absl::Condition(&wake),
                            std::min(next, absl::Now() + absl::Milliseconds(200)));
      if (stopping_) return;
      resync = resync_;
      resync_ = false;
      const absl::Time now = absl::Now();
      std::deque<Op> later;
      for (Op& op : queue_) {
        if (op.not_before <= now) {
          ready.push_back(std::move(op));
        } else {
          later.push_back(std::move(op));
        }
      }
      queue_ = std::move(later);
    }
    // A new lease (the old one expired while etcd was out of reach): this
    // node's records went with the old one; write them again under it.
    if (const int64_t lease = options_.lease ? options_.lease() : 0;
        lease != 0 && lease != published_lease_) {
      if (published_lease_ == 0 || Republish(lease)) published_lease_ = lease;
    }
    if (resync) {
      if (absl::Status s = Resync(); !s.ok()) {
        NoteTrouble(s);
        absl::SleepFor(absl::Milliseconds(200));
        absl::MutexLock lock(&mu_);
        resync_ = true;
      }
    }
    // In order, except that the claims of one group gather into one batch,
    // run before any other operation on that group.
    std::map<Key, std::vector<Op>> claims;
    for (Op& op : ready) {
      if (op.kind == Op::Kind::kClaim) {
        claims[op.group].push_back(std::move(op));
        continue;
      }
      if (auto c = claims.find(op.group); c != claims.end()) {
        RunClaimBatch(c->first, std::move(c->second));
        claims.erase(c);
      }
      if (op.kind == Op::Kind::kMarkState) {
        RunMarkState(op);
      } else if (op.kind == Op::Kind::kRelease) {
        RunRelease(op);
      } else {
        RunWithdraw(op);
      }
    }
    for (auto& [group, batch] : claims) RunClaimBatch(group, std::move(batch));
  }
}

void EtcdGroupDirectory::RunClaimBatch(const Key& group, std::vector<Op> batch) {
  // A replacement's claim goes alone (it compares the record it takes over).
  std::vector<Op> vacant;
  for (auto it = batch.begin(); it != batch.end();) {
    if (it->vacant) {
      vacant.push_back(std::move(*it));
      it = batch.erase(it);
    } else {
      ++it;
    }
  }
  for (Op& op : vacant) RunClaimVacant(group, std::move(op));
  for (size_t i = 0; i < batch.size(); i += kClaimsPerTxn) {
    std::vector<Op> part(
        std::make_move_iterator(batch.begin() + i),
        std::make_move_iterator(batch.begin() + std::min(batch.size(), i + kClaimsPerTxn)));
    RunClaims(group, std::move(part));
  }
}

void EtcdGroupDirectory::HoldWithdrawn(const Key& group, std::vector<Op>* claims) {
  // A rank whose withdrawal is still to be done (etcd was away, or the
  // withdrawal is queued behind): its new claim waits, or the withdrawal
  // would delete the newcomer's record.
  std::vector<Op> wait;
  absl::MutexLock lock(&mu_);
  for (auto it = claims->begin(); it != claims->end();) {
    auto w = withdrawn_.find({group, it->rank});
    if (w == withdrawn_.end()) {
      ++it;
      continue;
    }
    // Older than the withdrawal (taken off the queue just before it):
    // nobody waits for it any more.
    if (it->seq >= w->second) wait.push_back(std::move(*it));
    it = claims->erase(it);
  }
  for (Op& op : wait) {
    op.not_before = absl::Now() + absl::Milliseconds(50);
    queue_.push_back(std::move(op));
  }
}

void EtcdGroupDirectory::RunClaims(const Key& group, std::vector<Op> claims) {
  HoldWithdrawn(group, &claims);
  if (claims.empty()) return;
  const int64_t lease = options_.lease ? options_.lease() : 0;
  if (lease == 0) {
    return Postpone(std::move(claims),
                    absl::UnavailableError("this node is not registered in etcd (registering "
                                           "again): cross-node joins wait"));
  }
  const auto& [uid, tenant, name] = group;
  const std::string meta = GroupMetaKey(options_.prefix, uid, tenant, name);
  const uint32_t world_size = claims.front().me.world_size;
  const std::string ws = absl::StrCat(world_size);
  std::vector<std::pair<ClaimDone, absl::Status>> failed;
  std::vector<ClaimDone> won;
  auto fail_all = [&](const absl::Status& s) {
    for (Op& c : claims) failed.emplace_back(std::move(c.done), s);
    claims.clear();
  };
  for (int attempt = 0; attempt < 4 && !claims.empty(); ++attempt) {
    // The world size: created by the first claim anywhere, then compared.
    etcd::Txn create_meta;
    create_meta.IfCreateRevision(meta, etcd::CompareOp::kEqual, 0)
        .ThenPut(meta, ws, lease)
        .ElseGet(meta);
    absl::StatusOr<etcd::TxnResult> r1 = etcd_->Commit(create_meta);
    if (!r1.ok()) {
      if (Unreachable(r1.status())) return Postpone(std::move(claims), r1.status());
      fail_all(r1.status());
      break;
    }
    if (!r1->succeeded) {
      const std::vector<etcd::KeyValue>& kvs = r1->responses.at(0).kvs;
      if (kvs.empty()) continue;  // deleted just now: create it again
      if (kvs[0].value != ws) {
        fail_all(absl::InvalidArgumentError(
            absl::StrCat("group '", name, "' has world size ", EscapeForDisplay(kvs[0].value, 16),
                         " in the cluster but this rank asked for ", world_size,
                         ": start every rank with the same world size")));
        break;
      }
    }
    // The ranks, all at once.
    etcd::Txn take;
    take.IfValue(meta, etcd::CompareOp::kEqual, ws);
    for (const Op& c : claims) {
      const std::string key = GroupRankKey(options_.prefix, uid, tenant, name, c.rank);
      take.IfCreateRevision(key, etcd::CompareOp::kEqual, 0)
          .ThenPut(key, RecordJson(c.me, v1::GroupRankRecord::JOINED), lease);
    }
    take.ElseGet(meta);
    for (const Op& c : claims) {
      take.ElseGet(GroupRankKey(options_.prefix, uid, tenant, name, c.rank));
    }
    absl::StatusOr<etcd::TxnResult> r2 = etcd_->Commit(take);
    if (!r2.ok()) {
      // A write whose answer was lost may have been applied: the next
      // attempt finds our own records and counts them as claimed.
      if (Unreachable(r2.status())) return Postpone(std::move(claims), r2.status());
      fail_all(r2.status());
      break;
    }
    std::vector<Op> again;
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < claims.size(); ++i) {
        Op& c = claims[i];
        bool mine = r2->succeeded;
        if (!r2->succeeded) {
          const std::vector<etcd::KeyValue>& kvs = r2->responses.at(i + 1).kvs;
          if (kvs.empty()) {
            again.push_back(std::move(c));
            continue;
          }
          absl::StatusOr<ClusterMember> holder = ParseRecord(kvs[0].value, c.rank);
          mine = holder.ok() && holder->node_id == options_.node_id && holder->pid == c.me.pid &&
                 kvs[0].lease == lease;
          if (!mine) {
            failed.emplace_back(std::move(c.done),
                                absl::AlreadyExistsError(absl::StrCat(
                                    "rank ", c.rank, " of group '", name, "' is already taken",
                                    holder.ok() ? absl::StrCat(" by pid ", holder->pid, " on node ",
                                                               holder->node_id)
                                                : std::string(" in the cluster"))));
            continue;
          }
        }
        own_[{group, c.rank}] = c.me;
        won.push_back(std::move(c.done));
      }
      // A rank of the group is held here now: other nodes' endpoints are
      // needed (and will be served).
      if (!won.empty()) WantPendingLocked(group);
    }
    claims = std::move(again);
  }
  if (!claims.empty()) {
    return Postpone(std::move(claims),
                    absl::AbortedError("the group's keys kept changing while claiming"));
  }
  NoteTrouble(absl::OkStatus());
  for (ClaimDone& done : won) done(ClaimOutcome::kClaimed, absl::OkStatus());
  for (auto& [done, status] : failed) done(ClaimOutcome::kFailed, status);
}

bool EtcdGroupDirectory::Republish(int64_t lease) {
  std::vector<std::pair<std::pair<Key, uint32_t>, ClusterMember>> mine;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& entry : own_) {
      // A rank on its way out is not written again (its withdrawal runs next).
      if (withdrawn_.count(entry.first) == 0) mine.push_back(entry);
    }
  }
  size_t written = 0;
  for (const auto& [where, me] : mine) {
    const auto& [group, rank] = where;
    const auto& [uid, tenant, name] = group;
    const std::string meta = GroupMetaKey(options_.prefix, uid, tenant, name);
    const std::string key = GroupRankKey(options_.prefix, uid, tenant, name, rank);
    // The world size first (it went with its creator's lease if that was
    // this node's), then the rank unless another node took it meanwhile.
    etcd::Txn m;
    m.IfCreateRevision(meta, etcd::CompareOp::kEqual, 0)
        .ThenPut(meta, absl::StrCat(me.world_size), lease);
    etcd::Txn t;
    t.IfCreateRevision(key, etcd::CompareOp::kEqual, 0)
        .ThenPut(key, RecordJson(me, RecordState(me.state)), lease)
        .ElseGet(key);
    absl::StatusOr<etcd::TxnResult> r1 = etcd_->Commit(m);
    absl::StatusOr<etcd::TxnResult> r2 =
        r1.ok() ? etcd_->Commit(t) : absl::StatusOr<etcd::TxnResult>(r1.status());
    if (!r2.ok()) {
      if (Unreachable(r2.status())) {
        NoteTrouble(r2.status());
        return false;  // tried again on the worker's next pass
      }
      MC_LOG(kWarning, "etcd: could not publish rank ", rank, " of group '", name,
             "' again: ", r2.status().message());
      continue;
    }
    if (r2->succeeded) {
      ++written;
      continue;
    }
    const std::vector<etcd::KeyValue>& kvs = r2->responses.at(0).kvs;
    absl::StatusOr<ClusterMember> holder =
        kvs.empty() ? absl::NotFoundError("gone") : ParseRecord(kvs[0].value, rank);
    if (holder.ok() && holder->node_id == options_.node_id && holder->pid == me.pid) {
      if (kvs[0].lease == lease) continue;  // ours already, under the new lease
      // Ours under the old lease, which etcd still has: move it to the new
      // one, or it goes when the old one expires.
      etcd::Txn move;
      move.IfModRevision(key, etcd::CompareOp::kEqual, kvs[0].mod_revision)
          .ThenPut(key, RecordJson(me, RecordState(me.state)), lease);
      absl::StatusOr<etcd::TxnResult> moved = etcd_->Commit(move);
      if (!moved.ok() && Unreachable(moved.status())) {
        NoteTrouble(moved.status());
        return false;
      }
      if (moved.ok() && moved->succeeded) ++written;
      continue;
    }
    MC_LOG(kWarning, "etcd: rank ", rank, " of group '", name,
           "' was taken in the cluster while this node was out of reach",
           holder.ok() ? absl::StrCat(" (by pid ", holder->pid, " on node ", holder->node_id, ")")
                       : std::string());
  }
  if (!mine.empty()) {
    MC_LOG(kInfo, "etcd: published ", written, " of this node's ", mine.size(),
           " group ranks again under its new lease");
  }
  return true;
}

namespace {

// A replacement's Txn compares the group's world size (`meta`): as it
// stands, or, when the key went with the lease of the node that wrote it
// (that node died, or its last rank left) while another rank of the group
// still holds a record, written again under `lease` provided that rank's
// record is still there. FailedPrecondition when the world size differs or
// no other rank is left.
absl::Status GuardWorldSize(const std::string& name, const std::string& meta,
                            const std::string& key, uint32_t world_size, int64_t lease,
                            const std::vector<etcd::KeyValue>& metas,
                            const std::vector<etcd::KeyValue>& records, etcd::Txn* take) {
  const std::string ws = absl::StrCat(world_size);
  if (!metas.empty()) {
    if (metas[0].value != ws) {
      return absl::FailedPreconditionError(
          absl::StrCat("group '", name, "' has world size ", EscapeForDisplay(metas[0].value, 16),
                       " in the cluster but the replacement asked for ", ws,
                       ": start it with the group's world size"));
    }
    take->IfValue(meta, etcd::CompareOp::kEqual, ws);
    return absl::OkStatus();
  }
  const size_t ranks = key.rfind('/') + 1;  // the records' common prefix
  for (const etcd::KeyValue& kv : records) {
    uint32_t other = 0;
    if (kv.key == key || !ParseCanonicalNumber(absl::string_view(kv.key).substr(ranks), &other)) {
      continue;
    }
    absl::StatusOr<ClusterMember> m = ParseRecord(kv.value, other);
    if (m.ok() && m->world_size == world_size) {
      take->IfCreateRevision(meta, etcd::CompareOp::kEqual, 0)
          .IfCreateRevision(kv.key, etcd::CompareOp::kEqual, kv.create_revision)
          .ThenPut(meta, ws, lease);
      return absl::OkStatus();
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("group '", name, "' is no longer in the cluster with world size ", ws,
                   " (every other rank left it): start the group again"));
}

}  // namespace

void EtcdGroupDirectory::RunClaimVacant(const Key& group, Op claim) {
  std::vector<Op> one;
  one.push_back(std::move(claim));
  HoldWithdrawn(group, &one);
  if (one.empty()) return;
  Op& c = one.front();
  const int64_t lease = options_.lease ? options_.lease() : 0;
  if (lease == 0) {
    return Postpone(std::move(one),
                    absl::UnavailableError("this node is not registered in etcd (registering "
                                           "again): the replacement waits"));
  }
  const auto& [uid, tenant, name] = group;
  const std::string meta = GroupMetaKey(options_.prefix, uid, tenant, name);
  const std::string key = GroupRankKey(options_.prefix, uid, tenant, name, c.rank);
  absl::Status failed;
  bool won = false;
  const std::string ranks = key.substr(0, key.rfind('/') + 1);
  for (int attempt = 0; attempt < 4 && !won && failed.ok(); ++attempt) {
    etcd::Txn read;
    read.IfCreateRevision(key, etcd::CompareOp::kEqual, 0)
        .ThenGet(meta)
        .ThenGetPrefix(ranks)
        .ElseGet(meta)
        .ElseGet(key)
        .ElseGetPrefix(ranks);
    absl::StatusOr<etcd::TxnResult> now = etcd_->Commit(read);
    if (!now.ok()) {
      if (Unreachable(now.status())) return Postpone(std::move(one), now.status());
      failed = now.status();
      break;
    }
    const std::vector<etcd::KeyValue>& metas = now->responses.at(0).kvs;
    etcd::Txn take;
    failed = GuardWorldSize(name, meta, key, c.me.world_size, lease, metas,
                            now->responses.back().kvs, &take);
    if (!failed.ok()) break;
    if (now->succeeded) {
      take.IfCreateRevision(key, etcd::CompareOp::kEqual, 0);  // no record: its node died
    } else {
      const etcd::KeyValue& held = now->responses.at(1).kvs.at(0);
      absl::StatusOr<ClusterMember> holder = ParseRecord(held.value, c.rank);
      if (holder.ok() && holder->node_id == options_.node_id && holder->pid == c.me.pid &&
          held.lease == lease) {
        won = true;  // ours: an earlier attempt whose answer was lost
        break;
      }
      if (!holder.ok()) {
        // Perhaps a newer daemon's record of a live rank: never overwritten.
        failed = absl::FailedPreconditionError(
            absl::StrCat("rank ", c.rank, " of group '", name,
                         "' is held in the cluster by a record this daemon cannot read (",
                         holder.status().message(), "): remove ", EscapeForDisplay(key, 200),
                         " from etcd if its holder is gone"));
        break;
      }
      if (holder->state != MemberState::kLost && holder->state != MemberState::kLeft) {
        failed = absl::AlreadyExistsError(absl::StrCat(
            "rank ", c.rank, " of group '", name, "' is already taken by pid ", holder->pid,
            " on node ", holder->node_id,
            holder->joining ? " (another replacement)"
                            : " (if that process or its node died, retry once it is reported "
                              "LOST: within the node lease's TTL)"));
        break;
      }
      // LOST or LEFT: taken over only as it stands now.
      take.IfModRevision(key, etcd::CompareOp::kEqual, held.mod_revision);
    }
    take.ThenPut(key, RecordJson(c.me, v1::GroupRankRecord::JOINED), lease);
    absl::StatusOr<etcd::TxnResult> r = etcd_->Commit(take);
    if (!r.ok()) {
      if (Unreachable(r.status())) return Postpone(std::move(one), r.status());
      failed = r.status();
      break;
    }
    won = r->succeeded;  // else the record changed meanwhile: read it again
  }
  if (!won && failed.ok()) {
    return Postpone(std::move(one), absl::AbortedError("the rank's record kept changing"));
  }
  if (won) {
    absl::MutexLock lock(&mu_);
    own_[{group, c.rank}] = c.me;
    WantPendingLocked(group);
  }
  NoteTrouble(absl::OkStatus());
  if (won) {
    c.done(ClaimOutcome::kClaimed, absl::OkStatus());
  } else {
    c.done(ClaimOutcome::kFailed, failed);
  }
}

void EtcdGroupDirectory::RewriteOwn(const Op& op, const std::function<void(ClusterMember&)>& edit) {
  ClusterMember me;
  {
    absl::MutexLock lock(&mu_);
    auto it = own_.find({op.group, op.rank});
    if (it == own_.end()) return;
    // Edited in own_ at once: a republish under a new lease writes it too.
    edit(it->second);
    me = it->second;
  }
  const int64_t lease = options_.lease ? options_.lease() : 0;
  if (lease == 0) {
    // Written once the node is registered again (or republished with the
    // record now in own_ under a new lease).
    return Postpone({op}, absl::UnavailableError("this node is not registered in etcd"));
  }
  const auto& [uid, tenant, name] = op.group;
  const std::string key = GroupRankKey(options_.prefix, uid, tenant, name, op.rank);
  etcd::Txn t;
  t.IfLease(key, etcd::CompareOp::kEqual, lease)
      .ThenPut(key, RecordJson(me, RecordState(me.state)), lease);
  absl::StatusOr<etcd::TxnResult> r = etcd_->Commit(t);
  if (!r.ok() && Unreachable(r.status())) {
    Op retry = op;
    Postpone({std::move(retry)}, r.status());
  }
}

void EtcdGroupDirectory::RunMarkState(const Op& op) {
  RewriteOwn(op, [&op](ClusterMember& me) {
    me.state = op.state;
    if (op.epoch > me.epoch) {
      me.epoch = op.epoch;
      // Releases of vacancies before this epoch are settled.
      me.released.erase(std::remove_if(me.released.begin(), me.released.end(),
                                       [&op](const auto& rel) { return rel.second < op.epoch; }),
                        me.released.end());
    }
    // A replacement is a member like the others once its group re-formed.
    if (op.epoch > 0) me.joining = false;
  });
}

void EtcdGroupDirectory::RunRelease(const Op& op) {
  RewriteOwn(op, [this, &op](ClusterMember& me) {
    me.epoch = std::max(me.epoch, op.epoch);
    auto same = std::find_if(me.released.begin(), me.released.end(),
                             [&op](const auto& rel) { return rel.first == op.released_rank; });
    if (same != me.released.end()) {
      same->second = op.epoch;
    } else {
      me.released.emplace_back(op.released_rank, op.epoch);
    }
    if (op.rdma) {
      me.rdma = op.rdma;
      me.rdma_generation = NextGeneration();
    }
  });
}

void EtcdGroupDirectory::RunWithdraw(const Op& op) {
  {
    absl::MutexLock lock(&mu_);
    if (own_.count({op.group, op.rank}) == 0) {
      withdrawn_.erase({op.group, op.rank});  // claims of the rank may go now
      return;                                 // never claimed, or already gone
    }
  }
  // Until the delete is done the rank stays in own_: a record under a lease
  // that etcd kept (it restarted) would otherwise stay there for good.
  const int64_t lease = options_.lease ? options_.lease() : 0;
  if (lease == 0) {
    return Postpone({op}, absl::UnavailableError("this node is not registered in etcd"));
  }
  const auto& [uid, tenant, name] = op.group;
  const std::string key = GroupRankKey(options_.prefix, uid, tenant, name, op.rank);
  etcd::Txn t;
  t.IfLease(key, etcd::CompareOp::kEqual, lease).ThenDelete(key);
  absl::StatusOr<etcd::TxnResult> r = etcd_->Commit(t);
  if (!r.ok() && Unreachable(r.status())) return Postpone({op}, r.status());
  bool last_here = false;
  {
    absl::MutexLock lock(&mu_);
    own_.erase({op.group, op.rank});
    withdrawn_.erase({op.group, op.rank});  // claims of the rank may go now
    auto next = own_.lower_bound({op.group, 0});
    last_here = next == own_.end() || next->first.first != op.group;
  }
  if (!r.ok()) {
    MC_LOG(kWarning, "etcd: could not withdraw rank ", op.rank, " of group '", name,
           "': ", r.status().message(), " (the record goes with this node's lease)");
    return;
  }
  if (last_here) {
    // This node's last rank of the group is out: the world size goes too
    // when no rank of any node is left, whichever node created it. Every
    // node tries once, after its own deletes, so the one whose try comes
    // last in etcd's order finds the ranks gone (unless a new incarnation
    // claimed meanwhile: then the compare fails and the meta key stays).
    // Only the creator deleting it left the key behind whenever another
    // node's rank went last, and a later group of that name with another
    // world size was refused until the creator restarted.
    const std::string meta = GroupMetaKey(options_.prefix, uid, tenant, name);
    etcd::Txn m;
    m.IfNoKeyWithPrefix(key.substr(0, key.rfind('/') + 1)).ThenDelete(meta);
    (void)etcd_->Commit(m);
  }
}

}  // namespace mooncake::daemon::peering
