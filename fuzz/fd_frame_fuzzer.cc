// The fd channel's frame parser, RecvFrame (common/src/fd_passing.cc), and
// what the daemon does with a frame (daemon/fdchannel/fd_channel_server.cc):
// parse an FdRequest, authenticate it, store a PUT's fds in the FdBroker or
// redeem a GET's ticket, and answer with a frame the client side parses.
//
// Input: chunks, each a u8 c, a u16 length n and n bytes. The n bytes go
// into one end of a socketpair with one sendmsg, carrying c % 70 copies of
// one memfd (SCM_RIGHTS; more than kMaxFdsPerFrame is tried on purpose).
// The bytes are the raw stream, length prefixes included. Up to 16 frames
// are then read from the other end. To get past authentication an FdRequest
// names the session's token (random) as "@token", with session_id 0 for its
// id, and a ticket "@k" stands for the k-th ticket a PUT returned.
// Invariants: a frame holds at most kMaxFdsPerFrame fds, all close-on-exec,
// and at most kMaxFrameBytes bytes; an incoming (PUT) ticket is never
// handed out by GET; once the session is dropped the broker holds no fds;
// and after each input the process has exactly the fds it had before.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "fdchannel/fd_broker.h"
#include "fuzz_support.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/v1/fd_channel.pb.h"
#include "session/session_registry.h"

namespace mooncake::daemon {
namespace {

constexpr uint32_t kUid = 31337;  // not root, not ours: the fd budget applies
constexpr size_t kMaxFrames = 16;
constexpr size_t kMaxChunks = 256;

// Sends `bytes` with `nfds` copies of `fd`; false when the socket is full
// (the rest of the input is not sent).
bool SendChunk(int sock, absl::string_view bytes, int fd, size_t nfds) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<int> fds(nfds, fd);
  std::vector<char> control(CMSG_SPACE(sizeof(int) * nfds));
  if (nfds > 0) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * nfds);
  }
  for (;;) {
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n) == bytes.size();
    if (errno != EINTR) return false;
  }
}

void CheckFrame(const Frame& f) {
  FUZZ_CHECK(f.fds.size() <= kMaxFdsPerFrame, f.fds.size(), " fds in one frame");
  FUZZ_CHECK(f.payload.size() <= kMaxFrameBytes, f.payload.size(), " bytes in one frame");
  for (const UniqueFd& fd : f.fds) {
    const int flags = ::fcntl(fd.get(), F_GETFD);
    FUZZ_CHECK(flags >= 0 && (flags & FD_CLOEXEC), "received fd ", fd.get(), " flags ", flags);
  }
}

struct Channel {
  SessionRegistry sessions{16};
  FdBroker fds{absl::Seconds(60), &sessions};
  SessionInfo session;
  std::vector<std::string> incoming;  // tickets PUT returned, for "@k"

  // The server's answer to one request frame: the reply and the fds on it.
  v1::FdReply Handle(Frame frame, FdBundlePtr* out) {
    v1::FdReply reply;
    v1::FdRequest req;
    if (!req.ParseFromString(frame.payload)) {
      reply.set_error("fd channel: malformed request");
      return reply;
    }
    uint64_t id = req.session_id();
    std::string token = req.session_token();
    if (token == "@token") {
      token = session.token;
      if (id == 0) id = session.id;
    }
    absl::StatusOr<SessionInfo> who = sessions.Authenticate(id, token, kUid);
    if (!who.ok()) {
      reply.set_error(std::string(who.status().message()));
      return reply;
    }
    std::string ticket = req.ticket();
    size_t k = 0;
    const bool named = ticket.size() > 1 && ticket[0] == '@' &&
                       absl::SimpleAtoi(absl::string_view(ticket).substr(1), &k) &&
                       k < incoming.size();
    if (named) ticket = incoming[k];
    switch (req.op()) {
      case v1::FdRequest::PUT: {
        if (frame.fds.empty() || frame.fds.size() != req.fd_count()) {
          reply.set_error("fd count mismatch");
          return reply;
        }
        absl::StatusOr<std::string> t = fds.AddIncoming(*who, std::move(frame.fds));
        if (!t.ok()) {
          reply.set_error(std::string(t.status().message()));
          return reply;
        }
        incoming.push_back(*t);
        reply.set_ok(true);
        reply.set_ticket(*t);
        return reply;
      }
      case v1::FdRequest::GET: {
        absl::StatusOr<FdBundlePtr> bundle = fds.Redeem(ticket, who->id, kUid);
        FUZZ_CHECK(!(named && bundle.ok()), "GET redeemed the incoming ticket @", k);
        if (!bundle.ok()) {
          reply.set_error(std::string(bundle.status().message()));
          return reply;
        }
        *out = *std::move(bundle);
        reply.set_ok(true);
        reply.set_fd_count(static_cast<uint32_t>((*out)->fds.size()));
        return reply;
      }
      default: reply.set_error("fd channel: unknown op"); return reply;
    }
  }
};

