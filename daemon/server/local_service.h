// The Local gRPC service (proto/mooncake/v1/local.proto).
#pragma once

#include "mooncake/v1/local.grpc.pb.h"
#include "server/daemon_state.h"

namespace mooncake::daemon {

class LocalService final : public v1::Local::Service {
 public:
  explicit LocalService(DaemonState* state) : state_(state) {}

  grpc::Status Hello(grpc::ServerContext* ctx, const v1::HelloRequest* req,
                     v1::HelloResponse* resp) override;
  grpc::Status OpenSession(grpc::ServerContext* ctx, const v1::OpenSessionRequest* req,
                           grpc::ServerWriter<v1::SessionEvent>* writer) override;
  grpc::Status GetNodeInfo(grpc::ServerContext* ctx, const v1::GetNodeInfoRequest* req,
                           v1::NodeInfo* resp) override;
  grpc::Status JoinGroup(grpc::ServerContext* ctx, const v1::JoinGroupRequest* req,
                         v1::JoinGroupResponse* resp) override;
  grpc::Status LeaveGroup(grpc::ServerContext* ctx, const v1::LeaveGroupRequest* req,
                          v1::LeaveGroupResponse* resp) override;
  grpc::Status ReportReady(grpc::ServerContext* ctx, const v1::ReportReadyRequest* req,
                           v1::ReportReadyResponse* resp) override;
  grpc::Status ExportFds(grpc::ServerContext* ctx, const v1::ExportFdsRequest* req,
                         v1::ExportFdsResponse* resp) override;
  grpc::Status ImportFds(grpc::ServerContext* ctx, const v1::ImportFdsRequest* req,
                         v1::ImportFdsResponse* resp) override;

 private:
  // The caller's session, or FailedPrecondition when it has none.
  absl::StatusOr<SessionInfo> CallerSession(const grpc::ServerContext* ctx) const;
  DaemonState* state_;
};

}  // namespace mooncake::daemon
