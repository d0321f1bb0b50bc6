#include "fdchannel/fd_channel_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "absl/strings/str_cat.h"
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

}  // namespace

FdChannelServer::FdChannelServer(UniqueFd listen_fd, const SessionRegistry* sessions, FdBroker* fds)
    : listen_fd_(std::move(listen_fd)), sessions_(sessions), fds_(fds) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0) {
    wake_read_.reset(p[0]);
    wake_write_.reset(p[1]);
  }
}

FdChannelServer::~FdChannelServer() { Stop(); }

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
    for (int fd : conns_) ::shutdown(fd, SHUT_RDWR);
  }
  while (active_.load() > 0) ::usleep(1000);
}

void FdChannelServer::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd p[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
    int rc = ::poll(p, 2, -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      MC_LOG(kError, "fd channel: poll: ", std::strerror(errno));
      return;
    }
    if (p[1].revents != 0) return;
    int c = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      // Out of fds: back off instead of spinning on a readable listener.
      if (errno == EMFILE || errno == ENFILE) ::usleep(100000);
      continue;
    }
    // Each connection gets a thread; cap them so idle connections cannot
    // exhaust the daemon's threads (thread creation failing would abort it).
    if (active_.load() >= kMaxConnections) {
      MC_LOG(kWarning, "fd channel: ", kMaxConnections, " connections busy; refusing one");
      ::close(c);
      continue;
    }
    active_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(conns_mu_);
      conns_.insert(c);
    }
    auto serve = [this, c] {
      {
        UniqueFd conn(c);
        Serve(conn.get());
        // Forget the number before closing it, so a new connection that
        // reuses it is never dropped from the set.
        std::lock_guard<std::mutex> lock(conns_mu_);
        conns_.erase(c);
      }
      active_.fetch_sub(1);
    };
    try {
      std::thread(serve).detach();
    } catch (const std::system_error& e) {
      {
        std::lock_guard<std::mutex> lock(conns_mu_);
        conns_.erase(c);
      }
      ::close(c);
      active_.fetch_sub(1);
      MC_LOG(kWarning, "fd channel: cannot start a connection thread: ", e.what());
    }
  }
}

void FdChannelServer::Serve(int sock) {
  absl::StatusOr<PeerCred> cred = GetPeerCred(sock);
  if (!cred.ok()) return;
  // A client sends a request right after connecting; an idle connection is
  // closed so it cannot pin a thread.
  bool first = true;
  while (!stopping_.load()) {
    absl::StatusOr<Frame> frame = RecvFrame(sock, first ? absl::Seconds(2) : absl::Seconds(10));
    first = false;
    if (!frame.ok()) return;
    mooncake::v1::FdRequest req;
    if (!req.ParseFromString(frame->payload)) {
      ReplyError(sock, absl::InvalidArgumentError("fd channel: malformed request"));
      return;
    }
    absl::StatusOr<SessionInfo> session =
        sessions_->Authenticate(req.session_id(), req.session_token(), cred->uid);
    if (!session.ok()) {
      ReplyError(sock, session.status());
      continue;
    }
    switch (req.op()) {
      case mooncake::v1::FdRequest::PUT: {
        if (frame->fds.empty() || frame->fds.size() != req.fd_count()) {
          ReplyError(sock, absl::InvalidArgumentError(
                               absl::StrCat("fd channel: PUT announced ", req.fd_count(),
                                            " fds but carried ", frame->fds.size())));
          continue;
        }
        absl::StatusOr<std::string> ticket = fds_->AddIncoming(*session, std::move(frame->fds));
        if (!ticket.ok()) {
          ReplyError(sock, ticket.status());
          continue;
        }
        mooncake::v1::FdReply r;
        r.set_ok(true);
        r.set_ticket(*std::move(ticket));
        Reply(sock, r);
        break;
      }
      case mooncake::v1::FdRequest::GET: {
        absl::StatusOr<FdBundlePtr> bundle = fds_->Redeem(req.ticket(), session->id, cred->uid);
        if (!bundle.ok()) {
          ReplyError(sock, bundle.status());
          continue;
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
  }
}

}  // namespace mooncake::daemon
