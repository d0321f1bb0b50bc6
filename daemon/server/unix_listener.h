// Creating the daemon's listening UNIX sockets safely.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "mooncake/common/unique_fd.h"

namespace mooncake::daemon {

// Binds and listens on `path` with permissions `mode` (and group `group` when
// non-empty). A stale socket file left by a dead daemon is replaced; a live
// daemon on the path is an AlreadyExists error. The parent directory is
// created (0755) when missing. The socket is non-blocking and CLOEXEC.
absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, uint32_t mode,
                                    const std::string& group);

}  // namespace mooncake::daemon
