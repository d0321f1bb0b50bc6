// FdChannelServer: serves the fd side channel ("<socket>.fd").
//
// Each request frame is an FdRequest; PUT carries fds (SCM_RIGHTS) and
// returns a ticket, GET returns the fds of a ticket. The caller is
// authenticated by its session id + token AND by the uid read with
// SO_PEERCRED on this connection, so a leaked token alone is not enough.
// Each tenant socket has its fd channel next to it (AddTenantListener); a
// request is served only for a session of the tenant whose socket it came
// through.
//
// One thread per connection, so connections are admitted under caps: per
// uid and in total (AdmissionCounter; root and the daemon's uid are never
// refused). A connection is idle while it waits for its next request; when
// a cap is reached, the oldest idle connection (of the same uid for the
// per-uid cap, of the uid holding most for the total) is closed to make
// room before a newcomer is refused. A connection idle past the first-frame
// deadline (2 s) or between requests (10 s) is closed, and a request must
// arrive whole within 5 s.
//
// It sees the core through two narrow pieces: the SessionRegistry to
// authenticate (read only) and the FdBroker to store and hand out fds. Both
// are owned by Daemon and must outlive this.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "admission/admission_counter.h"
#include "admission/rate_limited_log.h"
#include "fdchannel/fd_broker.h"
#include "mooncake/common/unique_fd.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

struct FdChannelLimits {
  uint32_t connections_per_uid = 32;
  uint32_t connections = 256;
  // Connections of privileged uids beyond `connections`: threads are finite.
  uint32_t privileged_extra = 64;
  absl::Duration first_request = absl::Seconds(2);
  absl::Duration between_requests = absl::Seconds(10);
  absl::Duration request_transfer = absl::Seconds(5);
};

class FdChannelServer {
 public:
  // Takes a bound, listening socket.
  FdChannelServer(UniqueFd listen_fd, const SessionRegistry* sessions, FdBroker* fds,
                  FdChannelLimits limits = {});
  ~FdChannelServer();

  // Also serves `listen_fd`, the fd channel of `tenant`'s socket. Before
  // Start.
  void AddTenantListener(UniqueFd listen_fd, std::string tenant);
  void Start();
  void Stop();

  size_t connections() const;

 private:
  struct Conn {
    Principal who;      // uid and the tenant of the socket it came through
    absl::Time since;   // accepted, or last request finished
    bool busy = false;  // a request is being read or answered
    bool evicted = false;
  };
  struct Listener {
    UniqueFd fd;
    std::string tenant;  // "" for the main socket's channel
  };
  void AcceptLoop();
  void AcceptFrom(const Listener& listener, absl::Time* backoff_until);
  void Admit(UniqueFd conn, uint32_t uid, const std::string& tenant);
  // Makes room for `uid` by closing an idle connection; false when none
  // may be closed. Caller holds conns_mu_.
  bool EvictIdleFor(const Principal& who, bool per_uid_full);
  void Serve(int sock, uint32_t uid, const std::string& tenant);
  void SetBusy(int sock, bool busy);

  std::vector<Listener> listeners_;  // [0]: the main socket's channel
  UniqueFd wake_read_, wake_write_;
  const SessionRegistry* sessions_;
  FdBroker* fds_;
  const FdChannelLimits limits_;
  AdmissionCounter admission_;
  std::thread thread_;
  std::atomic<int> active_{0};
  std::atomic<bool> stopping_{false};
  // Connections being served, so Stop() and eviction can wake their reads.
  mutable std::mutex conns_mu_;
  std::map<int, Conn> conns_;
  RateLimitedLog refused_log_;
};

}  // namespace mooncake::daemon
