#include "server/session_lifecycle.h"

#include <optional>
#include <utility>

#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon {

absl::StatusOr<SessionInfo> SessionLifecycle::Open(const PeerCred& cred, int conn_fd,
                                                   std::string client_name, std::string tenant) {
  absl::StatusOr<SessionInfo> session =
      sessions_->Open(cred, conn_fd, std::move(client_name), std::move(tenant));
  if (session.ok()) {
    // The name is the client's choice: escaped so it cannot forge log lines
    // (4x: room for every byte of an accepted name as \xNN).
    MC_LOG(kInfo, "session ", session->id, " opened by pid ", session->cred.pid, " uid ",
           session->cred.uid, session->tenant.empty() ? "" : " tenant ", session->tenant, " (",
           EscapeForDisplay(session->client_name, 4 * kMaxClientNameBytes), ")");
  }
  return session;
}

void SessionLifecycle::End(uint64_t session_id) {
  std::optional<SessionInfo> info = sessions_->Find(session_id);
  // The order is the contract in the header: close, free, then tell others.
  sessions_->Close(session_id);
  fds_->DropSession(session_id);
  if (rdma_ != nullptr) rdma_->SessionEnded(session_id);
  broker_->SessionEnded(session_id);
  if (info) {
    MC_LOG(kInfo, "session ", session_id, " (pid ", info->cred.pid, ", uid ", info->cred.uid,
           ") ended");
  }
}

}  // namespace mooncake::daemon
