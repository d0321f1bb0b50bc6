// mc_abuse: what a hostile (or merely careless) local user can do to
// mooncaked with nothing but the right to connect. The abuse tests run it
// as another uid against a real daemon (abuse_test), and bench/abuse/run.sh
// runs it at review scale against two daemon builds for before/after figures.
//
//   mc_abuse SOCKET fd-frame BYTES [CONNS [HOLD_MS]]
//       on each of CONNS fd-channel connections, all but the last byte of a
//       frame of BYTES bytes with kMaxFdsPerFrame fds riding on every byte
//       (one sendmsg per byte), held open HOLD_MS; prints how many
//       connections the daemon dropped.
//   mc_abuse SOCKET idle main|fd COUNT HOLD_MS
//       opens COUNT connections that send nothing, holds them HOLD_MS, and
//       prints how many were accepted and how many the daemon closed.
//   mc_abuse SOCKET join-all WORLD [--fds] [--timeout-ms T]
//       one session joins every rank of one group of WORLD (each with a
//       memfd when --fds), all at once; prints status counts and elapsed.
//   mc_abuse SOCKET waiting-joins COUNT TIMEOUT_MS
//       one session starts COUNT joins that never complete (COUNT groups of
//       world 2, one rank each) and waits until all have returned.
//   mc_abuse SOCKET join-timeout TIMEOUT_MS
//       one join with that timeout_ms; prints its status.
//   mc_abuse SOCKET rdma-flood SESSIONS HOLD_MS [--qps-per-call N]
//            [--region-bytes B] [--region-offset O] [--max-qps N] [--max-mrs N]
//            [--connect] [--sparse-regions]
//       SESSIONS sessions one after the other, each creating queue pairs
//       and then registering regions of B bytes (at offset O of a memfd,
//       written whole unless --sparse-regions) until refused, or up to --max-qps/--max-mrs each;
//       prints "flooded ...", holds them HOLD_MS, then the last refusal of each RPC (rdma_flood.h).
// Every run ends with one line "result key=value ...".
#include <grpcpp/create_channel_posix.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/paths.h"
#include "mooncake/v1/fd_channel.pb.h"
#include "mooncake/v1/local.grpc.pb.h"
#include "raw_session.h"
#include "rdma_flood.h"

namespace {

using mooncake::ConnectUnix;
using mooncake::UniqueFd;
using mooncake::abuse::CodesText;
using mooncake::abuse::OpenRawSession;
using mooncake::abuse::PutFd;
using mooncake::abuse::RawSession;
namespace v1 = mooncake::v1;

int Usage() {
  std::fprintf(
      stderr,
      "usage: mc_abuse SOCKET fd-frame BYTES [CONNS [HOLD_MS]] | idle main|fd COUNT HOLD_MS |\n"
      "       join-all WORLD [--fds] [--timeout-ms T] | waiting-joins COUNT TIMEOUT_MS |\n"
      "       join-timeout TIMEOUT_MS |\n"
      "       rdma-flood SESSIONS HOLD_MS [--qps-per-call N] [--region-bytes B]\n"
      "                  [--region-offset O] [--max-qps N] [--max-mrs N] [--connect]\n"
      "                  [--sparse-regions]\n");
  return 64;
}

void RaiseFdLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// Each of `conns` connections sends all but the last byte of one frame of
// `bytes` bytes, kMaxFdsPerFrame fds on every byte, and holds the frame
// open for `hold_ms`: what a daemon that counts fds per recvmsg keeps.
int FdFrame(const std::string& socket, uint32_t bytes, uint32_t conns, uint32_t hold_ms) {
  RaiseFdLimit();
  int memfd = ::memfd_create("mc_abuse", MFD_CLOEXEC);
  std::string frame(4, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((bytes >> (8 * i)) & 0xff);
  frame.append(bytes, 'x');
  uint64_t fds_sent = 0;
  std::vector<UniqueFd> held;
  for (uint32_t k = 0; k < conns; ++k) {
    absl::StatusOr<UniqueFd> s = ConnectUnix(mooncake::FdSocketPath(socket));
    if (!s.ok()) continue;
    for (size_t i = 0; i + 1 < frame.size(); ++i) {
      iovec iov{&frame[i], 1};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * mooncake::kMaxFdsPerFrame)] = {};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * mooncake::kMaxFdsPerFrame);
      int* fds = reinterpret_cast<int*>(CMSG_DATA(c));
      for (size_t f = 0; f < mooncake::kMaxFdsPerFrame; ++f) fds[f] = memfd;
      if (::sendmsg(s->get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) break;
      fds_sent += mooncake::kMaxFdsPerFrame;
    }
    held.push_back(std::move(*s));
  }
  std::printf("connected %zu\n", held.size());
  std::fflush(stdout);
  absl::SleepFor(absl::Milliseconds(hold_ms));
  size_t dropped = 0;
  for (const UniqueFd& c : held) {
    pollfd p{c.get(), POLLIN | POLLRDHUP, 0};
    dropped += ::poll(&p, 1, 0) > 0;
  }
  std::printf("result attack=fd-frame connections=%zu fds_sent=%lu dropped_by_daemon=%zu\n",
              held.size(), static_cast<unsigned long>(fds_sent), dropped);
  return 0;
}

