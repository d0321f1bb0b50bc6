#include "server/local_service.h"

#include "absl/strings/str_cat.h"
#include "mooncake/common/grpc_status.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon {

absl::StatusOr<SessionInfo> LocalService::CallerSession(const grpc::ServerContext* ctx) const {
  auto caller = state_->Caller(ctx);
  if (!caller.ok()) return caller.status();
  std::optional<SessionInfo> s = state_->sessions->FindByConnection(caller->second);
  if (!s) {
    return absl::FailedPreconditionError(
        "no session on this connection: call OpenSession first (mooncake::Client does)");
  }
  return *s;
}

grpc::Status LocalService::Hello(grpc::ServerContext* ctx, const v1::HelloRequest* req,
                                 v1::HelloResponse* resp) {
  auto caller = state_->Caller(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  if (req->protocol_version() != 0 && req->protocol_version() != kProtocolVersion) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("client speaks protocol ", req->protocol_version(),
                                     ", mooncaked ", kDaemonVersion, " speaks ", kProtocolVersion,
                                     ": use matching versions of libmooncake_client and mooncaked"));
  }
  resp->set_protocol_version(kProtocolVersion);
  resp->set_daemon_version(kDaemonVersion);
  resp->set_instance_id(state_->instance_id);
  resp->set_node_id(state_->node_id);
  resp->set_uid(caller->first.uid);
  resp->set_gid(caller->first.gid);
  resp->set_pid(caller->first.pid);
  return grpc::Status::OK;
}

grpc::Status LocalService::OpenSession(grpc::ServerContext* ctx, const v1::OpenSessionRequest* req,
                                       grpc::ServerWriter<v1::SessionEvent>* writer) {
  auto caller = state_->Caller(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  absl::StatusOr<SessionInfo> session =
      state_->sessions->Open(caller->first, caller->second, req->client_name());
  if (!session.ok()) return ToGrpc(session.status());
  MC_LOG(kInfo, "session ", session->id, " opened by pid ", session->cred.pid, " uid ",
         session->cred.uid, " (", session->client_name, ")");
  v1::SessionEvent opened;
  opened.mutable_opened()->set_session_id(session->id);
  opened.mutable_opened()->set_token(session->token);
  opened.mutable_opened()->set_instance_id(state_->instance_id);
  bool alive = writer->Write(opened);
  bool shutting_down = false;
  while (alive && !ctx->IsCancelled()) {
    // Short waits so a vanished client is noticed well within a second.
    auto events = state_->sessions->Wait(session->id, absl::Milliseconds(100));
    if (!events) break;
    for (v1::SessionEvent& ev : *events) {
      shutting_down |= ev.has_shutdown();
      if (!writer->Write(ev)) {
        alive = false;
        break;
      }
    }
    if (shutting_down) break;
  }
  state_->EndSession(session->id);
  if (shutting_down) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "mooncaked is shutting down");
  return grpc::Status::OK;
}

grpc::Status LocalService::GetNodeInfo(grpc::ServerContext* ctx, const v1::GetNodeInfoRequest*,
                                       v1::NodeInfo* resp) {
  auto caller = state_->Caller(ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  resp->set_node_id(state_->node_id);
  resp->set_hostname(state_->hostname);
  resp->set_instance_id(state_->instance_id);
  *resp->mutable_topology() = state_->topology;
  return grpc::Status::OK;
}

grpc::Status LocalService::JoinGroup(grpc::ServerContext* ctx, const v1::JoinGroupRequest* req,
                                     v1::JoinGroupResponse* resp) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return ToGrpc(session.status());
  FdBundlePtr fds;
  if (!req->handle().fd_ticket().empty()) {
    absl::StatusOr<FdBundlePtr> taken =
        state_->tickets->TakeIncoming(req->handle().fd_ticket(), session->id);
    if (!taken.ok()) return ToGrpc(taken.status());
    fds = std::move(*taken);
  }
  absl::StatusOr<v1::JoinGroupResponse> view =
      state_->broker->Join(*session, *req, std::move(fds), [ctx] { return ctx->IsCancelled(); });
  if (!view.ok()) return ToGrpc(view.status());
  *resp = std::move(*view);
  return grpc::Status::OK;
}

grpc::Status LocalService::LeaveGroup(grpc::ServerContext* ctx, const v1::LeaveGroupRequest* req,
                                      v1::LeaveGroupResponse*) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return ToGrpc(session.status());
  return ToGrpc(state_->broker->Leave(*session, req->group(), req->rank()));
}

grpc::Status LocalService::ReportReady(grpc::ServerContext* ctx, const v1::ReportReadyRequest* req,
                                       v1::ReportReadyResponse*) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return ToGrpc(session.status());
  return ToGrpc(state_->broker->ReportReady(*session, *req));
}

grpc::Status LocalService::ExportFds(grpc::ServerContext* ctx, const v1::ExportFdsRequest* req,
                                     v1::ExportFdsResponse* resp) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return ToGrpc(session.status());
  if (req->kind().size() > 64) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "export kind longer than 64 characters");
  }
  absl::StatusOr<FdBundlePtr> fds = state_->tickets->TakeIncoming(req->fd_ticket(), session->id);
  if (!fds.ok()) return ToGrpc(fds.status());
  ExportRecord r = state_->exports.Add(session->id, session->cred.uid, session->cred.pid,
                                       req->kind(), req->size(), std::move(*fds));
  resp->set_export_id(r.id);
  resp->set_secret(r.secret);
  return grpc::Status::OK;
}

grpc::Status LocalService::ImportFds(grpc::ServerContext* ctx, const v1::ImportFdsRequest* req,
                                     v1::ImportFdsResponse* resp) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return ToGrpc(session.status());
  absl::StatusOr<ExportRecord> r =
      state_->exports.Lookup(req->export_id(), req->secret(), session->cred.uid);
  if (!r.ok()) return ToGrpc(r.status());
  resp->set_fd_ticket(
      state_->tickets->IssueOutgoing(r->owner_session, session->id, session->cred.uid, r->bundle));
  resp->set_fd_count(static_cast<uint32_t>(r->bundle->fds.size()));
  resp->set_kind(r->kind);
  resp->set_size(r->size);
  resp->set_owner_pid(r->pid);
  return grpc::Status::OK;
}

}  // namespace mooncake::daemon
