#include "admission/fd_capacity.h"

#include <sys/resource.h>

#include <algorithm>

#include "mooncake/common/log.h"

namespace mooncake::daemon {

uint64_t RaiseFdLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  return rl.rlim_cur == RLIM_INFINITY ? (uint64_t{1} << 20) : static_cast<uint64_t>(rl.rlim_cur);
}

FdCapacity FitToFdLimit(uint64_t limit, DaemonConfig* c) {
  FdCapacity cap;
  cap.limit = limit;
  // gRPC, the listeners, the log and peer connections need some; root's
  // tools need a few. A quarter of a small limit, 256 of a normal one.
  cap.reserved = std::max<uint64_t>(std::min<uint64_t>(256, limit / 4), 16);
  uint64_t room = limit > cap.reserved ? limit - cap.reserved : 0;
  uint64_t want = uint64_t{c->max_connections} + c->fd_channel_connections + c->max_fds;
  if (want <= room) return cap;
  auto scale = [&](uint32_t v) {
    return static_cast<uint32_t>(std::max<uint64_t>(1, uint64_t{v} * room / want));
  };
  MC_LOG(kWarning, "fd limit ", limit, " cannot hold max_connections=", c->max_connections,
         " + fd_channel_connections=", c->fd_channel_connections, " + max_fds=", c->max_fds,
         " with ", cap.reserved, " fds reserved for root; scaled them to ",
         scale(c->max_connections), " + ", scale(c->fd_channel_connections), " + ",
         scale(c->max_fds), " (raise LimitNOFILE= in the unit to keep them)");
  c->max_connections = scale(c->max_connections);
  c->fd_channel_connections = scale(c->fd_channel_connections);
  c->max_fds = scale(c->max_fds);
  c->max_connections_per_uid = std::min(c->max_connections_per_uid, c->max_connections);
  c->fd_channel_connections_per_uid =
      std::min(c->fd_channel_connections_per_uid, c->fd_channel_connections);
  c->max_fds_per_uid = std::min(c->max_fds_per_uid, c->max_fds);
  return cap;
}

}  // namespace mooncake::daemon
