// TicketStore: fds in transit between the fd channel and RPCs.
//
// gRPC cannot carry fds, so they travel on the fd channel and RPCs name
// them by ticket. Two directions:
//  - incoming: a session PUTs fds and gets a ticket; an RPC of the SAME
//    session consumes it (TakeIncoming).
//  - outgoing: an RPC issues a ticket for a recipient session to GET a
//    bundle owned by another session (Issue/Redeem).
//  - group: the fds of one member of a formed group, offered to the other
//    members at once (IssueShared/Redeem): redeemable by any session of an
//    audience, a fixed number of times in all.
// Every ticket is bound to a uid, incoming and outgoing ones to one session
// and one use; all expire after the TTL. Session end drops the tickets it
// owns or may redeem alone.
// Owned by FdBroker, which orders additions against session end; nothing
// else in the daemon holds one. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mooncake/common/unique_fd.h"

namespace mooncake::daemon {

// A set of fds owned by the daemon on behalf of a session. Shared so a
// bundle can be offered to several recipients without duplicating fds
// until one redeems it.
struct FdBundle {
  std::vector<UniqueFd> fds;
  // The owner's fd budget, given back when the bundle is freed.
  std::shared_ptr<const void> charge;
};
using FdBundlePtr = std::shared_ptr<const FdBundle>;

class TicketStore {
 public:
  explicit TicketStore(absl::Duration ttl) : ttl_(ttl) {}

  std::string AddIncoming(uint64_t session, uint32_t uid, std::vector<UniqueFd> fds,
                          std::shared_ptr<const void> charge = nullptr);
  absl::StatusOr<FdBundlePtr> TakeIncoming(const std::string& ticket, uint64_t session);

  std::string IssueOutgoing(uint64_t owner_session, uint64_t recipient_session,
                            uint32_t recipient_uid, FdBundlePtr bundle);
  // `audience` sorted; `uses` >= 1.
  std::string IssueShared(uint64_t owner_session, uint32_t uid, FdBundlePtr bundle,
                          std::shared_ptr<const std::vector<uint64_t>> audience, uint32_t uses);
  absl::StatusOr<FdBundlePtr> Redeem(const std::string& ticket, uint64_t session, uint32_t uid);

  // Drops tickets owned by `session` or issued to it.
  void DropSession(uint64_t session);
  size_t PendingFor(uint64_t session) const;
  // Incoming tickets the session holds (not yet named by an RPC).
  size_t IncomingFor(uint64_t session) const;
  size_t size() const;

 private:
  struct Ticket {
    bool incoming = false;
    uint64_t owner = 0;      // whose fds these are
    uint64_t recipient = 0;  // who may redeem (when no audience)
    uint32_t uid = 0;
    absl::Time expires;
    FdBundlePtr bundle;
    std::shared_ptr<const std::vector<uint64_t>> audience;  // group tickets
    uint32_t uses_left = 1;
  };
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(std::map<std::string, Ticket>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NewTicketLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration ttl_;
  mutable absl::Mutex mu_;
  // Expired tickets are swept at most every min(1 s, ttl/4) (a 256-rank group
  // issues 65280 tickets at once); lookups check expiry themselves.
  absl::Time next_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<std::string, Ticket> tickets_ ABSL_GUARDED_BY(mu_);
  // Incoming tickets per owner, so the per-session cap costs no scan.
  std::map<uint64_t, size_t> incoming_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mooncake::daemon
