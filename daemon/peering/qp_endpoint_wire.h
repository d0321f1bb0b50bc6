// QpEndpoint (rdma/provider.h) on the peer channel (peer.proto QpEndpoint):
// what one daemon tells another about a QP so that it can connect to it.
// What comes in is another node's word: every field is checked before a
// provider sees it.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "mooncake/v1/peer.pb.h"
#include "rdma/provider.h"

namespace mooncake::daemon::peering {

v1::QpEndpoint ToWire(const QpEndpoint& endpoint);
// InvalidArgument, naming `whose` ("node B's queue pair 7") and the field,
// for a value out of its range. An endpoint without a provider is from a
// daemon older than the exchange, which connected across nodes only on
// softnic: taken as softnic's.
absl::StatusOr<QpEndpoint> FromWire(const v1::QpEndpoint& wire, const std::string& whose);

}  // namespace mooncake::daemon::peering
