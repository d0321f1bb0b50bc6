#include "peering/trusted_peers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"
#include "mooncake/common/version.h"
#include "peering/peer_identity.h"

namespace mooncake::daemon::peering {

TrustedPeers::TrustedPeers(
    TrustedPeersOptions options,
    std::function<std::optional<v1::NodeRecord>(const std::string&)> record_of)
    : options_(std::move(options)), record_of_(std::move(record_of)) {}

absl::StatusOr<std::shared_ptr<v1::Peer::Stub>> TrustedPeers::Get(const std::string& node) {
  if (options_.mode == PeerMode::kTlsRequired) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this node's peer port has no TLS, and traffic to other nodes needs it: ", kTlsKeysHint));
  }
  if (node == options_.self_node) {
    return absl::FailedPreconditionError(absl::StrCat("node ", node, " is this node"));
  }
  const std::optional<v1::NodeRecord> record = record_of_(node);
  if (!record) {
    return absl::NotFoundError(
        absl::StrCat("node ", EscapeForDisplay(node, 64), " is not a live node of the cluster"));
  }
  const uint64_t revocations = RevocationsNow();
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(node);
    if (it != entries_.end() && it->second.instance_id == record->instance_id() &&
        it->second.address == record->peer_address() && it->second.revocations == revocations) {
      if (it->second.stub) return it->second.stub;
      if (absl::Now() - it->second.failed_at < kRetryAfter) return it->second.failure;
    }
  }
  absl::StatusOr<std::shared_ptr<v1::Peer::Stub>> verified = Verify(*record);
  absl::MutexLock lock(&mu_);
  if (entries_.size() >= kMaxPeers && !entries_.contains(node)) EvictVanishedLocked();
  if (entries_.size() >= kMaxPeers && !entries_.contains(node)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("more than ", kMaxPeers, " nodes in the cluster view"));
  }
  Entry& e = entries_[node];
  e.instance_id = record->instance_id();
  e.address = record->peer_address();
  e.revocations = revocations;
  if (verified.ok()) {
    e.stub = *verified;
    e.failure = absl::OkStatus();
  } else {
    e.stub.reset();
    e.failure = verified.status();
    e.failed_at = absl::Now();
  }
  return verified;
}

absl::StatusOr<std::shared_ptr<v1::Peer::Stub>> TrustedPeers::Verify(const v1::NodeRecord& record) {
  const std::string& node = record.node_id();
  if (record.peer_address().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node, " has no peer address (peer_listen is not set there)"));
  }
  if (absl::Status s = ValidatePeerAddress(record.peer_address()); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("node ", node, ": ", s.message()));
  }
  if (options_.mode == PeerMode::kMutualTls && record.peer_insecure()) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node,
                     " serves plaintext on its peer port and this node requires mTLS: give it "
                     "peer_tls_* files of this cluster's CA"));
  }
  std::shared_ptr<grpc::Channel> channel = PeerChannel(
      options_.mode, options_.credentials, node, record.peer_address(), options_.max_message_bytes);
  auto stub = std::shared_ptr<v1::Peer::Stub>(v1::Peer::NewStub(channel));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.hello_timeout));
  v1::PeerHelloRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_node_id(options_.self_node);
  v1::PeerHelloResponse resp;
  const grpc::Status s = stub->PeerHello(&ctx, req, &resp);
  if (!s.ok()) {
    const absl::StatusCode code = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                                          s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                                      ? absl::StatusCode::kUnavailable
                                      : absl::StatusCode::kFailedPrecondition;
    MC_LOG(kWarning, "peer: node ", node, " at ", record.peer_address(),
           " did not prove its identity: ", s.error_message());
    return absl::Status(
        code, absl::StrCat("node ", node, " at ", record.peer_address(), ": ", s.error_message()));
  }
  auto refuse = [&](const std::string& why) {
    MC_LOG(kWarning, "peer: node ", node, " at ", record.peer_address(), " is not trusted: ", why);
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node, " at ", record.peer_address(), ": ", why));
  };
  if (!resp.refusal().empty()) return refuse(EscapeForDisplay(resp.refusal(), 256));
  if (absl::Status id = CheckServerIdentity(options_.mode, ctx, node, options_.revocations.get());
      !id.ok()) {
    return refuse(std::string(id.message()));
  }
  if (resp.node_id() != node || resp.instance_id() != record.instance_id()) {
    return refuse(absl::StrCat("it answers as node '", EscapeForDisplay(resp.node_id(), 64),
                               "' instance '", EscapeForDisplay(resp.instance_id(), 64),
                               "', its etcd record says instance '",
                               EscapeForDisplay(record.instance_id(), 64), "'"));
  }
  MC_LOG(kInfo, "peer: node ", node, " at ", record.peer_address(), " verified (",
         options_.mode == PeerMode::kMutualTls ? "mTLS" : "plaintext, peer_insecure", ")");
  return stub;
}

uint64_t TrustedPeers::RevocationsNow() const {
  return options_.revocations ? options_.revocations->generation() : 0;
}

void TrustedPeers::EvictVanishedLocked() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (!record_of_(it->first)) {
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace mooncake::daemon::peering
