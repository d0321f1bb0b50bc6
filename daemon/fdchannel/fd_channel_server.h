// FdChannelServer: serves the fd side channel ("<socket>.fd").
//
// Each request frame is an FdRequest; PUT carries fds (SCM_RIGHTS) and
// returns a ticket, GET returns the fds of a ticket. The caller is
// authenticated by its session id + token AND by the uid read with
// SO_PEERCRED on this connection, so a leaked token alone is not enough.
// One short-lived thread per connection; requests time out.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "fdchannel/ticket_store.h"
#include "mooncake/common/unique_fd.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

class FdChannelServer {
 public:
  static constexpr int kMaxConnections = 256;
  static constexpr size_t kMaxIncomingPerSession = 64;

  // Takes a bound, listening socket.
  FdChannelServer(UniqueFd listen_fd, SessionRegistry* sessions, TicketStore* tickets);
  ~FdChannelServer();

  void Start();
  void Stop();

 private:
  void AcceptLoop();
  void Serve(int sock);

  UniqueFd listen_fd_;
  UniqueFd wake_read_, wake_write_;
  SessionRegistry* sessions_;
  TicketStore* tickets_;
  std::thread thread_;
  std::atomic<int> active_{0};
  std::atomic<bool> stopping_{false};
  // Connections being served, so Stop() can wake their blocked reads.
  std::mutex conns_mu_;
  std::set<int> conns_;
};

}  // namespace mooncake::daemon
