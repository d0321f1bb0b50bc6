// ListenUnix (socket file creation and takeover rules) and ConnectionTable.
#include "server/unix_listener.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "mooncake/common/fd_passing.h"
#include "server/connection_table.h"

namespace mooncake::daemon {
namespace {

class UnixListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mc_listen_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)!std::system(cmd.c_str());
  }
  std::string dir_;
};

struct stat StatOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path << ": " << std::strerror(errno);
  return st;
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// A socket file nobody listens on, as a crashed daemon leaves behind.
void MakeStaleSocket(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM, 0));
  ASSERT_TRUE(fd.valid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
}

TEST_F(UnixListenerTest, CreatesAListeningSocketWithTheMode) {
  for (uint32_t mode : {0660u, 0600u, 0666u}) {
    const std::string path = dir_ + "/m" + std::to_string(mode) + ".sock";
    absl::StatusOr<UniqueFd> fd = ListenUnix(path, mode, "");
    ASSERT_TRUE(fd.ok()) << fd.status();
    struct stat st = StatOf(path);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, mode) << std::oct << (st.st_mode & 07777);
    EXPECT_TRUE(::fcntl(fd->get(), F_GETFL) & O_NONBLOCK);
    EXPECT_TRUE(::fcntl(fd->get(), F_GETFD) & FD_CLOEXEC);
    // It accepts connections.
    absl::StatusOr<UniqueFd> client = ConnectUnix(path);
    ASSERT_TRUE(client.ok()) << client.status();
    UniqueFd server(::accept4(fd->get(), nullptr, nullptr, SOCK_CLOEXEC));
    EXPECT_TRUE(server.valid()) << std::strerror(errno);
  }
}

TEST_F(UnixListenerTest, UmaskDoesNotWidenOrNarrowTheMode) {
  mode_t old = ::umask(0);
  absl::StatusOr<UniqueFd> open = ListenUnix(dir_ + "/u0.sock", 0660, "");
  ::umask(077);
  absl::StatusOr<UniqueFd> tight = ListenUnix(dir_ + "/u77.sock", 0660, "");
  ::umask(old);
  ASSERT_TRUE(open.ok() && tight.ok());
  EXPECT_EQ(StatOf(dir_ + "/u0.sock").st_mode & 07777, 0660u);
  EXPECT_EQ(StatOf(dir_ + "/u77.sock").st_mode & 07777, 0660u);
  EXPECT_EQ(::umask(old), old) << "ListenUnix must restore the process umask";
}

TEST_F(UnixListenerTest, StaleSocketIsReplaced) {
  const std::string path = dir_ + "/stale.sock";
  MakeStaleSocket(path);
  ASSERT_TRUE(Exists(path));
  ASSERT_FALSE(ConnectUnix(path).ok()) << "nobody listens on a stale socket";
  absl::StatusOr<UniqueFd> fd = ListenUnix(path, 0660, "");
  ASSERT_TRUE(fd.ok()) << fd.status();
  // (tmpfs may reuse the inode number, so liveness is the proof of replacement.)
  EXPECT_TRUE(ConnectUnix(path).ok()) << "the stale file was replaced by a live socket";
  EXPECT_EQ(StatOf(path).st_mode & 07777, 0660u);
}

TEST_F(UnixListenerTest, LiveSocketIsAlreadyExistsAndKeepsServing) {
  const std::string path = dir_ + "/live.sock";
  absl::StatusOr<UniqueFd> first = ListenUnix(path, 0660, "");
  ASSERT_TRUE(first.ok()) << first.status();
  ino_t ino = StatOf(path).st_ino;
  absl::StatusOr<UniqueFd> second = ListenUnix(path, 0660, "");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  EXPECT_NE(second.status().message().find("already serving " + path), absl::string_view::npos)
      << second.status();
  EXPECT_EQ(StatOf(path).st_ino, ino) << "the live daemon's socket must not be touched";
  absl::StatusOr<UniqueFd> client = ConnectUnix(path);
  ASSERT_TRUE(client.ok()) << client.status();
}

