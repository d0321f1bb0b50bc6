#include "rdma/rdma_budget.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "admission/admission_counter.h"

namespace mooncake::daemon {
namespace {

// One of the three things counted, with its limits for messages.
struct Kind {
  const char* what;
  const char* advice;
  uint64_t held_session, held_uid, more;
  uint64_t per_session, per_uid;
  const char* session_key;
  const char* uid_key;
};

// held + more > limit, without overflow (more may be any 64-bit value).
bool Over(uint64_t held, uint64_t more, uint64_t limit) {
  return more > limit || held > limit - more;
}

uint64_t Less(uint64_t have, uint64_t take) { return have - std::min(have, take); }

Principal PrincipalOf(const SessionInfo& session) {
  return Principal{session.cred.uid, session.tenant};
}

}  // namespace

absl::Status RdmaBudget::Check(const SessionInfo& session, const RdmaUsage& more) const {
  const Principal who = PrincipalOf(session);
  const RdmaUsage mine = OfSession(session.id);
  const RdmaUsage theirs = Of(who);
  const Kind kinds[] = {
      {"queue pairs", "destroy queue pairs that are done", mine.qps, theirs.qps, more.qps,
       limits_.max_qps_per_session, limits_.max_qps_per_uid, "max_qps_per_session",
       "max_qps_per_uid"},
      {"memory regions (registered regions, and the control memory of each CreateQueuePairs "
       "call)",
       "deregister regions or destroy queue pairs that are done", mine.mrs, theirs.mrs, more.mrs,
       limits_.max_mrs_per_session, limits_.max_mrs_per_uid, "max_mrs_per_session",
       "max_mrs_per_uid"},
      {"bytes of registered memory", "deregister regions that are done", mine.bytes, theirs.bytes,
       more.bytes, limits_.max_registered_bytes_per_session, limits_.max_registered_bytes_per_uid,
       "max_registered_bytes_per_session", "max_registered_bytes_per_uid"},
  };
  const bool privileged = AdmissionCounter::Privileged(who);
  for (const Kind& k : kinds) {
    if (k.more == 0) continue;
    if (Over(k.held_session, k.more, k.per_session)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("session ", session.id, " holds ", k.held_session, " ", k.what,
                       " and asks for ", k.more, " more; the limit is ", k.per_session,
                       " per session (", k.session_key, " in mooncaked.conf): ", k.advice));
    }
    if (!privileged && Over(k.held_uid, k.more, k.per_uid)) {
      return absl::ResourceExhaustedError(
          absl::StrCat(who.Describe(), " holds ", k.held_uid, " ", k.what,
                       " in its sessions on this node and asks for ", k.more,
                       " more; the limit is ", k.per_uid, " per user (", k.uid_key,
                       " in mooncaked.conf): ", k.advice, ", or end sessions that are idle"));
    }
  }
  if (!privileged && more.bytes > 0 &&
      Over(unprivileged_bytes_, more.bytes, limits_.max_registered_bytes_total)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "mooncaked holds ", unprivileged_bytes_, " bytes of registered memory for all users and ",
        who.Describe(), " asks for ", more.bytes, " more; the limit is ",
        limits_.max_registered_bytes_total,
        " on this node (max_registered_bytes_total in mooncaked.conf): try again when others "
        "have deregistered, or ask the administrator"));
  }
  return absl::OkStatus();
}

void RdmaBudget::Charge(const SessionInfo& session, const RdmaUsage& more) {
  if (more.empty()) return;
  const Principal who = PrincipalOf(session);
  SessionEntry& s = sessions_[session.id];
  s.who = who;
  RdmaUsage& u = principals_[who];
  for (RdmaUsage* use : {&s.use, &u}) {
    use->qps += more.qps;
    use->mrs += more.mrs;
    use->bytes += more.bytes;
  }
  if (!AdmissionCounter::Privileged(who)) unprivileged_bytes_ += more.bytes;
}

void RdmaBudget::Release(uint64_t session, const RdmaUsage& less) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  RdmaUsage& s = it->second.use;
  // What the session gives back is what its uid gets back, never more.
  const RdmaUsage given{std::min(s.qps, less.qps), std::min(s.mrs, less.mrs),
                        std::min(s.bytes, less.bytes)};
  s.qps -= given.qps;
  s.mrs -= given.mrs;
  s.bytes -= given.bytes;
  ReleasePrincipal(it->second.who, given);
  if (s.empty()) sessions_.erase(it);
}

RdmaUsage RdmaBudget::EndSession(uint64_t session) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return {};
  const RdmaUsage held = it->second.use;
  ReleasePrincipal(it->second.who, held);
  sessions_.erase(it);
  return held;
}

void RdmaBudget::ReleasePrincipal(const Principal& who, const RdmaUsage& less) {
  auto it = principals_.find(who);
  if (it == principals_.end()) return;
  RdmaUsage& u = it->second;
  if (!AdmissionCounter::Privileged(who)) {
    unprivileged_bytes_ = Less(unprivileged_bytes_, std::min(u.bytes, less.bytes));
  }
  u.qps = Less(u.qps, less.qps);
  u.mrs = Less(u.mrs, less.mrs);
  u.bytes = Less(u.bytes, less.bytes);
  if (u.empty()) principals_.erase(it);
}

RdmaUsage RdmaBudget::OfSession(uint64_t session) const {
  auto it = sessions_.find(session);
  return it == sessions_.end() ? RdmaUsage{} : it->second.use;
}

RdmaUsage RdmaBudget::Of(const Principal& who) const {
  auto it = principals_.find(who);
  return it == principals_.end() ? RdmaUsage{} : it->second;
}

}  // namespace mooncake::daemon
