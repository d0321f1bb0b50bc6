// mc_test_client: a client process the integration tests start, kill and
// run as another user. Prints one line per fact so tests can wait for it.
//
//   mc_test_client member SOCKET GROUP RANK WORLD [--fd]
//       joins (with a memfd holding "rank-R" when --fd), prints JOINED and
//       PEERFD lines, then prints EVENT lines until stdin closes.
//   mc_test_client denied SOCKET EXPORT_ID SECRET_HEX TICKET
//       tries to import another user's export and redeem their ticket.
//   mc_test_client p2p-after-daemon SOCKET GROUP RANK WORLD
//       forms a host-platform group over P2P (Communicator: memfd buffers
//       mapped from every peer), prints READY, waits until its session says
//       the daemon is gone, prints DAEMON GONE, then puts a message into
//       every peer's buffer through those mappings and counts arrivals with
//       mc_red_add; prints "EXCHANGED ..., all correct" and exits 0 (1 on
//       wrong bytes, 2 on a setup error, 3 on a timeout).
//   mc_test_client rdma-after-daemon SOCKET GROUP RANK WORLD
//       the same group over RDMA (softnic); once the daemon is gone, puts
//       to the next rank and calls mc_quiet: prints
//       "AFTER DAEMON put=S quiet=S ms=T" (McStatus numbers) and exits 0.
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "mooncake/client/client.h"
#include "mooncake/client/communicator.h"
#include "mooncake/device/comm_device.h"
#include "mooncake/v1/admin.grpc.pb.h"

