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

grpc::Status PeerService::GetPeerTopology(grpc::ServerContext*, const v1::GetPeerTopologyRequest*,
                                          v1::Topology* resp) {
  *resp = node_->topology;
  return grpc::Status::OK;
}

}  // namespace mooncake::daemon
