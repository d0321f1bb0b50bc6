// Every RPC and the fd channel with bad input: a precise error each time,
// and the daemon keeps serving everyone else.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "daemon_process.h"
#include "gtest/gtest.h"
#include "mooncake/client/client.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/paths.h"
#include "mooncake/v1/fd_channel.pb.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(dir_.path());
    auto c = Client::Connect({.socket_path = daemon_->socket()});
    ASSERT_TRUE(c.ok()) << c.status();
    good_ = std::move(*c);
  }
  void TearDown() override {
    // Whatever happened, the well-behaved client is still served.
    ASSERT_TRUE(good_->hello().ok());
  }
  v1::FdReply FdCall(const v1::FdRequest& req, const std::vector<int>& fds = {}) {
    auto sock = ConnectUnix(FdSocketPath(daemon_->socket()));
    EXPECT_TRUE(sock.ok());
    std::string bytes;
    req.SerializeToString(&bytes);
    EXPECT_TRUE(SendFrame(sock->get(), bytes, fds).ok());
    auto frame = RecvFrame(sock->get());
    v1::FdReply r;
    if (frame.ok()) r.ParseFromString(frame->payload);
    return r;
  }
  TempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> good_;
};

TEST_F(BadInput, CallsWithoutASessionAreRefused) {
  auto stub = v1::Local::NewStub(UnixChannel(daemon_->socket()));
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::JoinGroupRequest req;
  req.set_group("g");
  req.set_world_size(1);
  v1::JoinGroupResponse resp;
  grpc::Status s = stub->JoinGroup(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("call OpenSession first"), std::string::npos);
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext c2;
    Deadline(&c2);
    v1::ExportFdsResponse er;
    EXPECT_EQ(stub->ExportFds(&c2, {}, &er).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
}

TEST_F(BadInput, HelloWithAnotherProtocolVersion) {
  auto stub = v1::Local::NewStub(UnixChannel(daemon_->socket()));
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::HelloRequest req;
  req.set_protocol_version(99);
  v1::HelloResponse resp;
  grpc::Status s = stub->Hello(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("protocol 99"), std::string::npos);
}

TEST_F(BadInput, SecondSessionOnOneConnection) {
  auto stub = v1::Local::NewStub(UnixChannel(daemon_->socket()));
  grpc::ClientContext c1;
  auto r1 = stub->OpenSession(&c1, {});
  v1::SessionEvent ev;
  ASSERT_TRUE(r1->Read(&ev));
  ASSERT_TRUE(ev.has_opened());
  grpc::ClientContext c2;
  Deadline(&c2);
  auto r2 = stub->OpenSession(&c2, {});
  EXPECT_FALSE(r2->Read(&ev));
  EXPECT_EQ(r2->Finish().error_code(), grpc::StatusCode::ALREADY_EXISTS);
  c1.TryCancel();
  r1->Finish();
}

// client_name is capped at 256 bytes: refused with a precise message, and
// the client library hands the daemon's code on unchanged.
TEST_F(BadInput, OverlongClientNameIsRefused) {
  auto stub = v1::Local::NewStub(UnixChannel(daemon_->socket()));
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::OpenSessionRequest req;
  req.set_client_name(std::string(257, 'n'));
  auto reader = stub->OpenSession(&ctx, req);
  v1::SessionEvent ev;
  EXPECT_FALSE(reader->Read(&ev));
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "client_name is 257 bytes; the limit is 256: choose a shorter "
            "ClientOptions::client_name");

  auto c =
      Client::Connect({.socket_path = daemon_->socket(), .client_name = std::string(300, 'c')});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find("client_name is 300 bytes; the limit is 256"),
            std::string::npos)
      << c.status();
  EXPECT_TRUE(
      Client::Connect({.socket_path = daemon_->socket(), .client_name = std::string(256, 'c')})
          .ok());
}

// What the review did: a name that forges a `mcctl sessions` row and sends
// colour codes and a bell to whoever lists sessions (root sees all).
TEST_F(BadInput, HostileClientNameIsEscapedInMcctlSessions) {
  const std::string forged = "w\n99  0  0  1  root-job  1s  0  0  -\x1b[31m\a";
  auto evil = Client::Connect({.socket_path = daemon_->socket(), .client_name = forged});
  ASSERT_TRUE(evil.ok()) << evil.status();
  const std::string cmd = BinDir() + "/mcctl --socket " + daemon_->socket() + " sessions 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 3) << out;  // header, good_, evil
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
  EXPECT_EQ(out.find('\a'), std::string::npos) << out;
  // Escaped, and cut at 48 bytes.
  EXPECT_NE(out.find("  w\\n99  0  0  1  root-job  1s  0  0  -\\x1b[31m...  "), std::string::npos)
      << out;
}

