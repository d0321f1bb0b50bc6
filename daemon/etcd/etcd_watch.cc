#include "etcd/etcd_watch.h"

#include <grpcpp/support/sync_stream.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "etcd/etcd_internal.h"
#include "mooncake/common/escape.h"

namespace mooncake::daemon::etcd {
namespace {

using internal::FromProto;
using internal::GrpcErrorText;

constexpr absl::Duration kMinBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);

}  // namespace

Watcher::Watcher(EtcdClient* client, std::string prefix, int64_t start_revision,
                 EventsCallback on_events, ErrorCallback on_error)
    : client_(client),
      prefix_(std::move(prefix)),
      on_events_(std::move(on_events)),
      on_error_(std::move(on_error)),
      next_revision_(std::max<int64_t>(start_revision, 0)) {}

absl::StatusOr<std::unique_ptr<Watcher>> Watcher::Start(EtcdClient* client, std::string prefix,
                                                        int64_t start_revision,
                                                        EventsCallback on_events,
                                                        ErrorCallback on_error) {
  if (prefix.empty()) {
    return absl::InvalidArgumentError("etcd Watch: the prefix is empty (that is every key)");
  }
  std::unique_ptr<Watcher> w(new Watcher(client, std::move(prefix), start_revision,
                                         std::move(on_events), std::move(on_error)));
  w->thread_ = std::thread([raw = w.get()] { raw->Run(); });
  absl::Status status;
  {
    absl::MutexLock lock(&w->mu_);
    const absl::Duration wait = client->options().request_timeout;
    if (!w->mu_.AwaitWithTimeout(absl::Condition(&w->started_), wait)) {
      status = absl::DeadlineExceededError(
          absl::StrCat("etcd Watch on ", DescribeKey("prefix", w->prefix_),
                       ": no member set the watch up within ", absl::FormatDuration(wait),
                       " (request_timeout)"));
    } else {
      status = w->start_status_;
    }
  }
  if (!status.ok()) {
    w->Cancel();
    return status;
  }
  return w;
}

Watcher::~Watcher() { Cancel(); }

void Watcher::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (ctx_) ctx_->TryCancel();
  }
  absl::MutexLock lock(&join_mu_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

int64_t Watcher::next_revision() const {
  absl::MutexLock lock(&mu_);
  return next_revision_;
}

int64_t Watcher::reconnects() const {
  absl::MutexLock lock(&mu_);
  return reconnects_;
}

void Watcher::SetStarted(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (started_) return;
  started_ = true;
  start_status_ = std::move(status);
}

void Watcher::Run() {
  const size_t n = client_->member_count();
  const std::string range_end = PrefixRangeEnd(prefix_);
  const std::string what = absl::StrCat("etcd Watch on ", DescribeKey("prefix", prefix_));
  size_t member = client_->preferred();
  absl::Duration backoff = kMinBackoff;
  bool started = false;
  std::vector<std::string> start_failures;
  int64_t next_revision;
  {
    absl::MutexLock lock(&mu_);
    next_revision = next_revision_;
  }

  auto stopped = [this] {
    absl::MutexLock lock(&mu_);
    return stop_;
  };
  // After a failure: note it (before the watch is up, failing on every
  // member fails Start), then wait and move to the next member.
  auto failed = [&](const std::string& url, absl::string_view why) {
    if (!started) {
      start_failures.push_back(absl::StrCat(url, " (", why, ")"));
      if (start_failures.size() >= n) {
        SetStarted(absl::UnavailableError(
            absl::StrCat(what, ": no member reachable: ", absl::StrJoin(start_failures, "; "))));
        return false;
      }
    }
    member = (member + 1) % n;
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), backoff);
    backoff = std::min(backoff * 2, kMaxBackoff);
    return !stop_;
  };

  for (bool first = true;; first = false) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
      if (!first) ++reconnects_;
    }
    const std::string& url = client_->member(member).address.url;
    // Connect first: a stream opened on a channel that is not connected
    // fails at once, and nothing would drive the reconnection meanwhile.
    const absl::Status reach = EtcdClient::AwaitConnection(
        client_->member(member), absl::Now() + client_->options().dial_timeout, stopped);
    if (absl::IsCancelled(reach)) break;
    if (!reach.ok()) {
      if (!failed(url, reach.message())) break;
      continue;
    }
    auto ctx = std::make_shared<grpc::ClientContext>();
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
      ctx_ = ctx;
    }
    auto stream = client_->member(member).watch->Watch(ctx.get());

    etcdserverpb::WatchRequest request;
    etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(prefix_);
    create->set_range_end(range_end);
    create->set_start_revision(next_revision);
    // Idle watches then learn the store's revision now and then, so a
    // resume does not start from a revision compacted meanwhile.
    create->set_progress_notify(true);

    absl::Status terminal;  // not OK: report it and stop
    bool created = false;
    if (stream->Write(request)) {
      etcdserverpb::WatchResponse response;
      while (stream->Read(&response)) {
        if (response.created() && !created) {
          created = true;
          // Watching "from now": now is the revision the member had.
          if (next_revision == 0) next_revision = response.header().revision() + 1;
          backoff = kMinBackoff;
          client_->set_preferred(member);
          if (!started) {
            started = true;
            {
              absl::MutexLock lock(&mu_);
              next_revision_ = next_revision;
            }
            SetStarted(absl::OkStatus());
          }
        }
        if (response.canceled()) {
          if (response.compact_revision() > 0) {
            terminal = absl::OutOfRangeError(absl::StrCat(
                what, " from revision ", next_revision, " at ", url,
                ": that revision was compacted (the oldest kept is ", response.compact_revision(),
                "), so changes were lost; read the prefix again (GetPrefix) and watch from its "
                "revision + 1"));
          } else {
            terminal = absl::FailedPreconditionError(absl::StrCat(
                what, " at ", url, ": canceled by the server",
                response.cancel_reason().empty() ? "" : ": ", response.cancel_reason()));
          }
          break;
        }
        if (response.events_size() > 0) {
          std::vector<WatchEvent> events;
          events.reserve(static_cast<size_t>(response.events_size()));
          for (const mvccpb::Event& e : response.events()) {
            WatchEvent event;
            event.type = e.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete
                                                           : WatchEvent::Type::kPut;
            event.kv = FromProto(e.kv());
            events.push_back(std::move(event));
          }
          next_revision = events.back().kv.mod_revision + 1;
          {
            absl::MutexLock lock(&mu_);
            next_revision_ = next_revision;
            if (stop_) break;
          }
          if (on_events_) on_events_(events);
        } else if (created && !response.created() &&
                   response.header().revision() >= next_revision) {
          // A progress notification: every change up to this revision has
          // been sent.
          next_revision = response.header().revision() + 1;
          absl::MutexLock lock(&mu_);
          next_revision_ = next_revision;
        }
      }
    }
    if (!terminal.ok()) ctx->TryCancel();
    const grpc::Status finish = stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      ctx_.reset();
      if (stop_) break;
    }
    if (!terminal.ok()) {
      if (!started) {
        SetStarted(terminal);
      } else if (on_error_) {
        on_error_(terminal);
      }
      break;
    }
    if (!failed(url, GrpcErrorText(finish))) break;
  }
  SetStarted(absl::CancelledError(what + ": canceled"));
}

}  // namespace mooncake::daemon::etcd
