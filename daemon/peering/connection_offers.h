// ConnectionOffers: RdmaResources' way to other nodes (rdma/remote_connections.h)
// over verified peers (trusted_peers.h). Each cross-node queue-pair
// connection's secret (16 bytes from the kernel's CSPRNG, made by
// RdmaResources once per QP) is handed to the peer node with
// Peer.OfferConnection over the authenticated channel; it never reaches
// etcd or the client. Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "peering/trusted_peers.h"
#include "rdma/remote_connections.h"

namespace mooncake::daemon::peering {

class ConnectionOffers final : public RemoteConnections {
 public:
  // `shares_group(session, node)`: whether a group of the session has a
  // live rank on `node` (GroupBroker::SharesGroupWithNode).
  ConnectionOffers(std::shared_ptr<TrustedPeers> peers,
                   std::function<bool(uint64_t, const std::string&)> shares_group,
                   absl::Duration call_timeout = absl::Seconds(5))
      : peers_(std::move(peers)),
        shares_group_(std::move(shares_group)),
        call_timeout_(call_timeout) {}

  absl::Status CheckNode(uint64_t session, const std::string& node) override;
  // At most kMaxOfferWaiters calls wait at once (each holds a peer-port
  // thread); beyond that the answer is the one of the moment.
  static constexpr int kMaxOfferWaiters = 16;
  bool AcceptsOfferFrom(uint64_t session, const std::string& node, absl::Duration wait) override;
  absl::StatusOr<QpEndpoint> Offer(const std::string& node, uint32_t qpn, uint32_t remote_qpn,
                                   uint32_t uid, const std::string& tenant,
                                   const std::string& secret, const QpEndpoint& mine) override;

 private:
  const std::shared_ptr<TrustedPeers> peers_;
  const std::function<bool(uint64_t, const std::string&)> shares_group_;
  const absl::Duration call_timeout_;
  std::atomic<int> offer_waiters_{0};
};

}  // namespace mooncake::daemon::peering
