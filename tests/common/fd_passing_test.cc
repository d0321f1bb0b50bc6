// Fd passing over real UNIX sockets: socketpair() for the frame codec,
// a bound socket in a temporary directory for ConnectUnix.
#include "mooncake/common/fd_passing.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace mooncake {
namespace {

struct SocketPair {
  UniqueFd a, b;
};

SocketPair MakePair(bool nonblocking = false) {
  int sv[2];
  int type = SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0);
  if (::socketpair(AF_UNIX, type, 0, sv) != 0) {
    ADD_FAILURE() << "socketpair: " << std::strerror(errno);
    return {};
  }
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

UniqueFd MakeMemfd(const std::string& contents) {
  UniqueFd fd(::memfd_create("fd_passing_test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid()) << std::strerror(errno);
  if (!contents.empty()) {
    EXPECT_EQ(::pwrite(fd.get(), contents.data(), contents.size(), 0),
              static_cast<ssize_t>(contents.size()));
  }
  return fd;
}

ino_t InodeOf(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0) << std::strerror(errno);
  return st.st_ino;
}

std::string ReadAt(int fd, size_t n, off_t off = 0) {
  std::string out(n, '\0');
  ssize_t r = ::pread(fd, out.data(), n, off);
  EXPECT_EQ(r, static_cast<ssize_t>(n)) << std::strerror(errno);
  return out;
}

// Sends `count` memfds and checks each received fd is the same open file:
// same inode, and a write through the received fd is visible through ours.
void RoundTripWithFds(size_t count) {
  SocketPair p = MakePair();
  std::vector<UniqueFd> originals;
  std::vector<int> raw;
  for (size_t i = 0; i < count; ++i) {
    originals.push_back(MakeMemfd("orig" + std::to_string(i)));
    raw.push_back(originals.back().get());
  }
  const std::string payload = "frame with " + std::to_string(count) + " fds";
  ASSERT_TRUE(SendFrame(p.a.get(), payload, raw).ok());
  absl::StatusOr<Frame> f = RecvFrame(p.b.get(), absl::Seconds(5));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->payload, payload);
  ASSERT_EQ(f->fds.size(), count);
  for (size_t i = 0; i < count; ++i) {
    const int got = f->fds[i].get();
    ASSERT_TRUE(f->fds[i].valid());
    EXPECT_NE(got, raw[i]) << "a received fd is a new descriptor number";
    EXPECT_EQ(InodeOf(got), InodeOf(raw[i])) << "fd " << i;
    EXPECT_TRUE(::fcntl(got, F_GETFD) & FD_CLOEXEC) << "received fds must be CLOEXEC";
    const std::string mark = "via-received-" + std::to_string(i);
    ASSERT_EQ(::pwrite(got, mark.data(), mark.size(), 100), static_cast<ssize_t>(mark.size()));
    EXPECT_EQ(ReadAt(raw[i], mark.size(), 100), mark);
    // Original contents are readable through the received fd, in order.
    std::string want = "orig" + std::to_string(i);
    EXPECT_EQ(ReadAt(got, want.size()), want);
  }
}

TEST(FdPassingTest, FrameWithoutFds) {
  SocketPair p = MakePair();
  ASSERT_TRUE(SendFrame(p.a.get(), "hello", {}).ok());
  absl::StatusOr<Frame> f = RecvFrame(p.b.get(), absl::Seconds(5));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->payload, "hello");
  EXPECT_TRUE(f->fds.empty());
}

TEST(FdPassingTest, EmptyPayloadFrame) {
  SocketPair p = MakePair();
  UniqueFd m = MakeMemfd("x");
  ASSERT_TRUE(SendFrame(p.a.get(), "", {m.get()}).ok());
  absl::StatusOr<Frame> f = RecvFrame(p.b.get(), absl::Seconds(5));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->payload, "");
  ASSERT_EQ(f->fds.size(), 1u);
  EXPECT_EQ(InodeOf(f->fds[0].get()), InodeOf(m.get()));
}

TEST(FdPassingTest, OneFd) { RoundTripWithFds(1); }
TEST(FdPassingTest, ThreeFds) { RoundTripWithFds(3); }
TEST(FdPassingTest, MaxFdsPerFrame) { RoundTripWithFds(kMaxFdsPerFrame); }

TEST(FdPassingTest, TooManyFdsRejectedBySender) {
  SocketPair p = MakePair();
  UniqueFd m = MakeMemfd("");
  std::vector<int> fds(kMaxFdsPerFrame + 1, m.get());
  absl::Status s = SendFrame(p.a.get(), "x", fds);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(std::to_string(kMaxFdsPerFrame + 1)), absl::string_view::npos) << s;
}

size_t OpenFdCount() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