TEST_F(UnixListenerTest, NonSocketFileIsAlreadyExistsAndUntouched) {
  const std::string path = dir_ + "/important.txt";
  std::ofstream(path) << "do not delete me";
  absl::StatusOr<UniqueFd> fd = ListenUnix(path, 0660, "");
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kAlreadyExists) << fd.status();
  EXPECT_NE(fd.status().message().find("not a socket"), absl::string_view::npos) << fd.status();
  std::stringstream ss;
  ss << std::ifstream(path).rdbuf();
  EXPECT_EQ(ss.str(), "do not delete me");
  EXPECT_TRUE(S_ISREG(StatOf(path).st_mode));
}

TEST_F(UnixListenerTest, SymlinkIsNotFollowedOrReplaced) {
  const std::string target = dir_ + "/target.txt";
  const std::string link = dir_ + "/link.sock";
  std::ofstream(target) << "target";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  absl::StatusOr<UniqueFd> fd = ListenUnix(link, 0660, "");
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kAlreadyExists) << fd.status();
  EXPECT_TRUE(S_ISLNK(StatOf(link).st_mode));
  EXPECT_TRUE(S_ISREG(StatOf(target).st_mode));
}

TEST_F(UnixListenerTest, MissingParentDirectoriesAreCreated) {
  const std::string parent = dir_ + "/run/mooncake";
  const std::string path = parent + "/mooncaked.sock";
  ASSERT_FALSE(Exists(dir_ + "/run"));
  absl::StatusOr<UniqueFd> fd = ListenUnix(path, 0660, "");
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_TRUE(S_ISDIR(StatOf(parent).st_mode));
  EXPECT_TRUE(S_ISSOCK(StatOf(path).st_mode));
}

TEST_F(UnixListenerTest, ParentThatIsAFileFails) {
  const std::string file = dir_ + "/notadir";
  std::ofstream(file) << "x";
  absl::StatusOr<UniqueFd> fd = ListenUnix(file + "/x.sock", 0660, "");
  EXPECT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find(file), absl::string_view::npos) << fd.status();
}

TEST_F(UnixListenerTest, BadPaths) {
  EXPECT_EQ(ListenUnix("", 0660, "").status().code(), absl::StatusCode::kInvalidArgument);
  std::string long_path = dir_ + "/" + std::string(sizeof(sockaddr_un{}.sun_path), 'x');
  absl::StatusOr<UniqueFd> fd = ListenUnix(long_path, 0660, "");
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fd.status().message().find("longer than 107 bytes"), absl::string_view::npos)
      << fd.status();
}

TEST_F(UnixListenerTest, SocketGroup) {
  const std::string path = dir_ + "/grp.sock";
  absl::StatusOr<UniqueFd> missing = ListenUnix(path, 0660, "no-such-group-mc-test");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_NE(missing.status().message().find("no-such-group-mc-test"), absl::string_view::npos);
  EXPECT_FALSE(Exists(path)) << "a failed listen must not leave a socket file behind";

  struct group* mine = ::getgrgid(::getgid());
  if (mine == nullptr) GTEST_SKIP() << "the test's own gid has no group entry";
  const std::string name = mine->gr_name;
  absl::StatusOr<UniqueFd> fd = ListenUnix(path, 0660, name);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(StatOf(path).st_gid, ::getgid());
}

