// ConnectionTable: maps a gRPC call to the credentials of its connection.
//
// The daemon accepts UNIX connections itself, reads SO_PEERCRED, and hands
// the fd to gRPC; ServerContext::peer() then reads "fd:N". Recording the
// credentials under N before gRPC sees the fd gives every RPC the identity
// the kernel vouched for. A number reused after close is overwritten at the
// next accept, before any call can arrive on it. Thread-safe.
#pragma once

#include "absl/strings/string_view.h"
#include <map>
#include <optional>
#include <string_view>

#include "absl/synchronization/mutex.h"
#include "mooncake/common/fd_passing.h"

namespace mooncake::daemon {

class ConnectionTable {
 public:
  void Set(int fd, const PeerCred& cred);
  std::optional<PeerCred> Get(int fd) const;
  // Parses "fd:N" (as peer() reports for fd-added channels); -1 otherwise.
  static int FdFromPeer(absl::string_view peer);

 private:
  mutable absl::Mutex mu_;
  std::map<int, PeerCred> creds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mooncake::daemon
