// RemoteConnections: what RdmaResources needs from the cluster to connect
// a queue pair to another node (issue 23 item 1). The peering layer
// implements it (peering/connection_offers.h); a daemon outside a cluster
// has none, and queue pairs to other nodes are refused.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rdma/provider.h"

namespace mooncake::daemon {

class RemoteConnections {
 public:
  virtual ~RemoteConnections() = default;
  // OK when `session`'s queue pairs may connect to `node` now: a node
  // where a group of the session has a live rank, live in the cluster, and
  // whose daemon proved it is that node. FailedPrecondition without peer
  // TLS (naming the keys to set), for a node whose identity did not check
  // out, or for one no group of the session spans; NotFound for a node the
  // cluster does not list; Unavailable when it does not answer.
  virtual absl::Status CheckNode(uint64_t session, const std::string& node) = 0;
  // Whether `node`, the authenticated caller of Peer.OfferConnection, may
  // offer connections to `session`'s queue pairs: a group of the session
  // has a live rank there (its policy and proof checked), as CheckNode asks
  // of the other direction. Without it any node holding a certificate of
  // the cluster's CA could plant secrets on (and learn the endpoints of)
  // any user's waiting queue pairs. Waits up to `wait` for the rank to
  // show: the offering node may have seen this node's rank a moment
  // before this node's etcd watch brings the other's.
  virtual bool AcceptsOfferFrom(uint64_t session, const std::string& node, absl::Duration wait) = 0;
  // Hands `secret`, the connection secret of this node's QP `qpn` to
  // `node`'s QP `remote_qpn` (the secret `remote_qpn`'s batches to `qpn`
  // must carry), to that node over the authenticated peer channel. The
  // caller makes it once per QP and offers the same one again when a
  // connect is retried (a reply lost after the node took it must not wedge
  // the pair). The node's refusal keeps its code.
  // `uid`/`tenant`: the owner of `qpn`; that node accepts only for a QP of
  // the same owner.
  // `mine`: what that node needs of `qpn` (RdmaProvider::EndpointOf);
  // returns what this node needs of `remote_qpn`, as that node answered.
  virtual absl::StatusOr<QpEndpoint> Offer(const std::string& node, uint32_t qpn,
                                           uint32_t remote_qpn, uint32_t uid,
                                           const std::string& tenant, const std::string& secret,
                                           const QpEndpoint& mine) = 0;
};

}  // namespace mooncake::daemon