void RunOne(mooncake::fuzz::ByteReader& in) {
  int pair[2];
  FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0, "socketpair");
  UniqueFd client(pair[0]), server(pair[1]);
  UniqueFd memfd(::memfd_create("fuzz", MFD_CLOEXEC));
  FUZZ_CHECK(memfd.valid(), "memfd_create");

  for (size_t chunks = 0; !in.empty() && chunks < kMaxChunks; ++chunks) {
    const size_t nfds = in.U8() % 70;
    if (!SendChunk(client.get(), in.Chunk(), memfd.get(), nfds)) break;
  }
  // End of the stream: a frame cut short fails instead of waiting.
  ::shutdown(client.get(), SHUT_WR);

  Channel channel;
  absl::StatusOr<SessionInfo> s = channel.sessions.Open(PeerCred{4242, kUid, kUid}, 7, "fuzz");
  FUZZ_CHECK(s.ok(), s.status());
  channel.session = *s;

  for (size_t i = 0; i < kMaxFrames; ++i) {
    absl::StatusOr<Frame> frame = RecvFrame(server.get(), absl::Seconds(5));
    if (!frame.ok()) {
      FUZZ_CHECK(frame.status().code() != absl::StatusCode::kDeadlineExceeded,
                 "RecvFrame waited on a closed stream: ", frame.status());
      break;
    }
    CheckFrame(*frame);
    FdBundlePtr bundle;
    v1::FdReply reply = channel.Handle(*std::move(frame), &bundle);
    std::vector<int> fds;
    if (bundle) {
      for (const UniqueFd& fd : bundle->fds) fds.push_back(fd.get());
    }
    // The reply travels back and is parsed as the client does.
    absl::Status sent = SendFrame(server.get(), reply.SerializeAsString(), fds);
    FUZZ_CHECK(sent.ok(), sent);
    absl::StatusOr<Frame> back = RecvFrame(client.get(), absl::Seconds(5));
    FUZZ_CHECK(back.ok(), back.status());
    CheckFrame(*back);
    v1::FdReply parsed;
    FUZZ_CHECK(parsed.ParseFromString(back->payload), "reply does not parse");
    FUZZ_CHECK(back->fds.size() == fds.size(), back->fds.size(), " fds, sent ", fds.size());
  }

  channel.sessions.Close(channel.session.id);
  channel.fds.DropSession(channel.session.id);
  FUZZ_CHECK(channel.fds.FdsHeld() == 0, channel.fds.FdsHeld(), " fds held after DropSession");
  FUZZ_CHECK(channel.fds.TicketCount() == 0, channel.fds.TicketCount(), " tickets left");
}

}  // namespace
}  // namespace mooncake::daemon

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mooncake::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mooncake::fuzz::ExpectFdsKept([&] {
    mooncake::fuzz::ByteReader in(data, size);
    mooncake::daemon::RunOne(in);
  });
  return 0;
}
