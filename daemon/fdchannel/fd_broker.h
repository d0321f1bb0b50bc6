// FdBroker: the one owner of the fds mooncaked holds for sessions.
//
// It owns the TicketStore (fds in transit between the fd channel and RPCs)
// and the ExportRegistry (fds a session publishes), and offers every
// operation the services need as one call, so no service coordinates the
// two stores itself:
//   fd channel   AddIncoming (PUT), Redeem (GET)
//   JoinGroup    TakeIncoming; the broker IssueForGroup's each member's fds
//   ExportFds    Export = TakeIncoming + publish
//   ImportFds    Import = look up + IssueOutgoing
//   session end  DropSession
//
// No leak when a session ends concurrently, by construction: every call
// that stores something for a session (AddIncoming, Export, Import,
// IssueOutgoing) checks under a shared lock that the sessions involved are
// still open in the SessionRegistry, and DropSession takes the same lock
// exclusively. The contract (kept by SessionLifecycle::End, the one place
// sessions end) is that a session is closed in the registry BEFORE
// DropSession: then an addition either runs before DropSession, which frees
// it, or after it, and sees the session closed.
//
// Every fd it holds is charged to the uid that sent it, once per bundle
// however many tickets, exports and group members share the bundle, until
// the bundle is freed (FdLimits; see AdmissionCounter).
//
// Errors: FailedPrecondition for a session that ended, InvalidArgument for a
// bad kind, ResourceExhausted past kMaxIncomingPerSession or the fd limits
// (naming the config key), and the
// TicketStore errors (NotFound, PermissionDenied) and ExportRegistry's
// NotFound (also for another user's export: no oracle for probing ids).
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "admission/admission_counter.h"
#include "fdchannel/export_registry.h"
#include "fdchannel/fd_ticket_issuer.h"
#include "fdchannel/ticket_store.h"
#include "mooncake/common/unique_fd.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

struct FdLimits {
  uint64_t per_uid = 4096;  // max_fds_per_uid
  uint64_t total = 8192;    // max_fds, all unprivileged uids
};

class FdBroker final : public FdTicketIssuer {
 public:
  // Unused incoming tickets one session may hold at once.
  static constexpr size_t kMaxIncomingPerSession = 64;
  static constexpr size_t kMaxKindLength = 64;

  // `sessions` is not owned and must outlive this; it answers "is this
  // session still open?".
  FdBroker(absl::Duration ticket_ttl, const SessionRegistry* sessions, FdLimits limits = {});
  FdBroker(const FdBroker&) = delete;
  FdBroker& operator=(const FdBroker&) = delete;

  // fd channel PUT: holds `fds` until an RPC of the same session names the
  // returned ticket (or the TTL passes).
  absl::StatusOr<std::string> AddIncoming(const SessionInfo& session, std::vector<UniqueFd> fds);
  // Consumes an incoming ticket `session` PUT earlier.
  absl::StatusOr<FdBundlePtr> TakeIncoming(uint64_t session, const std::string& ticket);

  // A single-use ticket with which `recipient` GETs `bundle` (owned by
  // `owner_session`). FailedPrecondition when either session has ended.
  absl::StatusOr<std::string> IssueOutgoing(uint64_t owner_session, const SessionInfo& recipient,
                                            FdBundlePtr bundle);
  absl::StatusOr<std::string> IssueForGroup(uint64_t owner_session, uint32_t uid,
                                            FdBundlePtr bundle,
                                            std::shared_ptr<const std::vector<uint64_t>> audience,
                                            uint32_t uses) override;
  // fd channel GET: uses an outgoing or group ticket issued to (session, uid).
  absl::StatusOr<FdBundlePtr> Redeem(const std::string& ticket, uint64_t session, uint32_t uid);

  // Publishes the fds of `session`'s incoming `ticket` until the session
  // ends. The kind is checked before the ticket is consumed.
  absl::StatusOr<ExportRecord> Export(const SessionInfo& session, const std::string& ticket,
                                      std::string kind, uint64_t size);
  struct Imported {
    ExportRecord record;
    std::string ticket;  // outgoing, for the importer to GET the fds
  };
  // Opens export `id` for `session` (same uid and tenant as the exporter,
  // right secret).
  absl::StatusOr<Imported> Import(const SessionInfo& session, uint64_t id,
                                  absl::string_view secret);

  // Frees every ticket and export of the session. Call after the session is
  // closed in the SessionRegistry (see above).
  void DropSession(uint64_t session);

  // For the admin listing and tests.
  size_t ExportsOf(uint64_t session) const;
  size_t PendingTicketsFor(uint64_t session) const;
  size_t TicketCount() const;
  size_t ExportCount() const;
  // fds held for `uid`, and for all unprivileged uids.
  uint64_t FdsHeldBy(const Principal& who) const { return fd_budget_.HeldBy(who); }
  uint64_t FdsHeld() const { return fd_budget_.HeldByUnprivileged(); }

 private:
  absl::Status CheckOpen(uint64_t session) const ABSL_SHARED_LOCKS_REQUIRED(end_mu_);

  const SessionRegistry* const sessions_;
  // Declared before the stores: bundles give their charge back on the way out.
  AdmissionCounter fd_budget_;
  TicketStore tickets_;
  ExportRegistry exports_;
  // Shared by additions, exclusive for DropSession (see the header comment);
  // the stores have their own locks for their maps.
  mutable absl::Mutex end_mu_;
};

}  // namespace mooncake::daemon
