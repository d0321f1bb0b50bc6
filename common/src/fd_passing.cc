#include "mooncake/common/fd_passing.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "mooncake/common/socket_access.h"
#include "mooncake/common/status.h"

namespace mooncake {
namespace {

// Waits until `sock` is readable/writable or the deadline passes.
absl::Status WaitFor(int sock, short events, absl::Time deadline) {
  for (;;) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("fd channel: timed out");
    pollfd p{sock, events, 0};
    int ms = static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return absl::OkStatus();
    if (rc < 0 && errno != EINTR) return ErrnoStatus(errno, "fd channel: poll");
  }
}

}  // namespace

absl::Status SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return ErrnoStatus(errno, "fcntl(O_NONBLOCK)");
  }
  return absl::OkStatus();
}

absl::Status SendFrame(int sock, absl::string_view payload, const std::vector<int>& fds,
                       absl::Duration timeout) {
  if (fds.size() > kMaxFdsPerFrame) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd channel: ", fds.size(), " fds in one frame; the limit is ", kMaxFdsPerFrame));
  }
  if (payload.size() > kMaxFrameBytes) {
    return absl::InvalidArgumentError("fd channel: frame too large");
  }
  absl::Time deadline = absl::Now() + timeout;
  std::string buf(4, '\0');
  uint32_t len = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) buf[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  buf.append(payload.data(), payload.size());

  size_t sent = 0;
  bool fds_sent = fds.empty();
  while (sent < buf.size()) {
    iovec iov{buf.data() + sent, buf.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)];
    if (!fds_sent) {
      size_t bytes = sizeof(int) * fds.size();
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(bytes);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(bytes);
      std::memcpy(CMSG_DATA(c), fds.data(), bytes);
    }
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        MC_RETURN_IF_ERROR(WaitFor(sock, POLLOUT, deadline));
        continue;
      }
      return ErrnoStatus(errno, "fd channel: sendmsg");
    }
    fds_sent = true;
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<Frame> RecvFrame(int sock, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  Frame frame;
  std::string header;
  size_t want = 4;
  std::string* target = &header;
  bool have_len = false;
  for (;;) {
    if (target->size() == want) {
      if (have_len) break;
      uint32_t len = 0;
      for (int i = 0; i < 4; ++i)
        len |= static_cast<uint32_t>(static_cast<uint8_t>(header[i])) << (8 * i);
      if (len > kMaxFrameBytes) {
        return absl::InvalidArgumentError(absl::StrCat("fd channel: frame of ", len, " bytes"));
      }
      have_len = true;
      target = &frame.payload;
      want = len;
      if (want == 0) break;
      continue;
    }
    char buf[4096];
    size_t chunk = std::min(sizeof(buf), want - target->size());
    iovec iov{buf, chunk};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        MC_RETURN_IF_ERROR(WaitFor(sock, POLLIN, deadline));
        continue;
      }
      return ErrnoStatus(errno, "fd channel: recvmsg");
    }
    // Every fd received is owned (and so closed on any error return) before
    // anything is checked.
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const int* in = reinterpret_cast<const int*>(CMSG_DATA(c));
        for (size_t i = 0; i < count; ++i) frame.fds.emplace_back(in[i]);
      }
    }
    // The limit is per frame, not per recvmsg: a sender can spread fds over
    // the bytes of one frame, one sendmsg per byte.
    if ((msg.msg_flags & MSG_CTRUNC) || frame.fds.size() > kMaxFdsPerFrame) {
      return absl::InvalidArgumentError(absl::StrCat("fd channel: more than ", kMaxFdsPerFrame,
                                                     " fds in one frame; connection dropped"));
    }
    if (n == 0) {
      return absl::UnavailableError("fd channel: peer closed the connection");
    }
    target->append(buf, static_cast<size_t>(n));
  }
  return frame;
}

absl::StatusOr<PeerCred> GetPeerCred(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus(errno, "getsockopt(SO_PEERCRED)");
  }
  return PeerCred{cred.pid, cred.uid, cred.gid};
}

absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path, absl::Duration timeout) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long (", path.size(),
                                                   " bytes, limit ", sizeof(addr.sun_path) - 1,
                                                   "): ", path));
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus(errno, "socket(AF_UNIX)");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // A full listen backlog (the daemon busy refusing a flood) makes a
  // blocking connect wait its turn; SO_SNDTIMEO bounds the wait.
  if (timeout != absl::InfiniteDuration()) {
    timeval tv = absl::ToTimeval(std::max(timeout, absl::Milliseconds(1)));
    ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
    if (errno == EINTR) continue;
    int err = errno;
    if (err == EAGAIN || err == EINPROGRESS) {
      return absl::UnavailableError(
          absl::StrCat("mooncaked at ", path, " did not accept the connection within ",
                       absl::FormatDuration(timeout), ": it is overloaded or not serving"));
    }
    // The daemon may well be running: say who may connect and how to join.
    if (err == EACCES || err == EPERM) return SocketAccessDenied(path);
    return absl::UnavailableError(absl::StrCat("cannot reach mooncaked at ", path, " (",
                                               std::strerror(err), "): is the service running?"));
  }
  return fd;
}

}  // namespace mooncake
