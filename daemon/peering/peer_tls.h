// Transport security of the Peer service between daemons (issue 9 item 6,
// issue 23 item 1). Three modes:
//
//   kMutualTls   peer_tls_ca_file, peer_tls_cert_file and peer_tls_key_file
//                set: the port speaks TLS only and requires every caller to
//                present a certificate signed by that CA; plaintext callers
//                fail the handshake. A caller is the node its certificate
//                names (peer_identity.h). The daemon dials other nodes with
//                the same certificate and accepts only a server whose
//                certificate names the node it meant to reach. With
//                peer_tls_crl_file, certificates the CA revoked are refused
//                both ways (peer_revocation.h).
//   kInsecure    peer_insecure = true (with or without the files): plaintext,
//                every method served, requester names taken on trust. For
//                isolated test networks only; logged loudly at start.
//   kTlsRequired neither: the port serves plaintext but answers only
//                PeerHello (version and "TLS required"). Cluster membership
//                works; queue pairs to other nodes are refused, naming the
//                keys to set.
//
// The mode shows in mcctl status and in the NodeRecord (peer_insecure for
// both plaintext modes).
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "peering/peer_revocation.h"

namespace mooncake::daemon::peering {

struct PeerTlsFiles {
  std::string ca_file;    // PEM: the cluster's CA
  std::string cert_file;  // PEM: this node's certificate (server and client)
  std::string key_file;   // PEM: its private key
  std::string crl_file;   // PEM CRL of the CA (optional; peer_revocation.h)
  bool insecure = false;  // peer_insecure: plaintext even with the files
};

enum class PeerMode { kMutualTls, kInsecure, kTlsRequired };

// What to tell a user who wants cross-node traffic without TLS.
inline constexpr char kTlsKeysHint[] =
    "set peer_tls_ca_file, peer_tls_cert_file and peer_tls_key_file in mooncaked.conf "
    "(deploy/make-cluster-certs.sh makes them), or peer_insecure = true on an isolated network";

struct PeerSecurity {
  bool tls = false;
  PeerMode mode = PeerMode::kTlsRequired;
  std::string description;  // for mcctl status: "mTLS (CA ...)" or "plaintext (...)"
};

// What the files and the flag amount to. InvalidArgument when only some of
// the three files are given (naming the missing ones).
absl::StatusOr<PeerSecurity> DescribePeerSecurity(const PeerTlsFiles& files);

// Server credentials for the peer port: mTLS (client certificate required
// and verified against the CA) or insecure, per DescribePeerSecurity. A file
// that cannot be read is an error naming it (the daemon does not start).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PeerServerCredentials(
    const PeerTlsFiles& files);

// The revocation list of peer_tls_crl_file, checked against the CA; null
// when no list is configured (or without TLS). An unreadable or foreign
// list is an error naming it (the daemon does not start).
absl::StatusOr<std::shared_ptr<PeerRevocations>> LoadPeerRevocations(const PeerTlsFiles& files);

// Credentials to dial another node's peer port with (same files). Under
// mTLS the handshake accepts a server only when its certificate, signed by
// the CA, names the node dialled (the channel's target name) and is not on
// `revocations` (may be null).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PeerChannelCredentials(
    const PeerTlsFiles& files, std::shared_ptr<PeerRevocations> revocations);

}  // namespace mooncake::daemon::peering
