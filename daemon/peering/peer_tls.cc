#include "peering/peer_tls.h"

#include <grpcpp/security/server_credentials.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mooncake::daemon::peering {

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " = ", path,
                     ": cannot be read (deploy/make-cluster-certs.sh makes the cluster's files)"));
  }
  std::stringstream s;
  s << in.rdbuf();
  std::string pem = s.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(key, " = ", path, ": not a PEM file"));
  }
  return pem;
}

struct Pems {
  std::string ca, cert, key;
};

absl::StatusOr<Pems> ReadPems(const PeerTlsFiles& f) {
  absl::StatusOr<std::string> ca = ReadPem(f.ca_file, "peer_tls_ca_file");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert = ReadPem(f.cert_file, "peer_tls_cert_file");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(f.key_file, "peer_tls_key_file");
  if (!key.ok()) return key.status();
  return Pems{*std::move(ca), *std::move(cert), *std::move(key)};
}

bool AnyFile(const PeerTlsFiles& f) {
  return !f.ca_file.empty() || !f.cert_file.empty() || !f.key_file.empty();
}

}  // namespace

absl::StatusOr<PeerSecurity> DescribePeerSecurity(const PeerTlsFiles& f) {
  if (AnyFile(f)) {
    std::vector<std::string> missing;
    if (f.ca_file.empty()) missing.push_back("peer_tls_ca_file");
    if (f.cert_file.empty()) missing.push_back("peer_tls_cert_file");
    if (f.key_file.empty()) missing.push_back("peer_tls_key_file");
    if (!missing.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer TLS needs all three files; missing: ", absl::StrJoin(missing, ", ")));
    }
  }
  if (AnyFile(f) && !f.insecure) {
    return PeerSecurity{
        true, PeerMode::kMutualTls,
        absl::StrCat("mTLS (peers need a certificate of ", f.ca_file, " naming their node id)")};
  }
  if (f.insecure) {
    return PeerSecurity{false, PeerMode::kInsecure,
                        "plaintext, INSECURE (peer_insecure = true: any host that reaches the port "
                        "can read and write memory of this node's RDMA regions)"};
  }
  return PeerSecurity{false, PeerMode::kTlsRequired,
                      "plaintext, PeerHello only (no peer_tls_* files: TLS required for queue "
                      "pairs to other nodes)"};
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PeerServerCredentials(
    const PeerTlsFiles& f) {
  absl::StatusOr<PeerSecurity> sec = DescribePeerSecurity(f);
  if (!sec.ok()) return sec.status();
  if (!sec->tls) return grpc::InsecureServerCredentials();
  absl::StatusOr<Pems> pems = ReadPems(f);
  if (!pems.ok()) return pems.status();
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = pems->ca;
  o.pem_key_cert_pairs.push_back({pems->key, pems->cert});
  return grpc::SslServerCredentials(o);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PeerChannelCredentials(
    const PeerTlsFiles& f) {
  absl::StatusOr<PeerSecurity> sec = DescribePeerSecurity(f);
  if (!sec.ok()) return sec.status();
  if (!sec->tls) return grpc::InsecureChannelCredentials();
  absl::StatusOr<Pems> pems = ReadPems(f);
  if (!pems.ok()) return pems.status();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = pems->ca;
  o.pem_private_key = pems->key;
  o.pem_cert_chain = pems->cert;
  return grpc::SslCredentials(o);
}

}  // namespace mooncake::daemon::peering
