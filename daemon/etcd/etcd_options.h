// Where an etcd cluster is and how to reach it: the endpoint list, TLS
// files and timeouts that EtcdClient::Connect takes, and their validation.
//
//   absl::StatusOr<EtcdOptions> o =
//       ParseEtcdEndpoints("http://10.0.0.1:2379,http://10.0.0.2:2379");
//   // "10.0.0.1" (no port) or "unix:///x" -> InvalidArgument naming the entry
//
// An endpoint is a member's client URL: "host:port", "http://host:port" or
// "https://host:port"; IPv6 hosts in brackets ("[::1]:2379"). The port is
// required (no silent 2379). TLS is used when any endpoint says https:// or
// any TLS file is set; mixing http:// and https:// is refused, and so is
// http:// with TLS files (a plaintext URL must not quietly become TLS).
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace mooncake::daemon::etcd {

struct EtcdOptions {
  // Client URLs of the cluster's members, tried in order; at least one.
  std::vector<std::string> endpoints;
  // PEM files. ca_file: the CA that signed the servers' certificates (empty:
  // the system's roots). cert_file + key_file (both or neither): this
  // client's certificate, for mTLS.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // How long Connect waits for a member to answer; also the most one
  // request waits for a connection to a member before trying the next.
  absl::Duration dial_timeout = absl::Seconds(3);
  // Deadline of each request, failover to other members included.
  absl::Duration request_timeout = absl::Seconds(5);
};

// One endpoint, validated.
struct EtcdEndpoint {
  std::string url;     // as the user wrote it (trimmed); error messages name it
  std::string target;  // "host:port", the gRPC target
  bool tls = false;    // https://, or TLS files given
};

// Splits `comma_list` (entries trimmed of blanks) into `base.endpoints`,
// replacing any there, and validates the result as ValidateEtcdOptions does.
absl::StatusOr<EtcdOptions> ParseEtcdEndpoints(absl::string_view comma_list, EtcdOptions base = {});

// Checks every endpoint, the TLS settings and the timeouts; returns the
// endpoints in order. InvalidArgument names the offending entry or setting.
// Does not read the TLS files (Connect does).
absl::StatusOr<std::vector<EtcdEndpoint>> ValidateEtcdOptions(const EtcdOptions& options);

// The range_end that makes [prefix, range_end) every key starting with
// `prefix`: the prefix with its last byte below 0xff incremented and what
// follows dropped ("a/b" -> "a/c", "a\xff" -> "b"). An empty prefix, or one
// of 0xff bytes only, gives "\0", which etcd reads as "every key >= key".
std::string PrefixRangeEnd(absl::string_view prefix);

}  // namespace mooncake::daemon::etcd
