#include "peering/softnic_peer_link.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon::peering {

using softnic::RemoteBatch;
using softnic::ResponderOp;
using softnic::ResponderResult;

SoftnicPeerLink::SoftnicPeerLink(std::string self_node, TrustedPeers* peers,
                                 absl::Duration call_timeout)
    : self_node_(std::move(self_node)), trusted_(peers), call_timeout_(call_timeout) {}

SoftnicPeerLink::~SoftnicPeerLink() { Stop(); }

void SoftnicPeerLink::Stop() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [node, peer] : peers_) threads.push_back(std::move(peer->thread));
  }
  for (std::thread& t : threads) t.join();
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
  auto& slot = peers_[batch.node];
  if (!slot) {
    slot = std::make_unique<Peer>();
    Peer* peer = slot.get();
    std::string node = batch.node;
    peer->thread = std::thread([this, node, peer] { Serve(node, peer); });
  }
  slot->queue.push_back(Job{std::move(batch), std::move(done)});
}

void SoftnicPeerLink::Serve(const std::string& node, Peer* peer) {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, peer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !peer->queue.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (peer->queue.empty()) return;  // stopping, nothing left
      job = std::move(peer->queue.front());
      peer->queue.pop_front();
    }
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopping_;
    }
    if (stopping) {
      job.done(absl::UnavailableError("mooncaked is shutting down"));
      continue;
    }
    job.done(Execute(job.batch));
  }
  (void)node;
}

absl::StatusOr<std::vector<ResponderResult>> SoftnicPeerLink::Execute(const RemoteBatch& batch) {
  absl::StatusOr<std::shared_ptr<v1::Peer::Stub>> stub = trusted_->Get(batch.node);
  if (!stub.ok()) {
    MC_LOG(kWarning, "softnic: no batch to node ", batch.node, ": ", stub.status().message());
    return absl::UnavailableError(absl::StrCat("node ", batch.node, ": ", stub.status().message()));
  }
  std::vector<ResponderResult> out;
  out.reserve(batch.ops.size());
  size_t next = 0;
  // A responder QP not connected yet is retried for about as long as a NIC
  // retries (retry_cnt 7 x ~0.27 s), backing off from 1 ms.
  const absl::Time give_up = absl::Now() + absl::Seconds(2);
  absl::Duration backoff = absl::Milliseconds(1);
  while (next < batch.ops.size()) {
    const size_t first = next;
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
      if (out.empty()) {
        return absl::UnavailableError(absl::StrCat("node ", batch.node, ": ", s.error_message()));
      }
      return out;  // the rest were not executed: the requester flushes them
    }
    if (static_cast<size_t>(response.results_size()) > sent) {
      return absl::InternalError(absl::StrCat("node ", batch.node, " answered ",
                                              response.results_size(), " results for ", sent));
    }
    bool retry = false;
    for (int i = 0; i < response.results_size(); ++i) {
      const v1::SoftnicResult& r = response.results(i);
      ResponderResult rr;
      rr.syndrome = static_cast<uint8_t>(r.syndrome() > 0xff ? 0xff : r.syndrome());
      rr.fetched = r.fetched();
      if (rr.syndrome != 0 && r.not_ready() && absl::Now() < give_up) {
        next = first + static_cast<size_t>(i);  // again from this one
        retry = true;
        break;
      }
      out.push_back(rr);
      if (rr.syndrome != 0) return out;
    }
    if (retry) {
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Milliseconds(100));
      continue;
    }
    if (static_cast<size_t>(response.results_size()) < sent) return out;  // a broken peer
  }
  return out;
}

}  // namespace mooncake::daemon::peering
