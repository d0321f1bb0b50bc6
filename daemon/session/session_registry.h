// SessionRegistry: who is connected, and what each session is told.
//
// A session is one client process's long-lived OpenSession stream on one
// connection. Its identity (uid, gid, pid) comes from SO_PEERCRED at
// accept, never from a message. Events for a session queue here and the
// stream's handler drains them. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/random.h"
#include "mooncake/v1/local.pb.h"

namespace mooncake::daemon {

// The longest client_name OpenSession accepts, in bytes.
inline constexpr size_t kMaxClientNameBytes = 256;

struct SessionInfo {
  uint64_t id = 0;
  PeerCred cred;
  // The tenant of the socket the session's connection came through ("" for
  // the main socket), like `cred` decided at accept and never by a message.
  // Part of every scope: groups, exports, listings (see ScopeOf).
  std::string tenant;
  std::string token;        // 16 random bytes; binds fd-channel requests
  std::string client_name;  // as the client sent it: escape before showing
  int connection_fd = -1;   // the gRPC connection it lives on
  absl::Time opened;
};

class SessionRegistry {
 public:
  explicit SessionRegistry(uint32_t max_sessions_per_uid) : max_per_uid_(max_sessions_per_uid) {}

  // Opens a session on connection `conn_fd`, accepted on the socket of
  // `tenant`. AlreadyExists when that connection has one; ResourceExhausted
  // past the per-user limit (per uid of that tenant; root on the main
  // socket is never refused, admission/principal.h); InvalidArgument for a
  // client_name over
  // kMaxClientNameBytes.
  absl::StatusOr<SessionInfo> Open(const PeerCred& cred, int conn_fd, std::string client_name,
                                   std::string tenant = {});
  // Removes the session; returns false when it was already gone.
  bool Close(uint64_t id);

  std::optional<SessionInfo> Find(uint64_t id) const;
  std::optional<SessionInfo> FindByConnection(int conn_fd) const;
  // Checks id + token (constant time) and that `uid` and `tenant` (of the
  // fd-channel socket the request came through) match the session's.
  absl::StatusOr<SessionInfo> Authenticate(uint64_t id, absl::string_view token, uint32_t uid,
                                           absl::string_view tenant = {}) const;

  // Queues an event and runs the session's notifier (outside the lock);
  // no-op when the session is gone. At most kMaxQueuedEvents wait per
  // session: a client that reads none of them (its session stream stalled)
  // would grow the daemon without end, so the event past the bound drops
  // the session instead: its queue is freed, later events are ignored, and
  // the overflow handler (set by the daemon: it shuts the connection down,
  // which ends the session as a client exit does) runs with the reason.
  static constexpr size_t kMaxQueuedEvents = 4096;
  void Post(uint64_t id, mooncake::v1::SessionEvent event);
  // Set once before serving.
  void SetOverflowHandler(std::function<void(const SessionInfo&, const std::string&)> handler) {
    overflow_ = std::move(handler);
  }
  // Called (outside the registry's lock, possibly from any thread) after
  // events are queued for the session; the streaming RPC uses it to start
  // writing instead of polling. Cleared by Close.
  void SetNotifier(uint64_t id, std::function<void()> notifier);
  // Removes and returns the queued events (empty when none or gone).
  std::vector<mooncake::v1::SessionEvent> TakeEvents(uint64_t id);
  // Waits up to `timeout` for events; returns them (possibly none). Returns
  // nullopt when the session is closed or the registry shut down.
  std::optional<std::vector<mooncake::v1::SessionEvent>> Wait(uint64_t id, absl::Duration timeout);
  // Tells every session the daemon is going away and wakes every waiter.
  void Shutdown(const std::string& reason);

  std::vector<SessionInfo> List() const;
  size_t size() const;

 private:
  struct Entry {
    SessionInfo info;
    std::deque<mooncake::v1::SessionEvent> queue;
    std::function<void()> notifier;
    bool dropped = false;  // its queue overflowed (Post)
  };
  std::function<void(const SessionInfo&, const std::string&)> overflow_;
  const uint32_t max_per_uid_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, Entry> sessions_ ABSL_GUARDED_BY(mu_);
};

// What a caller may see of the daemon's state: its own uid's entries of its
// own tenant; root on the main socket sees every uid of every tenant, root
// on a tenant's socket every uid of that tenant only.
struct Scope {
  uint32_t uid = 0;
  std::string tenant;
  bool all_uids = false;
  bool all_tenants = false;
  bool Sees(uint32_t owner_uid, absl::string_view owner_tenant) const {
    return (all_uids || owner_uid == uid) && (all_tenants || owner_tenant == tenant);
  }
};
Scope ScopeOf(const PeerCred& cred, const std::string& tenant);

std::string HexEncode(absl::string_view bytes);

}  // namespace mooncake::daemon