TEST_F(BadInput, LeaveReportExportImportWithBadArguments) {
  EXPECT_EQ(good_->leaveGroup("nope", 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(good_->reportReady("nope", 0, true).code(), absl::StatusCode::kNotFound);
  auto imported = good_->importFds({.id = 12345, .secret = std::string(16, 'x')});
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kNotFound);
  auto fetched = good_->fetchFds("00112233445566778899aabbccddeeff");
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(good_->sendFds({}).status().code(), absl::StatusCode::kInvalidArgument);
  // Export with a bogus ticket.
  auto stub = v1::Local::NewStub(UnixChannel(daemon_->socket()));
  (void)stub;
  int fd = ::memfd_create("x", MFD_CLOEXEC);
  auto e = good_->exportFds({fd}, "memfd", 1);
  ASSERT_TRUE(e.ok()) << e.status();
  // Wrong secret for a real export: the same answer as no export at all.
  auto wrong = good_->importFds({.id = e->id, .secret = std::string(16, '\0')});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kNotFound);
  auto right = good_->importFds(*e);
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_EQ(right->size(), 1u);
  ::close(fd);
  // Report readiness before the group formed.
  auto other = Client::Connect({.socket_path = daemon_->socket()});
  std::thread t([&] {
    (void)(*other)->joinGroup(
        {.group = "early", .rank = 0, .world_size = 2, .timeout = absl::Milliseconds(800)});
  });
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ((*other)->leaveGroup("early", 1).code(), absl::StatusCode::kNotFound);
  // Readiness can only be reported once the group has formed.
  absl::Status early = (*other)->reportReady("early", 0, true);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  t.join();
}

// A JoinGroup the daemon rejects as malformed (bad name, bad rank, unknown
// GPU) is rejected before its fd ticket is consumed: the same ticket still
// works afterwards.
TEST_F(BadInput, MalformedJoinGroupDoesNotBurnItsFdTicket) {
  auto stub = v1::Local::NewStub(UnixChannel(daemon_->socket()));
  grpc::ClientContext session_ctx;
  auto stream = stub->OpenSession(&session_ctx, {});
  v1::SessionEvent opened;
  ASSERT_TRUE(stream->Read(&opened));
  ASSERT_TRUE(opened.has_opened());
  int fd = ::memfd_create("x", MFD_CLOEXEC);
  v1::FdRequest put;
  put.set_op(v1::FdRequest::PUT);
  put.set_session_id(opened.opened().session_id());
  put.set_session_token(opened.opened().token());
  put.set_fd_count(1);
  v1::FdReply ticket = FdCall(put, {fd});
  ::close(fd);
  ASSERT_TRUE(ticket.ok()) << ticket.error();

  std::vector<v1::JoinGroupRequest> bad(3);
  bad[0].set_group("has space");
  bad[0].set_world_size(1);
  bad[1].set_group("g");
  bad[1].set_rank(2);
  bad[1].set_world_size(2);
  bad[2].set_group("g");
  bad[2].set_world_size(1);
  bad[2].mutable_device()->set_gpu_uuid("GPU-not-on-this-node");
  for (v1::JoinGroupRequest& req : bad) {
    req.mutable_handle()->set_fd_ticket(ticket.ticket());
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::JoinGroupResponse resp;
    grpc::Status s = stub->JoinGroup(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::ExportFdsRequest ereq;
  ereq.set_fd_ticket(ticket.ticket());
  ereq.set_kind("memfd");
  v1::ExportFdsResponse eresp;
  grpc::Status s = stub->ExportFds(&ctx, ereq, &eresp);
  EXPECT_TRUE(s.ok()) << "the ticket survived the rejected joins: " << s.error_message();
  session_ctx.TryCancel();
  stream->Finish();
}

TEST_F(BadInput, FdChannelRejectsGarbageAndForgedSessions) {
  // Not a protobuf.
  {
    auto sock = ConnectUnix(FdSocketPath(daemon_->socket()));
    ASSERT_TRUE(sock.ok());
    ASSERT_TRUE(SendFrame(sock->get(), std::string("\xff\xff\xff garbage", 11), {}).ok());
    auto frame = RecvFrame(sock->get());
    ASSERT_TRUE(frame.ok());
    v1::FdReply r;
    ASSERT_TRUE(r.ParseFromString(frame->payload));
    EXPECT_FALSE(r.ok());
  }
  // An oversized length prefix closes the connection; the daemon lives on.
  {
    auto sock = ConnectUnix(FdSocketPath(daemon_->socket()));
    ASSERT_TRUE(sock.ok());
    const char huge[4] = {'\xff', '\xff', '\xff', '\x7f'};
    ASSERT_EQ(::write(sock->get(), huge, 4), 4);
    auto frame = RecvFrame(sock->get(), absl::Seconds(3));
    EXPECT_FALSE(frame.ok());
  }
  // A forged session id/token.
  v1::FdRequest req;
  req.set_op(v1::FdRequest::GET);
  req.set_session_id(good_->sessionId());
  req.set_session_token(std::string(16, 'A'));
  req.set_ticket("deadbeef");
  v1::FdReply r = FdCall(req);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  // PUT announcing more fds than it carries.
  int fd = ::memfd_create("x", MFD_CLOEXEC);
  req.set_op(v1::FdRequest::PUT);
  req.set_fd_count(3);
  r = FdCall(req, {fd});
  EXPECT_FALSE(r.ok());
  ::close(fd);
}

TEST_F(BadInput, UnusedFdTicketsPerSessionAreCapped) {
  int fd = ::memfd_create("x", MFD_CLOEXEC);
  absl::Status last;
  int accepted = 0;
  for (int i = 0; i < 80; ++i) {
    auto t = good_->sendFds({fd});
    if (!t.ok()) {
      last = t.status();
      break;
    }
    ++accepted;
  }
  ::close(fd);
  EXPECT_EQ(accepted, 64);
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted) << last;
}

// Bytes no client built from our .proto files would send: every method
// answers INVALID_ARGUMENT with a message naming the method, whatever its
// service, and never gRPC's bare INTERNAL.
TEST_F(BadInput, UnparsableRequestsAreInvalidArgumentWithAMessage) {
  const std::string truncated("\x0a\xff\x01", 3);     // field 1: length past the end
  const std::string bad_utf8("\x0a\x02\xff\xfe", 4);  // field 1 (a string): not UTF-8
  auto channel = UnixChannel(daemon_->socket());
  for (const char* method : {"/mooncake.v1.Local/Hello", "/mooncake.v1.Local/GetNodeInfo",
                             "/mooncake.v1.Local/JoinGroup", "/mooncake.v1.Local/LeaveGroup",
                             "/mooncake.v1.Local/ReportReady", "/mooncake.v1.Local/ExportFds",
                             "/mooncake.v1.Local/ImportFds", "/mooncake.v1.Admin/GetStatus",
                             "/mooncake.v1.Admin/GetTopology", "/mooncake.v1.Admin/ListSessions",
                             "/mooncake.v1.Admin/ListGroups"}) {
    grpc::Status s = RawUnaryCall(channel, method, truncated);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(method), std::string::npos) << s.error_message();
  }
  for (const char* method : {"/mooncake.v1.Local/JoinGroup", "/mooncake.v1.Local/LeaveGroup",
                             "/mooncake.v1.Local/ReportReady"}) {
    grpc::Status s = RawUnaryCall(channel, method, bad_utf8);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << s.error_message();
  }
}

