#include "server/admin_service.h"

#include <unistd.h>

#include "mooncake/common/grpc_status.h"
#include "mooncake/common/paths.h"

namespace mooncake::daemon {

grpc::Status AdminService::GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest*,
                                     v1::DaemonStatus* resp) {
  auto caller = state_->Caller(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  const uint32_t uid = caller->first.uid;
  const bool all = uid == 0;
  resp->set_version(kDaemonVersion);
  resp->set_protocol_version(kProtocolVersion);
  resp->set_instance_id(state_->instance_id);
  resp->set_node_id(state_->node_id);
  resp->set_hostname(state_->hostname);
  resp->set_socket_path(state_->config.socket);
  resp->set_fd_socket_path(FdSocketPath(state_->config.socket));
  resp->set_pid(::getpid());
  resp->set_uptime_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(absl::Now() - state_->started)));
  uint32_t sessions = 0;
  for (const SessionInfo& s : state_->sessions->List()) sessions += (all || s.cred.uid == uid);
  resp->set_sessions(sessions);
  resp->set_groups(static_cast<uint32_t>(state_->broker->CountVisible(uid, all)));
  resp->set_gpu_count(static_cast<uint32_t>(state_->topology.gpus_size()));
  resp->set_nic_count(static_cast<uint32_t>(state_->topology.nics_size()));
  resp->set_cuda_driver_version(state_->topology.cuda_driver_version());
  resp->set_gpu_discovery_note(state_->topology.gpu_discovery_note());
  resp->set_nic_discovery_note(state_->topology.nic_discovery_note());
  resp->set_peer_listen(state_->config.peer_listen);
  return grpc::Status::OK;
}

grpc::Status AdminService::GetTopology(grpc::ServerContext* ctx, const v1::GetTopologyRequest*,
                                       v1::Topology* resp) {
  auto caller = state_->Caller(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  *resp = state_->topology;
  return grpc::Status::OK;
}

grpc::Status AdminService::ListSessions(grpc::ServerContext* ctx, const v1::ListSessionsRequest*,
                                        v1::ListSessionsResponse* resp) {
  auto caller = state_->Caller(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  const uint32_t uid = caller->first.uid;
  absl::Time now = absl::Now();
  for (const SessionInfo& s : state_->sessions->List()) {
    if (uid != 0 && s.cred.uid != uid) continue;
    v1::SessionInfo* out = resp->add_sessions();
    out->set_session_id(s.id);
    out->set_uid(s.cred.uid);
    out->set_gid(s.cred.gid);
    out->set_pid(s.cred.pid);
    out->set_client_name(s.client_name);
    out->set_age_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(now - s.opened)));
    for (std::string& g : state_->broker->MembershipsOf(s.id)) out->add_groups(std::move(g));
    out->set_fd_exports(static_cast<uint32_t>(state_->exports.CountFor(s.id)));
    out->set_pending_tickets(static_cast<uint32_t>(state_->tickets->PendingFor(s.id)));
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::ListGroups(grpc::ServerContext* ctx, const v1::ListGroupsRequest*,
                                      v1::ListGroupsResponse* resp) {
  auto caller = state_->Caller(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  const uint32_t uid = caller->first.uid;
  for (v1::GroupInfo& g : state_->broker->List(uid, uid == 0)) *resp->add_groups() = std::move(g);
  return grpc::Status::OK;
}

}  // namespace mooncake::daemon
