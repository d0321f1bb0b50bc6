// Admin.WatchEvents (proto/mooncake/v1/admin.proto), a server-streaming RPC,
// for request_fuzzer.cc. The watch is opened as AdminService::WatchEvents
// opens it (refused on a tenant's socket, else a subscription of the
// caller's Scope) on an EventFeed that is the broker's event sink for the
// input; a script then changes groups, reads a bounded number of events, or
// cancels the watch as a client going away does (the reactor's OnDone:
// Unsubscribe). At the end every session ends, the daemon stops
// (EventFeed::Close) and the watch drains and ends, in a bounded number of
// reads.
//
// WatchEventsRequest has no fields, so the watch's parameters come before
// the request's bytes (after the selector byte):
//   [u8 how]   bits 0-1: the caller: uid kUidA, kUidB, root, or kUidA on a
//                tenant's socket;
//              bits 2-4: the feed's queue depth, minus 2;
//              bit 5: the daemon is already stopping;
//              bits 6-7: watches the caller's uid already holds: 0, 1,
//                kMaxWatchersPerUid - 1 or kMaxWatchersPerUid
//   [u8 n][n script bytes], each [op: bits 0-2][arg: bits 3-7]:
//     0 join  1 leave  2 ready  3 end a session  (arg: session = arg % 3 of
//       A, A2 (uid kUidA), B (uid kUidB); group = arg / 3 % 3 of
//       "fuzz-forming", "w0", "w1"; rank = arg / 9 % 2; world size 2;
//       ready: ok = arg / 18 % 2)
//     4 read up to arg + 1 events   5 cancel the watch   6, 7 read one event
//
// Invariants: the watch is refused exactly as the handler and the feed's
// limits say (Unimplemented on a tenant's socket, FailedPrecondition once
// stopping, ResourceExhausted past kMaxWatchersPerUid for an unprivileged
// uid); every event read is in the caller's scope; the first is WATCHING
// (or DROPPED when WATCHING itself was dropped); sequence numbers increase;
// the events read are, in order, the events the broker reported that the
// scope sees while the watch was open, less exactly the number the DROPPED
// notices count; `wake` ran for each one queued; nothing is queued after a
// cancel; after Close the watch drains within queue depth + 1 reads; and no
// watch is left in the feed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "admission/admission_counter.h"
#include "daemon_core.h"
#include "mooncake/v1/admin.pb.h"
#include "server/event_feed.h"

namespace mooncake::fuzz {

struct WatchScript {
  uint8_t how = 0;
  std::string ops;
};

inline WatchScript ReadWatchScript(ByteReader& in) {
  WatchScript w;
  w.how = in.U8();
  w.ops = std::string(in.Bytes(in.U8()));
  return w;
}

// Forwards the broker's events to the feed, keeping a copy: what the
// watches should have seen. Called under the broker's lock, from this
// thread (the broker's timer never fires during an input).
class RecordingSink final : public daemon::GroupEventSink {
 public:
  explicit RecordingSink(daemon::EventFeed* feed) : feed_(feed) {}
  void OnGroupEvent(const daemon::GroupEvent& event) override {
    events.push_back(event);
    feed_->OnGroupEvent(event);
  }
  std::vector<daemon::GroupEvent> events;

 private:
  daemon::EventFeed* const feed_;
};

// What the watch read, checked as it goes.
struct WatchReader {
  daemon::Scope scope;
  std::vector<v1::WatchEvent> seen;  // neither WATCHING nor DROPPED
  bool watching_seen = false;
  uint64_t dropped = 0;
  uint64_t last_seq = 0;
  size_t reads = 0;

