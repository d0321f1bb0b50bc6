#include "peering/softnic_peer_link.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon::peering {

using softnic::RemoteBatch;
using softnic::ResponderOp;
using softnic::ResponderResult;

SoftnicPeerLink::SoftnicPeerLink(std::string self_node, TrustedPeers* peers,
                                 absl::Duration call_timeout)
    : self_node_(std::move(self_node)), trusted_(peers), call_timeout_(call_timeout) {
  for (int i = 0; i < kWorkers; ++i) workers_.emplace_back([this] { Work(); });
}

SoftnicPeerLink::~SoftnicPeerLink() { Stop(); }

void SoftnicPeerLink::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
  std::deque<Job> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(queue_);
  }
  for (Job& job : left) job.done(absl::UnavailableError("mooncaked is shutting down"));
}

size_t SoftnicPeerLink::queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

void SoftnicPeerLink::Send(RemoteBatch batch, softnic::RemoteDone done) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    // Never on the caller's thread: it may hold the engine's lock.
    std::thread([done = std::move(done)] {
      done(absl::UnavailableError("mooncaked is shutting down"));
    }).detach();
    return;
  }
  Job job;
  job.batch = std::move(batch);
  job.done = std::move(done);
  queue_.push_back(std::move(job));
  ++events_;
}

void SoftnicPeerLink::Work() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      while (true) {
        if (stopping_) return;
        // The first job that is due and whose node has room, in order.
        const absl::Time now = absl::Now();
        absl::Time next = absl::InfiniteFuture();
        auto pick = queue_.end();
        for (auto it = queue_.begin(); it != queue_.end(); ++it) {
          if (in_flight_[it->batch.node] >= kPerNode) continue;
          if (it->not_before <= now) {
            pick = it;
            break;
          }
          next = std::min(next, it->not_before);
        }
        if (pick != queue_.end()) {
          job = std::move(*pick);
          queue_.erase(pick);
          ++in_flight_[job.batch.node];
          break;
        }
        // Woken by a new job, a call ending or stopping (each changes the
        // state under mu_); else at the next retry's time.
        auto changed = [this, seen = events_]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || events_ != seen;
        };
        mu_.AwaitWithDeadline(absl::Condition(&changed),
                              std::min(next, absl::Now() + absl::Milliseconds(50)));
      }
    }
    const bool finished = Step(job);
    absl::MutexLock lock(&mu_);
    auto calls = in_flight_.find(job.batch.node);
    if (--calls->second == 0) in_flight_.erase(calls);
    ++events_;
    if (!finished) {
      job.not_before = absl::Now() + job.backoff;
      job.backoff = std::min(job.backoff * 2, absl::Milliseconds(100));
      queue_.push_back(std::move(job));
    }
  }
}

bool SoftnicPeerLink::Step(Job& job) {
  const RemoteBatch& batch = job.batch;
  absl::StatusOr<std::shared_ptr<v1::Peer::Stub>> stub = trusted_->Get(batch.node);
  if (!stub.ok()) {
    MC_LOG(kWarning, "softnic: no batch to node ", batch.node, ": ", stub.status().message());
    job.done(
        absl::UnavailableError(absl::StrCat("node ", batch.node, ": ", stub.status().message())));
    return true;
  }
  if (job.give_up == absl::InfiniteFuture()) {
    // A responder QP not connected yet is retried for about as long as a
    // NIC retries (retry_cnt 7 x ~0.27 s).
    job.give_up = absl::Now() + absl::Seconds(2);
    job.results.reserve(batch.ops.size());
  }
  while (job.next < batch.ops.size()) {
    const size_t first = job.next;
    size_t next = first;
    v1::SoftnicBatch request;
    request.set_requester_node(self_node_);
    request.set_requester_qpn(batch.requester_qpn);
    request.set_connection_secret(batch.secret);
    size_t bytes = 0;
    while (next < batch.ops.size() && request.ops_size() < kMaxOpsPerCall &&
           (request.ops_size() == 0 || bytes + batch.ops[next].data.size() <= kMaxBytesPerCall)) {
      const softnic::RemoteOp& op = batch.ops[next++];
      v1::SoftnicOp* o = request.add_ops();
      o->set_kind(op.kind == ResponderOp::Kind::kWrite        ? v1::SoftnicOp::WRITE
                  : op.kind == ResponderOp::Kind::kFetchAdd64 ? v1::SoftnicOp::FETCH_ADD_64
                                                              : v1::SoftnicOp::MASKED_FETCH_ADD_32);
      o->set_responder_qpn(op.responder_qpn);
      o->set_raddr(op.raddr);
      o->set_rkey(op.rkey);
      o->set_data(op.data);
      o->set_add(op.add);
      o->set_field_boundary(op.field_boundary);
      bytes += op.data.size();
    }
    const size_t sent = static_cast<size_t>(request.ops_size());
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
    v1::SoftnicResults response;
    grpc::Status s = (*stub)->SoftnicExecute(&ctx, request, &response);
    if (!s.ok()) {
      MC_LOG(kWarning, "softnic: node ", batch.node, " did not execute ", sent,
             " operation(s): ", s.error_message());
      if (job.results.empty()) {
        job.done(
            absl::UnavailableError(absl::StrCat("node ", batch.node, ": ", s.error_message())));
      } else {
        job.done(std::move(job.results));  // the rest were not executed: flushed
      }
      return true;
    }
    if (static_cast<size_t>(response.results_size()) > sent) {
      job.done(absl::InternalError(absl::StrCat("node ", batch.node, " answered ",
                                                response.results_size(), " results for ", sent)));
      return true;
    }
    for (int i = 0; i < response.results_size(); ++i) {
      const v1::SoftnicResult& r = response.results(i);
      ResponderResult rr;
      rr.syndrome = static_cast<uint8_t>(r.syndrome() > 0xff ? 0xff : r.syndrome());
      rr.fetched = r.fetched();
      if (rr.syndrome != 0 && r.not_ready() && absl::Now() < job.give_up) {
        job.next = first + static_cast<size_t>(i);  // again from this one, later
        return false;
      }
      job.results.push_back(rr);
      if (rr.syndrome != 0) {
        job.done(std::move(job.results));
        return true;
      }
    }
    if (static_cast<size_t>(response.results_size()) < sent) {  // a broken peer
      job.done(std::move(job.results));
      return true;
    }
    job.next = next;
  }
  job.done(std::move(job.results));
  return true;
}

}  // namespace mooncake::daemon::peering
