#include "fdchannel/fd_broker.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace mooncake::daemon {

FdBroker::FdBroker(absl::Duration ticket_ttl, const SessionRegistry* sessions, FdLimits limits)
    : sessions_(sessions),
      fd_budget_(AdmissionLimits{"fds in mooncaked", limits.per_uid, "max_fds_per_uid",
                                 limits.total, "max_fds"}),
      tickets_(ticket_ttl) {}

absl::Status FdBroker::CheckOpen(uint64_t session) const {
  if (sessions_->Find(session)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("session ", session, " has ended; reconnect and try again"));
}

absl::StatusOr<std::string> FdBroker::AddIncoming(const SessionInfo& session,
                                                  std::vector<UniqueFd> fds) {
  absl::ReaderMutexLock lock(&end_mu_);
  if (absl::Status s = CheckOpen(session.id); !s.ok()) return s;
  if (tickets_.IncomingFor(session.id) >= kMaxIncomingPerSession) {
    return absl::ResourceExhaustedError(
        absl::StrCat("fd channel: session holds ", kMaxIncomingPerSession,
                     " unused fd tickets; name them in an RPC or let them expire"));
  }
  absl::StatusOr<std::shared_ptr<AdmissionCounter::Charge>> charge =
      fd_budget_.TryCharge(Principal{session.cred.uid, session.tenant}, fds.size());
  if (!charge.ok()) return charge.status();  // the fds close with `fds`
  return tickets_.AddIncoming(session.id, session.cred.uid, std::move(fds), *std::move(charge));
}

absl::StatusOr<FdBundlePtr> FdBroker::TakeIncoming(uint64_t session, const std::string& ticket) {
  // Removing needs no ordering against DropSession: nothing is left behind.
  return tickets_.TakeIncoming(ticket, session);
}

absl::StatusOr<std::string> FdBroker::IssueOutgoing(uint64_t owner_session,
                                                    const SessionInfo& recipient,
                                                    FdBundlePtr bundle) {
  absl::ReaderMutexLock lock(&end_mu_);
  if (absl::Status s = CheckOpen(owner_session); !s.ok()) return s;
  if (absl::Status s = CheckOpen(recipient.id); !s.ok()) return s;
  return tickets_.IssueOutgoing(owner_session, recipient.id, recipient.cred.uid, std::move(bundle));
}

absl::StatusOr<std::string> FdBroker::IssueForGroup(
    uint64_t owner_session, uint32_t uid, FdBundlePtr bundle,
    std::shared_ptr<const std::vector<uint64_t>> audience, uint32_t uses) {
  absl::ReaderMutexLock lock(&end_mu_);
  if (absl::Status s = CheckOpen(owner_session); !s.ok()) return s;
  return tickets_.IssueShared(owner_session, uid, std::move(bundle), std::move(audience), uses);
}

absl::StatusOr<FdBundlePtr> FdBroker::Redeem(const std::string& ticket, uint64_t session,
                                             uint32_t uid) {
  return tickets_.Redeem(ticket, session, uid);
}

absl::StatusOr<ExportRecord> FdBroker::Export(const SessionInfo& session, const std::string& ticket,
                                              std::string kind, uint64_t size) {
  if (kind.size() > kMaxKindLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("export kind longer than ", kMaxKindLength, " characters"));
  }
  absl::ReaderMutexLock lock(&end_mu_);
  if (!sessions_->Find(session.id)) {
    return absl::FailedPreconditionError("the session ended during ExportFds");
  }
  absl::StatusOr<FdBundlePtr> fds = tickets_.TakeIncoming(ticket, session.id);
  if (!fds.ok()) return fds.status();
  return exports_.Add(session.id, session.cred.uid, session.cred.pid, std::move(kind), size,
                      std::move(*fds), session.tenant);
}

absl::StatusOr<FdBroker::Imported> FdBroker::Import(const SessionInfo& session, uint64_t id,
                                                    absl::string_view secret) {
  absl::ReaderMutexLock lock(&end_mu_);
  if (absl::Status s = CheckOpen(session.id); !s.ok()) return s;
  // A found export's owner has not been dropped yet (DropSession removes its
  // exports), so a ticket it owns is freed by that DropSession at the latest.
  absl::StatusOr<ExportRecord> r = exports_.Lookup(id, secret, session.cred.uid, session.tenant);
  if (!r.ok()) return r.status();
  std::string ticket =
      tickets_.IssueOutgoing(r->owner_session, session.id, session.cred.uid, r->bundle);
  return Imported{*std::move(r), std::move(ticket)};
}

void FdBroker::DropSession(uint64_t session) {
  absl::WriterMutexLock lock(&end_mu_);
  tickets_.DropSession(session);
  exports_.DropSession(session);
}

size_t FdBroker::ExportsOf(uint64_t session) const { return exports_.CountFor(session); }

size_t FdBroker::PendingTicketsFor(uint64_t session) const { return tickets_.PendingFor(session); }

size_t FdBroker::TicketCount() const { return tickets_.size(); }

size_t FdBroker::ExportCount() const { return exports_.size(); }

}  // namespace mooncake::daemon
