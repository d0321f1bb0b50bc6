#include "server/peer_service.h"

#include "absl/strings/str_cat.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/grpc_status.h"
#include "mooncake/common/log.h"
#include "mooncake/common/version.h"
#include "peering/peer_identity.h"
#include "peering/qp_endpoint_wire.h"
#include "rdma/rdma_resources.h"

namespace mooncake::daemon {

void PeerService::LogRefusal(Refusal kind, const grpc::ServerContext& ctx, const char* method,
                             absl::string_view why) {
  (kind == Refusal::kIdentity ? identity_refusals_ : connection_refusals_)
      .Log(LogLevel::kWarning, absl::StrCat("peer: refused ", method, " from ",
                                            EscapeForDisplay(ctx.peer(), 128), ": ", why));
}

absl::StatusOr<std::string> PeerService::Caller(const grpc::ServerContext& ctx, const char* method,
                                                const std::string& claimed) {
  absl::StatusOr<std::string> node =
      peering::AuthenticatePeer(mode_, ctx, claimed, revocations_.get());
  if (!node.ok()) LogRefusal(Refusal::kIdentity, ctx, method, node.status().message());
  return node;
}

grpc::Status PeerService::PeerHello(grpc::ServerContext* ctx, const v1::PeerHelloRequest* req,
                                    v1::PeerHelloResponse* resp) {
  resp->set_protocol_version(kProtocolVersion);
  if (mode_ == peering::PeerMode::kTlsRequired) {
    // The one answer a plaintext port gives: enough for an operator (or a
    // daemon) to see why nothing else is served, nothing about this node.
    resp->set_refusal(absl::StrCat("TLS required: ", peering::kTlsKeysHint));
    return grpc::Status::OK;
  }
  if (req->protocol_version() != kProtocolVersion) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("peer ", EscapeForDisplay(req->node_id(), 64), " speaks protocol ",
                     req->protocol_version(), ", this daemon ", kProtocolVersion));
  }
  absl::StatusOr<std::string> caller = Caller(*ctx, "PeerHello", req->node_id());
  if (!caller.ok()) {
    resp->Clear();
    return ToGrpc(caller.status());
  }
  MC_LOG(kDebug, "peer hello from node ", EscapeForDisplay(*caller, 64), " at ",
         EscapeForDisplay(ctx->peer(), 128));
  resp->set_node_id(node_->node_id);
  resp->set_instance_id(node_->instance_id);
  resp->set_daemon_version(kMooncakeVersion);
  return grpc::Status::OK;
}

grpc::Status PeerService::OfferConnection(grpc::ServerContext* ctx,
                                          const v1::OfferConnectionRequest* req,
                                          v1::OfferConnectionResponse* resp) {
  absl::StatusOr<std::string> caller = Caller(*ctx, "OfferConnection", req->node_id());
  if (!caller.ok()) return ToGrpc(caller.status());
  if (rdma_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("node ", node_->node_id, " serves no RDMA (rdma_provider)"));
  }
  absl::StatusOr<QpEndpoint> theirs = peering::FromWire(
      req->endpoint(), absl::StrCat("node ", *caller, "'s queue pair ", req->qpn()));
  if (!theirs.ok()) {
    LogRefusal(Refusal::kConnection, *ctx, "OfferConnection", theirs.status().message());
    return ToGrpc(theirs.status());
  }
  // Only for a QP of the offering QP's owner (same uid, same tenant): a
  // process of another user, on any node, cannot plant a secret on this
  // QP nor learn its endpoint. The same answer as for a missing QP.
  absl::StatusOr<QpEndpoint> mine = rdma_->AcceptOffer(
      *caller, req->qpn(), req->peer_qpn(), req->uid(), req->tenant(), req->secret(), *theirs);
  if (!mine.ok()) {
    if (mine.status().code() != absl::StatusCode::kNotFound) {
      LogRefusal(Refusal::kConnection, *ctx, "OfferConnection", mine.status().message());
    }
    return ToGrpc(mine.status());
  }
  *resp->mutable_endpoint() = peering::ToWire(*mine);
  return grpc::Status::OK;
}

