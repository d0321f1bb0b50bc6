// DaemonHandleExchange: the Device API's HandleExchange over mooncaked.
//
// exportFds sends the fds on the daemon's fd channel and publishes them for
// the session's lifetime (ExportFds); the returned bytes are the export id
// and secret (24 bytes), which travel inside a P2P handle. importFds asks
// the daemon for a one-shot ticket (ImportFds) and fetches the fds with it.
// Only processes of the exporter's uid can import. Thread-safe (the Client is).
#pragma once

#include <memory>

#include "mooncake/client/client.h"
#include "mooncake/device/device_transport.h"

namespace mooncake {

class DaemonHandleExchange final : public device::HandleExchange {
 public:
  // `client` must outlive this object.
  explicit DaemonHandleExchange(Client* client) : client_(client) {}

  absl::StatusOr<std::string> exportFds(const std::vector<int>& fds, std::string_view kind,
                                        uint64_t size) override;
  absl::StatusOr<std::vector<UniqueFd>> importFds(std::string_view exported) override;

 private:
  Client* client_;
};

}  // namespace mooncake
