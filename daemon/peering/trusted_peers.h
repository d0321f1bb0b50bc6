// TrustedPeers: the other nodes this daemon talks to, each proven to be the
// node it claims before anything but PeerHello is sent to it (issue 23
// item 1).
//
// A node is trusted once its daemon, dialled at the peer_address of its
// etcd record, answered PeerHello with that record's node id and instance
// id, over a TLS connection whose server certificate names the node id
// (peer_identity.h). The record is only where to look: an etcd record that
// points node A at another host fails the handshake, and a record that
// survives its daemon's restart (a new instance id) is verified again. The
// verified channel is kept per node until the node's record changes or a
// new revocation list is taken (peer_revocation.h).
//
// Bounded: entries exist only for nodes the cluster view lists (at most
// kMaxPeers; entries of vanished nodes are dropped first), and a node that
// failed verification is not dialled again for kRetryAfter.
//
// Thread-safe; Get may block for one PeerHello (hello_timeout).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mooncake/v1/peer.grpc.pb.h"
#include "peering/peer_revocation.h"
#include "peering/peer_tls.h"

namespace mooncake::daemon::peering {

struct TrustedPeersOptions {
  PeerMode mode = PeerMode::kTlsRequired;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string self_node;
  int max_message_bytes = 0;  // of the channels (0: gRPC's defaults)
  // peer_tls_crl_file's list (null: none). A node verified under an older
  // list is verified again, on a new channel, before its next use.
  std::shared_ptr<PeerRevocations> revocations;
  absl::Duration hello_timeout = absl::Seconds(3);
};

class TrustedPeers {
 public:
  static constexpr size_t kMaxPeers = 1024;
  static constexpr absl::Duration kRetryAfter = absl::Seconds(1);

  // `record_of`: a node's record in the cluster view now (nullopt: not a
  // live node).
  TrustedPeers(TrustedPeersOptions options,
               std::function<std::optional<v1::NodeRecord>(const std::string&)> record_of);

  // A stub to `node` once it is verified. FailedPrecondition: this node has
  // no peer TLS (kTlsRequired, naming the keys), `node` is this node, its
  // record says plaintext while this node requires mTLS, its address is
  // not host:port, or its answer did not prove its identity; NotFound: no
  // live node of that id; Unavailable: it did not answer.
  absl::StatusOr<std::shared_ptr<v1::Peer::Stub>> Get(const std::string& node);

  PeerMode mode() const { return options_.mode; }
  const std::string& self_node() const { return options_.self_node; }

 private:
  struct Entry {
    std::string instance_id;
    std::string address;
    uint64_t revocations = 0;              // the list's generation it was verified under
    std::shared_ptr<v1::Peer::Stub> stub;  // null: verification failed at `failed_at`
    absl::Status failure;
    absl::Time failed_at;
  };
  absl::StatusOr<std::shared_ptr<v1::Peer::Stub>> Verify(const v1::NodeRecord& record);
  void EvictVanishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t RevocationsNow() const;

  const TrustedPeersOptions options_;
  const std::function<std::optional<v1::NodeRecord>(const std::string&)> record_of_;
  absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mooncake::daemon::peering
