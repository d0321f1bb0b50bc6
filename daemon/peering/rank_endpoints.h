// The RDMA endpoints of group ranks, as they move between daemons (issue 23
// item 2). A rank's record in etcd says only that it has an endpoint and
// which version (GroupRankRecord.rdma_generation); the endpoint itself
// (raddr, rkey, QPNs, NIC) is a capability and goes from the rank's node to
// the nodes of its group over the authenticated peer channel
// (Peer.FetchRankEndpoints), never through etcd.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mooncake/v1/local.pb.h"
#include "peering/trusted_peers.h"

namespace mooncake::daemon::peering {

// At most this many ranks in one request, and this many bytes of endpoints
// in one answer (the peer channel carries 6 MiB): a caller asks again for
// what was left out.
inline constexpr int kMaxEndpointRanksPerFetch = 4096;
inline constexpr size_t kMaxEndpointBytesPerAnswer = size_t{4} << 20;

struct FetchedEndpoint {
  uint32_t rank = 0;
  uint64_t generation = 0;
  std::shared_ptr<const v1::RdmaEndpoint> rdma;
};

// Whether `e` has the shape a member of a `world_size` group may publish:
// 1..64 queue pairs per peer, a QPN table that is empty or world_size *
// qps_per_peer long, a NIC name of at most 64 characters.
absl::Status CheckEndpointShape(const v1::RdmaEndpoint& e, uint32_t world_size);

// Asks `node` (verified by `peers`) for the endpoints of `ranks` of a group,
// within `timeout`. Each answer is checked: a rank that was not asked for,
// or an endpoint of the wrong shape, fails the whole answer.
absl::StatusOr<std::vector<FetchedEndpoint>> FetchRankEndpointsFrom(
    TrustedPeers* peers, const std::string& node, uint32_t uid, const std::string& tenant,
    const std::string& group, uint32_t world_size, const std::vector<uint32_t>& ranks,
    absl::Duration timeout);

}  // namespace mooncake::daemon::peering
