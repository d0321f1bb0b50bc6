#include "fdchannel/ticket_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

void TicketStore::ExpireLocked(absl::Time now) {
  if (now < next_sweep_) return;
  next_sweep_ = now + std::min(absl::Seconds(1), ttl_ / 4);
  for (auto it = tickets_.begin(); it != tickets_.end();) {
    if (it->second.expires <= now) {
      EraseLocked(it++);
    } else {
      ++it;
    }
  }
}

void TicketStore::EraseLocked(std::map<std::string, Ticket>::iterator it) {
  if (it->second.incoming) {
    auto n = incoming_.find(it->second.owner);
    if (n != incoming_.end() && --n->second == 0) incoming_.erase(n);
  }
  tickets_.erase(it);
}

std::string TicketStore::NewTicketLocked() {
  for (;;) {
    std::string t = HexEncode(RandomBytes(16));
    if (!tickets_.contains(t)) return t;
  }
}

std::string TicketStore::AddIncoming(uint64_t session, uint32_t uid, std::vector<UniqueFd> fds,
                                     std::shared_ptr<const void> charge) {
  auto bundle = std::make_shared<FdBundle>();
  bundle->fds = std::move(fds);
  bundle->charge = std::move(charge);
  absl::MutexLock lock(&mu_);
  absl::Time now = absl::Now();
  ExpireLocked(now);
  std::string t = NewTicketLocked();
  tickets_[t] = Ticket{true, session, session, uid, now + ttl_, std::move(bundle), nullptr, 1};
  ++incoming_[session];
  return t;
}

absl::StatusOr<FdBundlePtr> TicketStore::TakeIncoming(const std::string& ticket, uint64_t session) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(absl::Now());
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || !it->second.incoming || it->second.expires <= absl::Now()) {
    return absl::NotFoundError(
        "fd ticket is unknown, used or expired: send the fds on the fd channel again");
  }
  if (it->second.recipient != session) {
    return absl::PermissionDeniedError("fd ticket belongs to another session");
  }
  FdBundlePtr b = std::move(it->second.bundle);
  EraseLocked(it);
  return b;
}

std::string TicketStore::IssueOutgoing(uint64_t owner_session, uint64_t recipient_session,
                                       uint32_t recipient_uid, FdBundlePtr bundle) {
  absl::MutexLock lock(&mu_);
  absl::Time now = absl::Now();
  ExpireLocked(now);
  std::string t = NewTicketLocked();
  tickets_[t] = Ticket{false,      owner_session,     recipient_session, recipient_uid,
                       now + ttl_, std::move(bundle), nullptr,           1};
  return t;
}

std::string TicketStore::IssueShared(uint64_t owner_session, uint32_t uid, FdBundlePtr bundle,
                                     std::shared_ptr<const std::vector<uint64_t>> audience,
                                     uint32_t uses) {
  absl::MutexLock lock(&mu_);
  absl::Time now = absl::Now();
  ExpireLocked(now);
  std::string t = NewTicketLocked();
  tickets_[t] = Ticket{false,
                       owner_session,
                       0,
                       uid,
                       now + ttl_,
                       std::move(bundle),
                       std::move(audience),
                       std::max<uint32_t>(uses, 1)};
  return t;
}

absl::StatusOr<FdBundlePtr> TicketStore::Redeem(const std::string& ticket, uint64_t session,
                                                uint32_t uid) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(absl::Now());
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || it->second.incoming || it->second.expires <= absl::Now()) {
    return absl::NotFoundError(
        "fd ticket is unknown, used or expired (tickets live "
        "ticket_ttl_ms and are redeemable once)");
  }
  const Ticket& k = it->second;
  bool allowed = k.uid == uid &&
                 (k.audience ? std::binary_search(k.audience->begin(), k.audience->end(), session)
                             : k.recipient == session);
  if (!allowed) {
    return absl::PermissionDeniedError("fd ticket was issued to another session or user");
  }
  if (--it->second.uses_left > 0) return it->second.bundle;
  FdBundlePtr b = std::move(it->second.bundle);
  EraseLocked(it);
  return b;
}

void TicketStore::DropSession(uint64_t session) {
  absl::MutexLock lock(&mu_);
  for (auto it = tickets_.begin(); it != tickets_.end();) {
    if (it->second.owner == session || (!it->second.audience && it->second.recipient == session)) {
      EraseLocked(it++);
    } else {
      ++it;
    }
  }
}

size_t TicketStore::PendingFor(uint64_t session) const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [t, k] : tickets_) n += (k.recipient == session);
  return n;
}

size_t TicketStore::IncomingFor(uint64_t session) const {
  absl::MutexLock lock(&mu_);
  auto it = incoming_.find(session);
  return it == incoming_.end() ? 0 : it->second;
}

size_t TicketStore::size() const {
  absl::MutexLock lock(&mu_);
  return tickets_.size();
}

}  // namespace mooncake::daemon
