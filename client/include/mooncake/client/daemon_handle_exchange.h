// DaemonHandleExchange: the Device API's HandleExchange over mooncaked.
//
// exportFds sends the fds on the daemon's fd channel and publishes them for
// the session's lifetime (ExportFds); the returned bytes are the export id
// and secret (24 bytes), which travel inside a P2P handle. importFds asks
// the daemon for a one-shot ticket (ImportFds) and fetches the fds with it.
// Only processes of the exporter's uid can import. Thread-safe (the Client is).
//
// This is the upstream route (the application moves handle bytes itself).
// mooncake::Communicator does not use it: its fds travel with the group
// join and come back by view ticket (communicator.h).
#pragma once

#include <memory>

#include "mooncake/client/client.h"
#include "mooncake/common/export.h"
#include "mooncake/device/device_transport.h"

namespace mooncake {

class MOONCAKE_API DaemonHandleExchange final : public device::HandleExchange {
 public:
  // `client` must outlive this object.
  explicit DaemonHandleExchange(Client* client) : client_(client) {}

  absl::StatusOr<std::string> exportFds(const std::vector<int>& fds, std::string_view kind,
                                        uint64_t size) override;
  absl::StatusOr<std::vector<UniqueFd>> importFds(std::string_view exported) override;
  // The daemon's node id: handles made through this exchange name it.
  std::string nodeId() const override { return client_->nodeId(); }

 private:
  Client* client_;
};

}  // namespace mooncake
