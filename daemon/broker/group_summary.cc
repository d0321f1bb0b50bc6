#include "broker/group_summary.h"

namespace mooncake::daemon {

bool IsJoinedNow(MemberState s) { return s != MemberState::kLeft && s != MemberState::kLost; }

uint32_t JoinedCount(const GroupSummary& g) {
  uint32_t n = 0;
  for (const GroupMemberSummary& m : g.members) n += IsJoinedNow(m.state) ? 1 : 0;
  return n;
}

const char* MemberStateName(MemberState s) {
  switch (s) {
    case MemberState::kJoined: return "joined";
    case MemberState::kReady: return "ready";
    case MemberState::kFailed: return "failed";
    case MemberState::kLeft: return "left";
    case MemberState::kLost: return "lost";
  }
  return "unknown";
}

const char* GroupStateName(GroupState s) {
  switch (s) {
    case GroupState::kForming: return "forming";
    case GroupState::kFormed: return "formed";
    case GroupState::kReady: return "ready";
    case GroupState::kDegraded: return "degraded";
  }
  return "unknown";
}

}  // namespace mooncake::daemon
