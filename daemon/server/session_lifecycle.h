// SessionLifecycle: the one place sessions open and end.
//
// Ending a session touches three owners, in an order that matters:
//   1. SessionRegistry::Close — no new events, and every later liveness
//      check (FdBroker's additions, GroupBroker::JoinAsync) sees it closed;
//   2. FdBroker::DropSession — its tickets and exports are freed; nothing
//      can be added for it afterwards (see fd_broker.h);
//   2b. RdmaResources::SessionEnded — its queue pairs and memory regions are
//      destroyed (softnic stops touching its memory) before peers hear;
//   3. GroupBroker::SessionEnded — its waiting joins end, and its groups'
//      other members are told it is lost.
// Services end sessions only through End(), so that order is written once.
//
// Holds pointers to objects Daemon owns; they must outlive this.
// Thread-safe; End() is idempotent.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "broker/group_broker.h"
#include "fdchannel/fd_broker.h"
#include "rdma/rdma_resources.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

class SessionLifecycle {
 public:
  // `rdma` may be null (rdma_provider = off).
  SessionLifecycle(SessionRegistry* sessions, FdBroker* fds, RdmaResources* rdma,
                   GroupBroker* broker)
      : sessions_(sessions), fds_(fds), rdma_(rdma), broker_(broker) {}

  // Opens a session for the process on connection `conn_fd`, accepted on
  // the socket of `tenant` (see SessionRegistry::Open for the errors).
  absl::StatusOr<SessionInfo> Open(const PeerCred& cred, int conn_fd, std::string client_name,
                                   std::string tenant = {});
  // Releases everything the session owned and tells its groups.
  void End(uint64_t session_id);

 private:
  SessionRegistry* const sessions_;
  FdBroker* const fds_;
  RdmaResources* const rdma_;
  GroupBroker* const broker_;
};

}  // namespace mooncake::daemon
