// The Admin gRPC service for mcctl (proto/mooncake/v1/admin.proto).
// Callers see their own uid's sessions and groups; root sees all.
#pragma once

#include "mooncake/v1/admin.grpc.pb.h"
#include "server/daemon_state.h"

namespace mooncake::daemon {

class AdminService final : public v1::Admin::Service {
 public:
  explicit AdminService(DaemonState* state) : state_(state) {}

  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest* req,
                         v1::DaemonStatus* resp) override;
  grpc::Status GetTopology(grpc::ServerContext* ctx, const v1::GetTopologyRequest* req,
                           v1::Topology* resp) override;
  grpc::Status ListSessions(grpc::ServerContext* ctx, const v1::ListSessionsRequest* req,
                            v1::ListSessionsResponse* resp) override;
  grpc::Status ListGroups(grpc::ServerContext* ctx, const v1::ListGroupsRequest* req,
                          v1::ListGroupsResponse* resp) override;

 private:
  DaemonState* state_;
};

}  // namespace mooncake::daemon
