// EventFeed: group and membership events for watchers (Admin.WatchEvents,
// `mcctl watch`).
//
// GroupBroker reports every group event to the feed (it is the broker's
// GroupEventSink); the feed stamps each with a sequence number and a time
// and queues it for every watcher allowed to see it: the group owner's uid,
// and root. Nothing is kept for a uid nobody watches.
//
// Bounded: at most kMaxWatchersPerUid watches per uid and kMaxWatchers in
// all (Subscribe fails with ResourceExhausted beyond), and each watcher
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
#include "broker/group_events.h"
#include "mooncake/v1/admin.pb.h"

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
    uint32_t uid() const { return uid_; }
    // The next event to send, or nullopt when none is queued. After a
    // loss, the first event taken is DROPPED with the count.
    std::optional<v1::WatchEvent> Next();
    // Close() was called and nothing is queued any more: end the stream.
    bool Drained() const;

   private:
    friend class EventFeed;
    Watcher(uint32_t uid, size_t depth, std::function<void()> wake)
        : uid_(uid), depth_(depth), wake_(std::move(wake)) {}
    // Queues `event`, dropping the oldest when full.
    void Push(v1::WatchEvent event);

    const uint32_t uid_;
    const size_t depth_;
    const std::function<void()> wake_;
    mutable absl::Mutex mu_;
    std::deque<v1::WatchEvent> queue_ ABSL_GUARDED_BY(mu_);
    uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
    bool closed_ ABSL_GUARDED_BY(mu_) = false;
  };

  explicit EventFeed(size_t queue_depth = kDefaultQueueDepth)
      : queue_depth_(queue_depth < 2 ? 2 : queue_depth) {}

  // Starts a watch for `uid` (root: every group). `wake` is called, from
  // any thread and possibly under the broker's lock, whenever the watcher
  // has something new to take (or was closed); it must not block and must
  // not call Subscribe or Unsubscribe. The first event queued is WATCHING.
  // ResourceExhausted when `uid` already holds kMaxWatchersPerUid watches
  // or the daemon kMaxWatchers; FailedPrecondition after Close().
  absl::StatusOr<std::shared_ptr<Watcher>> Subscribe(uint32_t uid, std::function<void()> wake);
  // Ends a watch: no event is queued for it afterwards. Idempotent.
  void Unsubscribe(const std::shared_ptr<Watcher>& watcher);

  // The broker's report (GroupEventSink).
  void OnGroupEvent(const GroupEvent& event) override;

  // The daemon is stopping: every watcher is closed (it drains what it has
  // queued, then ends) and Subscribe fails from now on.
  void Close();

  size_t watchers() const;
  // How many watches `uid` holds.
  size_t WatchersOf(uint32_t uid) const;

  // The wire kind of a broker event.
  static v1::WatchEvent::Kind KindOf(GroupEvent::Kind kind);

 private:
  const size_t queue_depth_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::multimap<uint32_t, std::shared_ptr<Watcher>> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mooncake::daemon
