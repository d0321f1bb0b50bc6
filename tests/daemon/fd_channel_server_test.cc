// A real FdChannelServer on a temporary socket, driven with the same frame
// codec the client uses.
#include "fdchannel/fd_channel_server.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/v1/fd_channel.pb.h"
#include "server/unix_listener.h"

namespace mooncake::daemon {
namespace {

UniqueFd MemfdWith(const std::string& contents) {
  UniqueFd fd(::memfd_create("fd_channel_server_test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::pwrite(fd.get(), contents.data(), contents.size(), 0),
            static_cast<ssize_t>(contents.size()));
  return fd;
}

std::string ReadAll(int fd, size_t n) {
  std::string out(n, '\0');
  EXPECT_EQ(::pread(fd, out.data(), n, 0), static_cast<ssize_t>(n));
  return out;
}

ino_t InodeOf(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

struct Reply {
  v1::FdReply msg;
  std::vector<UniqueFd> fds;
};

// One request/reply exchange on `conn`.
absl::StatusOr<Reply> Call(int conn, const v1::FdRequest& req, const std::vector<int>& fds = {}) {
  std::string bytes;
  req.SerializeToString(&bytes);
  if (absl::Status s = SendFrame(conn, bytes, fds, absl::Seconds(5)); !s.ok()) return s;
  absl::StatusOr<Frame> f = RecvFrame(conn, absl::Seconds(5));
  if (!f.ok()) return f.status();
  Reply r;
  if (!r.msg.ParseFromString(f->payload)) return absl::DataLossError("unparsable FdReply");
  r.fds = std::move(f->fds);
  return r;
}

class FdChannelServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mc_fdchan_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/mooncaked.sock.fd";
    absl::StatusOr<UniqueFd> listen_fd = ListenUnix(path_, 0600, "");
    ASSERT_TRUE(listen_fd.ok()) << listen_fd.status();
    server_ = std::make_unique<FdChannelServer>(std::move(*listen_fd), &sessions_, &fds_);
    server_->Start();
  }
  void TearDown() override {
    server_.reset();
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)!std::system(cmd.c_str());
  }

  SessionInfo OpenSession() {
    absl::StatusOr<SessionInfo> s =
        sessions_.Open(PeerCred{::getpid(), ::getuid(), ::getgid()}, next_conn_++, "test");
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }

  UniqueFd Connect() {
    absl::StatusOr<UniqueFd> c = ConnectUnix(path_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : UniqueFd();
  }

  static v1::FdRequest Request(const SessionInfo& s, v1::FdRequest::Op op) {
    v1::FdRequest r;
    r.set_op(op);
    r.set_session_id(s.id);
    r.set_session_token(s.token);
    return r;
  }

  std::string dir_, path_;
  SessionRegistry sessions_{1000};
  FdBroker fds_{absl::Seconds(30), &sessions_};
  std::unique_ptr<FdChannelServer> server_;
  int next_conn_ = 100;
};

TEST_F(FdChannelServerTest, PutThenGetRoundTrip) {
  SessionInfo owner = OpenSession(), receiver = OpenSession();
  UniqueFd conn = Connect();
  UniqueFd mem = MemfdWith("shared bytes");

  v1::FdRequest put = Request(owner, v1::FdRequest::PUT);
  put.set_fd_count(1);
  absl::StatusOr<Reply> pr = Call(conn.get(), put, {mem.get()});
  ASSERT_TRUE(pr.ok()) << pr.status();
  ASSERT_TRUE(pr->msg.ok()) << pr->msg.error();
  ASSERT_FALSE(pr->msg.ticket().empty());
  EXPECT_TRUE(pr->fds.empty());

  // The RPC side consumes the upload and offers it to the receiver.
  absl::StatusOr<FdBundlePtr> bundle = fds_.TakeIncoming(owner.id, pr->msg.ticket());
  ASSERT_TRUE(bundle.ok()) << bundle.status();
  ASSERT_EQ((*bundle)->fds.size(), 1u);
  EXPECT_EQ(InodeOf((*bundle)->fds[0].get()), InodeOf(mem.get()));
  std::string out_ticket = *fds_.IssueOutgoing(owner.id, receiver, *bundle);

  UniqueFd conn2 = Connect();
  v1::FdRequest get = Request(receiver, v1::FdRequest::GET);
  get.set_ticket(out_ticket);
  absl::StatusOr<Reply> gr = Call(conn2.get(), get);
  ASSERT_TRUE(gr.ok()) << gr.status();
  ASSERT_TRUE(gr->msg.ok()) << gr->msg.error();
  EXPECT_EQ(gr->msg.fd_count(), 1u);
  ASSERT_EQ(gr->fds.size(), 1u);
  EXPECT_EQ(InodeOf(gr->fds[0].get()), InodeOf(mem.get()));
  EXPECT_EQ(ReadAll(gr->fds[0].get(), 12), "shared bytes");

  // Redeemable once.
  absl::StatusOr<Reply> again = Call(conn2.get(), get);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->msg.ok());
  EXPECT_EQ(again->msg.code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_TRUE(again->fds.empty());
}

TEST_F(FdChannelServerTest, PutSeveralFdsAndManyRequestsOnOneConnection) {
  SessionInfo s = OpenSession();
  UniqueFd conn = Connect();
  for (int i = 0; i < 5; ++i) {
    UniqueFd a = MemfdWith("a"), b = MemfdWith("b"), c = MemfdWith("c");
    v1::FdRequest put = Request(s, v1::FdRequest::PUT);
    put.set_fd_count(3);
    absl::StatusOr<Reply> r = Call(conn.get(), put, {a.get(), b.get(), c.get()});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->msg.ok()) << r->msg.error();
    absl::StatusOr<FdBundlePtr> bundle = fds_.TakeIncoming(s.id, r->msg.ticket());
    ASSERT_TRUE(bundle.ok());
    ASSERT_EQ((*bundle)->fds.size(), 3u);
    EXPECT_EQ(InodeOf((*bundle)->fds[2].get()), InodeOf(c.get())) << "order is kept";
  }
}

TEST_F(FdChannelServerTest, ForgedTokenIsDeniedAndTheConnectionSurvives) {
  SessionInfo s = OpenSession();
  UniqueFd conn = Connect();
  UniqueFd mem = MemfdWith("x");
  v1::FdRequest put = Request(s, v1::FdRequest::PUT);
  put.set_fd_count(1);
  std::string forged = s.token;
  forged[3] = static_cast<char>(forged[3] ^ 0x5a);
  put.set_session_token(forged);
  absl::StatusOr<Reply> r = Call(conn.get(), put, {mem.get()});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->msg.ok());
  EXPECT_EQ(r->msg.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(fds_.TicketCount(), 0u) << "a denied PUT must not store the fds";

  // Unknown session id: same answer.
  v1::FdRequest ghost = Request(s, v1::FdRequest::PUT);
  ghost.set_session_id(s.id + 1000);
  ghost.set_fd_count(1);
  r = Call(conn.get(), ghost, {mem.get()});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->msg.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));

  // A correct request on the same connection still works.
  put.set_session_token(s.token);
  r = Call(conn.get(), put, {mem.get()});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->msg.ok()) << r->msg.error();
}

