// Daemon: mooncaked's process-level object. Owns the sockets, the gRPC
// server(s), the fd channel and the shared state; runs until Shutdown().
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "config/daemon_config.h"
#include "fdchannel/fd_channel_server.h"
#include "server/admin_service.h"
#include "server/daemon_state.h"
#include "server/local_service.h"
#include "server/peer_service.h"

namespace mooncake::daemon {

class Daemon {
 public:
  // Discovers the node and binds the sockets; nothing is served yet.
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(DaemonConfig config);
  ~Daemon();

  // Starts serving (gRPC on the UNIX socket, the fd channel, the optional
  // peer TCP server) and tells systemd READY=1 when run under it.
  absl::Status Start();
  // Tells clients, stops serving, removes the sockets. Idempotent.
  void Shutdown(const std::string& reason);

  const DaemonState& state() const { return *state_; }

 private:
  Daemon() = default;
  void AcceptLoop();

  std::unique_ptr<DaemonState> state_;
  UniqueFd listen_fd_;
  UniqueFd wake_read_, wake_write_;
  std::unique_ptr<FdChannelServer> fd_channel_;
  std::unique_ptr<LocalService> local_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<PeerService> peer_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> peer_server_;
  std::thread accept_thread_;
  std::atomic<bool> shut_down_{false};
};

// sd_notify(3) without libsystemd: a datagram to $NOTIFY_SOCKET. No-op when
// not started by systemd.
void NotifySystemd(const std::string& message);

}  // namespace mooncake::daemon
