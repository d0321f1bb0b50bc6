#include "mooncake/common/socket_access.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mooncake {
namespace {

constexpr absl::string_view kConfigFile = "/etc/mooncake/mooncaked.conf";

std::string UserName(uid_t uid) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
    return found->pw_name;
  }
  return absl::StrCat(uid);
}

std::string GroupName(gid_t gid) {
  group gr{};
  group* found = nullptr;
  std::vector<char> buf(16384);
  if (::getgrgid_r(gid, &gr, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
    return found->gr_name;
  }
  return absl::StrCat(gid);
}

bool ProcessHoldsGroup(gid_t gid) {
  if (::getegid() == gid) return true;
  int n = ::getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  n = ::getgroups(n, groups.data());
  return n > 0 && std::find(groups.begin(), groups.begin() + n, gid) != groups.begin() + n;
}

// Whether the group database (not this process) puts `uid` in `gid`.
bool DatabaseListsUserInGroup(uid_t uid, gid_t gid) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return false;
  }
  int n = 64;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  if (::getgrouplist(found->pw_name, found->pw_gid, groups.data(), &n) < 0) {
    groups.resize(static_cast<size_t>(n));
    if (::getgrouplist(found->pw_name, found->pw_gid, groups.data(), &n) < 0) return false;
  }
  return std::find(groups.begin(), groups.begin() + n, gid) != groups.begin() + n;
}

}  // namespace

SocketAccessFacts InspectSocketAccess(const std::string& socket_path) {
  SocketAccessFacts f;
  f.uid = ::geteuid();
  f.user = UserName(f.uid);
  f.blocked_path = socket_path;
  // A directory without search permission hides everything below it.
  for (size_t slash = socket_path.find('/', 1); slash != std::string::npos;
       slash = socket_path.find('/', slash + 1)) {
    const std::string dir = socket_path.substr(0, slash);
    if (::faccessat(AT_FDCWD, dir.c_str(), X_OK, AT_EACCESS) != 0 && errno == EACCES) {
      f.blocked_path = dir;
      f.blocked_is_directory = true;
      break;
    }
  }
  struct stat st {};
  if (::stat(f.blocked_path.c_str(), &st) != 0) return f;
  f.stat_ok = true;
  f.mode = st.st_mode & 07777;
  f.owner = UserName(st.st_uid);
  f.group = GroupName(st.st_gid);
  f.gid = st.st_gid;
  f.in_group = ProcessHoldsGroup(st.st_gid);
  f.in_group_after_login = !f.in_group && DatabaseListsUserInGroup(f.uid, st.st_gid);
  return f;
}

std::string SocketAccessDeniedMessage(absl::string_view socket_path, const SocketAccessFacts& f) {
  std::string out = absl::StrCat("permission denied on mooncaked's socket ", socket_path);
  const std::string who = f.user.empty() || f.user == absl::StrCat(f.uid)
                              ? absl::StrCat("uid ", f.uid)
                              : absl::StrCat("uid ", f.uid, " (", f.user, ")");
  if (!f.stat_ok) {
    absl::StrAppend(&out, ": ask an administrator to let ", who, " in");
    return out;
  }
  const std::string facts =
      absl::StrFormat("(mode %04o, owner %s, group '%s')", f.mode, f.owner, f.group);
  if (f.blocked_is_directory) {
    absl::StrAppend(&out, ": directory ", f.blocked_path, " ", facts, " may not be searched");
  } else {
    absl::StrAppend(&out, " ", facts);
  }
  // connect() needs write permission on the socket, search on a directory.
  const uint32_t group_bit = f.blocked_is_directory ? 010 : 020;
  const std::string fix_mode = f.blocked_is_directory
                                   ? absl::StrCat("chmod g+x ", f.blocked_path)
                                   : absl::StrCat("socket_mode = 0660 and socket_group in ",
                                                  kConfigFile, ", then restart mooncaked");
  if ((f.mode & group_bit) == 0) {
    absl::StrAppend(&out, ": group '", f.group, "' has no ",
                    f.blocked_is_directory ? "search" : "write", " permission; ask an ",
                    "administrator to open it to the group (", fix_mode, ")");
  } else if (f.in_group) {
    absl::StrAppend(&out, ": ", who, " is in group '", f.group,
                    "' and still refused (an ACL or a security module?); ask an administrator");
  } else if (f.in_group_after_login) {
    absl::StrAppend(&out, ": ", who, " was added to group '", f.group,
                    "' after this login session started; log in again (or run 'newgrp ", f.group,
                    "')");
  } else if (f.gid == 0) {
    absl::StrAppend(&out, ": ", who, " is not in group '", f.group,
                    "'; ask an administrator to set socket_group in ", kConfigFile,
                    " to a group for mooncake users and add you to it (usermod -aG GROUP $USER), "
                    "then log in again");
  } else {
    absl::StrAppend(&out, ": ", who, " is not in group '", f.group,
                    "'; ask an administrator to add you to group '", f.group, "' (usermod -aG ",
                    f.group, " $USER), then log in again");
  }
  return out;
}

absl::Status SocketAccessDenied(const std::string& socket_path) {
  return absl::PermissionDeniedError(
      SocketAccessDeniedMessage(socket_path, InspectSocketAccess(socket_path)));
}

}  // namespace mooncake
