#include "peering/rank_endpoints.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "mooncake/common/escape.h"

namespace mooncake::daemon::peering {

absl::Status CheckEndpointShape(const v1::RdmaEndpoint& e, uint32_t world_size) {
  if (e.qps_per_peer() == 0 || e.qps_per_peer() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("rdma.qps_per_peer ", e.qps_per_peer(), " is not in 1..64"));
  }
  if (!e.qpns().empty() && static_cast<uint64_t>(e.qpns_size()) !=
                               static_cast<uint64_t>(world_size) * e.qps_per_peer()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rdma.qpns has ", e.qpns_size(),
        " entries, not world_size * qps_per_peer = ", uint64_t{world_size} * e.qps_per_peer()));
  }
  if (e.nic().size() > 64) return absl::InvalidArgumentError("rdma.nic longer than 64 characters");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FetchedEndpoint>> FetchRankEndpointsFrom(
    TrustedPeers* peers, const std::string& node, uint32_t uid, const std::string& tenant,
    const std::string& group, uint32_t world_size, const std::vector<uint32_t>& ranks,
    absl::Duration timeout) {
  absl::StatusOr<std::shared_ptr<v1::Peer::Stub>> stub = peers->Get(node);
  if (!stub.ok()) return stub.status();
  v1::FetchRankEndpointsRequest req;
  req.set_node_id(peers->self_node());
  req.set_uid(uid);
  req.set_tenant(tenant);
  req.set_group(group);
  for (uint32_t r : ranks) req.add_ranks(r);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::FetchRankEndpointsResponse resp;
  const grpc::Status s = (*stub)->FetchRankEndpoints(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("node ", node, ": ", s.error_message()));
  }
  const std::set<uint32_t> asked(ranks.begin(), ranks.end());
  std::set<uint32_t> seen;
  std::vector<FetchedEndpoint> out;
  for (v1::RankEndpoint& e : *resp.mutable_endpoints()) {
    absl::Status shape = CheckEndpointShape(e.rdma(), world_size);
    if (asked.count(e.rank()) == 0 || !seen.insert(e.rank()).second || e.generation() == 0 ||
        !shape.ok()) {
      return absl::DataLossError(
          absl::StrCat("node ", node, " answered with an endpoint of rank ", e.rank(),
                       " that was not asked for, twice, without a generation or of the wrong shape",
                       shape.ok() ? "" : absl::StrCat(" (", shape.message(), ")")));
    }
    FetchedEndpoint f;
    f.rank = e.rank();
    f.generation = e.generation();
    f.rdma = std::make_shared<const v1::RdmaEndpoint>(std::move(*e.mutable_rdma()));
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace mooncake::daemon::peering
