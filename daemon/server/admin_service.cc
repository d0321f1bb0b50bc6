#include "server/admin_service.h"

#include <unistd.h>

#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mooncake/common/grpc_status.h"
#include "mooncake/common/paths.h"
#include "mooncake/common/version.h"
#include "mooncake/device/qp_error.h"

namespace mooncake::daemon {

v1::GroupInfo ToGroupInfo(const GroupSummary& g) {
  v1::GroupInfo info;
  info.set_name(g.name);
  info.set_uid(g.uid);
  info.set_tenant(g.tenant);
  info.set_world_size(g.world_size);
  info.set_joined(JoinedCount(g));
  info.set_state(GroupStateName(g.state));
  info.set_epoch(g.epoch);
  info.set_age_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(g.age)));
  for (const GroupMemberSummary& m : g.members) {
    v1::GroupMemberInfo* mi = info.add_members();
    mi->set_rank(m.rank);
    mi->set_state(MemberStateName(m.state));
    mi->set_pid(m.pid);
    mi->set_session_id(m.session_id);
    mi->set_gpu_index(m.gpu_index);
    mi->set_handle_kind(m.handle_kind);
    mi->set_handle_size(m.handle_size);
    mi->set_node_id(m.node_id);
  }
  return info;
}

std::string AdminService::SocketOf(const std::string& tenant) const {
  if (tenant.empty()) return endpoints_.socket_path;
  auto it = endpoints_.tenant_sockets.find(tenant);
  return it == endpoints_.tenant_sockets.end() ? "" : it->second;
}

bool AdminService::TenantSees(const Scope& scope, uint64_t session) const {
  // The RDMA listing has narrowed the rows to the caller's uid (all uids
  // for root); the tenant is the owning session's.
  if (scope.all_tenants) return true;
  std::optional<SessionInfo> s = sessions_->Find(session);
  return s && s->tenant == scope.tenant;
}

grpc::Status AdminService::GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest*,
                                     v1::DaemonStatus* resp) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  const Scope scope = ScopeOf(caller->cred, caller->tenant);
  resp->set_version(kMooncakeVersion);
  resp->set_protocol_version(kProtocolVersion);
  resp->set_instance_id(node_->instance_id);
  resp->set_node_id(node_->node_id);
  resp->set_hostname(node_->hostname);
  // A tenant's caller is told its own socket, never the others'.
  const std::string socket = SocketOf(caller->tenant);
  resp->set_socket_path(socket);
  resp->set_tenant(caller->tenant);
  resp->set_etcd_state(nodes_ != nullptr ? nodes_->state() : "off");
  resp->set_etcd_endpoints(endpoints_.etcd_endpoints);
  resp->set_peer_security(endpoints_.peer_security);
  resp->set_fd_socket_path(FdSocketPath(socket));
  resp->set_pid(::getpid());
  resp->set_uptime_ms(
      static_cast<uint64_t>(absl::ToInt64Milliseconds(absl::Now() - node_->started)));
  uint32_t sessions = 0;
  for (const SessionInfo& s : sessions_->List()) sessions += scope.Sees(s.cred.uid, s.tenant);
  resp->set_sessions(sessions);
  resp->set_groups(static_cast<uint32_t>(broker_->CountVisible(scope)));
  const v1::Topology& topo = node_->topology;
  resp->set_gpu_count(static_cast<uint32_t>(topo.gpus_size()));
  resp->set_nic_count(static_cast<uint32_t>(topo.nics_size()));
  resp->set_cuda_driver_version(topo.cuda_driver_version());
  resp->set_gpu_discovery_note(topo.gpu_discovery_note());
  resp->set_nic_discovery_note(topo.nic_discovery_note());
  resp->set_peer_listen(endpoints_.peer_listen);
  return grpc::Status::OK;
}

