#include "etcd/etcd_lease.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/async_stream.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "etcd/etcd_internal.h"

namespace mooncake::daemon::etcd {
namespace {

using internal::GrpcErrorText;
using internal::LeaseName;

constexpr absl::Duration kMinBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);

// The tag of the alarm Stop() sets to wake the thread.
char kWakeTag;

enum class Op { kStart, kRead, kWrite, kFinish };

}  // namespace

// One LeaseKeepAlive call. At most one read and one write are in flight
// (gRPC's rule for async streams); a broken stream is canceled, its ops
// drained, then finished, and only then freed.
struct LeaseKeeper::Stream {
  struct Tag {
    Stream* stream;
    Op op;
  };
  explicit Stream(size_t m) : member(m) {}
  bool busy() const { return starting || reading || writing; }

  const size_t member;
  grpc::ClientContext ctx;  // before rw: rw goes first
  std::unique_ptr<grpc::ClientAsyncReaderWriter<etcdserverpb::LeaseKeepAliveRequest,
                                                etcdserverpb::LeaseKeepAliveResponse>>
      rw;
  etcdserverpb::LeaseKeepAliveRequest request;
  etcdserverpb::LeaseKeepAliveResponse response;
  grpc::Status status;
  Tag start_tag{this, Op::kStart};
  Tag read_tag{this, Op::kRead};
  Tag write_tag{this, Op::kWrite};
  Tag finish_tag{this, Op::kFinish};
  bool starting = false;
  bool ready = false;
  bool reading = false;
  bool writing = false;
  bool broken = false;
  bool finishing = false;
  bool awaiting = false;  // a refresh was sent; its answer not read yet
  absl::Time opened_at;
  absl::Time sent_at;
  absl::Status why_broken;  // our reason, when we broke it
};

LeaseKeeper::LeaseKeeper(EtcdClient* client, Lease lease, LostCallback on_lost)
    : client_(client), lease_(std::move(lease)), on_lost_(std::move(on_lost)) {
  const absl::Duration ttl = absl::Seconds(std::max<int64_t>(lease_.ttl_seconds, 1));
  {
    absl::MutexLock lock(&mu_);
    alive_until_ =
        (lease_.granted_at == absl::InfinitePast() ? absl::Now() : lease_.granted_at) + ttl;
  }
  thread_ = std::thread([this] { Run(); });
}

LeaseKeeper::~LeaseKeeper() { Stop(); }

