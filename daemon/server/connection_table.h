// ConnectionTable: maps a gRPC call to the credentials of its connection.
//
// The daemon accepts UNIX connections itself, reads SO_PEERCRED, and hands
// the fd to gRPC; ServerContext::peer() then reads "fd:N". Recording the
// credentials under N before gRPC sees the fd gives every RPC the identity
// the kernel vouched for. A number reused after close is overwritten at the
// next accept, before any call can arrive on it.
//
// Owned by Daemon (which Sets); services get a const reference and only ask
// Caller(). Thread-safe.
#pragma once

#include <map>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "mooncake/common/fd_passing.h"

namespace grpc {
class ServerContextBase;
}

namespace mooncake::daemon {

// Who made an RPC: kernel-vouched credentials and the connection it came on.
struct Caller {
  PeerCred cred;
  int connection_fd = -1;
};

class ConnectionTable {
 public:
  void Set(int fd, const PeerCred& cred);
  std::optional<PeerCred> Get(int fd) const;

  // The caller of an RPC; PermissionDenied when the call did not come
  // through a connection the daemon accepted (so its identity is unknown).
  absl::StatusOr<Caller> CallerOf(const grpc::ServerContextBase* ctx) const;

  // Parses "fd:N" (as peer() reports for fd-added channels); -1 otherwise.
  static int FdFromPeer(absl::string_view peer);

 private:
  mutable absl::Mutex mu_;
  std::map<int, PeerCred> creds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mooncake::daemon
