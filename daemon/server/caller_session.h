// What every session-scoped callback RPC starts and ends with: the caller's
// session from the connection the call arrived on (never from the message),
// and finishing a unary call with an absl::Status. Shared by LocalService
// and RdmaService.
#pragma once

#include <grpcpp/support/server_callback.h>

#include "absl/status/statusor.h"
#include "server/connection_table.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

// The session opened on the caller's connection; FailedPrecondition when
// the connection has none (OpenSession first), or the ConnectionTable's
// error for an unknown connection.
absl::StatusOr<SessionInfo> CallerSession(const ConnectionTable& connections,
                                          const SessionRegistry& sessions,
                                          const grpc::ServerContextBase* ctx);

// Finishes a unary callback RPC with `s` (as a grpc::Status).
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx, const absl::Status& s);

}  // namespace mooncake::daemon