// The review's attack: one frame whose fds ride on many of its bytes, one
// sendmsg per byte with kMaxFdsPerFrame fds each. The receiver must count
// per frame, fail, and keep none of them.
TEST(FdPassingTest, FdsSpreadOverOneFramesBytesAreCountedPerFrame) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  const int memfd = ::memfd_create("spread", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  constexpr uint32_t kBytes = 8;
  std::string frame(4, '\0');
  frame[0] = static_cast<char>(kBytes);
  frame.append(kBytes, 'x');
  const size_t before = OpenFdCount();
  std::thread sender([&] {
    for (size_t i = 0; i < frame.size(); ++i) {
      iovec iov{&frame[i], 1};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)] = {};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * kMaxFdsPerFrame);
      int* fds = reinterpret_cast<int*>(CMSG_DATA(c));
      for (size_t k = 0; k < kMaxFdsPerFrame; ++k) fds[k] = memfd;
      if (::sendmsg(sv[0], &msg, MSG_NOSIGNAL) != 1) break;
    }
  });
  absl::StatusOr<Frame> f = RecvFrame(sv[1], absl::Seconds(5));
  sender.join();
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  EXPECT_NE(f.status().message().find("fds in one frame"), absl::string_view::npos);
  // At most the second chunk's fds arrived, and all were closed: the count
  // is back where it was (the unread chunks die with the socket).
  ::close(sv[0]);
  ::close(sv[1]);
  ::close(memfd);
  EXPECT_EQ(OpenFdCount(), before - 3);
}

