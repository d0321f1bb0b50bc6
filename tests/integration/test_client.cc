// mc_test_client: a client process the integration tests start, kill and
// run as another user. Prints one line per fact so tests can wait for it.
//
//   mc_test_client member SOCKET GROUP RANK WORLD [--fd]
//       joins (with a memfd holding "rank-R" when --fd), prints JOINED and
//       PEERFD lines, then prints EVENT lines until stdin closes.
//   mc_test_client denied SOCKET EXPORT_ID SECRET_HEX TICKET
//       tries to import another user's export and redeem their ticket.
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  std::string cmd = argv[1];
  if (cmd == "member") return Member(argc, argv);
  if (cmd == "denied") return Denied(argc, argv);
  return 64;
}
