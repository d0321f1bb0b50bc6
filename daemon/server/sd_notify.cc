// sd_notify(3) as the documented datagram protocol ("Notification socket"
// in sd_notify(3), stable since systemd 209), not through libsystemd: the
// daemon sends READY=1, STATUS=, WATCHDOG=1 and STOPPING=1 and reads
// $WATCHDOG_USEC (systemd_watchdog.cc); the library would add a build and
// run-time dependency for those few lines. Abstract socket addresses ("@")
// are handled; the vsock: addresses of systemd 254+ (used for VMs) are not.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "server/daemon.h"

namespace mooncake::daemon {

void NotifySystemd(const std::string& message) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return;
  sockaddr_un addr{};
  size_t len = std::strlen(path);
  if (len >= sizeof(addr.sun_path)) return;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path, len);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  socklen_t alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  (void)::sendto(fd, message.data(), message.size(), MSG_NOSIGNAL,
                 reinterpret_cast<sockaddr*>(&addr), alen);
  ::close(fd);
}

}  // namespace mooncake::daemon
