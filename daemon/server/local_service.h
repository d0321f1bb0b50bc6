// The Local gRPC service (proto/mooncake/v1/local.proto), on gRPC's
// callback API: no RPC parks a thread. A session stream is a write reactor
// woken when events are posted, and its cancellation (the client closed,
// exited or was killed) ends the session at once; a JoinGroup waiting for
// the rest of its group holds no thread either.
#pragma once

#include "mooncake/v1/local.grpc.pb.h"
#include "server/arena_allocator.h"
#include "server/daemon_state.h"

namespace mooncake::daemon {

class LocalService final : public v1::Local::CallbackService {
 public:
  explicit LocalService(DaemonState* state) : state_(state) {
    SetMessageAllocatorFor_JoinGroup(&join_allocator_);
  }

  grpc::ServerUnaryReactor* Hello(grpc::CallbackServerContext* ctx, const v1::HelloRequest* req,
                                  v1::HelloResponse* resp) override;
  grpc::ServerWriteReactor<v1::SessionEvent>* OpenSession(
      grpc::CallbackServerContext* ctx, const v1::OpenSessionRequest* req) override;
  grpc::ServerUnaryReactor* GetNodeInfo(grpc::CallbackServerContext* ctx,
                                        const v1::GetNodeInfoRequest* req,
                                        v1::NodeInfo* resp) override;
  grpc::ServerUnaryReactor* JoinGroup(grpc::CallbackServerContext* ctx,
                                      const v1::JoinGroupRequest* req,
                                      v1::JoinGroupResponse* resp) override;
  grpc::ServerUnaryReactor* LeaveGroup(grpc::CallbackServerContext* ctx,
                                       const v1::LeaveGroupRequest* req,
                                       v1::LeaveGroupResponse* resp) override;
  grpc::ServerUnaryReactor* ReportReady(grpc::CallbackServerContext* ctx,
                                        const v1::ReportReadyRequest* req,
                                        v1::ReportReadyResponse* resp) override;
  grpc::ServerUnaryReactor* ExportFds(grpc::CallbackServerContext* ctx,
                                      const v1::ExportFdsRequest* req,
                                      v1::ExportFdsResponse* resp) override;
  grpc::ServerUnaryReactor* ImportFds(grpc::CallbackServerContext* ctx,
                                      const v1::ImportFdsRequest* req,
                                      v1::ImportFdsResponse* resp) override;

 private:
  // The caller's session, or FailedPrecondition when it has none.
  absl::StatusOr<SessionInfo> CallerSession(const grpc::ServerContextBase* ctx) const;
  DaemonState* state_;
  ArenaMessageAllocator<v1::JoinGroupRequest, v1::JoinGroupResponse> join_allocator_;
};

}  // namespace mooncake::daemon
