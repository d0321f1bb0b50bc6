// ConnectionTable: the connections of the main socket, and who made each.
//
// The daemon accepts UNIX connections itself, reads SO_PEERCRED, and hands
// the fd to gRPC; ServerContext::peer() then reads "fd:N". Recording the
// credentials under N before gRPC sees the fd gives every RPC the identity
// the kernel vouched for.
//
// gRPC closes a connection's fd without telling us, so each record also
// keeps the socket's inode: a record whose fd number is closed, or now
// names another file, is a connection that ended. Sweep() finds those
// (giving their admission back) and shuts down connections that started no
// RPC within the handshake deadline. A number reused by the next accept
// replaces its stale record at once.
//
// Owned by Daemon; the acceptor adds, the RPC interceptor marks calls, the
// services ask CallerOf(). Thread-safe.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "admission/admission_counter.h"
#include "mooncake/common/fd_passing.h"

namespace grpc {
class ServerContextBase;
}

namespace mooncake::daemon {

// Who made an RPC: kernel-vouched credentials, the tenant of the socket
// that accepted its connection ("" for the main socket; never taken from a
// message), and the connection it came on.
struct Caller {
  PeerCred cred;
  int connection_fd = -1;
  std::string tenant;
};

class ConnectionTable {
 public:
  // `admission` (may be null in tests; not owned) gets one unit back for
  // the uid of every record that is dropped.
  explicit ConnectionTable(AdmissionCounter* admission = nullptr) : admission_(admission) {}

  // Records connection `fd` (already admitted for cred.uid), accepted on
  // the socket of `tenant` ("" for the main socket).
  void Add(int fd, const PeerCred& cred, absl::Time accepted, const std::string& tenant = {});
  // An RPC started on `fd`. CallerOf marks too (the services call it at
  // the start of every RPC), so it is const.
  void MarkUsed(int fd) const;
  std::optional<PeerCred> Get(int fd) const;

  // The caller of an RPC; PermissionDenied when the call did not come
  // through a connection the daemon accepted (so its identity is unknown).
  absl::StatusOr<Caller> CallerOf(const grpc::ServerContextBase* ctx) const;

  struct SweepResult {
    size_t ended = 0;      // records dropped: gRPC closed the connection
    size_t shut_down = 0;  // connections with no RPC past the deadline
  };
  // Drops the records of ended connections and shuts down (shutdown(2);
  // gRPC then closes the fd) every connection that has started no RPC
  // `handshake` after it was accepted.
  SweepResult Sweep(absl::Time now, absl::Duration handshake);
  // Shuts down connection `fd` (gRPC then ends its calls and closes it) when
  // it is still the one accepted (same file); false otherwise.
  bool ShutDown(int fd);

  size_t size() const;

  // Parses "fd:N" (as peer() reports for fd-added channels); -1 otherwise.
  static int FdFromPeer(absl::string_view peer);

 private:
  struct Record {
    PeerCred cred;
    std::string tenant;
    dev_t dev = 0;
    ino_t ino = 0;
    absl::Time accepted;
    bool used = false;
    bool shut = false;
  };
  void DropLocked(std::map<int, Record>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  AdmissionCounter* const admission_;
  mutable absl::Mutex mu_;
  // Mutable for MarkUsed: a call's start is not a change of the table.
  mutable std::map<int, Record> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mooncake::daemon
