// RpcInterceptor: what every RPC on the main socket passes through,
// whatever its service (Local, Admin, health, reflection).
//  - It marks the call's connection as used in the ConnectionTable, so the
//    handshake deadline only closes connections that never started an RPC.
//  - A request gRPC could not parse (malformed protobuf, invalid UTF-8 in a
//    string field) answers INVALID_ARGUMENT with a message naming the
//    method and its request type, instead of what gRPC sends: INTERNAL
//    with an empty message (sync handlers) or UNIMPLEMENTED with an empty
//    message (callback handlers). The daemon's own errors always carry a
//    message, so either, empty, on a method we serve is the parse failure.
//  - With metrics on, it counts each answered call by method and final
//    code (metrics::EventCounters: one atomic add).
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <string>
#include <vector>

#include "metrics/event_counters.h"
#include "server/connection_table.h"

namespace mooncake::daemon {

class RpcInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `connections` may be null (the peer server has no connection table);
  // `services`: full names of the services this server serves;
  // `counters` (may be null: metrics off) outlives the server.
  RpcInterceptorFactory(ConnectionTable* connections, std::vector<std::string> services,
                        metrics::EventCounters* counters = nullptr)
      : connections_(connections), services_(std::move(services)), counters_(counters) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  ConnectionTable* const connections_;
  const std::vector<std::string> services_;
  metrics::EventCounters* const counters_;
};

}  // namespace mooncake::daemon
