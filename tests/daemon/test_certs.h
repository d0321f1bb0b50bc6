// Test support: certificates made by openssl at test time, for the tests of
// TLS to etcd (etcd_client_test, cluster_test) and of the peer port's mTLS
// (peer_tls_test, the cluster tests, peer_forgery_test). Needs the openssl
// command line tool.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace mooncake::testing {

// The files MakeTestCa wrote.
struct TestCertificates {
  std::string ca_file;    // <dir>/<name>-ca.pem: the CA's certificate
  std::string cert_file;  // <dir>/<name>.pem: CN=<name>, signed by the CA
  std::string key_file;   // <dir>/<name>.key: its private key (unencrypted)
};

// Makes a CA (CN=<name>-ca) and a certificate signed by it for
// IP:127.0.0.1 and DNS:localhost, valid 2 days, in `dir`. The certificate
// has no extended key usage, so it serves as a server's and as a client's.
// Internal with the command line when openssl fails.
absl::StatusOr<TestCertificates> MakeTestCa(const std::string& dir, const std::string& name);

// Node certificates as an operator makes them, with the project's own
// deploy/make-cluster-certs.sh: <dir>/ca.pem (made on first use, then
// reused) and, per node, <dir>/<node_id>.pem with DNS:<node_id> and its
// key. Internal with the script's output when it fails.
absl::StatusOr<TestCertificates> MakeNodeCertificate(const std::string& dir,
                                                     const std::string& node_id);

// Revokes the nodes' certificates with deploy/make-cluster-certs.sh
// --revoke (the CA made by MakeNodeCertificate in `dir`): <dir>/crl.pem
// lists them afterwards and their files move to <dir>/revoked/. Returns the
// list's path; Internal with the script's output when it fails.
absl::StatusOr<std::string> RevokeNodeCertificate(const std::string& dir,
                                                  const std::string& node_id);

// The lines of mooncaked.conf that give a node those files.
std::string PeerTlsConfig(const TestCertificates& certs);

}  // namespace mooncake::testing
