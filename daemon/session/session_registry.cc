#include "session/session_registry.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "admission/admission_counter.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/status.h"

namespace mooncake::daemon {

std::string HexEncode(absl::string_view bytes) { return absl::BytesToHexString(bytes); }

Scope ScopeOf(const PeerCred& cred, const std::string& tenant) {
  const bool root = cred.uid == 0;
  return Scope{cred.uid, tenant, root, root && tenant.empty()};
}

absl::StatusOr<SessionInfo> SessionRegistry::Open(const PeerCred& cred, int conn_fd,
                                                  std::string client_name, std::string tenant) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("mooncaked is shutting down");
  if (client_name.size() > kMaxClientNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_name is ", client_name.size(), " bytes; the limit is ",
                     kMaxClientNameBytes, ": choose a shorter ClientOptions::client_name"));
  }
  // Per principal: the same uid on another tenant's socket is another user
  // (root in one tenant's container cannot spend another's budget).
  const Principal who{cred.uid, tenant};
  uint32_t same_uid = 0;
  for (const auto& [id, e] : sessions_) {
    if (e.info.connection_fd == conn_fd) {
      return absl::AlreadyExistsError(absl::StrCat("this connection already has session ", id,
                                                   "; open one session per connection"));
    }
    if (e.info.cred.uid == cred.uid && e.info.tenant == tenant) ++same_uid;
  }
  // Root and the daemon's own uid on the main socket are counted but never
  // refused, as by every other per-user limit (docs/limits.md).
  if (same_uid >= max_per_uid_ && !AdmissionCounter::Privileged(who)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who.Describe(), " already has ", same_uid, " sessions; the limit is ", max_per_uid_,
        " (max_sessions_per_uid in mooncaked.conf): close clients that are done"));
  }
  Entry e;
  e.info.id = next_id_++;
  e.info.cred = cred;
  e.info.tenant = std::move(tenant);
  e.info.token = RandomBytes(16);
  e.info.client_name = std::move(client_name);
  e.info.connection_fd = conn_fd;
  e.info.opened = absl::Now();
  SessionInfo info = e.info;
  sessions_.emplace(info.id, std::move(e));
  return info;
}

bool SessionRegistry::Close(uint64_t id) {
  absl::MutexLock lock(&mu_);
  return sessions_.erase(id) > 0;
}

std::optional<SessionInfo> SessionRegistry::Find(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::nullopt;
  return it->second.info;
}

std::optional<SessionInfo> SessionRegistry::FindByConnection(int conn_fd) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : sessions_) {
    if (e.info.connection_fd == conn_fd) return e.info;
  }
  return std::nullopt;
}

absl::StatusOr<SessionInfo> SessionRegistry::Authenticate(uint64_t id, absl::string_view token,
                                                          uint32_t uid,
                                                          absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  // One message for "no such session" and "wrong token" so ids can't be probed.
  auto denied = absl::PermissionDeniedError(absl::StrCat(
      "fd channel: session ", id, " is not open for this caller (session closed or wrong token)"));
  if (it == sessions_.end()) return denied;
  const std::string& want = it->second.info.token;
  if (token.size() != want.size()) return denied;
  unsigned char diff = 0;
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(want[i] ^ token[i]);
  if (diff != 0 || it->second.info.cred.uid != uid || it->second.info.tenant != tenant) {
    return denied;
  }
  return it->second.info;
}

void SessionRegistry::Post(uint64_t id, mooncake::v1::SessionEvent event) {
  std::function<void()> notify;
  std::optional<SessionInfo> overflowed;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second.dropped) return;
    if (it->second.queue.size() >= kMaxQueuedEvents) {
      it->second.dropped = true;
      it->second.queue.clear();
      it->second.queue.shrink_to_fit();
      overflowed = it->second.info;
    } else {
      it->second.queue.push_back(std::move(event));
      notify = it->second.notifier;
    }
  }
  if (overflowed) {
    const std::string reason = absl::StrCat(
        "session ", overflowed->id, " of ",
        Principal{overflowed->cred.uid, overflowed->tenant}.Describe(), " (pid ",
        overflowed->cred.pid, ", client '", EscapeForDisplay(overflowed->client_name, 64),
        "') dropped: it left ", kMaxQueuedEvents,
        " events unread on its session stream (a client must keep reading it)");
    if (overflow_) overflow_(*overflowed, reason);
    return;
  }
  if (notify) notify();
}

void SessionRegistry::SetNotifier(uint64_t id, std::function<void()> notifier) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) it->second.notifier = std::move(notifier);
}

std::vector<mooncake::v1::SessionEvent> SessionRegistry::TakeEvents(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return {};
  std::vector<mooncake::v1::SessionEvent> out(std::make_move_iterator(it->second.queue.begin()),
                                              std::make_move_iterator(it->second.queue.end()));
  it->second.queue.clear();
  return out;
}

std::optional<std::vector<mooncake::v1::SessionEvent>> SessionRegistry::Wait(
    uint64_t id, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = sessions_.find(id);
    return shut_down_ || it == sessions_.end() || !it->second.queue.empty();
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::nullopt;
  std::vector<mooncake::v1::SessionEvent> out(std::make_move_iterator(it->second.queue.begin()),
                                              std::make_move_iterator(it->second.queue.end()));
  it->second.queue.clear();
  if (out.empty() && shut_down_) return std::nullopt;
  return out;
}

void SessionRegistry::Shutdown(const std::string& reason) {
  std::vector<std::function<void()>> notify;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    for (auto& [id, e] : sessions_) {
      mooncake::v1::SessionEvent ev;
      ev.mutable_shutdown()->set_reason(reason);
      e.queue.push_back(std::move(ev));
      if (e.notifier) notify.push_back(e.notifier);
    }
  }
  for (auto& n : notify) n();
}

std::vector<SessionInfo> SessionRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<SessionInfo> out;
  for (const auto& [id, e] : sessions_) out.push_back(e.info);
  return out;
}

size_t SessionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace mooncake::daemon
