// A synchronous client for mooncaked's Admin service over the node's UNIX
// socket, as mcctl uses it: one channel, a deadline per call, no waiting for
// a daemon that is not there.
//
// Errors: the gRPC status as an absl::Status (same canonical code). A daemon
// that cannot be reached shows up as Unavailable (nothing listening, socket
// missing, permission denied) or DeadlineExceeded (no reply in time); see
// IsUnreachable() and UnreachableReason(). A socket path that cannot be a
// UNIX socket address fails every call with CheckSocketPath()'s error, and
// no gRPC channel is made for it.
//
// Thread-safety: the calls may be made from several threads (the gRPC stub is
// thread-safe); the object must outlive them.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mooncake/v1/admin.grpc.pb.h"

namespace mooncake::mcctl {

class AdminClient {
 public:
  // `socket_path` is a filesystem path (no "unix:" prefix). Creating the
  // client does not connect; the first call does.
  AdminClient(std::string socket_path, int timeout_ms);

  // InvalidArgument, naming the path and the limit, when `socket_path` does
  // not fit a sockaddr_un (107 bytes on Linux).
  static absl::Status CheckSocketPath(const std::string& socket_path);

  absl::StatusOr<mooncake::v1::DaemonStatus> GetStatus();
  absl::StatusOr<mooncake::v1::Topology> GetTopology();
  absl::StatusOr<mooncake::v1::ListSessionsResponse> ListSessions();
  absl::StatusOr<mooncake::v1::ListGroupsResponse> ListGroups();
  absl::StatusOr<mooncake::v1::ListQueuePairsResponse> ListQueuePairs();
  absl::StatusOr<mooncake::v1::ListPeersResponse> ListPeers();
  absl::StatusOr<mooncake::v1::ListMemoryRegionsResponse> ListMemoryRegions();
  // Streams Admin.WatchEvents with no deadline, calling `on_event` for each
  // event until it returns false (then OK) or the stream ends (the status
  // it ended with: Unavailable when the daemon stopped, ResourceExhausted
  // when this user holds too many watches).
  absl::Status WatchEvents(const std::function<bool(const mooncake::v1::WatchEvent&)>& on_event);

  const std::string& socket_path() const { return socket_path_; }
  // Why no RPC could be sent (bad path, refused connect); OK when connected.
  const absl::Status& connect_status() const { return path_status_; }
  int timeout_ms() const { return timeout_ms_; }

  // Whether `status` (from one of the calls above) means the daemon was not
  // reached rather than that it answered with an error.
  static bool IsUnreachable(const absl::Status& status);

  // One line saying why the daemon was not reached: the errno of a fresh
  // connect() to the socket when that fails ("No such file or directory",
  // "Connection refused", "Permission denied"), else what gRPC said.
  std::string UnreachableReason(const absl::Status& status) const;

 private:
  std::string socket_path_;
  int timeout_ms_;
  absl::Status path_status_;  // CheckSocketPath, then the connect
  std::unique_ptr<mooncake::v1::Admin::Stub> stub_;
};

}  // namespace mooncake::mcctl
