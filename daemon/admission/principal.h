// Principal: who a budget counts against (issue 23 item 4). The same uid
// on two tenants' sockets is two principals: tenants are isolated from each
// other even where their containers all run as root. Every per-user limit
// of the daemon (connections, fds, sessions, ranks, waiting joins,
// watchers, QPs, regions, registered bytes) is per principal.
//
// Privileged: uid 0 and the daemon's own uid on the main socket only,
// counted but never refused (the administrator's mcctl answers while a user
// floods the daemon). Root on a tenant socket is a tenant like any other.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mooncake::daemon {

struct Principal {
  uint32_t uid = 0;
  std::string tenant;  // the accepting socket's tenant; "" = the main socket

  bool operator==(const Principal& o) const { return uid == o.uid && tenant == o.tenant; }
  template <typename H>
  friend H AbslHashValue(H h, const Principal& p) {
    return H::combine(std::move(h), p.uid, p.tenant);
  }
  // "uid 1000", or "uid 0 of tenant 'a'" (tenant names are checked at
  // config time: [A-Za-z0-9._-]).
  std::string Describe() const {
    return tenant.empty() ? absl::StrCat("uid ", uid)
                          : absl::StrCat("uid ", uid, " of tenant '", tenant, "'");
  }
};

// Root or the daemon's own uid, on the main socket.
bool IsPrivileged(const Principal& p);

}  // namespace mooncake::daemon
