// NodeRegistry: this daemon's node in the cluster's membership in etcd
// (issue 9 item 2), and its view of the other nodes.
//
// It registers <prefix>/nodes/<node_id> (a NodeRecord as JSON) under a lease
// of `lease_ttl` that a LeaseKeeper keeps alive, and watches <prefix>/nodes/
// so that Nodes() lists every live node, this one included, without asking
// etcd. A node whose daemon dies or is cut off from etcd loses its lease:
// its key vanishes after the TTL and the watch reports it (OnNodeEvent).
//
// Start. Unavailable when etcd cannot be reached (the daemon does not start;
// the message names the endpoints). A node id registered by another live
// daemon is waited out for one lease TTL (a restarted daemon's old lease
// may still run), then AlreadyExists naming the holder: two daemons must
// not share a node id.
//
// etcd lost later. The lease keeper reports the lease lost and lease_id()
// reads 0 (nothing is written under a lease that may have expired); a
// background thread, once etcd answers, keeps the old lease when etcd still
// has it (a restarted etcd restores and renews its leases, so the node's
// keys never went), else grants a new lease and registers again (the group
// directory then publishes its ranks again under it), backing off up to
// 2 s (a quarter of the TTL when that is less), until it succeeds or Stop. state() says what is
// going on, for mcctl status. Nodes() keeps the last view meanwhile (the watch reconnects by
// itself); local work never waits on etcd.
//
// Its own record is watched too: rewritten or deleted by anyone else while
// its lease lives (etcd is input, not authority), it is put back at once
// and the change logged (rate limited); the view keeps this node's own.
//
// Stop (the daemon's SIGTERM): revokes the lease, so the node's keys vanish
// at once instead of after the TTL. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "admission/rate_limited_log.h"
#include "etcd/etcd_client.h"
#include "etcd/etcd_lease.h"
#include "etcd/etcd_watch.h"
#include "mooncake/v1/peer.pb.h"

namespace mooncake::daemon::peering {

struct NodeRegistryOptions {
  std::string prefix = "/mooncake";  // no trailing '/'
  absl::Duration lease_ttl = absl::Seconds(5);
};

struct NodeEvent {
  enum class Kind { kJoined, kLost };
  Kind kind = Kind::kJoined;
  std::string node_id;
  std::string instance_id;
};

// The key of `node_id`'s record, and the prefix of all of them.
std::string NodeKey(const std::string& prefix, const std::string& node_id);
std::string NodesPrefix(const std::string& prefix);
// A node id usable in a key: 1..64 of [A-Za-z0-9._-]. InvalidArgument else.
absl::Status ValidateNodeId(const std::string& node_id);

class NodeRegistry {
 public:
  // `etcd` is not owned and must outlive the registry.
  static absl::StatusOr<std::unique_ptr<NodeRegistry>> Start(etcd::EtcdClient* etcd,
                                                             NodeRegistryOptions options,
                                                             v1::NodeRecord self);
  ~NodeRegistry();  // Stop()
  NodeRegistry(const NodeRegistry&) = delete;
  NodeRegistry& operator=(const NodeRegistry&) = delete;

  // Revokes the lease (the node leaves at once) and stops every thread.
  // Idempotent.
  void Stop();

  // Live nodes as the watch sees them, sorted by node id.
  std::vector<v1::NodeRecord> Nodes() const;
  // One live node's record, as the watch sees it (nullopt: not live).
  std::optional<v1::NodeRecord> Node(const std::string& node_id) const;
  // "registered", or what is wrong and what it is doing about it.
  std::string state() const;
  const v1::NodeRecord& self() const { return self_; }
  // The lease to write this node's keys under; 0 while it is lost (or
  // unknown: etcd out of reach for longer than the TTL).
  int64_t lease_id() const;

  // Called (on the watch's thread) for every node that appears or vanishes
  // after Start, this one excepted. Set before events matter; the callback
  // must not call back into the registry's Stop.
  void OnNodeEvent(std::function<void(const NodeEvent&)> callback);

 private:
  NodeRegistry(etcd::EtcdClient* etcd, NodeRegistryOptions options, v1::NodeRecord self);
  // Grants a lease and creates the node's key under it. `wait_out`: how
  // long a key held by another instance is waited for before AlreadyExists.
  absl::Status Register(absl::Duration wait_out);
  absl::Status StartWatch();
  void ApplyEvents(const std::vector<etcd::WatchEvent>& events);
  void Reregister();  // the background thread
  // After a loss: when etcd still has the old lease alive and the node's
  // key under it, keeps refreshing it and returns true; false when etcd
  // says the lease (or the key under it) is gone; an error when etcd did
  // not answer.
  absl::StatusOr<bool> ResumeLease();
  // Refreshes `lease` from now on (replacing the keeper) and writes under it.
  void KeepLease(const etcd::Lease& lease);

  etcd::EtcdClient* const etcd_;
  const NodeRegistryOptions options_;
  const v1::NodeRecord self_;
  const std::string key_;

  mutable absl::Mutex mu_;
  absl::btree_map<std::string, v1::NodeRecord> nodes_ ABSL_GUARDED_BY(mu_);
  std::string state_ ABSL_GUARDED_BY(mu_);
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  bool lease_lost_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(const NodeEvent&)> on_event_ ABSL_GUARDED_BY(mu_);
  RateLimitedLog tamper_log_;     // this node's record rewritten or deleted by others
  RateLimitedLog malformed_log_;  // junk under the prefix: one line per period

  std::unique_ptr<etcd::LeaseKeeper> keeper_;  // replaced only by the re-register thread
  std::unique_ptr<etcd::Watcher> watcher_;
  std::thread reregister_;
};

}  // namespace mooncake::daemon::peering
