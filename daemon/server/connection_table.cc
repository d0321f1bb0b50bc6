#include "server/connection_table.h"

#include <grpcpp/server_context.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace mooncake::daemon {

void ConnectionTable::Set(int fd, const PeerCred& cred) {
  absl::MutexLock lock(&mu_);
  creds_[fd] = cred;
}

std::optional<PeerCred> ConnectionTable::Get(int fd) const {
  absl::MutexLock lock(&mu_);
  auto it = creds_.find(fd);
  if (it == creds_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<Caller> ConnectionTable::CallerOf(const grpc::ServerContextBase* ctx) const {
  int fd = FdFromPeer(ctx->peer());
  std::optional<PeerCred> cred = fd >= 0 ? Get(fd) : std::nullopt;
  if (!cred) {
    return absl::PermissionDeniedError(
        "the local API is served only on mooncaked's UNIX socket (caller identity unknown)");
  }
  return Caller{*cred, fd};
}

int ConnectionTable::FdFromPeer(absl::string_view peer) {
  if (!absl::StartsWith(peer, "fd:")) return -1;
  int fd = -1;
  if (!absl::SimpleAtoi(peer.substr(3), &fd) || fd < 0) return -1;
  return fd;
}

}  // namespace mooncake::daemon
