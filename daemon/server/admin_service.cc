#include "server/admin_service.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mooncake/common/grpc_status.h"
#include "mooncake/common/paths.h"
#include "mooncake/common/version.h"

namespace mooncake::daemon {

v1::GroupInfo ToGroupInfo(const GroupSummary& g) {
  v1::GroupInfo info;
  info.set_name(g.name);
  info.set_uid(g.uid);
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
  }
  return info;
}

grpc::Status AdminService::GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest*,
                                     v1::DaemonStatus* resp) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  const uint32_t uid = caller->cred.uid;
  const bool all = uid == 0;
  resp->set_version(kMooncakeVersion);
  resp->set_protocol_version(kProtocolVersion);
  resp->set_instance_id(node_->instance_id);
  resp->set_node_id(node_->node_id);
  resp->set_hostname(node_->hostname);
  resp->set_socket_path(endpoints_.socket_path);
  resp->set_etcd_state(nodes_ != nullptr ? nodes_->state() : "off");
  resp->set_etcd_endpoints(endpoints_.etcd_endpoints);
  resp->set_peer_security(endpoints_.peer_security);
  resp->set_fd_socket_path(FdSocketPath(endpoints_.socket_path));
  resp->set_pid(::getpid());
  resp->set_uptime_ms(
      static_cast<uint64_t>(absl::ToInt64Milliseconds(absl::Now() - node_->started)));
  uint32_t sessions = 0;
  for (const SessionInfo& s : sessions_->List()) sessions += (all || s.cred.uid == uid);
  resp->set_sessions(sessions);
  resp->set_groups(static_cast<uint32_t>(broker_->CountVisible(uid, all)));
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
  return grpc::Status::OK;
}

grpc::Status AdminService::ListSessions(grpc::ServerContext* ctx, const v1::ListSessionsRequest*,
                                        v1::ListSessionsResponse* resp) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  const uint32_t uid = caller->cred.uid;
  absl::Time now = absl::Now();
  for (const SessionInfo& s : sessions_->List()) {
    if (uid != 0 && s.cred.uid != uid) continue;
    v1::SessionInfo* out = resp->add_sessions();
    out->set_session_id(s.id);
    out->set_uid(s.cred.uid);
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
  const uint32_t uid = caller->cred.uid;
  for (const GroupSummary& g : broker_->List(uid, uid == 0)) *resp->add_groups() = ToGroupInfo(g);
  return grpc::Status::OK;
}

namespace {

// The syndrome that put a QP in the error state, in words.
std::string SyndromeText(uint8_t s) {
  switch (s) {
    case 0: return "";
    case 0x01: return "local length error (0x01)";
    case 0x02: return "local QP operation error: malformed WQE or doorbell (0x02)";
    case 0x04: return "local protection error: bad lkey or source range (0x04)";
    case 0x05: return "work request flushed (0x05)";
    case 0x12: return "remote invalid request: misaligned atomic (0x12)";
    case 0x13: return "remote access error: bad rkey, range or rights (0x13)";
    case 0x14: return "remote operation error (0x14)";
    default: return absl::StrCat("syndrome 0x", absl::Hex(s));
  }
}

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
    q->set_last_error(SyndromeText(r.info.last_syndrome));
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

}  // namespace mooncake::daemon
