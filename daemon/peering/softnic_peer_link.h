// SoftnicPeerLink: softnic's RemoteLink over the peer port (issue 9 item 5).
// A batch for node N goes to N's daemon as Peer.SoftnicExecute calls (at
// most kMaxOpsPerCall operations and kMaxBytesPerCall payload bytes each),
// in order, from one thread per destination node, so batches for one node
// execute there in the order they were sent. Batches go only to a node
// TrustedPeers verified (its certificate names it, its instance id is the
// one in its record), each carrying its connection's secret; a node that
// is not verified, or does not answer within the call deadline, fails the
// batch (the requester's CQE reads TRANSPORT_RETRY_EXC_ERR). Destinations
// are nodes a queue pair was connected to, which RdmaResources allowed
// only after TrustedPeers verified them: their count is bounded by the
// cluster's.
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

  // `peers` must outlive the link.
  SoftnicPeerLink(std::string self_node, TrustedPeers* peers,
                  absl::Duration call_timeout = absl::Seconds(5));
  ~SoftnicPeerLink() override;
  void Stop();

  void Send(softnic::RemoteBatch batch, softnic::RemoteDone done) override;

 private:
  struct Job {
    softnic::RemoteBatch batch;
    softnic::RemoteDone done;
  };
  struct Peer {
    std::deque<Job> queue;
    std::thread thread;
  };
  void Serve(const std::string& node, Peer* peer);
  absl::StatusOr<std::vector<softnic::ResponderResult>> Execute(const softnic::RemoteBatch& batch);

  const std::string self_node_;
  TrustedPeers* const trusted_;
  const absl::Duration call_timeout_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mooncake::daemon::peering
