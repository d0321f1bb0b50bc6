// DaemonState: everything the RPC services share. Owned by Daemon; the
// services hold a pointer. Members are thread-safe on their own.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "broker/group_broker.h"
#include "config/daemon_config.h"
#include "fdchannel/export_registry.h"
#include "fdchannel/ticket_store.h"
#include "mooncake/v1/node.pb.h"
#include "server/connection_table.h"
#include "session/session_registry.h"

namespace grpc {
class ServerContextBase;
}

namespace mooncake::daemon {

inline constexpr char kDaemonVersion[] = "0.1.0";
inline constexpr uint32_t kProtocolVersion = 1;

struct DaemonState {
  DaemonConfig config;
  std::string instance_id;
  std::string node_id;
  std::string hostname;
  absl::Time started;
  v1::Topology topology;
  ConnectionTable connections;
  std::unique_ptr<SessionRegistry> sessions;
  std::unique_ptr<TicketStore> tickets;
  ExportRegistry exports;
  std::unique_ptr<GroupBroker> broker;

  // Credentials and connection fd of the caller; PermissionDenied when the
  // call did not come through a connection the daemon accepted.
  absl::StatusOr<std::pair<PeerCred, int>> Caller(const grpc::ServerContextBase* ctx) const;
  // Releases everything a session owned and tells its groups.
  void EndSession(uint64_t session_id);
};

}  // namespace mooncake::daemon
