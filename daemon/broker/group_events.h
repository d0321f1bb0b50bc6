// GroupEventSink: where GroupBroker reports what happens to groups, for an
// observer that watches every group (the admin event feed behind
// `mcctl watch`). Apart from the SessionEvents the broker posts to a
// group's own members: those go to members only, and only about others.
//
// The broker holds no sink unless one is set (GroupBroker::set_event_sink)
// and does not own it.
#pragma once

#include <cstdint>
#include <string>

namespace mooncake::daemon {

struct GroupEvent {
  enum class Kind {
    kJoined,      // a rank joined a forming group
    kWithdrew,    // a rank left a forming group (leave, cancel, deadline, session end)
    kFormed,      // every rank is in (`rank`: the one that completed it)
    kReady,       // a member reported its peers verified
    kFailed,      // a member reported a failed verification
    kGroupReady,  // every member is ready
    kLeft,        // a member of a formed group left it
    kLost,        // a member's session ended without leaving
    kReleased,    // no live member is left: the group is gone
  };
  Kind kind = Kind::kJoined;
  uint32_t uid = 0;  // the group's owner: groups are namespaced by uid
  // The group's tenant ("" = the main socket's): groups are namespaced by
  // (uid, tenant), and a watcher sees only its scope's (session/Scope).
  std::string tenant;
  std::string group;
  uint32_t rank = 0;
  int pid = 0;
  uint32_t world_size = 0;
  uint64_t epoch = 0;
  std::string detail;  // as the broker or a client wrote it: not escaped
};

class GroupEventSink {
 public:
  virtual ~GroupEventSink() = default;
  // Called with the broker's lock held, in the order things happen: an
  // implementation must not block, and must not call back into the broker.
  virtual void OnGroupEvent(const GroupEvent& event) = 0;
};

}  // namespace mooncake::daemon
