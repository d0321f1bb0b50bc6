// The Peer gRPC service other nodes' daemons call over TCP: identity,
// topology, the RDMA endpoints of this node's group ranks
// (FetchRankEndpoints), and softnic's responder side for requester QPs on
// other nodes (SoftnicExecute, OfferConnection).
//
// Who may call (issue 23 item 1; peering/peer_identity.h): under mTLS a
// request acts for the node its certificate names, and one naming another
// node is PERMISSION_DENIED; a plaintext port without peer_insecure serves
// PeerHello only (version and "TLS required"). A batch must also carry its
// connection's secret (softnic/engine.h). Every refusal is logged, rate
// limited, with the caller's address.
//
// It reads the node's immutable identity and calls the softnic engine,
// which is thread-safe; both are owned by Daemon and outlive the service.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "admission/rate_limited_log.h"
#include "mooncake/v1/peer.grpc.pb.h"
#include "peering/peer_tls.h"
#include "peering/rank_endpoints.h"
#include "server/node_identity.h"
#include "softnic/engine.h"

namespace mooncake::daemon {
class RdmaResources;
}  // namespace mooncake::daemon

namespace mooncake::daemon {

class PeerService final : public v1::Peer::Service {
 public:
  PeerService(const NodeIdentity* node, peering::PeerMode mode) : node_(node), mode_(mode) {}
  grpc::Status PeerHello(grpc::ServerContext* ctx, const v1::PeerHelloRequest* req,
                         v1::PeerHelloResponse* resp) override;
  grpc::Status GetPeerTopology(grpc::ServerContext* ctx, const v1::GetPeerTopologyRequest* req,
                               v1::Topology* resp) override;
  grpc::Status SoftnicExecute(grpc::ServerContext* ctx, const v1::SoftnicBatch* req,
                              v1::SoftnicResults* resp) override;
  grpc::Status OfferConnection(grpc::ServerContext* ctx, const v1::OfferConnectionRequest* req,
                               v1::OfferConnectionResponse* resp) override;
  grpc::Status FetchRankEndpoints(grpc::ServerContext* ctx,
                                  const v1::FetchRankEndpointsRequest* req,
                                  v1::FetchRankEndpointsResponse* resp) override;

  // The node's softnic engine (null: this node's provider is not softnic):
  // SoftnicExecute. Set before serving.
  void set_softnic(softnic::Engine* engine) { softnic_ = engine; }
  // peer_tls_crl_file's list: callers whose certificate it names are
  // refused on every method (null: no list). Set before serving.
  void set_revocations(std::shared_ptr<peering::PeerRevocations> r) { revocations_ = std::move(r); }
  // Where offers of connections go (RdmaResources::AcceptOffer; null: RDMA
  // off, every offer FAILED_PRECONDITION). Not owned. Set before serving.
  void set_rdma(RdmaResources* rdma) { rdma_ = rdma; }
  // The endpoints of this node's ranks that the authenticated `node` asks
  // for (GroupBroker::MayFetchEndpoints, then EtcdGroupDirectory::
  // OwnEndpoints). Set before serving; without it (no cluster) every fetch
  // is FAILED_PRECONDITION.
  using EndpointSource = std::function<absl::StatusOr<std::vector<peering::FetchedEndpoint>>(
      const std::string& node, uint32_t uid, const std::string& tenant, const std::string& group,
      const std::vector<uint32_t>& ranks)>;
  void set_endpoint_source(EndpointSource source) { endpoints_ = std::move(source); }
  // Whether `node` is a live node of the cluster (NodeRegistry::Node):
  // GetPeerTopology answers only those, so a retired node's certificate
  // reads nothing. Set before serving; without it (no cluster), none.
  void set_live_node(std::function<bool(const std::string&)> live) { live_ = std::move(live); }

 private:
  // The authenticated node of a request naming `claimed`; a refusal is
  // logged and returned as the call's status.
  absl::StatusOr<std::string> Caller(const grpc::ServerContext& ctx, const char* method,
                                     const std::string& claimed);
  // One line per period per kind: a flood of one kind does not hide the other.
  enum class Refusal { kIdentity, kConnection };
  void LogRefusal(Refusal kind, const grpc::ServerContext& ctx, const char* method,
                  absl::string_view why);

  const NodeIdentity* const node_;
  const peering::PeerMode mode_;
  std::shared_ptr<peering::PeerRevocations> revocations_;
  softnic::Engine* softnic_ = nullptr;
  RdmaResources* rdma_ = nullptr;
  EndpointSource endpoints_;
  std::function<bool(const std::string&)> live_;
  RateLimitedLog identity_refusals_;    // who the caller is
  RateLimitedLog connection_refusals_;  // secrets and offers
};

}  // namespace mooncake::daemon
