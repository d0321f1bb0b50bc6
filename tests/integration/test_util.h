// Helpers for integration tests: raw stubs over the daemon's socket.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

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

// Sends `bytes` as the request of unary `method` ("/pkg.Service/Method")
// without any schema, as a fuzzer or a stale client would; the response's
// bytes go to `response` when given.
inline grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& method, const std::string& bytes,
                                 std::string* response_bytes = nullptr) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  Deadline(&ctx);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&ctx, method, request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (response_bytes != nullptr) {
    response_bytes->clear();
    std::vector<grpc::Slice> slices;
    if (status.ok() && response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        response_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
  }
  return status;
}

}  // namespace mooncake::testing
