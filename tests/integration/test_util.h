// Helpers for integration tests: raw stubs over the daemon's socket.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "mooncake/v1/admin.grpc.pb.h"
#include "mooncake/v1/local.grpc.pb.h"

namespace mooncake::testing {

inline std::shared_ptr<grpc::Channel> UnixChannel(const std::string& socket) {
  return grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
}

inline void Deadline(grpc::ClientContext* ctx, int ms = 5000) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
}

inline v1::ListGroupsResponse ListGroups(const std::string& socket) {
  auto stub = v1::Admin::NewStub(UnixChannel(socket));
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::ListGroupsResponse r;
  stub->ListGroups(&ctx, {}, &r);
  return r;
}

inline v1::DaemonStatus GetStatus(const std::string& socket) {
  auto stub = v1::Admin::NewStub(UnixChannel(socket));
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::DaemonStatus r;
  stub->GetStatus(&ctx, {}, &r);
  return r;
}

}  // namespace mooncake::testing