TEST_F(FdChannelServerTest, ClosedSessionIsDenied) {
  SessionInfo s = OpenSession();
  ASSERT_TRUE(sessions_.Close(s.id));
  UniqueFd conn = Connect();
  UniqueFd mem = MemfdWith("x");
  v1::FdRequest put = Request(s, v1::FdRequest::PUT);
  put.set_fd_count(1);
  absl::StatusOr<Reply> r = Call(conn.get(), put, {mem.get()});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->msg.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
}

TEST_F(FdChannelServerTest, PutFdCountMustMatch) {
  SessionInfo s = OpenSession();
  UniqueFd conn = Connect();
  UniqueFd mem = MemfdWith("x");
  v1::FdRequest put = Request(s, v1::FdRequest::PUT);
  put.set_fd_count(2);
  absl::StatusOr<Reply> r = Call(conn.get(), put, {mem.get()});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->msg.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(r->msg.error().find("announced 2 fds but carried 1"), std::string::npos)
      << r->msg.error();
  put.set_fd_count(0);
  r = Call(conn.get(), put);  // no fds at all
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->msg.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(fds_.TicketCount(), 0u);
}

TEST_F(FdChannelServerTest, UnknownOp) {
  SessionInfo s = OpenSession();
  UniqueFd conn = Connect();
  absl::StatusOr<Reply> r = Call(conn.get(), Request(s, v1::FdRequest::OP_UNSPECIFIED));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->msg.ok());
  EXPECT_EQ(r->msg.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
}

TEST_F(FdChannelServerTest, GetOfAnotherSessionsTicketIsDeniedAndNotConsumed) {
  SessionInfo owner = OpenSession(), receiver = OpenSession(), thief = OpenSession();
  auto bundle = std::make_shared<FdBundle>();
  bundle->fds.push_back(MemfdWith("secret"));
  std::string t = *fds_.IssueOutgoing(owner.id, receiver, bundle);
  UniqueFd conn = Connect();
  v1::FdRequest get = Request(thief, v1::FdRequest::GET);
  get.set_ticket(t);
  absl::StatusOr<Reply> r = Call(conn.get(), get);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->msg.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_TRUE(r->fds.empty());
  get = Request(receiver, v1::FdRequest::GET);
  get.set_ticket(t);
  r = Call(conn.get(), get);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->msg.ok()) << r->msg.error();
  ASSERT_EQ(r->fds.size(), 1u);
  EXPECT_EQ(ReadAll(r->fds[0].get(), 6), "secret");
}

