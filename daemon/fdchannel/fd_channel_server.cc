#include "fdchannel/fd_channel_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/log.h"
#include "mooncake/v1/fd_channel.pb.h"

namespace mooncake::daemon {
namespace {

void Reply(int sock, const mooncake::v1::FdReply& reply, const std::vector<int>& fds = {}) {
  std::string bytes;
  reply.SerializeToString(&bytes);
  if (absl::Status s = SendFrame(sock, bytes, fds, absl::Seconds(5)); !s.ok()) {
    MC_LOG(kDebug, "fd channel: reply failed: ", s.message());
  }
}

void ReplyError(int sock, const absl::Status& s) {
  mooncake::v1::FdReply r;
  r.set_ok(false);
  r.set_code(static_cast<int>(s.code()));
  r.set_error(std::string(s.message()));
  Reply(sock, r);
}

// Waits until `sock` has bytes (true) or `timeout` passes / it fails (false).
bool WaitReadable(int sock, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{sock, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (rc > 0) return (p.revents & POLLIN) != 0;
    if (rc < 0 && errno != EINTR) return false;
  }
}

}  // namespace

FdChannelServer::FdChannelServer(UniqueFd listen_fd, const SessionRegistry* sessions, FdBroker* fds,
                                 FdChannelLimits limits)
    : sessions_(sessions),
      fds_(fds),
      limits_(limits),
      admission_(AdmissionLimits{"fd-channel connections", limits.connections_per_uid,
                                 "fd_channel_connections_per_uid", limits.connections,
                                 "fd_channel_connections"}) {
  listeners_.push_back(Listener{std::move(listen_fd), ""});
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0) {
    wake_read_.reset(p[0]);
    wake_write_.reset(p[1]);
  }
}

FdChannelServer::~FdChannelServer() { Stop(); }

void FdChannelServer::AddTenantListener(UniqueFd listen_fd, std::string tenant) {
  listeners_.push_back(Listener{std::move(listen_fd), std::move(tenant)});
}

void FdChannelServer::Start() {
  thread_ = std::thread([this] { AcceptLoop(); });
}

void FdChannelServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_write_) (void)!::write(wake_write_.get(), "x", 1);
  if (thread_.joinable()) thread_.join();
  // Connection threads hold pointers into us. Shutting their sockets down
  // makes a blocked read return at once; then wait for every one to end.
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    for (const auto& [fd, c] : conns_) ::shutdown(fd, SHUT_RDWR);
  }
  while (active_.load() > 0) ::usleep(1000);
}

size_t FdChannelServer::connections() const {
  std::lock_guard<std::mutex> lock(conns_mu_);
  return conns_.size();
}

void FdChannelServer::AcceptLoop() {
  absl::Time backoff_until = absl::InfinitePast();
  while (!stopping_.load()) {
    bool backing_off = absl::Now() < backoff_until;
    std::vector<pollfd> p;
    p.reserve(1 + listeners_.size());
    p.push_back({wake_read_.get(), POLLIN, 0});
    for (const Listener& l : listeners_) p.push_back({l.fd.get(), POLLIN, 0});
    int rc = ::poll(p.data(), backing_off ? 1 : p.size(), backing_off ? 100 : -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      MC_LOG(kError, "fd channel: poll: ", std::strerror(errno));
      return;
    }
    if (p[0].revents != 0) return;
    if (backing_off) continue;
    for (size_t l = 0; l < listeners_.size(); ++l) {
      if (p[l + 1].revents != 0) AcceptFrom(listeners_[l], &backoff_until);
    }
  }
}

void FdChannelServer::AcceptFrom(const Listener& listener, absl::Time* backoff_until) {
  int c = ::accept4(listener.fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (c < 0) {
    // Out of fds: back off instead of spinning on a readable listener.
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      refused_log_.Log(
          LogLevel::kWarning,
          absl::StrCat("fd channel: accept: ", std::strerror(errno), "; not accepting for 100 ms"));
      *backoff_until = absl::Now() + absl::Milliseconds(100);
    }
    return;
  }
  UniqueFd conn(c);
  absl::StatusOr<PeerCred> cred = GetPeerCred(c);
  if (!cred.ok()) return;
  Admit(std::move(conn), cred->uid, listener.tenant);
}

bool FdChannelServer::EvictIdleFor(const Principal& who, bool per_uid_full) {
  // The victim: the newcomer's own principal when its cap is full,
  // otherwise the unprivileged one holding the most idle connections.
  absl::flat_hash_map<Principal, int> idle_by;
  for (const auto& [fd, c] : conns_) {
    if (!c.busy && !c.evicted && !AdmissionCounter::Privileged(c.who)) ++idle_by[c.who];
  }
  Principal victim_of = who;
  if (!per_uid_full) {
    int most = 0;
    for (const auto& [p, n] : idle_by) {
      if (n > most) most = n, victim_of = p;
    }
    if (most == 0) return false;
  } else if (!idle_by.contains(who)) {
    return false;
  }
  int victim = -1;
  absl::Time oldest = absl::InfiniteFuture();
  for (const auto& [fd, c] : conns_) {
    if (c.who == victim_of && !c.busy && !c.evicted && c.since < oldest) {
      oldest = c.since;
      victim = fd;
    }
  }
  if (victim < 0) return false;
  Conn& v = conns_.at(victim);
  v.evicted = true;
  admission_.Give(v.who);
  // Its thread wakes from its wait, sees the connection shut and exits.
  ::shutdown(victim, SHUT_RDWR);
  return true;
}