grpc::Status PeerService::FetchRankEndpoints(grpc::ServerContext* ctx,
                                             const v1::FetchRankEndpointsRequest* req,
                                             v1::FetchRankEndpointsResponse* resp) {
  absl::StatusOr<std::string> caller = Caller(*ctx, "FetchRankEndpoints", req->node_id());
  if (!caller.ok()) return ToGrpc(caller.status());
  if (req->ranks_size() == 0 || req->ranks_size() > peering::kMaxEndpointRanksPerFetch ||
      req->group().empty() || req->group().size() > 128 || req->tenant().size() > 63) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("a fetch names a group (1..128 characters), a tenant (at "
                                     "most 63) and 1..",
                                     peering::kMaxEndpointRanksPerFetch, " ranks"));
  }
  if (!endpoints_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("node ", node_->node_id, " is not in a cluster"));
  }
  const std::vector<uint32_t> ranks(req->ranks().begin(), req->ranks().end());
  absl::StatusOr<std::vector<peering::FetchedEndpoint>> found =
      endpoints_(*caller, req->uid(), req->tenant(), req->group(), ranks);
  if (!found.ok()) {
    if (absl::IsPermissionDenied(found.status())) {
      LogRefusal(Refusal::kConnection, *ctx, "FetchRankEndpoints", found.status().message());
    }
    return ToGrpc(found.status());
  }
  for (const peering::FetchedEndpoint& f : *found) {
    v1::RankEndpoint* e = resp->add_endpoints();
    e->set_rank(f.rank);
    e->set_generation(f.generation);
    *e->mutable_rdma() = *f.rdma;
  }
  return grpc::Status::OK;
}

grpc::Status PeerService::SoftnicExecute(grpc::ServerContext* ctx, const v1::SoftnicBatch* req,
                                         v1::SoftnicResults* resp) {
  absl::StatusOr<std::string> caller = Caller(*ctx, "SoftnicExecute", req->requester_node());
  if (!caller.ok()) return ToGrpc(caller.status());
  if (softnic_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("node ", node_->node_id, " does not run softnic"));
  }
  if (req->ops_size() > 256 || req->requester_node().empty() || req->requester_node().size() > 64) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a batch has 1..256 operations and names its requester node");
  }
  // Checked whole before anything runs: a bad batch changes nothing.
  for (const v1::SoftnicOp& op : req->ops()) {
    if (op.data().size() > (1u << 20) || (op.kind() == v1::SoftnicOp::WRITE) == op.data().empty() ||
        !v1::SoftnicOp::Kind_IsValid(op.kind())) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a WRITE carries 1 byte .. 1 MiB; atomics carry none");
    }
  }
  for (const v1::SoftnicOp& op : req->ops()) {
    softnic::ResponderOp r;
    r.kind = op.kind() == v1::SoftnicOp::WRITE ? softnic::ResponderOp::Kind::kWrite
             : op.kind() == v1::SoftnicOp::FETCH_ADD_64
                 ? softnic::ResponderOp::Kind::kFetchAdd64
                 : softnic::ResponderOp::Kind::kMaskedFetchAdd32;
    r.remote_qpn = op.responder_qpn();
    r.raddr = op.raddr();
    r.rkey = op.rkey();
    r.source = softnic::ByteSpan{softnic::MemoryKind::kHost,
                                 reinterpret_cast<uintptr_t>(op.data().data()), op.data().size()};
    r.add = op.add();
    r.field_boundary = op.field_boundary();
    const softnic::ResponderResult result =
        softnic_->ExecuteForPeer(*caller, req->requester_qpn(), req->connection_secret(), r);
    if (result.refused) {
      LogRefusal(Refusal::kConnection, *ctx, "SoftnicExecute",
                 absl::StrCat("node ", *caller, " queue pair ", req->requester_qpn(),
                              " sent a batch for queue pair ", op.responder_qpn(),
                              " without its connection's secret"));
    }
    v1::SoftnicResult* out = resp->add_results();
    out->set_syndrome(result.syndrome);
    out->set_fetched(result.fetched);
    out->set_not_ready(result.not_ready);
    if (result.syndrome != 0) break;  // the requester flushes the rest
  }
  return grpc::Status::OK;
}

grpc::Status PeerService::GetPeerTopology(grpc::ServerContext* ctx,
                                          const v1::GetPeerTopologyRequest* req,
                                          v1::Topology* resp) {
  // A live node of the cluster, which its certificate names (any holder of
  // a certificate of the CA was enough before: a retired node's, or one
  // naming no node); over plaintext only with peer_insecure.
  absl::StatusOr<std::string> caller = Caller(*ctx, "GetPeerTopology", req->node_id());
  if (!caller.ok()) return ToGrpc(caller.status());
  if (!live_ || !live_(*caller)) {
    const std::string why = absl::StrCat("node ", EscapeForDisplay(*caller, 64),
                                         " is not a live node of this cluster (etcd)");
    LogRefusal(Refusal::kIdentity, *ctx, "GetPeerTopology", why);
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, why);
  }
  *resp = node_->topology;
  return grpc::Status::OK;
}

}  // namespace mooncake::daemon
