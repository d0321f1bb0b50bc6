// NodeIdentity: what this daemon is and what node it runs on. Built once by
// Daemon::Create (discovery included) and immutable afterwards, so services
// read it through a const reference without locking.
#pragma once

#include <string>

#include "absl/time/time.h"
#include "mooncake/v1/node.pb.h"

namespace mooncake::daemon {

struct NodeIdentity {
  std::string instance_id;  // random per start: tells clients the daemon restarted
  std::string node_id;      // config node_id, else the hostname
  std::string hostname;
  absl::Time started;
  v1::Topology topology;  // GPUs, NICs and their affinity, as discovered at start
};

}  // namespace mooncake::daemon
