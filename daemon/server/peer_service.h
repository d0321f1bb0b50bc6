// The Peer gRPC service other nodes' daemons call over TCP. Small for now:
// identity and topology, the ground for cross-node rendezvous. It reads
// only the node's immutable identity (owned by Daemon, outliving it), so it
// needs no locking.
#pragma once

#include "mooncake/v1/peer.grpc.pb.h"
#include "server/node_identity.h"

namespace mooncake::daemon {

class PeerService final : public v1::Peer::Service {
 public:
  explicit PeerService(const NodeIdentity* node) : node_(node) {}
  grpc::Status PeerHello(grpc::ServerContext* ctx, const v1::PeerHelloRequest* req,
                         v1::PeerHelloResponse* resp) override;
  grpc::Status GetPeerTopology(grpc::ServerContext* ctx, const v1::GetPeerTopologyRequest* req,
                               v1::Topology* resp) override;

 private:
  const NodeIdentity* const node_;
};

}  // namespace mooncake::daemon
