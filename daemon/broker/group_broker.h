// GroupBroker: named groups of ranks and their rendezvous.
//
// A member joins group G as rank r of n with an opaque handle (bytes and/or
// fds) and a deadline. When all n ranks are in, the group forms and every
// member receives the full view: each rank's node, GPU, handle, and whether
// the receiver can reach it directly (P2P). Members that leave or whose
// session ends are reported to the others as events.
//
// Groups are scoped by the caller's uid: the same name under two uids is two
// unrelated groups, and no caller can see or join another user's group.
// Thread-safe. JoinAsync never blocks: the daemon's RPC threads are not
// held while a rendezvous waits (a 256-rank join would otherwise park 256
// threads); deadlines are enforced by one timer thread.
//
// A join is validated once, by ValidateJoin, which yields the ValidatedJoin
// that JoinAsync requires. The broker sees the rest of the daemon through
// the SessionRegistry (liveness, events) and an FdTicketIssuer (members'
// fds); both are not owned and must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "broker/group_summary.h"
#include "broker/validated_join.h"
#include "fdchannel/fd_ticket_issuer.h"
#include "fdchannel/ticket_store.h"
#include "mooncake/v1/local.pb.h"
#include "mooncake/v1/node.pb.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

struct BrokerLimits {
  uint32_t max_world_size = 65536;
  uint32_t default_timeout_ms = 30000;
  size_t max_handle_bytes = 4096;
};

class GroupBroker {
 public:
  using JoinDone = std::function<void(absl::StatusOr<v1::JoinGroupResponse>)>;

  GroupBroker(std::string node_id, v1::Topology topology, BrokerLimits limits,
              SessionRegistry* sessions, FdTicketIssuer* fd_tickets);
  ~GroupBroker();

  // Every check of a join that needs only the request and this node: group
  // name, world size, rank, handle size and kind, and the GPU selector
  // (InvalidArgument with what to fix). Reads no group state.
  absl::StatusOr<ValidatedJoin> ValidateJoin(const v1::JoinGroupRequest& request) const;

  // Registers a join. `done` runs exactly once, never under the broker's
  // lock: at once when the join conflicts with its group (world size,
  // taken rank, formed group) or the session is gone, when the group forms
  // (with the caller's view), when the deadline passes, on CancelJoin,
  // when the caller's session ends, or on Shutdown. On any error the
  // caller's rank is not left behind in the group.
  // When `out` is given (it must outlive the call to `done`), a successful
  // view is written straight into it and `done` receives an empty message:
  // the RPC layer passes its arena-allocated response this way, which saves
  // a malloc per string at large world sizes.
  void JoinAsync(const SessionInfo& caller, ValidatedJoin join, FdBundlePtr fds, JoinDone done,
                 v1::JoinGroupResponse* out = nullptr);
  // The caller's RPC went away: drops a still-waiting rank (done gets
  // Cancelled). No-op when the join already completed.
  void CancelJoin(const SessionInfo& caller, const std::string& group, uint32_t rank);

  // Blocking form of ValidateJoin + JoinAsync (tests, tools): waits for
  // `done`, polling `cancelled` every 100 ms and cancelling the join when
  // it returns true.
  absl::StatusOr<v1::JoinGroupResponse> Join(const SessionInfo& caller,
                                             const v1::JoinGroupRequest& request, FdBundlePtr fds,
                                             const std::function<bool()>& cancelled);
  absl::Status Leave(const SessionInfo& caller, const std::string& group, uint32_t rank);
  absl::Status ReportReady(const SessionInfo& caller, const v1::ReportReadyRequest& request);

  // The session is gone: its ranks become `lost` (or vanish while forming).
  void SessionEnded(uint64_t session_id);
  // Fails every waiting Join with Unavailable.
  void Shutdown();

  // Groups visible to `uid` (all of them for root when `all` is set).
  std::vector<GroupSummary> List(uint32_t uid, bool all) const;
  // "name/rank" for each live membership of the session.
  std::vector<std::string> MembershipsOf(uint64_t session_id) const;
  size_t CountVisible(uint32_t uid, bool all) const;

 private:
  struct Member {
    uint32_t rank = 0;
    uint64_t session = 0;
    PeerCred cred;
    int gpu_index = -1;
    std::string gpu_uuid, gpu_pci;
    v1::MemberHandle handle;  // fd_ticket cleared
    FdBundlePtr fds;
    MemberState state = MemberState::kJoined;
  };
  struct Waiter {
    SessionInfo caller;
    JoinDone done;
    absl::Time deadline;
    uint32_t timeout_ms = 0;
    v1::JoinGroupResponse* out = nullptr;
  };
  struct Group {
    std::string name;
    uint32_t uid = 0;
    uint32_t world_size = 0;
    bool formed = false;
    uint64_t epoch = 0;
    absl::Time created;
    std::map<uint32_t, Member> members;
    std::map<uint32_t, Waiter> waiters;  // ranks whose JoinAsync has not completed
  };
  // A completion to run once the lock is released.
  struct Completion {
    JoinDone done;
    absl::StatusOr<v1::JoinGroupResponse> result;
  };
  // What every member's view is built from, once per formation.
  struct Formation {
    std::shared_ptr<const Group> group;  // immutable snapshot
    std::vector<std::pair<uint32_t, Waiter>> waiters;
  };
  using GroupKey = std::pair<uint32_t, std::string>;

  absl::StatusOr<int> ResolveGpu(const v1::DeviceSelector& device, std::string* uuid,
                                 std::string* pci) const;
  bool Reachable(int from_gpu, int to_gpu, bool* native_atomics) const;
  // Thread-safe without mu_: reads an immutable snapshot.
  void BuildView(const Group& g, const SessionInfo& receiver, uint32_t rank,
                 v1::JoinGroupResponse* resp) const;
  static void Complete(std::vector<Completion>* completions);
  void CompleteFormation(Formation f) const;
  absl::Status DeadlineError(const Group& g, uint32_t rank, uint32_t timeout_ms) const;
  void TimerLoop();
  void NotifyOthers(const Group& g, uint32_t about_rank, v1::MemberEvent::Kind kind,
                    const std::string& detail) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseIfEmpty(const GroupKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static GroupState StateOf(const Group& g);

  const std::string node_id_;
  const v1::Topology topology_;
  const BrokerLimits limits_;
  SessionRegistry* sessions_;
  FdTicketIssuer* fd_tickets_;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool timer_kick_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time timer_next_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::map<GroupKey, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  std::thread timer_;
};

}  // namespace mooncake::daemon
