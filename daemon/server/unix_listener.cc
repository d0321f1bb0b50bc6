#include "server/unix_listener.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/status.h"

namespace mooncake::daemon {

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, uint32_t mode,
                                    const std::string& group) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path '", path, "' is empty or longer than ", sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create socket directory ", parent.string(), ": ", ec.message()));
    }
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::AlreadyExistsError(
          absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
    }
    // Someone answering means a live daemon: never steal its socket.
    if (ConnectUnix(path).ok()) {
      return absl::AlreadyExistsError(
          absl::StrCat("another mooncaked is already serving ", path,
                       "; stop it first or pass --socket with another path"));
    }
    ::unlink(path.c_str());
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return ErrnoStatus(errno, "socket(AF_UNIX)");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // Bind under a umask that yields the final mode, so the socket is never
  // briefly more open than asked and no chmod by path (which would follow a
  // symlink swapped in after bind) is needed.
  mode_t old = ::umask(static_cast<mode_t>(~mode & 0777));
  int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  ::umask(old);
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("bind(", path, ")"));
  if (!group.empty()) {
    struct group* gr = ::getgrnam(group.c_str());
    if (gr == nullptr) {
      ::unlink(path.c_str());
      return absl::NotFoundError(absl::StrCat("socket_group '", group, "' does not exist"));
    }
    if (::lchown(path.c_str(), static_cast<uid_t>(-1), gr->gr_gid) != 0) {
      err = errno;
      ::unlink(path.c_str());
      return ErrnoStatus(err, absl::StrCat("chown(", path, ", group ", group, ")"));
    }
  }
  if (::listen(fd.get(), 1024) != 0) return ErrnoStatus(errno, absl::StrCat("listen(", path, ")"));
  return fd;
}

}  // namespace mooncake::daemon
