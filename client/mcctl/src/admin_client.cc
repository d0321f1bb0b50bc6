#include "mooncake/mcctl/admin_client.h"

#include <grpcpp/create_channel_posix.h>
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/grpc_status.h"

namespace mooncake::mcctl {
namespace {

template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> Call(v1::Admin::Stub* stub, const absl::Status& path_status,
                              int timeout_ms, Method method) {
  if (!path_status.ok()) return path_status;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  // A missing daemon must fail at once, not after the deadline.
  ctx.set_wait_for_ready(false);
  Request request;
  Response response;
  grpc::Status st = (stub->*method)(&ctx, request, &response);
  if (!st.ok()) return FromGrpc(st);
  return response;
}

std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

}  // namespace

absl::Status AdminClient::CheckSocketPath(const std::string& socket_path) {
  constexpr size_t kMaxPath = sizeof(sockaddr_un::sun_path) - 1;
  if (socket_path.size() > kMaxPath) {
    return absl::InvalidArgumentError(absl::StrCat("socket path is ", socket_path.size(),
                                                   " bytes, longer than the ", kMaxPath,
                                                   " a UNIX socket allows: ", socket_path));
  }
  return absl::OkStatus();
}

AdminClient::AdminClient(std::string socket_path, int timeout_ms)
    : socket_path_(std::move(socket_path)), timeout_ms_(timeout_ms) {
  // gRPC logs its own error lines for a path it cannot parse; never give it one.
  path_status_ = CheckSocketPath(socket_path_);
  if (!path_status_.ok()) return;
  // Connected here, not by gRPC: a blocking connect waits its turn in the
  // listen backlog while another user floods the socket (gRPC's
  // non-blocking connect fails at once with EAGAIN then), and a refusal
  // gets ConnectUnix's precise message (permissions, mode, group).
  absl::StatusOr<UniqueFd> fd = ConnectUnix(socket_path_, absl::Milliseconds(timeout_ms_));
  if (!fd.ok()) {
    path_status_ = fd.status();
    return;
  }
  if (absl::Status s = SetNonBlocking(fd->get()); !s.ok()) {
    path_status_ = s;
    return;
  }
  auto channel = grpc::CreateInsecureChannelFromFd("mooncaked", fd->release());
  stub_ = v1::Admin::NewStub(channel);
}

absl::StatusOr<v1::DaemonStatus> AdminClient::GetStatus() {
  return Call<v1::GetStatusRequest, v1::DaemonStatus>(stub_.get(), path_status_, timeout_ms_,
                                                      &v1::Admin::Stub::GetStatus);
}

absl::StatusOr<v1::Topology> AdminClient::GetTopology() {
  return Call<v1::GetTopologyRequest, v1::Topology>(stub_.get(), path_status_, timeout_ms_,
                                                    &v1::Admin::Stub::GetTopology);
}

absl::StatusOr<v1::ListSessionsResponse> AdminClient::ListSessions() {
  return Call<v1::ListSessionsRequest, v1::ListSessionsResponse>(
      stub_.get(), path_status_, timeout_ms_, &v1::Admin::Stub::ListSessions);
}

absl::StatusOr<v1::ListGroupsResponse> AdminClient::ListGroups() {
  return Call<v1::ListGroupsRequest, v1::ListGroupsResponse>(stub_.get(), path_status_, timeout_ms_,
                                                             &v1::Admin::Stub::ListGroups);
}

absl::StatusOr<v1::ListPeersResponse> AdminClient::ListPeers() {
  return Call<v1::ListPeersRequest, v1::ListPeersResponse>(stub_.get(), path_status_, timeout_ms_,
                                                           &v1::Admin::Stub::ListPeers);
}

absl::StatusOr<v1::ListQueuePairsResponse> AdminClient::ListQueuePairs() {
  return Call<v1::ListQueuePairsRequest, v1::ListQueuePairsResponse>(
      stub_.get(), path_status_, timeout_ms_, &v1::Admin::Stub::ListQueuePairs);
}

absl::StatusOr<v1::ListMemoryRegionsResponse> AdminClient::ListMemoryRegions() {
  return Call<v1::ListMemoryRegionsRequest, v1::ListMemoryRegionsResponse>(
      stub_.get(), path_status_, timeout_ms_, &v1::Admin::Stub::ListMemoryRegions);
}

absl::Status AdminClient::WatchEvents(const std::function<bool(const v1::WatchEvent&)>& on_event) {
  if (!path_status_.ok()) return path_status_;
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(false);
  v1::WatchEventsRequest request;
  std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader = stub_->WatchEvents(&ctx, request);
  v1::WatchEvent event;
  while (reader->Read(&event)) {
    if (!on_event(event)) {
      ctx.TryCancel();
      while (reader->Read(&event)) {
      }
      (void)reader->Finish();
      return absl::OkStatus();
    }
  }
  grpc::Status st = reader->Finish();
  if (st.ok()) {
    return absl::UnavailableError("mooncaked ended the event stream");
  }
  return FromGrpc(st);
}

bool AdminClient::IsUnreachable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

std::string AdminClient::UnreachableReason(const absl::Status& status) const {
  if (absl::IsDeadlineExceeded(status)) {
    return absl::StrCat("no reply within ", timeout_ms_, " ms");
  }
  // gRPC's text for a failed connect is long and varies by version; the
  // errno of connect() itself is what a user can act on.
  sockaddr_un addr{};
  if (socket_path_.size() >= sizeof(addr.sun_path)) {
    return absl::StrCat("socket path longer than ", sizeof(addr.sun_path) - 1, " bytes");
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path_.data(), socket_path_.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    const int err = errno;
    ::close(fd);
    if (rc != 0) return std::strerror(err);
  }
  return OneLine(std::string(status.message()));
}

}  // namespace mooncake::mcctl
