// The Peer gRPC service other nodes' daemons call over TCP (mTLS when
// configured): identity, topology, and softnic's responder side for
// requester QPs on other nodes (SoftnicExecute). It reads the node's
// immutable identity and calls the softnic engine, which is thread-safe;
// both are owned by Daemon and outlive the service.
#pragma once

#include "mooncake/v1/peer.grpc.pb.h"
#include "server/node_identity.h"
#include "softnic/engine.h"

namespace mooncake::daemon {

class PeerService final : public v1::Peer::Service {
 public:
  explicit PeerService(const NodeIdentity* node) : node_(node) {}
  grpc::Status PeerHello(grpc::ServerContext* ctx, const v1::PeerHelloRequest* req,
                         v1::PeerHelloResponse* resp) override;
  grpc::Status GetPeerTopology(grpc::ServerContext* ctx, const v1::GetPeerTopologyRequest* req,
                               v1::Topology* resp) override;
  grpc::Status SoftnicExecute(grpc::ServerContext* ctx, const v1::SoftnicBatch* req,
                              v1::SoftnicResults* resp) override;

  // The node's softnic engine (null: this node's provider is not softnic).
  // Set before serving.
  void set_softnic(softnic::Engine* engine) { softnic_ = engine; }

 private:
  const NodeIdentity* const node_;
  softnic::Engine* softnic_ = nullptr;
};

}  // namespace mooncake::daemon
