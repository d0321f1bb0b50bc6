// Fitting the daemon's caps under its fd limit.
//
// Every connection (main socket, fd channel) and every fd held for a client
// costs the daemon one fd. If unprivileged users could together reach
// RLIMIT_NOFILE, accept() would fail for everyone, root's `mcctl status`
// included. So at start the soft limit is raised to the hard limit, and the
// unprivileged totals (max_connections, fd_channel_connections, max_fds)
// must fit under it with a reserve left for privileged callers and the
// daemon's own fds; when they do not, they are scaled down with a warning
// that names the keys and LimitNOFILE=.
#pragma once

#include <cstdint>

#include "config/daemon_config.h"

namespace mooncake::daemon {

struct FdCapacity {
  uint64_t limit = 0;     // RLIMIT_NOFILE soft limit after raising it
  uint64_t reserved = 0;  // kept for privileged callers and the daemon
};

// Raises the soft fd limit as far as allowed and returns it.
uint64_t RaiseFdLimit();

// Scales the unprivileged totals in `config` to fit `limit`; returns what
// was reserved. Logs a warning when it had to shrink something.
FdCapacity FitToFdLimit(uint64_t limit, DaemonConfig* config);

}  // namespace mooncake::daemon
