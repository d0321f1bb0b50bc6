// Why this process may not connect to a UNIX socket, and what to do about it.
//
// connect() fails with EACCES when the socket lacks write permission for the
// caller, or when a directory on its path lacks search permission. The
// daemon's socket is 0660 root:<socket_group> (deploy/README.md), so the
// usual cure is membership in that group, and the usual trap is a group
// added since the user logged in. ConnectUnix (fd_passing.h) turns EACCES
// into SocketAccessDenied(path).
//
//   absl::Status s = SocketAccessDenied("/run/mooncake/mooncaked.sock");
//   // PermissionDenied: "permission denied on mooncaked's socket
//   // /run/mooncake/mooncaked.sock (mode 0660, owner root, group 'mooncake'):
//   // uid 1001 (alice) is not in group 'mooncake'; ask an administrator to add
//   // you to group 'mooncake' (usermod -aG mooncake $USER), then log in again"
//
// Thread-safe (reentrant user and group lookups).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mooncake {

// What the caller and the file system say about a refused connect().
struct SocketAccessFacts {
  // The socket, or the first directory on its path this process cannot
  // search (then `blocked_is_directory`).
  std::string blocked_path;
  bool blocked_is_directory = false;
  bool stat_ok = false;  // false: nothing below `uid` is known
  uint32_t mode = 0;     // permission bits of blocked_path (07777)
  std::string owner;     // user name, or the uid in digits
  std::string group;     // group name, or the gid in digits
  uint32_t gid = 0;
  uint32_t uid = 0;       // the caller's effective uid
  std::string user;       // its name, or empty
  bool in_group = false;  // the caller holds `gid` now
  // The group database lists the caller in `gid` but this process does not
  // hold it: added to the group after this login session started.
  bool in_group_after_login = false;
};

// Gathers the facts for `socket_path` (stat, access checks along the path,
// the group database, getgroups()).
SocketAccessFacts InspectSocketAccess(const std::string& socket_path);

// One line: what was refused (path, mode, owner, group) and how to be let
// in. Pure: tests pass made-up facts.
std::string SocketAccessDeniedMessage(absl::string_view socket_path,
                                      const SocketAccessFacts& facts);

// PermissionDenied with SocketAccessDeniedMessage(InspectSocketAccess(path)).
absl::Status SocketAccessDenied(const std::string& socket_path);

}  // namespace mooncake