TEST_F(BadInput, IdleFdChannelConnectionsCannotExhaustTheDaemon) {
  // Far more idle connections than the daemon serves at once: the excess is
  // refused, idle ones time out, and the daemon never runs out of threads.
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 400; ++i) {
    auto s = ConnectUnix(FdSocketPath(daemon_->socket()));
    if (s.ok()) idle.push_back(std::move(*s));
  }
  EXPECT_TRUE(good_->hello().ok());
  absl::SleepFor(absl::Milliseconds(2500));  // the daemon drops idle ones after 2 s
  idle.clear();
  int fd = ::memfd_create("x", MFD_CLOEXEC);
  auto t = good_->sendFds({fd});
  ::close(fd);
  EXPECT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(daemon_->running());
}

// Runs a shell command line for at most 10 s (a daemon that wrongly starts
// is stopped: exit 124), returning its exit code and its stdout+stderr.
std::pair<int, std::string> RunShell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(("timeout 10 " + cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, out};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A malformed peer_listen is refused by mooncaked's own config check, in
// one line: gRPC never sees it, so none of its "E... chttp2_server.cc"
// lines come first.
TEST(BadDaemonConfig, MalformedPeerListenIsOneClearLine) {
  TempDir dir;
  for (const std::string addr : {"0.0.0.0:99999", "::1:7450", "localhost"}) {
    auto [rc, out] = RunShell(BinDir() + "/mooncaked --socket " + dir.path() +
                              "/m.sock --peer-listen '" + addr + "'");
    EXPECT_EQ(rc, 64) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    EXPECT_EQ(out.rfind("mooncaked: flag: peer_listen = '" + addr + "': ", 0), 0u) << out;
  }
}

// `--config DIR` fails naming the path, instead of starting on defaults.
TEST(BadDaemonConfig, ConfigThatIsADirectoryFails) {
  TempDir dir;
  auto [rc, out] = RunShell(BinDir() + "/mooncaked --config " + dir.path() + " --socket " +
                            dir.path() + "/m.sock");
  EXPECT_EQ(rc, 64) << out;
  EXPECT_EQ(out, "mooncaked: config file " + dir.path() +
                     " is a directory; --config wants a file such as "
                     "/etc/mooncake/mooncaked.conf\n");
}

}  // namespace
}  // namespace mooncake::testing