TEST(FdPassingTest, OversizedPayloadRejectedBySender) {
  SocketPair p = MakePair();
  std::string big(kMaxFrameBytes + 1, 'x');
  EXPECT_EQ(SendFrame(p.a.get(), big, {}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(FdPassingTest, BackToBackFramesKeepBoundariesAndFds) {
  SocketPair p = MakePair();
  UniqueFd m1 = MakeMemfd("one");
  UniqueFd m2 = MakeMemfd("two");
  ASSERT_TRUE(SendFrame(p.a.get(), "first", {m1.get()}).ok());
  ASSERT_TRUE(SendFrame(p.a.get(), "second", {}).ok());
  ASSERT_TRUE(SendFrame(p.a.get(), "third", {m2.get(), m1.get()}).ok());
  absl::StatusOr<Frame> f1 = RecvFrame(p.b.get(), absl::Seconds(5));
  absl::StatusOr<Frame> f2 = RecvFrame(p.b.get(), absl::Seconds(5));
  absl::StatusOr<Frame> f3 = RecvFrame(p.b.get(), absl::Seconds(5));
  ASSERT_TRUE(f1.ok() && f2.ok() && f3.ok());
  EXPECT_EQ(f1->payload, "first");
  ASSERT_EQ(f1->fds.size(), 1u);
  EXPECT_EQ(InodeOf(f1->fds[0].get()), InodeOf(m1.get()));
  EXPECT_EQ(f2->payload, "second");
  EXPECT_TRUE(f2->fds.empty());
  EXPECT_EQ(f3->payload, "third");
  ASSERT_EQ(f3->fds.size(), 2u);
  EXPECT_EQ(InodeOf(f3->fds[0].get()), InodeOf(m2.get()));
  EXPECT_EQ(InodeOf(f3->fds[1].get()), InodeOf(m1.get()));
}

// A 64 KiB frame through a socket whose send buffer is far smaller: the
// sender sees EAGAIN and short writes, and must still deliver every byte in
// order with the fds attached exactly once.
TEST(FdPassingTest, LargePayloadAcrossShortWrites) {
  SocketPair p = MakePair(/*nonblocking=*/true);
  int small = 4096;
  ASSERT_EQ(::setsockopt(p.a.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
  ASSERT_EQ(::setsockopt(p.b.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
  std::string payload(kMaxFrameBytes, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>((i * 131 + 7) & 0xff);
  UniqueFd m = MakeMemfd("large");

  absl::StatusOr<Frame> got = absl::UnknownError("reader did not run");
  std::thread reader([&] {
    absl::SleepFor(absl::Milliseconds(50));  // let the sender fill the buffer first
    got = RecvFrame(p.b.get(), absl::Seconds(10));
  });
  absl::Status sent = SendFrame(p.a.get(), payload, {m.get()}, absl::Seconds(10));
  reader.join();
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->payload.size(), payload.size());
  EXPECT_TRUE(got->payload == payload) << "payload corrupted across short writes";
  ASSERT_EQ(got->fds.size(), 1u);
  EXPECT_EQ(InodeOf(got->fds[0].get()), InodeOf(m.get()));

  // The stream is still framed correctly afterwards.
  ASSERT_TRUE(SendFrame(p.a.get(), "after", {}).ok());
  absl::StatusOr<Frame> next = RecvFrame(p.b.get(), absl::Seconds(5));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->payload, "after");
}

TEST(FdPassingTest, PeerClosedIsUnavailable) {
  SocketPair p = MakePair();
  p.a.reset();
  absl::StatusOr<Frame> f = RecvFrame(p.b.get(), absl::Seconds(5));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kUnavailable) << f.status();
}

TEST(FdPassingTest, PeerClosedMidFrameIsUnavailable) {
  SocketPair p = MakePair();
  // Header announces 100 bytes; only 3 arrive before the peer goes away.
  const char partial[] = {100, 0, 0, 0, 'a', 'b', 'c'};
  ASSERT_EQ(::write(p.a.get(), partial, sizeof(partial)), static_cast<ssize_t>(sizeof(partial)));
  p.a.reset();
  absl::StatusOr<Frame> f = RecvFrame(p.b.get(), absl::Seconds(5));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kUnavailable) << f.status();
}

TEST(FdPassingTest, SendToClosedPeerFailsWithoutSigpipe) {
  SocketPair p = MakePair();
  p.b.reset();
  absl::Status s = SendFrame(p.a.get(), "nobody listens", {}, absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST(FdPassingTest, RecvTimeoutIsDeadlineExceeded) {
  SocketPair p = MakePair();
  absl::Time start = absl::Now();
  absl::StatusOr<Frame> f = RecvFrame(p.b.get(), absl::Milliseconds(100));
  absl::Duration took = absl::Now() - start;
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDeadlineExceeded) << f.status();
  EXPECT_GE(took, absl::Milliseconds(100));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(FdPassingTest, RecvTimeoutMidFrameIsDeadlineExceeded) {
  SocketPair p = MakePair();
  const char partial[] = {10, 0, 0, 0, 'x'};
  ASSERT_EQ(::write(p.a.get(), partial, sizeof(partial)), static_cast<ssize_t>(sizeof(partial)));
  absl::StatusOr<Frame> f = RecvFrame(p.b.get(), absl::Milliseconds(100));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDeadlineExceeded) << f.status();
}

TEST(FdPassingTest, SendTimeoutWhenNobodyReads) {
  SocketPair p = MakePair(/*nonblocking=*/true);
  int small = 4096;
  ASSERT_EQ(::setsockopt(p.a.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
  ASSERT_EQ(::setsockopt(p.b.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
  std::string payload(kMaxFrameBytes, 'z');
  absl::Status s;
  // One frame may fit in the kernel's buffers; keep sending until the
  // buffers are full and a send has to wait out its deadline.
  for (int i = 0; i < 64 && s.ok(); ++i)
    s = SendFrame(p.a.get(), payload, {}, absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

TEST(FdPassingTest, OversizedLengthPrefixIsInvalidArgument) {
  SocketPair p = MakePair();
  uint32_t len = static_cast<uint32_t>(kMaxFrameBytes) + 1;
  unsigned char hdr[4];
  for (int i = 0; i < 4; ++i) hdr[i] = static_cast<unsigned char>((len >> (8 * i)) & 0xff);
  ASSERT_EQ(::write(p.a.get(), hdr, 4), 4);
  absl::StatusOr<Frame> f = RecvFrame(p.b.get(), absl::Seconds(5));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  EXPECT_NE(f.status().message().find(std::to_string(len)), absl::string_view::npos) << f.status();
}

TEST(FdPassingTest, LengthPrefixIsLittleEndian) {
  SocketPair p = MakePair();
  // 0x0102 = 258 bytes, little-endian on the wire.
  std::string raw = {static_cast<char>(0x02), static_cast<char>(0x01), 0, 0};
  raw += std::string(258, 'q');
  ASSERT_EQ(::write(p.a.get(), raw.data(), raw.size()), static_cast<ssize_t>(raw.size()));
  absl::StatusOr<Frame> f = RecvFrame(p.b.get(), absl::Seconds(5));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->payload, std::string(258, 'q'));
}

// A hostile peer attaching more fds than a frame may carry: the receiver's
// control buffer truncates and the frame is rejected (the fds that did
// arrive are closed with it, not leaked into the process).
TEST(FdPassingTest, TooManyFdsFromRawPeerIsInvalidArgument) {
  SocketPair p = MakePair();
  UniqueFd m = MakeMemfd("");
  constexpr size_t kCount = kMaxFdsPerFrame + 8;
  std::vector<int> fds(kCount, m.get());
  const char hdr[] = {1, 0, 0, 0, 'x'};
  iovec iov{const_cast<char*>(hdr), sizeof(hdr)};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kCount));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * kCount);
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * kCount);
  ASSERT_EQ(::sendmsg(p.a.get(), &msg, 0), static_cast<ssize_t>(sizeof(hdr)))
      << std::strerror(errno);
  absl::StatusOr<Frame> f = RecvFrame(p.b.get(), absl::Seconds(5));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
}

TEST(FdPassingTest, GetPeerCredIsThisProcess) {
  SocketPair p = MakePair();
  absl::StatusOr<PeerCred> c = GetPeerCred(p.b.get());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pid, ::getpid());
  EXPECT_EQ(c->uid, ::getuid());
  EXPECT_EQ(c->gid, ::getgid());
}

TEST(FdPassingTest, GetPeerCredOnNonSocketFails) {
  int pfd[2];
  ASSERT_EQ(::pipe(pfd), 0);
  UniqueFd r(pfd[0]), w(pfd[1]);
  absl::StatusOr<PeerCred> c = GetPeerCred(r.get());
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("SO_PEERCRED"), absl::string_view::npos) << c.status();
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/mc_common_XXXXXX";
    char* d = ::mkdtemp(tmpl);
    EXPECT_NE(d, nullptr) << std::strerror(errno);
    path_ = d ? d : "/tmp";
  }
  ~TempDir() {
    std::string cmd = "rm -rf '" + path_ + "'";
    (void)!std::system(cmd.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(ConnectUnixTest, MissingPathIsUnavailableWithAdvice) {
  TempDir dir;
  const std::string path = dir.path() + "/nobody.sock";
  absl::StatusOr<UniqueFd> fd = ConnectUnix(path);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kUnavailable) << fd.status();
  const std::string msg(fd.status().message());
  EXPECT_NE(msg.find("cannot reach mooncaked at " + path), std::string::npos) << msg;
  EXPECT_NE(msg.find("is the service running?"), std::string::npos) << msg;
}

TEST(ConnectUnixTest, TooLongPathIsInvalidArgument) {
  std::string path = "/tmp/" + std::string(sizeof(sockaddr_un{}.sun_path), 'a');
  absl::StatusOr<UniqueFd> fd = ConnectUnix(path);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kInvalidArgument) << fd.status();
  EXPECT_NE(fd.status().message().find("too long"), absl::string_view::npos) << fd.status();
}

// EACCES on connect(): PermissionDenied that names the socket's mode and
// group, not "is the service running?". Root bypasses file permissions, so
// as root the connecting child drops to nobody (65534) first.
TEST(ConnectUnixTest, NoPermissionIsPermissionDeniedWithModeAndGroup) {
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const std::string path = dir.path() + "/closed.sock";
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  const bool root = ::getuid() == 0;
  const mode_t mode = root ? 0600 : 0;  // the owner itself is refused only by 0
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);

  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    if (root && (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      ::_exit(126);
    }
    absl::StatusOr<UniqueFd> fd = ConnectUnix(path);
    const std::string report = std::to_string(static_cast<int>(fd.status().code())) + " " +
                               std::string(fd.status().message());
    (void)!::write(pipe_fds[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string report;
  char buf[1024];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0) report.append(buf, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(report.substr(0, report.find(' ')),
            std::to_string(static_cast<int>(absl::StatusCode::kPermissionDenied)))
      << report;
  char mode_text[8];
  std::snprintf(mode_text, sizeof(mode_text), "%04o", mode);
  EXPECT_NE(report.find("permission denied on mooncaked's socket " + path + " (mode " + mode_text +
                        ", owner "),
            std::string::npos)
      << report;
  EXPECT_NE(report.find(", group '"), std::string::npos) << report;
  EXPECT_NE(report.find("ask an administrator"), std::string::npos) << report;
  EXPECT_EQ(report.find("is the service running"), std::string::npos) << report;
}

TEST(ConnectUnixTest, ConnectsToListenerAndCarriesFrames) {
  TempDir dir;
  const std::string path = dir.path() + "/live.sock";
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(listener.valid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);

  absl::StatusOr<UniqueFd> client = ConnectUnix(path);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(::fcntl(client->get(), F_GETFD) & FD_CLOEXEC);
  UniqueFd server(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(server.valid());
  ASSERT_TRUE(SendFrame(client->get(), "ping", {}).ok());
  absl::StatusOr<Frame> f = RecvFrame(server.get(), absl::Seconds(5));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->payload, "ping");
  absl::StatusOr<PeerCred> c = GetPeerCred(server.get());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pid, ::getpid());
}

TEST(SetNonBlockingTest, SetsTheFlag) {
  SocketPair p = MakePair();
  ASSERT_FALSE(::fcntl(p.a.get(), F_GETFL) & O_NONBLOCK);
  ASSERT_TRUE(SetNonBlocking(p.a.get()).ok());
  EXPECT_TRUE(::fcntl(p.a.get(), F_GETFL) & O_NONBLOCK);
  EXPECT_EQ(SetNonBlocking(-1).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mooncake