void FdChannelServer::Admit(UniqueFd conn, uint32_t uid, const std::string& tenant) {
  const int c = conn.get();
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    if (conns_.size() >= limits_.connections + limits_.privileged_extra) {
      refused_log_.Log(LogLevel::kWarning,
                       absl::StrCat("fd channel: ", conns_.size(),
                                    " connections open; refusing one from uid ", uid));
      return;
    }
    const Principal who{uid, tenant};
    absl::Status admitted = admission_.TryTake(who);
    // Idle connections make room first: the principal's own when its cap
    // is full, then (for the total) the heaviest holder's.
    for (int attempt = 0; attempt < 2 && !admitted.ok(); ++attempt) {
      bool per_uid_full = admission_.HeldBy(who) >= limits_.connections_per_uid;
      if (!EvictIdleFor(who, per_uid_full)) break;
      admitted = admission_.TryTake(who);
    }
    if (!admitted.ok()) {
      refused_log_.Log(LogLevel::kWarning,
                       absl::StrCat("fd channel: refused a connection: ", admitted.message()));
      return;
    }
    conns_.emplace(c, Conn{who, absl::Now(), false, false});
    active_.fetch_add(1);
  }
  conn.release();
  auto serve = [this, c, uid, tenant] {
    {
      UniqueFd owned(c);
      Serve(owned.get(), uid, tenant);
      // Forget the number before closing it, so a new connection that
      // reuses it is never dropped from the map.
      std::lock_guard<std::mutex> lock(conns_mu_);
      auto it = conns_.find(c);
      if (it != conns_.end()) {
        if (!it->second.evicted) admission_.Give(it->second.who);
        conns_.erase(it);
      }
    }
    active_.fetch_sub(1);
  };
  try {
    std::thread(serve).detach();
  } catch (const std::system_error& e) {
    {
      std::lock_guard<std::mutex> lock(conns_mu_);
      auto it = conns_.find(c);
      if (it != conns_.end()) {
        if (!it->second.evicted) admission_.Give(it->second.who);
        conns_.erase(it);
      }
    }
    ::close(c);
    active_.fetch_sub(1);
    MC_LOG(kWarning, "fd channel: cannot start a connection thread: ", e.what());
  }
}

void FdChannelServer::SetBusy(int sock, bool busy) {
  std::lock_guard<std::mutex> lock(conns_mu_);
  auto it = conns_.find(sock);
  if (it == conns_.end()) return;
  it->second.busy = busy;
  if (!busy) it->second.since = absl::Now();
}

void FdChannelServer::Serve(int sock, uint32_t uid, const std::string& tenant) {
  // A client sends a request right after connecting; an idle connection is
  // closed so it cannot pin a thread.
  bool first = true;
  while (!stopping_.load()) {
    if (!WaitReadable(sock, first ? limits_.first_request : limits_.between_requests)) return;
    first = false;
    SetBusy(sock, true);
    absl::StatusOr<Frame> frame = RecvFrame(sock, limits_.request_transfer);
    if (!frame.ok()) return;  // fds of a bad frame are closed with it
    mooncake::v1::FdRequest req;
    if (!req.ParseFromString(frame->payload)) {
      ReplyError(sock, absl::InvalidArgumentError("fd channel: malformed request"));
      return;
    }
    absl::StatusOr<SessionInfo> session =
        sessions_->Authenticate(req.session_id(), req.session_token(), uid, tenant);
    if (!session.ok()) {
      ReplyError(sock, session.status());
      SetBusy(sock, false);
      continue;
    }
    switch (req.op()) {
      case mooncake::v1::FdRequest::PUT: {
        if (frame->fds.empty() || frame->fds.size() != req.fd_count()) {
          ReplyError(sock, absl::InvalidArgumentError(
                               absl::StrCat("fd channel: PUT announced ", req.fd_count(),
                                            " fds but carried ", frame->fds.size())));
          break;
        }
        absl::StatusOr<std::string> ticket = fds_->AddIncoming(*session, std::move(frame->fds));
        if (!ticket.ok()) {
          ReplyError(sock, ticket.status());
          break;
        }
        mooncake::v1::FdReply r;
        r.set_ok(true);
        r.set_ticket(*std::move(ticket));
        Reply(sock, r);
        break;
      }
      case mooncake::v1::FdRequest::GET: {
        absl::StatusOr<FdBundlePtr> bundle = fds_->Redeem(req.ticket(), session->id, uid);
        if (!bundle.ok()) {
          ReplyError(sock, bundle.status());
          break;
        }
        std::vector<int> fds;
        for (const UniqueFd& fd : (*bundle)->fds) fds.push_back(fd.get());
        mooncake::v1::FdReply r;
        r.set_ok(true);
        r.set_fd_count(static_cast<uint32_t>(fds.size()));
        Reply(sock, r, fds);
        break;
      }
      default: ReplyError(sock, absl::InvalidArgumentError("fd channel: unknown op"));
    }
    SetBusy(sock, false);
  }
}

}  // namespace mooncake::daemon
