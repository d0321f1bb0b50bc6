// Group secrets (issue 23 item 3): the same uid on two nodes is not the
// same person, so a group may require a secret its ranks share (the
// launcher sets MC_GROUP_SECRET for each rank). The secret stays on the
// nodes of the ranks that gave it: a claim published in etcd carries only
// GroupProof, an HMAC-SHA256 under the secret of what the claim is (uid,
// tenant, group, rank, node, world size), so a record cannot be moved to
// another rank or node, and one made without the secret does not verify.
// A node whose members gave a secret counts another node's rank only when
// its proof verifies (docs/cluster.md, "Group secrets").
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace mooncake::daemon {

inline constexpr size_t kMinGroupSecretBytes = 16;
inline constexpr size_t kMaxGroupSecretBytes = 256;

// OK for "" (no secret) or 16..256 bytes; InvalidArgument otherwise.
absl::Status ValidateGroupSecret(const std::string& secret);

// What the claim of `rank` on `node_id` publishes: hex HMAC-SHA256.
std::string GroupProof(const std::string& secret, uint32_t uid, const std::string& tenant,
                       const std::string& group, uint32_t rank, const std::string& node_id,
                       uint32_t world_size);

// Whether `proof` is GroupProof of those under `secret` (constant time).
bool ProvesGroupSecret(const std::string& secret, uint32_t uid, const std::string& tenant,
                       const std::string& group, uint32_t rank, const std::string& node_id,
                       uint32_t world_size, const std::string& proof);

}  // namespace mooncake::daemon
