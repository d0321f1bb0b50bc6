// Another uid cannot import this user's exports, redeem its tickets, or see
// or join its groups. Tests run as root; the intruder child drops to nobody.
#include <grp.h>
#include <pwd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/escaping.h"
#include "daemon_process.h"
#include "gtest/gtest.h"
#include "mooncake/client/client.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

TEST(Permission, OtherUidGetsPermissionDenied) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to start a process as another uid";
  passwd* nobody = ::getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  TempDir dir;
  // World-connectable socket so the intruder reaches the daemon at all; the
  // default 0660 would already stop it at connect().
  DaemonProcess daemon(dir.path(), {"--socket-mode", "0666"});
  auto c = Client::Connect({.socket_path = daemon.socket()});
  ASSERT_TRUE(c.ok()) << c.status();
  int fd = ::memfd_create("secret", MFD_CLOEXEC);
  auto e = (*c)->exportFds({fd}, "memfd", 4096);
  ASSERT_TRUE(e.ok()) << e.status();
  // A real ticket, issued to root's rank 1 for rank 0's fd.
  auto d = Client::Connect({.socket_path = daemon.socket()});
  ASSERT_TRUE(d.ok()) << d.status();
  std::thread holder([&] {
    EXPECT_TRUE((*c)->joinGroup({.group = "shared",
                                 .rank = 0,
                                 .world_size = 2,
                                 .timeout = absl::Seconds(5),
                                 .fds = {fd}})
                    .ok());
  });
  auto view =
      (*d)->joinGroup({.group = "shared", .rank = 1, .world_size = 2, .timeout = absl::Seconds(5)});
  holder.join();
  ASSERT_TRUE(view.ok()) << view.status();
  const std::string ticket = view->members[0].fd_ticket;
  ASSERT_FALSE(ticket.empty());
  Child intruder = Child::Spawn({BinDir() + "/mc_test_client", "denied", daemon.socket(),
                                 std::to_string(e->id), absl::BytesToHexString(e->secret), ticket},
                                static_cast<int>(nobody->pw_uid));
  ASSERT_FALSE(intruder.WaitForLine("DONE", 15000).empty()) << intruder.output();
  const std::string out = intruder.output();
  const std::string denied = std::to_string(static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_NE(out.find("UID " + std::to_string(nobody->pw_uid)), std::string::npos) << out;
  // An export of another uid answers as if there were none (no id oracle).
  const std::string not_found = std::to_string(static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_NE(out.find("IMPORT code=" + not_found), std::string::npos) << out;
  EXPECT_NE(out.find("FETCH code=" + denied), std::string::npos) << out;
  // The intruder's join of "shared" lands in its own namespace and never forms.
  EXPECT_NE(out.find("JOIN code=" +
                     std::to_string(static_cast<int>(absl::StatusCode::kDeadlineExceeded))),
            std::string::npos)
      << out;
  // It sees none of root's groups.
  EXPECT_NE(out.find("GROUPS ok=1 n=0"), std::string::npos) << out;
  EXPECT_EQ(intruder.Wait(5000), 0);
  // Root's group is untouched and the ticket still works for its owner.
  v1::ListGroupsResponse g = ListGroups(daemon.socket());
  ASSERT_EQ(g.groups_size(), 1);
  EXPECT_EQ(g.groups(0).uid(), 0u);
  EXPECT_EQ(g.groups(0).joined(), 2u);
  auto fds = (*d)->fetchFds(ticket);
  EXPECT_TRUE(fds.ok()) << fds.status();
  ::close(fd);
}

TEST(Permission, DefaultSocketModeKeepsOtherUsersOut) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to start a process as another uid";
  passwd* nobody = ::getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  TempDir dir;
  DaemonProcess daemon(dir.path());
  Child intruder =
      Child::Spawn({BinDir() + "/mc_test_client", "denied", daemon.socket(), "1", "00", "00"},
                   static_cast<int>(nobody->pw_uid));
  const std::string line = intruder.WaitForLine("CONNECT code=", 10000);
  ASSERT_FALSE(line.empty()) << intruder.output();
  EXPECT_EQ(intruder.Wait(5000), 0);
  // Not "is the service running?": the daemon is there; say who may connect.
  const std::string denied = std::to_string(static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(line.rfind("CONNECT code=" + denied + " permission denied on mooncaked's socket " +
                           daemon.socket() + " (mode 0660, owner root, group 'root'): uid " +
                           std::to_string(nobody->pw_uid),
                       0),
            0u)
      << line;
  EXPECT_NE(line.find("set socket_group in /etc/mooncake/mooncaked.conf"), std::string::npos)
      << line;
  EXPECT_EQ(line.find("is the service running"), std::string::npos) << line;

  // mcctl says the same, in one line.
  Child mcctl = Child::Spawn(
      {"/bin/sh", "-c",
       StagedForOtherUids(BinDir() + "/mcctl") + " --socket " + daemon.socket() + " status 2>&1"},
      static_cast<int>(nobody->pw_uid));
  EXPECT_EQ(mcctl.Wait(10000), 2);
  EXPECT_EQ(mcctl.output(), "mcctl: " + line.substr(line.find("permission denied")) + "\n");
}

// With socket_group set, the advice names that group and how to join it.
TEST(Permission, SocketGroupAdviceNamesTheGroup) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to start a process as another uid";
  passwd* nobody = ::getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  group* daemon_group = ::getgrnam("daemon");
  if (daemon_group == nullptr) GTEST_SKIP() << "no group 'daemon' on this machine";
  TempDir dir;
  const std::string conf = dir.path() + "/mooncaked.conf";
  std::FILE* f = std::fopen(conf.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("socket_group = daemon\n", f);
  std::fclose(f);
  DaemonProcess daemon(dir.path(), {"--config", conf});
  Child intruder =
      Child::Spawn({BinDir() + "/mc_test_client", "denied", daemon.socket(), "1", "00", "00"},
                   static_cast<int>(nobody->pw_uid));
  const std::string line = intruder.WaitForLine("CONNECT code=", 10000);
  EXPECT_EQ(intruder.Wait(5000), 0);
  EXPECT_NE(
      line.find("(mode 0660, owner root, group 'daemon'): uid " + std::to_string(nobody->pw_uid) +
                " (nobody) is not in group 'daemon'; ask an administrator to add you to "
                "group 'daemon' (usermod -aG daemon $USER), then log in again"),
      std::string::npos)
      << line;
}

}  // namespace
}  // namespace mooncake::testing