int Idle(const std::string& socket, bool main_socket, uint32_t count, uint32_t hold_ms) {
  RaiseFdLimit();
  std::string path = main_socket ? socket : mooncake::FdSocketPath(socket);
  std::vector<UniqueFd> conns;
  uint32_t failed = 0;
  for (uint32_t i = 0; i < count; ++i) {
    // A daemon out of fds stops accepting; a full backlog then blocks.
    absl::StatusOr<UniqueFd> s = ConnectUnix(path, absl::Seconds(1));
    if (s.ok()) {
      conns.push_back(std::move(*s));
    } else {
      ++failed;
    }
  }
  std::printf("connected %zu\n", conns.size());
  std::fflush(stdout);
  // A connection the daemon accepted and then closed reads EOF; one it never
  // accepted (still in the backlog, or refused at accept) reads EOF too once
  // closed. Count what is still open at the end of the hold.
  absl::SleepFor(absl::Milliseconds(hold_ms));
  size_t closed = 0;
  std::vector<pollfd> p;
  for (const UniqueFd& c : conns) p.push_back({c.get(), POLLIN | POLLRDHUP, 0});
  ::poll(p.data(), p.size(), 0);
  for (const pollfd& x : p) closed += (x.revents & (POLLHUP | POLLRDHUP | POLLIN)) != 0;
  std::printf("result attack=idle socket=%s connected=%zu connect_failed=%u closed_by_daemon=%zu\n",
              main_socket ? "main" : "fd", conns.size(), failed, closed);
  return 0;
}

// Starts `requests` as async JoinGroup calls on one session and waits for
// all; returns counts by status code.
std::map<std::string, int> JoinMany(RawSession* s, std::vector<v1::JoinGroupRequest> requests) {
  struct Call {
    grpc::ClientContext ctx;
    v1::JoinGroupResponse resp;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::JoinGroupResponse>> reader;
  };
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Call>> calls;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto c = std::make_unique<Call>();
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
    c->reader = s->stub->PrepareAsyncJoinGroup(&c->ctx, requests[i], &cq);
    c->reader->StartCall();
    c->reader->Finish(&c->resp, &c->status, reinterpret_cast<void*>(i));
    calls.push_back(std::move(c));
  }
  std::map<std::string, int> codes;
  for (size_t done = 0; done < calls.size(); ++done) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    Call& c = *calls[reinterpret_cast<size_t>(tag)];
    codes[c.status.ok() ? "OK" : absl::StrCat(static_cast<int>(c.status.error_code()))] += 1;
    c.resp.Clear();  // what a client that read its view would free
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return codes;
}

int JoinAll(const std::string& socket, uint32_t world, bool with_fds, uint32_t timeout_ms) {
  RaiseFdLimit();
  std::unique_ptr<RawSession> s = OpenRawSession(socket);
  if (!s) {
    std::printf("result attack=join-all error=no-session\n");
    return 2;
  }
  absl::Time start = absl::Now();
  std::vector<v1::JoinGroupRequest> reqs;
  absl::StatusOr<UniqueFd> fdconn = ConnectUnix(mooncake::FdSocketPath(socket));
  int memfd = ::memfd_create("mc_abuse", MFD_CLOEXEC);
  int put_failed = 0;
  for (uint32_t r = 0; r < world; ++r) {
    v1::JoinGroupRequest j;
    j.set_group("abuse-all");
    j.set_rank(r);
    j.set_world_size(world);
    j.set_timeout_ms(timeout_ms);
    j.mutable_handle()->set_kind("memfd");
    j.mutable_handle()->set_data(std::string(48, 'h'));
    j.mutable_handle()->set_size(4096);
    reqs.push_back(std::move(j));
  }
  // Tickets are taken per join; the daemon holds at most 64 unused per
  // session, so fds go in batches with their joins.
  std::map<std::string, int> codes;
  const size_t batch = with_fds ? 16 : world;
  std::vector<std::unique_ptr<std::thread>> waiters;
  std::vector<std::map<std::string, int>> results((world + batch - 1) / batch);
  for (size_t b = 0; b * batch < world; ++b) {
    std::vector<v1::JoinGroupRequest> part;
    for (size_t r = b * batch; r < std::min<size_t>(world, (b + 1) * batch); ++r) {
      if (with_fds && fdconn.ok()) {
        absl::StatusOr<std::string> t = PutFd(fdconn->get(), s->opened, memfd);
        if (t.ok()) {
          reqs[r].mutable_handle()->set_fd_ticket(*t);
        } else {
          ++put_failed;
        }
      }
      part.push_back(reqs[r]);
    }
    waiters.push_back(std::make_unique<std::thread>(
        [&, b, part]() mutable { results[b] = JoinMany(s.get(), std::move(part)); }));
    if (with_fds) absl::SleepFor(absl::Milliseconds(25));  // let the batch consume its tickets
  }
  for (auto& t : waiters) t->join();
  for (const auto& r : results) {
    for (const auto& [k, v] : r) codes[k] += v;
  }
  std::printf("result attack=join-all world=%u fds=%d put_failed=%d codes=%s elapsed_ms=%ld\n",
              world, with_fds ? 1 : 0, put_failed, CodesText(codes).c_str(),
              static_cast<long>(absl::ToInt64Milliseconds(absl::Now() - start)));
  return 0;
}

