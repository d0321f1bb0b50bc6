// Helpers shared by the etcd client's .cc files; not part of its API.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "etcd/etcd_client.h"
#include "mvccpb/kv.pb.h"

namespace mooncake::daemon::etcd::internal {

KeyValue FromProto(const mvccpb::KeyValue& kv);

// The canonical codes are the same numbers in gRPC and Abseil.
inline absl::StatusCode FromGrpcCode(const grpc::Status& s) {
  return static_cast<absl::StatusCode>(s.error_code());
}

// The error's message, prefixed with its code where gRPC's own text is too
// terse to say what happened ("Deadline Exceeded").
std::string GrpcErrorText(const grpc::Status& s);

// "lease 694d7a0c2e8b5f04": lease ids in hex, as etcdctl prints them.
std::string LeaseName(int64_t lease_id);

}  // namespace mooncake::daemon::etcd::internal
