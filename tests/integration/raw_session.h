// What mc_abuse's attacks share: a session opened on a connection of its
// own with raw stubs, as a client that skips the library would, an fd PUT
// on the fd channel, and status counts as text.
#pragma once

#include <fcntl.h>
#include <grpcpp/create_channel_posix.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/populate.h"
#include "mooncake/v1/fd_channel.pb.h"
#include "mooncake/v1/local.grpc.pb.h"

namespace mooncake::abuse {

struct RawSession {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Local::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::SessionEvent>> events;
  v1::SessionOpened opened;
};

// Null when the daemon refuses the connection or the session.
inline std::unique_ptr<RawSession> OpenRawSession(const std::string& socket) {
  absl::StatusOr<UniqueFd> fd = ConnectUnix(socket);
  if (!fd.ok()) return nullptr;
  (void)SetNonBlocking(fd->get());
  auto s = std::make_unique<RawSession>();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  s->channel = grpc::CreateCustomInsecureChannelFromFd("mooncaked", fd->release(), args);
  s->stub = v1::Local::NewStub(s->channel);
  v1::OpenSessionRequest req;
  req.set_client_name("mc_abuse");
  s->events = s->stub->OpenSession(&s->ctx, req);
  v1::SessionEvent ev;
  if (!s->events->Read(&ev) || !ev.has_opened()) return nullptr;
  s->opened = ev.opened();
  return s;
}

// A memfd sealed against shrinking and growing, as the daemon requires of
// client memory; invalid when the kernel refuses. `populate` false leaves
// it sparse (which the daemon refuses to register).
inline UniqueFd SealedMemfd(uint64_t bytes, bool populate = true) {
  UniqueFd fd(::memfd_create("mc_abuse_rdma", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  // Allocated whole (as the client library does): mooncaked registers only
  // memfds whose every page holds data.
  if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
      (populate && PopulateMemfd(fd.get(), 0, bytes) != 0) ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return UniqueFd();
  }
  return fd;
}

// PUTs `fd` for `session` on the fd-channel connection `conn`; the ticket.
inline absl::StatusOr<std::string> PutFd(int conn, const v1::SessionOpened& session, int fd) {
  v1::FdRequest req;
  req.set_op(v1::FdRequest::PUT);
  req.set_session_id(session.session_id());
  req.set_session_token(session.token());
  req.set_fd_count(1);
  std::string bytes;
  req.SerializeToString(&bytes);
  if (absl::Status s = SendFrame(conn, bytes, {fd}); !s.ok()) return s;
  absl::StatusOr<Frame> f = RecvFrame(conn);
  if (!f.ok()) return f.status();
  v1::FdReply reply;
  if (!reply.ParseFromString(f->payload) || !reply.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(reply.code()), reply.error());
  }
  return reply.ticket();
}

// "OK:3,8:2": how many calls ended with each status code.
inline std::string CodesText(const std::map<std::string, int>& codes) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : codes) parts.push_back(absl::StrCat(k, ":", v));
  return absl::StrJoin(parts, ",");
}

}  // namespace mooncake::abuse