TEST_F(FdChannelServerTest, MalformedFrameGetsAnErrorAndTheConnectionCloses) {
  UniqueFd conn = Connect();
  // Field 31, wire type 7 (invalid): no FdRequest parses from this.
  const std::string garbage = "\xff\x01\xff\xff\xff";
  ASSERT_TRUE(SendFrame(conn.get(), garbage, {}).ok());
  absl::StatusOr<Frame> f = RecvFrame(conn.get(), absl::Seconds(5));
  ASSERT_TRUE(f.ok()) << f.status();
  v1::FdReply reply;
  ASSERT_TRUE(reply.ParseFromString(f->payload));
  EXPECT_FALSE(reply.ok());
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(reply.error().find("malformed"), std::string::npos) << reply.error();
  absl::StatusOr<Frame> after = RecvFrame(conn.get(), absl::Seconds(5));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << after.status();
}

TEST_F(FdChannelServerTest, OversizedFrameClosesTheConnection) {
  UniqueFd conn = Connect();
  const unsigned char hdr[4] = {0xff, 0xff, 0xff, 0x7f};
  ASSERT_EQ(::write(conn.get(), hdr, 4), 4);
  absl::StatusOr<Frame> f = RecvFrame(conn.get(), absl::Seconds(5));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kUnavailable) << f.status();
  // The server is still serving others.
  SessionInfo s = OpenSession();
  UniqueFd conn2 = Connect();
  UniqueFd mem = MemfdWith("x");
  v1::FdRequest put = Request(s, v1::FdRequest::PUT);
  put.set_fd_count(1);
  absl::StatusOr<Reply> r = Call(conn2.get(), put, {mem.get()});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->msg.ok());
}

TEST_F(FdChannelServerTest, ConcurrentPutGet) {
  constexpr int kThreads = 8, kRounds = 50;
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    SessionInfo s = OpenSession();
    threads.emplace_back([this, s, t, &good] {
      UniqueFd conn = Connect();
      for (int i = 0; i < kRounds; ++i) {
        const std::string contents = "t" + std::to_string(t) + "-i" + std::to_string(i);
        UniqueFd mem = MemfdWith(contents);
        v1::FdRequest put = Request(s, v1::FdRequest::PUT);
        put.set_fd_count(1);
        absl::StatusOr<Reply> pr = Call(conn.get(), put, {mem.get()});
        ASSERT_TRUE(pr.ok()) << pr.status();
        ASSERT_TRUE(pr->msg.ok()) << pr->msg.error();
        absl::StatusOr<FdBundlePtr> b = fds_.TakeIncoming(s.id, pr->msg.ticket());
        ASSERT_TRUE(b.ok()) << b.status();
        v1::FdRequest get = Request(s, v1::FdRequest::GET);
        get.set_ticket(*fds_.IssueOutgoing(s.id, s, *b));
        absl::StatusOr<Reply> gr = Call(conn.get(), get);
        ASSERT_TRUE(gr.ok()) << gr.status();
        ASSERT_TRUE(gr->msg.ok()) << gr->msg.error();
        ASSERT_EQ(gr->fds.size(), 1u);
        ASSERT_EQ(ReadAll(gr->fds[0].get(), contents.size()), contents);
        ++good;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(good.load(), kThreads * kRounds);
  EXPECT_EQ(fds_.TicketCount(), 0u);
}

TEST_F(FdChannelServerTest, StopWithNoClientsIsPrompt) {
  absl::Time start = absl::Now();
  server_->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  server_->Stop();  // idempotent
}

// BUG (reported to the lead): Stop() waits at most 600 x 10 ms = 6 s for
// connection threads, but an idle connection's thread sits in
// RecvFrame(conn, 10 s). Stop() then returns while that thread still runs,
// and ~FdChannelServer frees stopping_/active_/sessions_/fds_ under it
// (use after free at daemon shutdown with an idle fd-channel client). Once
// fixed, every connection is closed by the time Stop() returns.
TEST_F(FdChannelServerTest, StopClosesIdleConnectionsBeforeReturning) {
  UniqueFd idle = Connect();
  // Make sure the server has accepted and is serving it.
  SessionInfo s = OpenSession();
  UniqueFd mem = MemfdWith("x");
  v1::FdRequest put = Request(s, v1::FdRequest::PUT);
  put.set_fd_count(1);
  ASSERT_TRUE(Call(idle.get(), put, {mem.get()}).ok());
  server_->Stop();
  absl::StatusOr<Frame> f = RecvFrame(idle.get(), absl::Milliseconds(100));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kUnavailable)
      << "Stop() returned while a connection thread was still serving: " << f.status();
}

}  // namespace
}  // namespace mooncake::daemon
