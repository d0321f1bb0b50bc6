// ValidatedJoin: a JoinGroup request that passed every check that needs
// only the request and this node (group name, sizes, rank, handle, GPU
// selector). Only GroupBroker::ValidateJoin makes one, and
// GroupBroker::JoinAsync takes nothing else, so a join cannot reach the
// broker unvalidated and is validated exactly once. The RPC layer
// validates before consuming the request's fd ticket, so a malformed
// request never burns it. A plain value; copyable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "mooncake/v1/local.pb.h"

namespace mooncake::daemon {

class GroupBroker;

class ValidatedJoin {
 public:
  const std::string& group() const { return group_; }
  uint32_t rank() const { return rank_; }
  uint32_t world_size() const { return world_size_; }
  // The fd channel ticket the request names; empty when it carries no fds.
  const std::string& fd_ticket() const { return fd_ticket_; }
  // The group secret (broker/group_secret.h); empty: none.
  const std::string& group_secret() const { return group_secret_; }

 private:
  friend class GroupBroker;
  ValidatedJoin() = default;

  std::string group_;
  uint32_t rank_ = 0;
  uint32_t world_size_ = 0;
  uint32_t timeout_ms_ = 0;  // the default already applied
  int gpu_index_ = -1;       // -1: no GPU selected (host memory)
  std::string gpu_uuid_, gpu_pci_;
  v1::MemberHandle handle_;  // fd_ticket cleared
  std::optional<v1::RdmaEndpoint> rdma_;
  std::string fd_ticket_;
  std::string group_secret_;
};

}  // namespace mooncake::daemon
