// Test support: a plain etcd client of the test's etcd, to read (or plant)
// what the daemons keep there as anyone with access to the prefix would.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "etcd/etcd_client.h"
#include "etcd/etcd_options.h"

namespace mooncake::testing {

inline absl::StatusOr<std::unique_ptr<daemon::etcd::EtcdClient>> ConnectEtcd(
    const std::string& client_url) {
  absl::StatusOr<daemon::etcd::EtcdOptions> o = daemon::etcd::ParseEtcdEndpoints(client_url, {});
  if (!o.ok()) return o.status();
  return daemon::etcd::EtcdClient::Connect(*o);
}

}  // namespace mooncake::testing
