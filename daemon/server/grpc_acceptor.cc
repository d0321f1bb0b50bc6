#include "server/grpc_acceptor.h"

#include <fcntl.h>
#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon {
namespace {

constexpr absl::Duration kSweepPeriod = absl::Seconds(1);
// A uid at its cap that keeps connecting makes the acceptor sweep to see
// whether some of its connections ended; at most this often.
constexpr absl::Duration kRefusalSweepPeriod = absl::Milliseconds(100);
constexpr int kMaxAcceptsPerWake = 64;

}  // namespace

GrpcAcceptor::GrpcAcceptor(UniqueFd listen_fd, ConnectionTable* table, AdmissionCounter* admission,
                           absl::Duration handshake_timeout)
    : table_(table), admission_(admission), handshake_timeout_(handshake_timeout) {
  listeners_.push_back(Listener{std::move(listen_fd), ""});
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0) {
    wake_read_.reset(p[0]);
    wake_write_.reset(p[1]);
  }
}

GrpcAcceptor::~GrpcAcceptor() { Stop(); }

void GrpcAcceptor::AddTenantListener(UniqueFd listen_fd, std::string tenant) {
  listeners_.push_back(Listener{std::move(listen_fd), std::move(tenant)});
}

void GrpcAcceptor::Start(grpc::Server* server) {
  server_ = server;
  thread_ = std::thread([this] { Loop(); });
}

void GrpcAcceptor::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_write_) (void)!::write(wake_write_.get(), "x", 1);
  if (thread_.joinable()) thread_.join();
}

void GrpcAcceptor::Loop() {
  absl::Time next_sweep = absl::Now() + kSweepPeriod;
  absl::Time backoff_until = absl::InfinitePast();
  while (!stopping_.load()) {
    absl::Time now = absl::Now();
    if (now >= next_sweep) {
      ConnectionTable::SweepResult r = table_->Sweep(now, handshake_timeout_);
      if (r.shut_down > 0) {
        if (counters_ != nullptr) {
          counters_->RecordRefused(metrics::RefusalReason::kHandshake, r.shut_down);
        }
        handshake_log_.Log(
            LogLevel::kInfo,
            absl::StrCat("closed ", r.shut_down, " connection(s) that started no RPC within ",
                         absl::ToInt64Milliseconds(handshake_timeout_),
                         " ms of accept (handshake_timeout_ms)"));
      }
      next_sweep = now + kSweepPeriod;
    }
    // While out of fds the listener stays readable: wait out the back-off
    // on the wake pipe alone instead of spinning on it.
    bool backing_off = now < backoff_until;
    absl::Time wake = backing_off ? std::min(next_sweep, backoff_until) : next_sweep;
    int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(wake - now)) + 1;
    std::vector<pollfd> p;
    p.reserve(1 + listeners_.size());
    p.push_back({wake_read_.get(), POLLIN, 0});
    for (const Listener& l : listeners_) p.push_back({l.fd.get(), POLLIN, 0});
    int rc = ::poll(p.data(), backing_off ? 1 : p.size(), timeout_ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      MC_LOG(kError, "accept loop: poll: ", std::strerror(errno));
      return;
    }
    if (p[0].revents != 0) return;
    if (backing_off) continue;
    for (size_t l = 0; l < listeners_.size(); ++l) {
      if (p[l + 1].revents != 0) AcceptFrom(listeners_[l], &backoff_until);
    }
  }
}

void GrpcAcceptor::AcceptFrom(const Listener& listener, absl::Time* backoff_until) {
  for (int i = 0; i < kMaxAcceptsPerWake; ++i) {
    // gRPC needs the fd non-blocking, or every call ends in DEADLINE_EXCEEDED.
    int c = ::accept4(listener.fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_error_log_.Log(LogLevel::kWarning,
                              absl::StrCat("accept: ", std::strerror(errno),
                                           "; not accepting for 100 ms (raise LimitNOFILE= or "
                                           "lower the connection and fd limits)"));
        *backoff_until = absl::Now() + absl::Milliseconds(100);
      }
      break;  // EAGAIN: drained; ECONNABORTED and the like: next wake
    }
    UniqueFd conn(c);
    absl::StatusOr<PeerCred> cred = GetPeerCred(c);
    if (!cred.ok()) continue;
    absl::Status admitted = admission_->TryTake(Principal{cred->uid, listener.tenant});
    if (!admitted.ok() && absl::Now() - last_refusal_sweep_ >= kRefusalSweepPeriod) {
      // Maybe some of the uid's connections ended since the last sweep.
      last_refusal_sweep_ = absl::Now();
      ConnectionTable::SweepResult swept = table_->Sweep(last_refusal_sweep_, handshake_timeout_);
      if (counters_ != nullptr && swept.shut_down > 0) {
        counters_->RecordRefused(metrics::RefusalReason::kHandshake, swept.shut_down);
      }
      admitted = admission_->TryTake(Principal{cred->uid, listener.tenant});
    }
    if (!admitted.ok()) {
      if (counters_ != nullptr) counters_->RecordRefused(metrics::RefusalReason::kCap);
      refused_log_.Log(LogLevel::kWarning, absl::StrCat("refused a connection from pid ", cred->pid,
                                                        ": ", admitted.message()));
      continue;  // closed by `conn`
    }
    table_->Add(c, *cred, absl::Now(), listener.tenant);
    MC_LOG(kDebug, "connection fd ", c, " from pid ", cred->pid, " uid ", cred->uid,
           listener.tenant.empty() ? "" : " tenant ", listener.tenant);
    grpc::AddInsecureChannelFromFd(server_, conn.release());
  }
}

}  // namespace mooncake::daemon