  // One Next(); false when nothing was queued.
  bool ReadOne(daemon::EventFeed::Watcher& w) {
    std::optional<v1::WatchEvent> ev = w.Next();
    if (!ev) return false;
    ++reads;
    if (ev->kind() == v1::WatchEvent::DROPPED) {
      FUZZ_CHECK(ev->dropped() > 0, "a DROPPED notice for no event");
      dropped += ev->dropped();
      return true;
    }
    FUZZ_CHECK(ev->seq() > last_seq, "seq ", ev->seq(), " after ", last_seq);
    last_seq = ev->seq();
    if (ev->kind() == v1::WatchEvent::WATCHING) {
      FUZZ_CHECK(reads == 1 && !watching_seen, "WATCHING as event ", reads);
      FUZZ_CHECK(ev->uid() == scope.uid && ev->tenant() == scope.tenant, "WATCHING of uid ",
                 ev->uid());
      watching_seen = true;
      return true;
    }
    FUZZ_CHECK(reads > 1 || dropped > 0, "the first event is neither WATCHING nor DROPPED");
    FUZZ_CHECK(scope.Sees(ev->uid(), ev->tenant()), "uid ", scope.uid, " saw an event of uid ",
               ev->uid());
    CheckEscaped(ev->detail(), 1024);
    seen.push_back(*std::move(ev));
    return true;
  }
};

inline void HandleWatchEvents(DaemonCore& core, const daemon::SessionInfo& a,
                              const WatchScript& script) {
  const uint32_t callers[] = {kUidA, kUidB, 0, kUidA};
  const uint32_t uid = callers[script.how & 3];
  const std::string tenant = (script.how & 3) == 3 ? "tenant-0" : "";
  const size_t depth = 2 + ((script.how >> 2) & 7);
  const bool stopping = (script.how >> 5) & 1;
  const size_t held_options[] = {0, 1, daemon::EventFeed::kMaxWatchersPerUid - 1,
                                 daemon::EventFeed::kMaxWatchersPerUid};
  const size_t held = held_options[script.how >> 6];

  daemon::EventFeed feed(depth);
  RecordingSink sink(&feed);
  core.broker.set_event_sink(&sink);

  absl::StatusOr<daemon::SessionInfo> a2 = core.Open(kUidA, "fuzz-watch-a2");
  absl::StatusOr<daemon::SessionInfo> b = core.Open(kUidB, "fuzz-watch-b");
  FUZZ_CHECK(a2.ok() && b.ok(), "opening A2 and B");
  const daemon::SessionInfo* sessions[] = {&a, &*a2, &*b};

  // Watches the caller's uid already holds (other `mcctl watch`es).
  std::vector<std::shared_ptr<daemon::EventFeed::Watcher>> others;
  for (size_t i = 0; i < held; ++i) {
    absl::StatusOr<std::shared_ptr<daemon::EventFeed::Watcher>> w = feed.Subscribe(uid, nullptr);
    FUZZ_CHECK(w.ok(), w.status());
    others.push_back(*std::move(w));
  }
  if (stopping) feed.Close();

  // AdminService::WatchEvents.
  WatchReader reader;
  reader.scope = daemon::ScopeOf(PeerCred{4242, uid, uid}, tenant);
  size_t wakes = 0;
  std::shared_ptr<daemon::EventFeed::Watcher> watcher;
  absl::Status opened;
  if (!tenant.empty()) {
    opened = absl::UnimplementedError("WatchEvents is not served on a tenant's socket yet");
  } else {
    absl::StatusOr<std::shared_ptr<daemon::EventFeed::Watcher>> w =
        feed.Subscribe(reader.scope, [&wakes] { ++wakes; });
    opened = w.status();
    if (w.ok()) watcher = *std::move(w);
    const bool refused = !daemon::AdmissionCounter::Privileged(daemon::Principal{uid, ""}) &&
                         held >= daemon::EventFeed::kMaxWatchersPerUid;
    if (stopping) {
      FUZZ_CHECK(opened.code() == absl::StatusCode::kFailedPrecondition, opened);
    } else if (refused) {
      FUZZ_CHECK(opened.code() == absl::StatusCode::kResourceExhausted, opened);
    } else {
      FUZZ_CHECK(opened.ok(), opened);
    }
  }
  // The events the watch is open for: [first, last).
  const size_t first = sink.events.size();
  size_t last = SIZE_MAX;

  auto cancel = [&] {
    if (!watcher || last != SIZE_MAX) return;
    feed.Unsubscribe(watcher);
    last = sink.events.size();
  };
  for (unsigned char byte : script.ops) {
    const unsigned op = byte & 7, arg = byte >> 3;
    const daemon::SessionInfo& s = *sessions[arg % 3];
    const char* groups[] = {"fuzz-forming", "w0", "w1"};
    const std::string group = groups[arg / 3 % 3];
    const uint32_t rank = arg / 9 % 2;
    switch (op) {
      case 0: {
        v1::JoinGroupRequest r;
        r.set_group(group);
        r.set_rank(rank);
        r.set_world_size(2);
        r.mutable_handle()->set_kind("memfd");
        absl::StatusOr<daemon::ValidatedJoin> j = core.broker.ValidateJoin(r);
        FUZZ_CHECK(j.ok(), j.status());
        core.StartJoin(s, *std::move(j), nullptr);
        break;
      }
      case 1: (void)core.broker.Leave(s, group, rank); break;
      case 2: {
        v1::ReportReadyRequest r;
        r.set_group(group);
        r.set_rank(rank);
        r.set_ok(arg / 18 % 2 == 0);
        if (!r.ok()) r.set_detail("peer \x1b[31munreachable");
        (void)core.broker.ReportReady(s, r);
        break;
      }
      case 3: core.lifecycle.End(s.id); break;
      case 4:
        for (unsigned i = 0; watcher && i <= arg && reader.ReadOne(*watcher);) ++i;
        break;
      case 5: cancel(); break;
      default:
        if (watcher) reader.ReadOne(*watcher);
        break;
    }
  }
  // Every client goes, then the daemon stops; the stream drains and ends.
  for (const daemon::SessionInfo& s : core.sessions.List()) core.lifecycle.End(s.id);
  feed.Close();
  core.broker.set_event_sink(nullptr);
  if (watcher) {
    const bool cancelled = last != SIZE_MAX;
    if (!cancelled) last = sink.events.size();
    size_t n = 0;
    while (reader.ReadOne(*watcher)) {
      FUZZ_CHECK(++n <= depth + 1, n, " reads after the end, queue depth ", depth);
    }
    FUZZ_CHECK(cancelled || watcher->Drained(),
               "a closed watch that read everything is not drained");
    if (!cancelled) feed.Unsubscribe(watcher);  // the reactor's OnDone

    // What the broker reported in the watch's scope while it was open,
    // after its WATCHING.
    std::vector<const daemon::GroupEvent*> visible;
    for (size_t i = first; i < last; ++i) {
      const daemon::GroupEvent& e = sink.events[i];
      if (reader.scope.Sees(e.uid, e.tenant)) visible.push_back(&e);
    }
    const uint64_t expected = visible.size() + 1;
    const uint64_t got = reader.seen.size() + (reader.watching_seen ? 1 : 0);
    FUZZ_CHECK(got + reader.dropped == expected, got, " events read and ", reader.dropped,
               " dropped, of ", expected, " in scope");
    FUZZ_CHECK(wakes >= visible.size(), wakes, " wakes for ", visible.size(), " events");
    // Read in order: a subsequence of what happened.
    size_t k = 0;
    for (const v1::WatchEvent& ev : reader.seen) {
      while (k < visible.size() &&
             !(daemon::EventFeed::KindOf(visible[k]->kind) == ev.kind() &&
               visible[k]->group == ev.group() && visible[k]->uid == ev.uid() &&
               visible[k]->rank == ev.rank() && visible[k]->epoch == ev.epoch())) {
        ++k;
      }
      FUZZ_CHECK(k < visible.size(), "event ", static_cast<int>(ev.kind()), " of '", ev.group(),
                 "' rank ", ev.rank(), " read, not reported (or out of order)");
      ++k;
    }
  } else {
    FUZZ_CHECK(!opened.ok(), "no watch, no error");
  }
  for (const auto& w : others) feed.Unsubscribe(w);
  FUZZ_CHECK(feed.watchers() == 0, feed.watchers(), " watches left in the feed");
}

}  // namespace mooncake::fuzz
