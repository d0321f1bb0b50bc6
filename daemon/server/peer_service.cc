#include "server/peer_service.h"

#include "absl/strings/str_cat.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"
#include "mooncake/common/version.h"

namespace mooncake::daemon {

grpc::Status PeerService::PeerHello(grpc::ServerContext* ctx, const v1::PeerHelloRequest* req,
                                    v1::PeerHelloResponse* resp) {
  if (req->protocol_version() != kProtocolVersion) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("peer ", req->node_id(), " speaks protocol ",
                                     req->protocol_version(), ", this daemon ", kProtocolVersion));
  }
  MC_LOG(kDebug, "peer hello from node ", EscapeForDisplay(req->node_id(), 256), " at ",
         ctx->peer());
  resp->set_protocol_version(kProtocolVersion);
  resp->set_node_id(node_->node_id);
  resp->set_instance_id(node_->instance_id);
  resp->set_daemon_version(kMooncakeVersion);
  return grpc::Status::OK;
}

grpc::Status PeerService::SoftnicExecute(grpc::ServerContext*, const v1::SoftnicBatch* req,
                                         v1::SoftnicResults* resp) {
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
        softnic_->ExecuteForPeer(req->requester_node(), req->requester_qpn(), r);
    v1::SoftnicResult* out = resp->add_results();
    out->set_syndrome(result.syndrome);
    out->set_fetched(result.fetched);
    out->set_not_ready(result.not_ready);
    if (result.syndrome != 0) break;  // the requester flushes the rest
  }
  return grpc::Status::OK;
}

grpc::Status PeerService::GetPeerTopology(grpc::ServerContext*, const v1::GetPeerTopologyRequest*,
                                          v1::Topology* resp) {
  *resp = node_->topology;
  return grpc::Status::OK;
}

}  // namespace mooncake::daemon
