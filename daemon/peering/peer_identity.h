// Who is calling on the peer port, and who answers when this daemon calls
// another node (issue 23 item 1).
//
// A node's identity is its node id, carried in its certificate as a DNS
// subjectAltName equal to the id (deploy/make-cluster-certs.sh). The
// server takes a requester's node id from the request only when the
// caller's verified certificate lists it among its DNS names; a
// certificate of node C therefore cannot act as node A. The caller dials
// with the node id as the TLS target name, so the handshake refuses a
// server whose certificate does not name the node meant (an etcd record
// that points node A at another host cannot pass; peer_tls.cc), and
// CheckServerIdentity repeats the check on the answer of PeerHello. A
// certificate on peer_tls_crl_file's list is refused in both directions
// (peer_revocation.h).
//
// The CA must be the cluster's own: every certificate it signs for a name
// acts as the node of that name.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "peering/peer_revocation.h"
#include "peering/peer_tls.h"

namespace mooncake::daemon::peering {

// The DNS subjectAltNames of the peer's verified certificate (empty over
// plaintext).
std::vector<std::string> CertificateNodeNames(const grpc::AuthContext& auth);

// The node a peer call comes from, given the node id the request names.
//   kMutualTls: `claimed` when the certificate names it and is not on
//               `revocations` (may be null); PermissionDenied naming why
//               otherwise. Checked on every call, so a list that changes
//               reaches connections already open.
//   kInsecure: `claimed`, on trust.
//   kTlsRequired: PermissionDenied ("TLS required", with the keys to set).
absl::StatusOr<std::string> AuthenticatePeer(PeerMode mode, const grpc::ServerContext& ctx,
                                             const std::string& claimed,
                                             PeerRevocations* revocations);

// After a call to node `node_id` under kMutualTls: FailedPrecondition
// unless the server's certificate named it and is not on `revocations`
// (may be null). OK in the plaintext modes.
absl::Status CheckServerIdentity(PeerMode mode, const grpc::ClientContext& ctx,
                                 const std::string& node_id, PeerRevocations* revocations);

// A channel to node `node_id` at `address` (host:port, ValidatePeerAddress):
// under kMutualTls its TLS target name is the node id. `max_message_bytes`
// bounds both directions (0: gRPC's defaults).
std::shared_ptr<grpc::Channel> PeerChannel(PeerMode mode,
                                           std::shared_ptr<grpc::ChannelCredentials> credentials,
                                           const std::string& node_id, const std::string& address,
                                           int max_message_bytes);

// A peer address as a NodeRecord may carry it: host:port only, where host
// is a DNS name, an IPv4 address or a bracketed IPv6 address and port is
// 1..65535. Schemes (unix:, dns:, ipv4: ...) are refused: an etcd record
// must not point a daemon at a local socket. InvalidArgument naming why.
absl::Status ValidatePeerAddress(const std::string& address);

}  // namespace mooncake::daemon::peering
