#include "server/daemon_state.h"

#include <grpcpp/server_context.h>

#include "mooncake/common/log.h"

namespace mooncake::daemon {

absl::StatusOr<std::pair<PeerCred, int>> DaemonState::Caller(const grpc::ServerContextBase* ctx) const {
  int fd = ConnectionTable::FdFromPeer(ctx->peer());
  std::optional<PeerCred> cred = fd >= 0 ? connections.Get(fd) : std::nullopt;
  if (!cred) {
    return absl::PermissionDeniedError(
        "the local API is served only on mooncaked's UNIX socket (caller identity unknown)");
  }
  return std::make_pair(*cred, fd);
}

void DaemonState::EndSession(uint64_t session_id) {
  std::optional<SessionInfo> info = sessions->Find(session_id);
  // Order: stop new events, then free what it owned, then tell others.
  sessions->Close(session_id);
  tickets->DropSession(session_id);
  exports.DropSession(session_id);
  broker->SessionEnded(session_id);
  if (info) {
    MC_LOG(kInfo, "session ", session_id, " (pid ", info->cred.pid, ", uid ", info->cred.uid,
           ") ended");
  }
}

}  // namespace mooncake::daemon
