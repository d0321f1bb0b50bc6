// The Peer gRPC service other nodes' daemons call over TCP. Small for now:
// identity and topology, the ground for cross-node rendezvous.
#pragma once

#include "mooncake/v1/peer.grpc.pb.h"
#include "server/daemon_state.h"

namespace mooncake::daemon {

class PeerService final : public v1::Peer::Service {
 public:
  explicit PeerService(DaemonState* state) : state_(state) {}
  grpc::Status PeerHello(grpc::ServerContext* ctx, const v1::PeerHelloRequest* req,
                         v1::PeerHelloResponse* resp) override;
  grpc::Status GetPeerTopology(grpc::ServerContext* ctx, const v1::GetPeerTopologyRequest* req,
                               v1::Topology* resp) override;

 private:
  DaemonState* state_;
};

}  // namespace mooncake::daemon
