// JSON renderings of the Admin API replies for `mcctl --json`, the contract
// scripts and the acceptance checks rely on.
//
// Each message is printed as protobuf's JSON printer would with proto field
// names (snake_case) and every primitive field present, so a key never
// disappears because its value is zero, with one difference: every integer,
// 64-bit ones included, is a JSON number ("uptime_ms": 1234), where proto3
// JSON would print 64-bit integers as strings. (A reader that parses numbers
// as doubles, such as JavaScript, is exact up to 2^53.) Strings are escaped
// per EscapeForJson (mooncake/common/escape.h): control characters as
// "\n" or "\u001b", so the output is safe on a terminal and parses back to
// the daemon's text. Arrays and extra keys are composed around the printed
// messages.
//
// Shapes:
//   status    object: every DaemonStatus field + "gpus" [Gpu] + "nics" [Nic]
//   gpus      array of Gpu
//   nics      array of Nic
//   topo      object: the Topology message
//   sessions  array of SessionInfo
//   groups    array of GroupInfo, each with "joined_ranks" [int] (ranks whose
//             member is neither "left" nor "lost", ascending; the daemon's
//             "joined" counts the same ranks)
//   qps       array of QueuePairInfo, each with "session" (= "session_id",
//             the owner session; both keys are printed)
//   mrs       array of MemoryRegionInfo, each with "session" likewise
//
// Functions return compact JSON (no whitespace); PrettyJson() indents it.
// Errors: Internal when protobuf refuses to print a well-known type (not
// expected; none is used in the Admin API). Thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "mooncake/v1/admin.pb.h"
#include "mooncake/v1/node.pb.h"

namespace mooncake::mcctl {

absl::StatusOr<std::string> MessageToCompactJson(const google::protobuf::Message& message);

absl::StatusOr<std::string> StatusJson(const mooncake::v1::DaemonStatus& status,
                                       const mooncake::v1::Topology& topology);
absl::StatusOr<std::string> GpusJson(const mooncake::v1::Topology& topology);
absl::StatusOr<std::string> NicsJson(const mooncake::v1::Topology& topology);
absl::StatusOr<std::string> TopologyJson(const mooncake::v1::Topology& topology);
absl::StatusOr<std::string> SessionsJson(const mooncake::v1::ListSessionsResponse& sessions);
absl::StatusOr<std::string> GroupsJson(const mooncake::v1::ListGroupsResponse& groups);
// Arrays of QueuePairInfo / MemoryRegionInfo objects, with "session" added.
absl::StatusOr<std::string> QueuePairsJson(const mooncake::v1::ListQueuePairsResponse& qps);
// {"self_node_id", "etcd_state", "nodes": [NodeRecord...]}.
absl::StatusOr<std::string> PeersJson(const mooncake::v1::ListPeersResponse& peers);
absl::StatusOr<std::string> MemoryRegionsJson(const mooncake::v1::ListMemoryRegionsResponse& mrs);

// The ranks counted as joined in GroupsJson.
std::vector<uint32_t> JoinedRanks(const mooncake::v1::GroupInfo& group);

// Re-indents compact JSON (two spaces per level, "key": value); strings are
// copied untouched. Input that is not compact JSON is indented on a
// best-effort basis, never rejected.
std::string PrettyJson(std::string_view compact);

}  // namespace mooncake::mcctl