namespace {

int Member(int argc, char** argv) {
  if (argc < 6) return 64;
  std::string socket = argv[2], group = argv[3];
  uint32_t rank = 0, world = 0;
  if (!absl::SimpleAtoi(argv[4], &rank) || !absl::SimpleAtoi(argv[5], &world)) return 64;
  bool with_fd = argc > 6 && std::string(argv[6]) == "--fd";
  auto client = mooncake::Client::Connect({.socket_path = socket, .client_name = "test member"});
  if (!client.ok()) {
    std::cout << "ERROR connect " << client.status().message() << std::endl;
    return 2;
  }
  mooncake::JoinOptions j{
      .group = group, .rank = rank, .world_size = world, .timeout = absl::Seconds(20)};
  int memfd = -1;
  if (with_fd) {
    memfd = ::memfd_create("mc-test", MFD_CLOEXEC);
    std::string text = "rank-" + std::to_string(rank);
    if (memfd < 0 ||
        ::write(memfd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      return 2;
    }
    j.fds = {memfd};
    j.handle_kind = "memfd";
    j.handle_size = text.size();
  }
  auto view = (*client)->joinGroup(j);
  if (!view.ok()) {
    std::cout << "ERROR join code=" << static_cast<int>(view.status().code()) << " "
              << view.status().message() << std::endl;
    return 3;
  }
  std::cout << "JOINED epoch=" << view->epoch << " n=" << view->members.size()
            << " session=" << (*client)->sessionId() << std::endl;
  for (const auto& m : view->members) {
    if (m.fd_ticket.empty()) continue;
    auto fds = (*client)->fetchFds(m.fd_ticket);
    if (!fds.ok() || fds->size() != 1) {
      std::cout << "ERROR fetch rank=" << m.rank << std::endl;
      continue;
    }
    char buf[64] = {};
    ssize_t n = ::pread((*fds)[0].get(), buf, sizeof(buf) - 1, 0);
    std::cout << "PEERFD rank=" << m.rank << " content=" << std::string(buf, n > 0 ? n : 0)
              << std::endl;
  }
  // Events until stdin closes.
  std::thread events([&] {
    for (;;) {
      auto ev = (*client)->nextEvent(absl::Milliseconds(100));
      if (!ev) continue;
      std::cout << "EVENT kind=" << mooncake::SessionEventKindName(ev->kind)
                << " group=" << ev->group << " rank=" << ev->rank << std::endl;
      if (ev->kind == mooncake::SessionEvent::Kind::kDaemonShutdown ||
          ev->kind == mooncake::SessionEvent::Kind::kDisconnected) {
        return;
      }
    }
  });
  events.detach();
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  (void)(*client)->leaveGroup(group, rank);
  std::cout << "LEFT" << std::endl;
  std::_Exit(0);
}

int Denied(int argc, char** argv) {
  if (argc < 6) return 64;
  std::string socket = argv[2];
  mooncake::FdExport e;
  if (!absl::SimpleAtoi(argv[3], &e.id)) return 64;
  e.secret = absl::HexStringToBytes(argv[4]);
  std::string ticket = argv[5];
  auto client = mooncake::Client::Connect({.socket_path = socket, .client_name = "intruder"});
  if (!client.ok()) {
    std::cout << "CONNECT code=" << static_cast<int>(client.status().code()) << " "
              << client.status().message() << std::endl;
    return 0;
  }
  auto hello = (*client)->hello();
  std::cout << "UID " << (hello.ok() ? hello->uid : 999999) << std::endl;
  auto imported = (*client)->importFds(e);
  std::cout << "IMPORT code=" << static_cast<int>(imported.status().code()) << std::endl;
  auto fetched = (*client)->fetchFds(ticket);
  std::cout << "FETCH code=" << static_cast<int>(fetched.status().code()) << std::endl;
  // The same group name under another uid is another group: it never forms.
  auto joined = (*client)->joinGroup(
      {.group = "shared", .rank = 1, .world_size = 2, .timeout = absl::Milliseconds(300)});
  std::cout << "JOIN code=" << static_cast<int>(joined.status().code()) << std::endl;
  auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  auto admin = mooncake::v1::Admin::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  mooncake::v1::ListGroupsResponse groups;
  grpc::Status s = admin->ListGroups(&ctx, {}, &groups);
  std::cout << "GROUPS ok=" << s.ok() << " n=" << groups.groups_size() << std::endl;
  std::cout << "DONE" << std::endl;
  return 0;
}

uint8_t P2pPattern(size_t i, uint32_t src) { return static_cast<uint8_t>(i * 7 + src * 31 + 1); }

int AfterDaemon(int argc, char** argv, mooncake::Route route) {
  if (argc < 6) return 64;
  mooncake::CommunicatorOptions o;
  o.socket_path = argv[2];
  o.group = argv[3];
  if (!absl::SimpleAtoi(argv[4], &o.rank) || !absl::SimpleAtoi(argv[5], &o.world_size) ||
      o.world_size < 2 || o.world_size > 64 || o.rank >= o.world_size) {
    return 64;
  }
  // [0, 8): arrival counter; from 4096: one kSlot slot per source rank.
  constexpr size_t kMsg = 1000, kSlot = 1024, kSlots = 4096;
  o.buffer_bytes = kSlots + kSlot * o.world_size;
  o.platform = mooncake::Platform::kHost;
  o.route = route;
  o.timeout = absl::Seconds(20);
  o.client_name = "test member after the daemon";
  auto comm = mooncake::Communicator::Create(o);
  if (!comm.ok()) {
    std::cout << "ERROR setup " << comm.status().message() << std::endl;
    return 2;
  }
  std::cout << "READY handle=" << (*comm)->handleKind() << std::endl;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (;;) {
    auto ev = (*comm)->client().nextEvent(absl::Milliseconds(100));
    if (ev && (ev->kind == mooncake::SessionEvent::Kind::kDaemonShutdown ||
               ev->kind == mooncake::SessionEvent::Kind::kDisconnected)) {
      std::cout << "DAEMON GONE " << mooncake::SessionEventKindName(ev->kind) << std::endl;
      break;
    }
    if (absl::Now() > deadline) {
      std::cout << "ERROR the daemon is still there" << std::endl;
      return 3;
    }
  }
  const mooncake::device::CommCtx& ctx = (*comm)->ctx();
  auto* buf = static_cast<uint8_t*>((*comm)->buffer());
  auto* counter = reinterpret_cast<uint64_t*>(buf);
  if (route == mooncake::Route::kRdma) {
    // Nothing executes WQEs any more: what do a put and mc_quiet say?
    const int dst = static_cast<int>((o.rank + 1) % o.world_size);
    const absl::Time start = absl::Now();
    const auto put = mooncake::device::mc_put_thread(ctx, dst, buf + kSlots, buf + kSlots, 16);
    const auto quiet = mooncake::device::mc_quiet(ctx);
    std::cout << "AFTER DAEMON put=" << static_cast<int>(put)
              << " quiet=" << static_cast<int>(quiet)
              << " ms=" << absl::ToInt64Milliseconds(absl::Now() - start) << std::endl;
    comm->reset();
    std::cout << "CLOSED" << std::endl;
    return 0;
  }
  uint8_t msg[kMsg];
  for (size_t i = 0; i < kMsg; ++i) msg[i] = P2pPattern(i, o.rank);
  for (uint32_t dst = 0; dst < o.world_size; ++dst) {
    if (dst == o.rank) continue;
    if (!mooncake::device::mc_p2p_available(ctx, static_cast<int>(dst))) {
      std::cout << "ERROR rank " << dst << " is not mapped" << std::endl;
      return 2;
    }
    auto st = mooncake::device::mc_put_thread(ctx, static_cast<int>(dst),
                                              buf + kSlots + kSlot * o.rank, msg, kMsg);
    mooncake::device::mc_fence();
    if (st == mooncake::device::McStatus::kOk) {
      st = mooncake::device::mc_red_add(ctx, static_cast<int>(dst), counter, uint64_t{1});
    }
    if (st != mooncake::device::McStatus::kOk) {
      std::cout << "ERROR put to rank " << dst << ": status " << static_cast<int>(st) << std::endl;
      return 2;
    }
  }
  uint64_t seen = 0;
  const uint64_t want = o.world_size - 1;
  if (!mooncake::device::mc_wait_until_for(counter, mooncake::device::McCmp::kGe, want,
                                           uint64_t{20'000'000'000}, &seen)) {
    std::cout << "ERROR " << seen << " of " << want << " arrivals" << std::endl;
    return 3;
  }
  uint64_t bad = 0;
  for (uint32_t src = 0; src < o.world_size; ++src) {
    if (src == o.rank) continue;
    const uint8_t* slot = buf + kSlots + kSlot * src;
    for (size_t i = 0; i < kMsg; ++i) bad += slot[i] != P2pPattern(i, src);
  }
  if (bad != 0) {
    std::cout << "ERROR " << bad << " bytes wrong" << std::endl;
    return 1;
  }
  std::cout << "EXCHANGED " << want << " messages of " << kMsg << " bytes, all correct"
            << std::endl;
  // The destructor talks to a daemon that is gone: it must not hang.
  comm->reset();
  std::cout << "CLOSED" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  std::string cmd = argv[1];
  if (cmd == "member") return Member(argc, argv);
  if (cmd == "denied") return Denied(argc, argv);
  if (cmd == "p2p-after-daemon") return AfterDaemon(argc, argv, mooncake::Route::kP2p);
  if (cmd == "rdma-after-daemon") return AfterDaemon(argc, argv, mooncake::Route::kRdma);
  return 64;
}