TEST(ConnectionTableTest, FdFromPeer) {
  EXPECT_EQ(ConnectionTable::FdFromPeer("fd:12"), 12);
  EXPECT_EQ(ConnectionTable::FdFromPeer("fd:0"), 0);
  EXPECT_EQ(ConnectionTable::FdFromPeer("fd:"), -1);
  EXPECT_EQ(ConnectionTable::FdFromPeer("fd:-3"), -1);
  EXPECT_EQ(ConnectionTable::FdFromPeer("fd:12x"), -1);
  EXPECT_EQ(ConnectionTable::FdFromPeer("fd:99999999999"), -1) << "overflow";
  EXPECT_EQ(ConnectionTable::FdFromPeer("FD:12"), -1);
  EXPECT_EQ(ConnectionTable::FdFromPeer("unix:/x"), -1);
  EXPECT_EQ(ConnectionTable::FdFromPeer("unix:/run/mooncake/mooncaked.sock"), -1);
  EXPECT_EQ(ConnectionTable::FdFromPeer("ipv4:127.0.0.1:5000"), -1);
  EXPECT_EQ(ConnectionTable::FdFromPeer("ipv6:[::1]:5000"), -1);
  EXPECT_EQ(ConnectionTable::FdFromPeer(""), -1);
}

TEST(ConnectionTableTest, AddGetAndAReusedNumberReplacesTheRecord) {
  AdmissionCounter admission(AdmissionLimits{"connections", 10, "per", 100, "total"});
  ConnectionTable t(&admission);
  int a[2], b[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
  EXPECT_FALSE(t.Get(a[0]).has_value());
  ASSERT_TRUE(admission.TryTake(Principal{1000}).ok());
  t.Add(a[0], PeerCred{100, 1000, 1000}, absl::Now());
  ASSERT_TRUE(admission.TryTake(Principal{2000}).ok());
  t.Add(b[0], PeerCred{200, 2000, 2000}, absl::Now());
  EXPECT_EQ(t.Get(a[0])->pid, 100);
  EXPECT_EQ(t.Get(b[0])->uid, 2000u);
  // A number accepted again replaces the old record and gives its uid back.
  ASSERT_TRUE(admission.TryTake(Principal{3000}).ok());
  t.Add(a[0], PeerCred{300, 3000, 3001}, absl::Now());
  EXPECT_EQ(t.Get(a[0])->pid, 300);
  EXPECT_EQ(admission.HeldBy(Principal{1000}), 0u);
  EXPECT_EQ(admission.HeldBy(Principal{3000}), 1u);
  for (int fd : {a[0], a[1], b[0], b[1]}) ::close(fd);
}

TEST(ConnectionTableTest, SweepDropsEndedConnectionsAndShutsSilentOnes) {
  AdmissionCounter admission(AdmissionLimits{"connections", 10, "per", 100, "total"});
  ConnectionTable t(&admission);
  int used[2], silent[2], ended[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, used), 0);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, silent), 0);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, ended), 0);
  absl::Time t0 = absl::Now();
  for (int fd : {used[0], silent[0], ended[0]}) {
    ASSERT_TRUE(admission.TryTake(Principal{1000}).ok());
    t.Add(fd, PeerCred{1, 1000, 1000}, t0);
  }
  t.MarkUsed(used[0]);
  ::close(ended[0]);  // what gRPC does when a connection ends
  // Before the deadline only the ended one goes.
  ConnectionTable::SweepResult r = t.Sweep(t0 + absl::Seconds(1), absl::Seconds(5));
  EXPECT_EQ(r.ended, 1u);
  EXPECT_EQ(r.shut_down, 0u);
  EXPECT_EQ(admission.HeldBy(Principal{1000}), 2u);
  // Past it, the connection that started no RPC is shut down (its peer
  // sees EOF); the used one is left alone.
  r = t.Sweep(t0 + absl::Seconds(6), absl::Seconds(5));
  EXPECT_EQ(r.shut_down, 1u);
  char c;
  EXPECT_EQ(::recv(silent[1], &c, 1, MSG_DONTWAIT), 0) << "peer of the silent one sees EOF";
  EXPECT_EQ(::recv(used[1], &c, 1, MSG_DONTWAIT), -1) << "the used one stays open";
  ::close(silent[0]);
  r = t.Sweep(t0 + absl::Seconds(7), absl::Seconds(5));
  EXPECT_EQ(r.ended, 1u);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(admission.HeldBy(Principal{1000}), 1u);
  for (int fd : {used[0], used[1], silent[1], ended[1]}) ::close(fd);
}

}  // namespace
}  // namespace mooncake::daemon
