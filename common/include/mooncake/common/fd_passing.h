// Length-prefixed frames with file descriptors over a UNIX stream socket
// (SCM_RIGHTS). Used by the daemon's fd channel and by the client.
//
// A frame is a 4-byte little-endian length followed by that many bytes; up
// to kMaxFdsPerFrame fds ride on the first byte. RecvFrame counts fds per
// frame, however a sender spreads them over its bytes, and fails (closing
// them all) past the limit. Both functions handle short
// reads/writes and EINTR; received fds are CLOEXEC.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "mooncake/common/unique_fd.h"

namespace mooncake {

inline constexpr size_t kMaxFdsPerFrame = 64;
inline constexpr size_t kMaxFrameBytes = 64 * 1024;

struct Frame {
  std::string payload;
  std::vector<UniqueFd> fds;
};

// Sends `payload` and `fds` (borrowed; not closed). Deadline applies to the
// whole frame.
absl::Status SendFrame(int sock, absl::string_view payload, const std::vector<int>& fds,
                       absl::Duration timeout = absl::Seconds(10));

// Receives one frame. Returns Unavailable when the peer closed before any
// byte, DeadlineExceeded on timeout, InvalidArgument on an oversized frame.
absl::StatusOr<Frame> RecvFrame(int sock, absl::Duration timeout = absl::Seconds(10));

// Credentials of the process on the other end of a connected UNIX socket.
struct PeerCred {
  int pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
};
absl::StatusOr<PeerCred> GetPeerCred(int sock);

// Connects a SOCK_STREAM UNIX socket to `path` (CLOEXEC). Errors name the
// path: PermissionDenied (EACCES/EPERM) with the socket's mode and group and
// how to be let in (socket_access.h); InvalidArgument for a path too long
// for sun_path; Unavailable otherwise (the daemon is probably not running).
// `timeout` bounds the wait for a full listen backlog (Unavailable after it).
absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path,
                                     absl::Duration timeout = absl::InfiniteDuration());

// Sets O_NONBLOCK (gRPC needs it on fds handed to it).
absl::Status SetNonBlocking(int fd);

}  // namespace mooncake