grpc::Status AdminService::GetTopology(grpc::ServerContext* ctx, const v1::GetTopologyRequest*,
                                       v1::Topology* resp) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  *resp = node_->topology;
  if (rdma_ != nullptr) {
    for (v1::Nic& n : *resp->mutable_nics()) {
      if (n.provider() == rdma_->provider()) n.set_atomics(rdma_->NicAtomics(n.name()));
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::ListSessions(grpc::ServerContext* ctx, const v1::ListSessionsRequest*,
                                        v1::ListSessionsResponse* resp) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  const Scope scope = ScopeOf(caller->cred, caller->tenant);
  absl::Time now = absl::Now();
  for (const SessionInfo& s : sessions_->List()) {
    if (!scope.Sees(s.cred.uid, s.tenant)) continue;
    v1::SessionInfo* out = resp->add_sessions();
    out->set_session_id(s.id);
    out->set_uid(s.cred.uid);
    out->set_tenant(s.tenant);
    out->set_gid(s.cred.gid);
    out->set_pid(s.cred.pid);
    out->set_client_name(s.client_name);
    out->set_age_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(now - s.opened)));
    for (std::string& g : broker_->MembershipsOf(s.id)) out->add_groups(std::move(g));
    out->set_fd_exports(static_cast<uint32_t>(fds_->ExportsOf(s.id)));
    out->set_pending_tickets(static_cast<uint32_t>(fds_->PendingTicketsFor(s.id)));
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::ListGroups(grpc::ServerContext* ctx, const v1::ListGroupsRequest*,
                                      v1::ListGroupsResponse* resp) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  for (const GroupSummary& g : broker_->List(ScopeOf(caller->cred, caller->tenant))) {
    *resp->add_groups() = ToGroupInfo(g);
  }
  return grpc::Status::OK;
}

namespace {

// The syndrome that put a QP in the error state, in words.
std::string AccessText(uint32_t a) {
  std::vector<std::string> parts = {"local"};
  if (a & softnic::kRemoteWrite) parts.push_back("remote-write");
  if (a & softnic::kRemoteRead) parts.push_back("remote-read");
  if (a & softnic::kRemoteAtomic) parts.push_back("remote-atomic");
  return absl::StrJoin(parts, ",");
}

}  // namespace

