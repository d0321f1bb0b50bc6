// SoftnicPeerLink: softnic's RemoteLink over the peer port (issue 9 item 5).
// A batch for node N goes to N's daemon as Peer.SoftnicExecute calls (at
// most kMaxOpsPerCall operations and kMaxBytesPerCall payload bytes each),
// in order. Batches go only to a node TrustedPeers verified (its
// certificate names it, its instance id is the one in its record), each
// carrying its connection's secret; a node that is not verified, or does
// not answer within the call deadline, fails the batch (the requester's
// CQE reads TRANSPORT_RETRY_EXC_ERR).
//
// Bounded (issue 23 item 6): a fixed pool of kWorkers threads carries every
// node's batches, whatever the number of nodes, with at most kPerNode calls
// in flight to one node, so a node that stalls holds up only its own share.
// A batch whose responder QP is not connected yet (not_ready) waits aside
// and is tried again, backing off from 1 ms to 100 ms for about as long as
// a NIC retries (2 s), without holding a worker: nothing else to that node
// waits behind it. The engine sends one batch per QP at a time, so a QP's
// WQEs still execute there in order.
//
// Stop (and the destructor) fails every queued batch with Unavailable and
// joins the threads. Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mooncake/v1/peer.grpc.pb.h"
#include "peering/trusted_peers.h"
#include "softnic/remote_link.h"

namespace mooncake::daemon::peering {

class SoftnicPeerLink final : public softnic::RemoteLink {
 public:
  static constexpr int kMaxOpsPerCall = 256;
  static constexpr size_t kMaxBytesPerCall = 4u << 20;
  // What the peer server accepts in one call (kMaxBytesPerCall plus room).
  static constexpr int kMaxMessageBytes = 6 << 20;
  static constexpr int kWorkers = 4;
  static constexpr int kPerNode = 2;

  // `peers` must outlive the link.
  SoftnicPeerLink(std::string self_node, TrustedPeers* peers,
                  absl::Duration call_timeout = absl::Seconds(5));
  ~SoftnicPeerLink() override;
  void Stop();

  void Send(softnic::RemoteBatch batch, softnic::RemoteDone done) override;

  // Batches queued or waiting to retry (tests).
  size_t queued() const;

 private:
  struct Job {
    softnic::RemoteBatch batch;
    softnic::RemoteDone done;
    size_t next = 0;  // the first operation not executed yet
    std::vector<softnic::ResponderResult> results;
    absl::Time give_up = absl::InfiniteFuture();  // of not_ready retries
    absl::Duration backoff = absl::Milliseconds(1);
    absl::Time not_before = absl::InfinitePast();
  };
  void Work();
  // Runs `job` on from job.next: true when it is finished (done called),
  // false when its responder was not ready (job.next says where to resume).
  bool Step(Job& job);

  const std::string self_node_;
  TrustedPeers* const trusted_;
  const absl::Duration call_timeout_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> in_flight_ ABSL_GUARDED_BY(mu_);  // calls per node now
  uint64_t events_ ABSL_GUARDED_BY(mu_) = 0;  // jobs queued and calls ended (wakes workers)
  std::vector<std::thread> workers_;
};

}  // namespace mooncake::daemon::peering
