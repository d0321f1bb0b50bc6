#include "server/connection_table.h"

#include <grpcpp/server_context.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace mooncake::daemon {
namespace {

bool SameFile(int fd, dev_t dev, ino_t ino) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == dev && st.st_ino == ino;
}

}  // namespace

void ConnectionTable::Add(int fd, const PeerCred& cred, absl::Time accepted,
                          const std::string& tenant) {
  Record r;
  r.cred = cred;
  r.tenant = tenant;
  r.accepted = accepted;
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    r.dev = st.st_dev;
    r.ino = st.st_ino;
  }
  absl::MutexLock lock(&mu_);
  // The number was free for accept, so whatever was recorded under it ended.
  if (auto it = records_.find(fd); it != records_.end()) DropLocked(it);
  records_.emplace(fd, r);
}

void ConnectionTable::MarkUsed(int fd) const {
  absl::MutexLock lock(&mu_);
  if (auto it = records_.find(fd); it != records_.end()) it->second.used = true;
}

std::optional<PeerCred> ConnectionTable::Get(int fd) const {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(fd);
  if (it == records_.end()) return std::nullopt;
  return it->second.cred;
}

void ConnectionTable::DropLocked(std::map<int, Record>::iterator it) {
  if (admission_ != nullptr) admission_->Give(Principal{it->second.cred.uid, it->second.tenant});
  records_.erase(it);
}

ConnectionTable::SweepResult ConnectionTable::Sweep(absl::Time now, absl::Duration handshake) {
  SweepResult result;
  absl::MutexLock lock(&mu_);
  for (auto it = records_.begin(); it != records_.end();) {
    Record& r = it->second;
    if (!SameFile(it->first, r.dev, r.ino)) {
      DropLocked(it++);
      ++result.ended;
      continue;
    }
    if (!r.used && !r.shut && now - r.accepted >= handshake) {
      // The fd was this connection just above. The one race left: gRPC
      // closes it and another thread's accept reuses the number in the few
      // instructions between; that socket would see one connection end.
      // gRPC sees the shutdown as the peer going away and closes the fd.
      ::shutdown(it->first, SHUT_RDWR);
      r.shut = true;
      ++result.shut_down;
    }
    ++it;
  }
  return result;
}

bool ConnectionTable::ShutDown(int fd) {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(fd);
  if (it == records_.end() || !SameFile(fd, it->second.dev, it->second.ino)) return false;
  ::shutdown(fd, SHUT_RDWR);  // the race Sweep describes is the only one left
  it->second.shut = true;
  return true;
}

size_t ConnectionTable::size() const {
  absl::MutexLock lock(&mu_);
  return records_.size();
}

absl::StatusOr<Caller> ConnectionTable::CallerOf(const grpc::ServerContextBase* ctx) const {
  int fd = FdFromPeer(ctx->peer());
  std::optional<Caller> caller;
  if (fd >= 0) {
    absl::MutexLock lock(&mu_);
    if (auto it = records_.find(fd); it != records_.end()) {
      it->second.used = true;
      caller = Caller{it->second.cred, fd, it->second.tenant};
    }
  }
  if (!caller) {
    return absl::PermissionDeniedError(
        "the local API is served only on mooncaked's UNIX socket (caller identity unknown)");
  }
  return *std::move(caller);
}

int ConnectionTable::FdFromPeer(absl::string_view peer) {
  if (!absl::StartsWith(peer, "fd:")) return -1;
  int fd = -1;
  if (!absl::SimpleAtoi(peer.substr(3), &fd) || fd < 0) return -1;
  return fd;
}

}  // namespace mooncake::daemon