grpc::Status AdminService::ListQueuePairs(grpc::ServerContext* ctx,
                                          const v1::ListQueuePairsRequest*,
                                          v1::ListQueuePairsResponse* resp) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  if (rdma_ == nullptr) return grpc::Status::OK;
  const uint32_t uid = caller->cred.uid;
  for (const QpRow& r : rdma_->ListQps(uid, uid == 0)) {
    if (!TenantSees(ScopeOf(caller->cred, caller->tenant), r.session)) continue;
    v1::QueuePairInfo* q = resp->add_qps();
    q->set_qpn(r.info.qpn);
    q->set_nic(r.info.nic.empty() ? rdma_->nic() : r.info.nic);
    q->set_state(softnic::QpStateName(r.info.state));
    q->set_session_id(r.session);
    q->set_uid(r.uid);
    q->set_pid(r.pid);
    q->set_doorbell_mode(r.info.doorbell_mode != nullptr ? r.info.doorbell_mode
                                                         : rdma_->doorbell_mode());
    q->set_remote_qpn(r.info.remote_qpn);
    q->set_sq_wqe_cnt(r.info.sq_wqe_cnt);
    q->set_wqes_done(r.info.wqes_done);
    q->set_wqes_counted(rdma_->provider_counts_wqes());
    q->set_last_error(device::DescribeCqeSyndrome(r.info.last_syndrome));
    q->set_ring_memory(r.info.rings_in_gpu_memory ? "gpu" : "host");
    if (r.rings.has_value()) {
      q->set_ring_counters(true);
      q->set_sq_posted(r.rings->sq_posted);
      q->set_cq_consumed(r.rings->cq_consumed);
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::ListMemoryRegions(grpc::ServerContext* ctx,
                                             const v1::ListMemoryRegionsRequest*,
                                             v1::ListMemoryRegionsResponse* resp) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  if (rdma_ == nullptr) return grpc::Status::OK;
  const uint32_t uid = caller->cred.uid;
  for (const MrRow& r : rdma_->ListMrs(uid, uid == 0)) {
    if (!TenantSees(ScopeOf(caller->cred, caller->tenant), r.session)) continue;
    v1::MemoryRegionInfo* m = resp->add_regions();
    m->set_nic(rdma_->nic());
    m->set_size(r.info.length);
    m->set_session_id(r.session);
    m->set_uid(r.uid);
    m->set_pid(r.pid);
    m->set_kind(r.kind);
    m->set_access(AccessText(r.info.access));
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::ListPeers(grpc::ServerContext* ctx, const v1::ListPeersRequest*,
                                     v1::ListPeersResponse* resp) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  resp->set_self_node_id(node_->node_id);
  if (nodes_ == nullptr) {
    // No cluster: this node alone, as it would register itself.
    resp->set_etcd_state("off");
    v1::NodeRecord* self = resp->add_nodes();
    self->set_node_id(node_->node_id);
    self->set_instance_id(node_->instance_id);
    self->set_peer_address(endpoints_.peer_listen);
    self->set_daemon_version(kMooncakeVersion);
    self->set_protocol_version(kProtocolVersion);
    self->set_hostname(node_->hostname);
    self->set_gpu_count(static_cast<uint32_t>(node_->topology.gpus_size()));
    self->set_nic_count(static_cast<uint32_t>(node_->topology.nics_size()));
    self->set_rdma_provider(rdma_ != nullptr ? rdma_->provider() : "off");
    return grpc::Status::OK;
  }
  resp->set_etcd_state(nodes_->state());
  for (v1::NodeRecord& n : nodes_->Nodes()) *resp->add_nodes() = std::move(n);
  return grpc::Status::OK;
}

namespace {

// One watch. Writes are started by Pump() whenever the feed wakes it (from
// any thread, possibly under the broker's lock); at most one write is in
// flight. As with the session stream, gRPC may run a reaction inline from
// StartWrite or Finish, so neither is called with mu_ held, and the feed
// reaches the reactor only through the Hook, which OnDone clears before
// the reactor is deleted.
class WatchReactor final : public grpc::ServerWriteReactor<v1::WatchEvent> {
 public:
  struct Hook {
    std::recursive_mutex mu;  // recursive: OnDone may run inside a wake's Pump
    WatchReactor* reactor = nullptr;
  };

  explicit WatchReactor(const absl::Status& error) {
    finished_ = true;
    Finish(ToGrpc(error));
  }

  WatchReactor(EventFeed* feed, const Scope& scope) : feed_(feed), hook_(std::make_shared<Hook>()) {
    // Held until the watcher is in place: a wake racing the constructor
    // waits here instead of reading watcher_ half-set.
    std::shared_ptr<Hook> hook = hook_;  // outlives `this` should a reaction run inline
    std::lock_guard<std::recursive_mutex> hook_lock(hook->mu);
    hook->reactor = this;
    std::weak_ptr<Hook> weak = hook;
    absl::StatusOr<std::shared_ptr<EventFeed::Watcher>> w = feed_->Subscribe(scope, [weak] {
      if (auto h = weak.lock()) {
        std::lock_guard<std::recursive_mutex> lock(h->mu);
        if (h->reactor != nullptr) h->reactor->Pump();
      }
    });
    if (!w.ok()) {
      finished_ = true;
      Finish(ToGrpc(w.status()));
      return;
    }
    watcher_ = std::move(*w);
    Pump();
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (finished_) return;
      if (!ok || cancelled_) finished_ = finish = true;
    }
    if (finish) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    Pump();
  }

  void OnCancel() override {
    bool finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      // With a write in flight, OnWriteDone finishes (Finish must not race it).
      if (!finished_ && !writing_) finished_ = finish = true;
    }
    if (finish) Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    if (hook_) {
      std::lock_guard<std::recursive_mutex> lock(hook_->mu);
      hook_->reactor = nullptr;
    }
    if (watcher_) feed_->Unsubscribe(watcher_);
    delete this;
  }

  void Pump() {
    bool finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writing_ || finished_ || cancelled_ || !watcher_) return;
      if (std::optional<v1::WatchEvent> ev = watcher_->Next()) {
        current_ = std::move(*ev);
        writing_ = true;
      } else if (watcher_->Drained()) {
        finished_ = finish = true;
      } else {
        return;
      }
    }
    if (finish) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "mooncaked is shutting down"));
    } else {
      StartWrite(&current_);
    }
  }

 private:
  EventFeed* feed_ = nullptr;
  std::shared_ptr<Hook> hook_;
  std::shared_ptr<EventFeed::Watcher> watcher_;
  std::mutex mu_;
  bool writing_ = false;
  bool finished_ = false;
  bool cancelled_ = false;
  v1::WatchEvent current_;
};

}  // namespace

grpc::ServerWriteReactor<v1::WatchEvent>* AdminService::WatchEvents(
    grpc::CallbackServerContext* ctx, const v1::WatchEventsRequest*) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return new WatchReactor(caller.status());
  // The feed filters by the caller's Scope (uid and tenant, as ListGroups),
  // so a main-socket user never sees a tenant's groups of its uid. Closed
  // on tenant sockets until the broker stamps every GroupEvent with its
  // group's tenant (GroupBroker::Emit): till then a tenant's watch would
  // see nothing.
  if (!caller->tenant.empty()) {
    return new WatchReactor(absl::UnimplementedError(
        "WatchEvents is not served on a tenant's socket yet; watch from the node's main socket"));
  }
  return new WatchReactor(&feed_, ScopeOf(caller->cred, caller->tenant));
}

}  // namespace mooncake::daemon
