// The daemon's side of the Prometheus metrics (metrics/metrics.h): which
// RPC methods are counted by name, and the gauge sources over the daemon's
// state. Kept here, not in metrics/, so that the metrics library depends on
// none of the daemon's classes (they record into it).
#pragma once

#include <string>
#include <vector>

#include "broker/group_broker.h"
#include "fdchannel/fd_broker.h"
#include "metrics/metrics.h"
#include "peering/node_registry.h"
#include "rdma/rdma_resources.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

// Every method of the Local, Admin, Rdma and Peer services and the health
// check, as "package.Service/Method": a fixed set, whatever is served.
std::vector<std::string> CountedRpcMethods();

// Gauges read at scrape time, each under its owner's lock. `rdma` and
// `nodes` may be null (RDMA off, not in a cluster); all must outlive the
// Metrics' HTTP server (Metrics::Stop).
metrics::GaugeSources DaemonGaugeSources(const SessionRegistry* sessions, const GroupBroker* broker,
                                         const FdBroker* fds, const RdmaResources* rdma,
                                         const peering::NodeRegistry* nodes);

}  // namespace mooncake::daemon