int WaitingJoins(const std::string& socket, uint32_t count, uint32_t timeout_ms) {
  std::unique_ptr<RawSession> s = OpenRawSession(socket);
  if (!s) {
    std::printf("result attack=waiting-joins error=no-session\n");
    return 2;
  }
  std::vector<v1::JoinGroupRequest> reqs;
  for (uint32_t i = 0; i < count; ++i) {
    v1::JoinGroupRequest j;
    j.set_group(absl::StrCat("abuse-wait-", i));
    j.set_rank(0);
    j.set_world_size(2);
    j.set_timeout_ms(timeout_ms);
    reqs.push_back(std::move(j));
  }
  absl::Time start = absl::Now();
  std::map<std::string, int> codes = JoinMany(s.get(), std::move(reqs));
  std::printf("result attack=waiting-joins count=%u codes=%s elapsed_ms=%ld\n", count,
              CodesText(codes).c_str(),
              static_cast<long>(absl::ToInt64Milliseconds(absl::Now() - start)));
  return 0;
}

int JoinTimeout(const std::string& socket, uint32_t timeout_ms) {
  std::unique_ptr<RawSession> s = OpenRawSession(socket);
  if (!s) return 2;
  v1::JoinGroupRequest j;
  j.set_group("abuse-timeout");
  j.set_rank(0);
  j.set_world_size(2);
  j.set_timeout_ms(timeout_ms);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::JoinGroupResponse resp;
  grpc::Status st = s->stub->JoinGroup(&ctx, j, &resp);
  std::printf("result attack=join-timeout timeout_ms=%u code=%d message=%s\n", timeout_ms,
              static_cast<int>(st.error_code()), st.error_message().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  std::string socket = argv[1], attack = argv[2];
  auto num = [&](int i, uint32_t* out) { return i < argc && absl::SimpleAtoi(argv[i], out); };
  uint32_t a = 0, b = 0;
  uint32_t c = 1, h = 1500;
  if (attack == "fd-frame" && num(3, &a)) {
    if (argc > 4) num(4, &c);
    if (argc > 5) num(5, &h);
    return FdFrame(socket, a, c, h);
  }
  if (attack == "idle" && argc >= 6 && num(4, &a) && num(5, &b)) {
    return Idle(socket, std::string(argv[3]) == "main", a, b);
  }
  if (attack == "join-all" && num(3, &a)) {
    bool fds = false;
    uint32_t timeout_ms = 120000;
    for (int i = 4; i < argc; ++i) {
      if (std::string(argv[i]) == "--fds") fds = true;
      if (std::string(argv[i]) == "--timeout-ms") num(++i, &timeout_ms);
    }
    return JoinAll(socket, a, fds, timeout_ms);
  }
  if (attack == "waiting-joins" && num(3, &a) && num(4, &b)) return WaitingJoins(socket, a, b);
  if (attack == "join-timeout" && num(3, &a)) return JoinTimeout(socket, a);
  if (attack == "rdma-flood" && num(3, &a) && num(4, &b)) {
    mooncake::abuse::RdmaFloodOptions o;
    o.sessions = a;
    o.hold_ms = b;
    for (int i = 5; i < argc; ++i) {
      const std::string flag = argv[i];
      bool ok = true;
      if (flag == "--connect") {
        o.connect = true;
      } else if (flag == "--qps-per-call") {
        ok = num(++i, &o.qps_per_call) && o.qps_per_call > 0;
      } else if (flag == "--region-bytes") {
        ok = ++i < argc && absl::SimpleAtoi(argv[i], &o.region_bytes) && o.region_bytes > 0;
      } else if (flag == "--region-offset") {
        ok = ++i < argc && absl::SimpleAtoi(argv[i], &o.region_offset);
      } else if (flag == "--max-qps") {
        ok = num(++i, &o.max_qps);
      } else if (flag == "--max-mrs") {
        ok = num(++i, &o.max_mrs);
      } else if (flag == "--sparse-regions") {
        o.sparse_regions = true;
      } else {
        ok = false;
      }
      if (!ok) return Usage();
    }
    RaiseFdLimit();
    return mooncake::abuse::RdmaFlood(socket, o);
  }
  return Usage();
}
