// GrpcAcceptor: accepts connections on the main socket and hands them to
// gRPC, under the daemon's admission rules.
//
// For each connection: SO_PEERCRED gives the uid, the per-uid and total
// connection caps are checked (privileged uids are never refused, see
// AdmissionCounter), the credentials are recorded in the ConnectionTable,
// then gRPC gets the fd. Once a second the table is swept: ended
// connections give their admission back, and connections that started no
// RPC within the handshake deadline are shut down. When the process is out
// of fds, accepting backs off instead of spinning, with one log line per
// period. Refusals are logged the same way.
//
// Tenant sockets (tenant_sockets): each extra listener carries a tenant
// name, and every connection it accepts is recorded with it; the caps are
// per uid over all the sockets.
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "admission/admission_counter.h"
#include "admission/rate_limited_log.h"
#include "metrics/event_counters.h"
#include "mooncake/common/unique_fd.h"
#include "server/connection_table.h"

namespace grpc {
class Server;
}

namespace mooncake::daemon {

class GrpcAcceptor {
 public:
  // `table`, `admission` not owned; they outlive this.
  GrpcAcceptor(UniqueFd listen_fd, ConnectionTable* table, AdmissionCounter* admission,
               absl::Duration handshake_timeout);
  ~GrpcAcceptor();

  // Also accepts on `listen_fd`, whose connections belong to `tenant`
  // (non-empty). Before Start.
  void AddTenantListener(UniqueFd listen_fd, std::string tenant);
  // Starts the accept thread; `server` must outlive Stop().
  void Start(grpc::Server* server);
  // Stops accepting (connections already handed to gRPC are gRPC's).
  void Stop();
  // Where refusals are counted (metrics on; null: off). Before Start; not
  // owned, outlives this.
  void set_counters(metrics::EventCounters* counters) { counters_ = counters; }

 private:
  struct Listener {
    UniqueFd fd;
    std::string tenant;  // "" for the main socket
  };
  void Loop();
  // Accepts what is pending on `listener` (at most kMaxAcceptsPerWake).
  void AcceptFrom(const Listener& listener, absl::Time* backoff_until);

  std::vector<Listener> listeners_;  // [0]: the main socket
  UniqueFd wake_read_, wake_write_;
  ConnectionTable* const table_;
  AdmissionCounter* const admission_;
  const absl::Duration handshake_timeout_;
  grpc::Server* server_ = nullptr;
  metrics::EventCounters* counters_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  absl::Time last_refusal_sweep_ = absl::InfinitePast();
  RateLimitedLog refused_log_;
  RateLimitedLog accept_error_log_;
  RateLimitedLog handshake_log_;
};

}  // namespace mooncake::daemon