void LeaseKeeper::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      stop_ = true;
      if (!exiting_) wake_.Set(&cq_, std::chrono::system_clock::now(), &kWakeTag);
    }
  }
  absl::MutexLock lock(&join_mu_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool LeaseKeeper::lost() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

absl::Time LeaseKeeper::known_alive_until() const {
  absl::MutexLock lock(&mu_);
  return alive_until_;
}

int64_t LeaseKeeper::refreshes() const {
  absl::MutexLock lock(&mu_);
  return refreshes_;
}

void LeaseKeeper::Run() {
  const size_t n = client_->member_count();
  // How long a stream may take to come up, or a refresh to be answered,
  // before trying again elsewhere: a third of the TTL leaves time for it.
  const absl::Duration stall_limit =
      std::min(client_->options().request_timeout,
               std::max(absl::Seconds(std::max<int64_t>(lease_.ttl_seconds, 1)) / 3,
                        absl::Milliseconds(200)));
  size_t member = client_->preferred();
  std::unique_ptr<Stream> s;
  absl::Duration backoff = kMinBackoff;
  absl::Time reopen_at = absl::InfinitePast();
  absl::Time next_send = absl::InfinitePast();
  absl::Status last_error = absl::UnavailableError("no refresh answered yet");
  bool done = false;  // stopping or lost: open nothing new, drain and exit

  auto url = [&](const Stream& st) { return client_->member(st.member).address.url; };
  auto report_lost = [&](absl::Status why) {
    {
      absl::MutexLock lock(&mu_);
      lost_ = true;
    }
    done = true;
    if (on_lost_) on_lost_(why);
  };
  auto break_stream = [&](Stream& st, absl::Status why) {
    if (st.broken) return;
    st.broken = true;
    st.why_broken = std::move(why);
    st.ctx.TryCancel();
  };

  for (;;) {
    const absl::Time now = absl::Now();
    absl::Time alive_until;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) done = true;
      alive_until = alive_until_;
    }
    if (!done && now >= alive_until) {
      report_lost(absl::UnavailableError(absl::StrCat(
          "etcd ", LeaseName(lease_.id), ": no refresh got through before its TTL (",
          lease_.ttl_seconds,
          " s) ran out: it has expired or is about to, and its keys with it (last error: ",
          last_error.message(), ")")));
    }
    if (s) {
      if (done) {
        break_stream(*s, absl::OkStatus());
      } else if (s->ready && !s->broken && !s->awaiting && !s->writing && now >= next_send) {
        s->request.set_id(lease_.id);
        s->rw->Write(s->request, &s->write_tag);
        s->writing = true;
        s->awaiting = true;
        s->sent_at = now;
      } else if (s->awaiting && !s->broken && now - s->sent_at >= stall_limit) {
        break_stream(*s, absl::DeadlineExceededError(
                             absl::StrCat(url(*s), ": a refresh got no answer within ",
                                          absl::FormatDuration(stall_limit))));
      } else if (s->starting && !s->broken && now - s->opened_at >= stall_limit) {
        break_stream(*s, absl::UnavailableError(absl::StrCat(url(*s), ": no connection within ",
                                                             absl::FormatDuration(stall_limit))));
      }
      if (s->broken && !s->busy() && !s->finishing) {
        s->rw->Finish(&s->status, &s->finish_tag);
        s->finishing = true;
      }
    } else if (done) {
      break;
    } else if (now >= reopen_at) {
      s = std::make_unique<Stream>(member);
      // Wait for a connection rather than fail at once on a channel that is
      // reconnecting: the waiting call is also what makes gRPC retry the
      // connection (stall_limit bounds the wait).
      s->ctx.set_wait_for_ready(true);
      s->rw = client_->member(member).lease->PrepareAsyncLeaseKeepAlive(&s->ctx, &cq_);
      s->rw->StartCall(&s->start_tag);
      s->starting = true;
      s->opened_at = now;
      next_send = now;  // a new stream refreshes at once
    }

    // Sleep until the next deadline or event.
    absl::Time wake = now + absl::Seconds(1);
    if (!done) wake = std::min(wake, alive_until);
    if (s && !s->broken) {
      if (s->ready && !s->awaiting) wake = std::min(wake, next_send);
      if (s->awaiting) wake = std::min(wake, s->sent_at + stall_limit);
      if (s->starting) wake = std::min(wake, s->opened_at + stall_limit);
    }
    if (!s && !done) wake = std::min(wake, reopen_at);
    void* tag = nullptr;
    bool ok = false;
    const grpc::CompletionQueue::NextStatus next =
        cq_.AsyncNext(&tag, &ok, absl::ToChronoTime(std::max(wake, now)));
    if (next == grpc::CompletionQueue::SHUTDOWN) break;
    if (next == grpc::CompletionQueue::TIMEOUT || tag == &kWakeTag) continue;

    auto* t = static_cast<Stream::Tag*>(tag);
    Stream& st = *t->stream;
    switch (t->op) {
      case Op::kStart:
        st.starting = false;
        if (!ok) {
          break_stream(st, absl::OkStatus());
        } else if (!st.broken) {
          st.ready = true;
          st.rw->Read(&st.response, &st.read_tag);
          st.reading = true;
        }
        break;
      case Op::kWrite:
        st.writing = false;
        if (!ok) break_stream(st, absl::OkStatus());
        break;
      case Op::kRead:
        st.reading = false;
        if (!ok) {
          break_stream(st, absl::OkStatus());
          break;
        }
        if (st.broken) break;
        if (st.response.ttl() <= 0) {
          report_lost(absl::NotFoundError(
              absl::StrCat("etcd ", LeaseName(lease_.id), " is gone: ", url(st),
                           " answered a refresh with TTL ", st.response.ttl(),
                           " (it expired or was revoked); the keys attached to it were deleted")));
          break_stream(st, absl::OkStatus());
          break;
        }
        {
          const absl::Duration ttl = absl::Seconds(st.response.ttl());
          absl::MutexLock lock(&mu_);
          // The member renewed the lease after we sent: counting from the
          // send errs on the safe side.
          alive_until_ = st.sent_at + ttl;
          ++refreshes_;
          next_send = st.sent_at + ttl / 3;
        }
        st.awaiting = false;
        backoff = kMinBackoff;
        st.rw->Read(&st.response, &st.read_tag);
        st.reading = true;
        break;
      case Op::kFinish:
        if (!st.why_broken.ok()) {
          last_error = st.why_broken;
        } else if (!st.status.ok() && st.status.error_code() != grpc::StatusCode::CANCELLED) {
          last_error = absl::Status(internal::FromGrpcCode(st.status),
                                    absl::StrCat(url(st), ": ", GrpcErrorText(st.status)));
        }
        s.reset();
        if (!done) {
          // Another member may still reach the cluster.
          member = (member + 1) % n;
          reopen_at = absl::Now() + backoff;
          backoff = std::min(backoff * 2, kMaxBackoff);
        }
        break;
    }
  }

  {
    absl::MutexLock lock(&mu_);
    exiting_ = true;
  }
  cq_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) {
  }
}

}  // namespace mooncake::daemon::etcd
