#include "server/caller_session.h"

#include <grpcpp/server_context.h>

#include "mooncake/common/grpc_status.h"

namespace mooncake::daemon {

absl::StatusOr<SessionInfo> CallerSession(const ConnectionTable& connections,
                                          const SessionRegistry& sessions,
                                          const grpc::ServerContextBase* ctx) {
  absl::StatusOr<Caller> caller = connections.CallerOf(ctx);
  if (!caller.ok()) return caller.status();
  std::optional<SessionInfo> s = sessions.FindByConnection(caller->connection_fd);
  if (!s) {
    return absl::FailedPreconditionError(
        "no session on this connection: call OpenSession first (mooncake::Client does)");
  }
  return *s;
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpc(s));
  return r;
}

}  // namespace mooncake::daemon
