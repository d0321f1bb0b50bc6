// The Local gRPC service (proto/mooncake/v1/local.proto), on gRPC's
// callback API: no RPC parks a thread. A session stream is a write reactor
// woken when events are posted, and its cancellation (the client closed,
// exited or was killed) ends the session at once; a JoinGroup waiting for
// the rest of its group holds no thread either.
//
// It holds only the pieces it uses, all owned by Daemon and outliving it:
// the node's identity, the caller lookup, the session registry (lookups and
// event queues), SessionLifecycle (open/end), the group broker and the
// FdBroker. It coordinates none of them: each operation that spans owners
// is one call on the owner that orders it.
#pragma once

#include "broker/group_broker.h"
#include "fdchannel/fd_broker.h"
#include "mooncake/v1/local.grpc.pb.h"
#include "server/connection_table.h"
#include "server/node_identity.h"
#include "server/session_lifecycle.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

// JoinGroup is a raw method: its request is parsed here (a malformed one
// answers INVALID_ARGUMENT), and its reply is the broker's EncodedView sent
// as two slices, the shared one without a copy, so n replies of an n-rank
// group cost O(n) memory between them instead of O(n^2).
class LocalService final
    : public v1::Local::WithRawCallbackMethod_JoinGroup<v1::Local::CallbackService> {
 public:
  LocalService(const NodeIdentity* node, const ConnectionTable* connections,
               SessionRegistry* sessions, SessionLifecycle* lifecycle, GroupBroker* broker,
               FdBroker* fds)
      : node_(node),
        connections_(connections),
        sessions_(sessions),
        lifecycle_(lifecycle),
        broker_(broker),
        fds_(fds) {}

  grpc::ServerUnaryReactor* Hello(grpc::CallbackServerContext* ctx, const v1::HelloRequest* req,
                                  v1::HelloResponse* resp) override;
  grpc::ServerWriteReactor<v1::SessionEvent>* OpenSession(
      grpc::CallbackServerContext* ctx, const v1::OpenSessionRequest* req) override;
  grpc::ServerUnaryReactor* GetNodeInfo(grpc::CallbackServerContext* ctx,
                                        const v1::GetNodeInfoRequest* req,
                                        v1::NodeInfo* resp) override;
  grpc::ServerUnaryReactor* JoinGroup(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* LeaveGroup(grpc::CallbackServerContext* ctx,
                                       const v1::LeaveGroupRequest* req,
                                       v1::LeaveGroupResponse* resp) override;
  grpc::ServerUnaryReactor* ReportReady(grpc::CallbackServerContext* ctx,
                                        const v1::ReportReadyRequest* req,
                                        v1::ReportReadyResponse* resp) override;
  grpc::ServerUnaryReactor* ReleaseRank(grpc::CallbackServerContext* ctx,
                                        const v1::ReleaseRankRequest* req,
                                        v1::ReleaseRankResponse* resp) override;
  grpc::ServerUnaryReactor* ExportFds(grpc::CallbackServerContext* ctx,
                                      const v1::ExportFdsRequest* req,
                                      v1::ExportFdsResponse* resp) override;
  grpc::ServerUnaryReactor* ImportFds(grpc::CallbackServerContext* ctx,
                                      const v1::ImportFdsRequest* req,
                                      v1::ImportFdsResponse* resp) override;

 private:
  // The caller's session, or FailedPrecondition when it has none.
  absl::StatusOr<SessionInfo> CallerSession(const grpc::ServerContextBase* ctx) const;

  const NodeIdentity* const node_;
  const ConnectionTable* const connections_;
  SessionRegistry* const sessions_;
  SessionLifecycle* const lifecycle_;
  GroupBroker* const broker_;
  FdBroker* const fds_;
};

}  // namespace mooncake::daemon
