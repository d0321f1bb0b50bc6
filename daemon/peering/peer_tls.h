// Transport security of the Peer service between daemons (issue 9 item 6).
//
// With peer_tls_ca_file, peer_tls_cert_file and peer_tls_key_file set, the
// peer port speaks TLS only and requires every caller to present a
// certificate signed by that CA (mutual TLS); plaintext callers fail the
// handshake. The daemon dials other nodes with the same certificate. Set
// peer_insecure = true to serve plaintext anyway (an explicit choice, logged).
// Without the files the port serves plaintext and the daemon says so once
// at start, in mcctl status, and in its NodeRecord (peer_insecure).
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace mooncake::daemon::peering {

struct PeerTlsFiles {
  std::string ca_file;    // PEM: the cluster's CA
  std::string cert_file;  // PEM: this node's certificate (server and client)
  std::string key_file;   // PEM: its private key
  bool insecure = false;  // peer_insecure: plaintext even with the files
};

struct PeerSecurity {
  bool tls = false;
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

// Credentials to dial another node's peer port with (same files).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PeerChannelCredentials(
    const PeerTlsFiles& files);

}  // namespace mooncake::daemon::peering
