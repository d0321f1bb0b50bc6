// FdChannelServer: serves the fd side channel ("<socket>.fd").
//
// Each request frame is an FdRequest; PUT carries fds (SCM_RIGHTS) and
// returns a ticket, GET returns the fds of a ticket. The caller is
// authenticated by its session id + token AND by the uid read with
// SO_PEERCRED on this connection, so a leaked token alone is not enough.
// One short-lived thread per connection; requests time out.
//
// It sees the core through two narrow pieces: the SessionRegistry to
// authenticate (read only) and the FdBroker to store and hand out fds. Both
// are owned by Daemon and must outlive this.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "fdchannel/fd_broker.h"
#include "mooncake/common/unique_fd.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

class FdChannelServer {
 public:
  static constexpr int kMaxConnections = 256;

  // Takes a bound, listening socket.
  FdChannelServer(UniqueFd listen_fd, const SessionRegistry* sessions, FdBroker* fds);
  ~FdChannelServer();

  void Start();
  void Stop();

 private:
  void AcceptLoop();
  void Serve(int sock);

  UniqueFd listen_fd_;
  UniqueFd wake_read_, wake_write_;
  const SessionRegistry* sessions_;
  FdBroker* fds_;
  std::thread thread_;
  std::atomic<int> active_{0};
  std::atomic<bool> stopping_{false};
  // Connections being served, so Stop() can wake their blocked reads.
  std::mutex conns_mu_;
  std::set<int> conns_;
};

}  // namespace mooncake::daemon
