// FdTicketIssuer: the one thing the group broker needs of the fd side —
// offering one member's fds to the other members by ticket. FdBroker
// implements it; tests may hand the broker a fake.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fdchannel/ticket_store.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

class FdTicketIssuer {
 public:
  virtual ~FdTicketIssuer() = default;

  // One ticket with which the members of a formed group GET `bundle`
  // (owned by `owner_session`, of `uid`) on the fd channel: redeemable by
  // any session in `audience` (sorted) with that uid, `uses` times in all,
  // until the TTL. One ticket per member instead of one per (member,
  // receiver) keeps a group's tickets O(n). FailedPrecondition when the
  // owner's session has ended: no ticket is stored then. Thread-safe.
  virtual absl::StatusOr<std::string> IssueForGroup(
      uint64_t owner_session, uint32_t uid, FdBundlePtr bundle,
      std::shared_ptr<const std::vector<uint64_t>> audience, uint32_t uses) = 0;
};

}  // namespace mooncake::daemon
