#include "server/event_feed.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "admission/admission_counter.h"

namespace mooncake::daemon {

std::optional<v1::WatchEvent> EventFeed::Watcher::Next() {
  absl::MutexLock lock(&mu_);
  if (dropped_ > 0) {
    v1::WatchEvent notice;
    notice.set_kind(v1::WatchEvent::DROPPED);
    notice.set_time_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
    notice.set_dropped(dropped_);
    notice.set_detail(absl::StrCat(dropped_, " events dropped: this watcher read too slowly"));
    dropped_ = 0;
    return notice;
  }
  if (queue_.empty()) return std::nullopt;
  v1::WatchEvent ev = std::move(queue_.front());
  queue_.pop_front();
  return ev;
}

bool EventFeed::Watcher::Drained() const {
  absl::MutexLock lock(&mu_);
  return closed_ && queue_.empty() && dropped_ == 0;
}

void EventFeed::Watcher::Push(v1::WatchEvent event) {
  absl::MutexLock lock(&mu_);
  // Drop-oldest: what is happening now matters more to a watcher than what
  // it missed, and the DROPPED notice says that it missed something.
  while (queue_.size() >= depth_) {
    queue_.pop_front();
    ++dropped_;
  }
  queue_.push_back(std::move(event));
}

v1::WatchEvent::Kind EventFeed::KindOf(GroupEvent::Kind kind) {
  switch (kind) {
    case GroupEvent::Kind::kJoined: return v1::WatchEvent::MEMBER_JOINED;
    case GroupEvent::Kind::kWithdrew: return v1::WatchEvent::MEMBER_WITHDREW;
    case GroupEvent::Kind::kFormed: return v1::WatchEvent::GROUP_FORMED;
    case GroupEvent::Kind::kReady: return v1::WatchEvent::MEMBER_READY;
    case GroupEvent::Kind::kFailed: return v1::WatchEvent::MEMBER_FAILED;
    case GroupEvent::Kind::kGroupReady: return v1::WatchEvent::GROUP_READY;
    case GroupEvent::Kind::kLeft: return v1::WatchEvent::MEMBER_LEFT;
    case GroupEvent::Kind::kLost: return v1::WatchEvent::MEMBER_LOST;
    case GroupEvent::Kind::kReleased: return v1::WatchEvent::GROUP_RELEASED;
  }
  return v1::WatchEvent::KIND_UNSPECIFIED;
}

absl::StatusOr<std::shared_ptr<EventFeed::Watcher>> EventFeed::Subscribe(
    const Scope& scope, std::function<void()> wake) {
  const uint32_t uid = scope.uid;
  const Principal who{uid, scope.tenant};
  std::shared_ptr<Watcher> w(new Watcher(scope, queue_depth_, std::move(wake)));
  // Root and the daemon's own uid (on the main socket) are counted but
  // never refused: users holding every watch must not blind root's
  // `mcctl watch`.
  const bool privileged = AdmissionCounter::Privileged(who);
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::FailedPreconditionError("mooncaked is shutting down");
    if (!privileged && WatchersOfLocked(who) >= kMaxWatchersPerUid) {
      return absl::ResourceExhaustedError(
          absl::StrCat(who.Describe(), " already holds ", kMaxWatchersPerUid,
                       " event watches (mcctl watch), the most one user may: end one first"));
    }
    if (!privileged && unprivileged_ >= kMaxWatchers) {
      return absl::ResourceExhaustedError(absl::StrCat("mooncaked already serves ", kMaxWatchers,
                                                       " event watches: try again later"));
    }
    v1::WatchEvent hello;
    hello.set_seq(next_seq_++);
    hello.set_time_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
    hello.set_kind(v1::WatchEvent::WATCHING);
    hello.set_uid(uid);
    hello.set_tenant(scope.tenant);
    const std::string where =
        scope.tenant.empty() ? "" : absl::StrCat(" of tenant '", scope.tenant, "'");
    hello.set_detail(scope.all_uids && scope.all_tenants ? "watching every group (root)"
                     : scope.all_uids ? absl::StrCat("watching every group", where, " (root)")
                                      : absl::StrCat("watching the groups of uid ", uid, where));
    w->Push(std::move(hello));
    watchers_.emplace(uid, w);
    if (!privileged) ++unprivileged_;
  }
  return w;
}

void EventFeed::Unsubscribe(const std::shared_ptr<Watcher>& watcher) {
  if (!watcher) return;
  absl::MutexLock lock(&mu_);
  auto [begin, end] = watchers_.equal_range(watcher->uid());
  for (auto it = begin; it != end; ++it) {
    if (it->second == watcher) {
      watchers_.erase(it);
      if (!AdmissionCounter::Privileged(watcher->principal())) --unprivileged_;
      return;
    }
  }
}

void EventFeed::OnGroupEvent(const GroupEvent& event) {
  std::vector<std::shared_ptr<Watcher>> woken;
  {
    absl::MutexLock lock(&mu_);
    if (closed_ || watchers_.empty()) return;
    v1::WatchEvent ev;
    ev.set_kind(KindOf(event.kind));
    ev.set_group(event.group);
    ev.set_uid(event.uid);
    ev.set_tenant(event.tenant);
    ev.set_rank(event.rank);
    ev.set_pid(event.pid);
    ev.set_world_size(event.world_size);
    ev.set_epoch(event.epoch);
    ev.set_detail(event.detail);
    bool numbered = false;
    for (uint32_t who : {event.uid, 0u}) {
      auto [begin, end] = watchers_.equal_range(who);
      for (auto it = begin; it != end; ++it) {
        // The owner's uid of another tenant, or root of another tenant's
        // socket, does not see the group (as in ListGroups).
        if (!it->second->scope().Sees(event.uid, event.tenant)) continue;
        if (!numbered) {
          // Numbered only when someone sees it, so a watcher's gaps are
          // other uids' events, never lost ones.
          ev.set_seq(next_seq_++);
          ev.set_time_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
          numbered = true;
        }
        it->second->Push(ev);
        woken.push_back(it->second);
      }
      if (event.uid == 0) break;  // root's own group: its watchers once
    }
  }
  // Outside mu_: a wake may start a write, and gRPC may run the stream's
  // reactions (OnDone, which unsubscribes) inline.
  for (const auto& w : woken) {
    if (w->wake_) w->wake_();
  }
}

void EventFeed::Close() {
  std::vector<std::shared_ptr<Watcher>> woken;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (auto& [uid, w] : watchers_) {
      {
        absl::MutexLock wl(&w->mu_);
        w->closed_ = true;
      }
      woken.push_back(w);
    }
  }
  for (const auto& w : woken) {
    if (w->wake_) w->wake_();
  }
}

size_t EventFeed::watchers() const {
  absl::MutexLock lock(&mu_);
  return watchers_.size();
}

size_t EventFeed::WatchersOf(const Principal& who) const {
  absl::MutexLock lock(&mu_);
  return WatchersOfLocked(who);
}

size_t EventFeed::WatchersOfLocked(const Principal& who) const {
  size_t n = 0;
  auto [begin, end] = watchers_.equal_range(who.uid);
  for (auto it = begin; it != end; ++it) n += it->second->principal() == who ? 1 : 0;
  return n;
}

}  // namespace mooncake::daemon
