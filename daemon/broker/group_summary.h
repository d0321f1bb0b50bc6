// GroupSummary: what GroupBroker::List reports about a group — a plain
// snapshot for listings (AdminService turns it into v1::GroupInfo), so the
// broker does not depend on the admin wire format.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace mooncake::daemon {

// A member's life in its group: joined → ready | failed, and left or lost
// (its session ended) at any point after the group formed.
enum class MemberState { kJoined, kReady, kFailed, kLeft, kLost };

// forming: waiting for ranks; formed: all joined; ready: every member
// reported ready; degraded: a member failed, left or was lost.
enum class GroupState { kForming, kFormed, kReady, kDegraded };

struct GroupMemberSummary {
  uint32_t rank = 0;
  MemberState state = MemberState::kJoined;
  int pid = 0;
  uint64_t session_id = 0;
  int gpu_index = -1;  // -1: host memory
  std::string handle_kind;
  uint64_t handle_size = 0;
  std::string node_id;  // another node's rank (cross-node groups); "" = this node
};

struct GroupSummary {
  std::string name;
  uint32_t uid = 0;
  std::string tenant;  // "" = the main socket's
  uint32_t world_size = 0;
  GroupState state = GroupState::kForming;
  uint64_t epoch = 0;
  absl::Duration age;
  std::vector<GroupMemberSummary> members;  // by rank
};

// Whether a member in state `s` counts as joined now: every state but left
// and lost. The one rule behind GroupInfo.joined and mcctl's "joined_ranks".
bool IsJoinedNow(MemberState s);

// The number of members of `g` that are joined now (IsJoinedNow), what a
// listing reports as "joined": a degraded group of 2 with rank 1 lost says 1.
uint32_t JoinedCount(const GroupSummary& g);

// Lower-case names as listings show them ("joined", "degraded", ...).
const char* MemberStateName(MemberState s);
const char* GroupStateName(GroupState s);

}  // namespace mooncake::daemon
