#include "peering/connection_offers.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "mooncake/common/grpc_status.h"
#include "peering/qp_endpoint_wire.h"

namespace mooncake::daemon::peering {

absl::Status ConnectionOffers::CheckNode(uint64_t session, const std::string& node) {
  // Without TLS nothing crosses nodes: say that first (it names the keys).
  if (peers_->mode() == PeerMode::kTlsRequired) return peers_->Get(node).status();
  // Then without the network: a name no group of the session spans costs
  // nothing (no PeerHello, no channel, no link thread).
  if (!shares_group_(session, node)) {
    return absl::FailedPreconditionError(
        absl::StrCat("no group of this session has a live rank on node ", node,
                     ": queue pairs go only to nodes of the caller's groups (join first)"));
  }
  return peers_->Get(node).status();
}

bool ConnectionOffers::AcceptsOfferFrom(uint64_t session, const std::string& node,
                                        absl::Duration wait) {
  if (shares_group_(session, node)) return true;
  if (offer_waiters_.fetch_add(1, std::memory_order_relaxed) >= kMaxOfferWaiters) wait = {};
  const absl::Time deadline = absl::Now() + wait;
  bool shares = false;
  while (!shares && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
    shares = shares_group_(session, node);
  }
  offer_waiters_.fetch_sub(1, std::memory_order_relaxed);
  return shares;
}

absl::StatusOr<QpEndpoint> ConnectionOffers::Offer(const std::string& node, uint32_t qpn,
                                                   uint32_t remote_qpn, uint32_t uid,
                                                   const std::string& tenant,
                                                   const std::string& secret,
                                                   const QpEndpoint& mine) {
  absl::StatusOr<std::shared_ptr<v1::Peer::Stub>> stub = peers_->Get(node);
  if (!stub.ok()) return stub.status();
  v1::OfferConnectionRequest req;
  req.set_node_id(peers_->self_node());
  req.set_qpn(qpn);
  req.set_peer_qpn(remote_qpn);
  req.set_uid(uid);
  req.set_tenant(tenant);
  req.set_secret(secret);
  *req.mutable_endpoint() = ToWire(mine);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
  v1::OfferConnectionResponse resp;
  const grpc::Status s = (*stub)->OfferConnection(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("node ", node, " refused the connection of queue pair ", qpn,
                                     " to its queue pair ", remote_qpn, ": ", s.error_message()));
  }
  return FromWire(resp.endpoint(), absl::StrCat("node ", node, "'s queue pair ", remote_qpn));
}

}  // namespace mooncake::daemon::peering
