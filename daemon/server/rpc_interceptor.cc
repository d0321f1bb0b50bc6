#include "server/rpc_interceptor.h"

#include <grpcpp/server_context.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"

namespace mooncake::daemon {
namespace {

using grpc::experimental::InterceptionHookPoints;

// The method of a call ("/pkg.Service/Method") when one of `services` has
// it; null otherwise: a method this server does not serve, whose
// UNIMPLEMENTED is the true answer.
const google::protobuf::MethodDescriptor* ServedMethod(const char* path,
                                                       const std::vector<std::string>& services) {
  if (path == nullptr || path[0] != '/') return nullptr;
  std::string name(path + 1);
  size_t slash = name.find('/');
  if (slash == std::string::npos) return nullptr;
  if (std::find(services.begin(), services.end(), name.substr(0, slash)) == services.end()) {
    return nullptr;
  }
  name[slash] = '.';
  return google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(name);
}

class RpcInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(grpc::experimental::ServerRpcInfo* info, ConnectionTable* connections,
                 const std::vector<std::string>* services, metrics::EventCounters* counters)
      : info_(info),
        connections_(connections),
        services_(services),
        counters_(counters),
        method_(counters != nullptr
                    ? counters->MethodIndex(absl::NullSafeStringView(info->method()))
                    : 0) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA) &&
        connections_ != nullptr && info_->server_context() != nullptr) {
      int fd = ConnectionTable::FdFromPeer(info_->server_context()->peer());
      if (fd >= 0) connections_->MarkUsed(fd);
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status s = methods->GetSendStatus();
      grpc::StatusCode code = s.error_code();
      const google::protobuf::MethodDescriptor* method = nullptr;
      if ((s.error_code() == grpc::StatusCode::INTERNAL ||
           s.error_code() == grpc::StatusCode::UNIMPLEMENTED) &&
          s.error_message().empty() &&
          (method = ServedMethod(info_->method(), *services_)) != nullptr) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("the request to ", info_->method(), " could not be parsed as ",
                         method->input_type()->full_name(),
                         ": malformed protobuf, or invalid UTF-8 in a string field (build the "
                         "client from the same .proto files)")));
        code = grpc::StatusCode::INVALID_ARGUMENT;
      }
      if (counters_ != nullptr) counters_->RecordRpc(method_, code);
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;
  ConnectionTable* const connections_;
  const std::vector<std::string>* const services_;
  metrics::EventCounters* const counters_;
  const size_t method_;  // counters_->MethodIndex of the call
};

}  // namespace

grpc::experimental::Interceptor* RpcInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  // Unary calls only: a call with no interceptor skips gRPC's interception
  // machinery, which would otherwise run on every message of the session
  // streams (n^2 membership events when a large group leaves). Streams need
  // neither job: a request that does not parse is a unary one here, and a
  // connection's first call is a unary Hello (OpenSession also marks it,
  // through ConnectionTable::CallerOf).
  if (info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY) return nullptr;
  return new RpcInterceptor(info, connections_, &services_, counters_);
}

}  // namespace mooncake::daemon
