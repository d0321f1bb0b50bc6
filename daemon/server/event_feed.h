// EventFeed: group and membership events for watchers (Admin.WatchEvents,
// `mcctl watch`).
//
// GroupBroker reports every group event to the feed (it is the broker's
// GroupEventSink); the feed stamps each with a sequence number and a time
// and queues it for every watcher whose Scope sees the group: the owner's
// uid through the group's own tenant socket, and root (every tenant from
// the main socket, its own tenant's from a tenant socket). Nothing is kept
// for a uid nobody watches.
//
// Bounded: at most kMaxWatchersPerUid watches per uid and kMaxWatchers in
// all (Subscribe fails with ResourceExhausted beyond; root and the daemon's
// own uid are counted but never refused, as by every per-uid limit in
// docs/limits.md), and each watcher
// queues at most `queue_depth` events. A watcher that reads too slowly
// loses its oldest events; the next one it takes is a DROPPED event that
// says how many were lost, so a gap is never silent.
//
// Strings are passed through as the broker has them (group names and
// details come from clients): whoever displays them escapes them.
//
// Thread-safety: every method may be called from any thread. OnGroupEvent
// runs under the broker's lock: it only queues and then calls the woken
// watchers' `wake` outside the feed's own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "admission/principal.h"
#include "broker/group_events.h"
#include "mooncake/v1/admin.pb.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

class EventFeed final : public GroupEventSink {
 public:
  static constexpr size_t kMaxWatchersPerUid = 8;
  static constexpr size_t kMaxWatchers = 64;
  static constexpr size_t kDefaultQueueDepth = 1024;

  // One watch. Owned jointly by the feed (until Unsubscribe) and the
  // stream that reads it.
  class Watcher {
   public:
    uint32_t uid() const { return scope_.uid; }
    // Whom the watch counts against (the uid on its socket's tenant).
    Principal principal() const { return Principal{scope_.uid, scope_.tenant}; }
    const Scope& scope() const { return scope_; }
    // The next event to send, or nullopt when none is queued. After a
    // loss, the first event taken is DROPPED with the count.
    std::optional<v1::WatchEvent> Next();
    // Close() was called and nothing is queued any more: end the stream.
    bool Drained() const;

   private:
    friend class EventFeed;
    Watcher(Scope scope, size_t depth, std::function<void()> wake)
        : scope_(std::move(scope)), depth_(depth), wake_(std::move(wake)) {}
    // Queues `event`, dropping the oldest when full.
    void Push(v1::WatchEvent event);

    const Scope scope_;
    const size_t depth_;
    const std::function<void()> wake_;
    mutable absl::Mutex mu_;
    std::deque<v1::WatchEvent> queue_ ABSL_GUARDED_BY(mu_);
    uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
    bool closed_ ABSL_GUARDED_BY(mu_) = false;
  };

  explicit EventFeed(size_t queue_depth = kDefaultQueueDepth)
      : queue_depth_(queue_depth < 2 ? 2 : queue_depth) {}

  // Starts a watch of the groups `scope` sees (ScopeOf the caller's
  // credentials and tenant). `wake` is called, from any thread and possibly
  // under the broker's lock, whenever the watcher has something new to take
  // (or was closed); it must not block and must not call Subscribe or
  // Unsubscribe. The first event queued is WATCHING. ResourceExhausted when
  // scope.uid (unprivileged) already holds kMaxWatchersPerUid watches or
  // unprivileged uids hold kMaxWatchers; FailedPrecondition after Close().
  absl::StatusOr<std::shared_ptr<Watcher>> Subscribe(const Scope& scope,
                                                     std::function<void()> wake);
  // A watch from the main socket: `uid`'s groups of the main socket, every
  // group for root.
  absl::StatusOr<std::shared_ptr<Watcher>> Subscribe(uint32_t uid, std::function<void()> wake) {
    return Subscribe(Scope{uid, "", uid == 0, uid == 0}, std::move(wake));
  }
  // Ends a watch: no event is queued for it afterwards. Idempotent.
  void Unsubscribe(const std::shared_ptr<Watcher>& watcher);

  // The broker's report (GroupEventSink).
  void OnGroupEvent(const GroupEvent& event) override;

  // The daemon is stopping: every watcher is closed (it drains what it has
  // queued, then ends) and Subscribe fails from now on.
  void Close();

  size_t watchers() const;
  // How many watches `uid` holds.
  size_t WatchersOf(const Principal& who) const;

  // The wire kind of a broker event.
  static v1::WatchEvent::Kind KindOf(GroupEvent::Kind kind);

 private:
  const size_t queue_depth_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  size_t unprivileged_ ABSL_GUARDED_BY(mu_) = 0;  // watches held by unprivileged uids
  size_t WatchersOfLocked(const Principal& who) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::multimap<uint32_t, std::shared_ptr<Watcher>> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mooncake::daemon
