// FdTicketIssuer: the one thing the group broker needs of the fd side —
// offering one member's fds to another member by ticket. FdBroker
// implements it; tests may hand the broker a fake.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "fdchannel/ticket_store.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

class FdTicketIssuer {
 public:
  virtual ~FdTicketIssuer() = default;

  // A single-use ticket with which `recipient` GETs `bundle` (owned by
  // `owner_session`) on the fd channel. FailedPrecondition when either
  // session has ended: no ticket is stored then. Thread-safe.
  virtual absl::StatusOr<std::string> IssueOutgoing(uint64_t owner_session,
                                                    const SessionInfo& recipient,
                                                    FdBundlePtr bundle) = 0;
};

}  // namespace mooncake::daemon
