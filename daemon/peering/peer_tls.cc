#include "peering/peer_tls.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"

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

// The check of a server this daemon dials, in the TLS handshake after gRPC
// verified the chain against the CA: the certificate names the node meant
// (the target name, which PeerChannel sets to the node id: the check gRPC's
// default verifier made by host name) and is not revoked. A refusal fails
// the handshake, so nothing is sent to such a server.
class NodeServerVerifier final : public grpc::experimental::ExternalCertificateVerifier {
 public:
  explicit NodeServerVerifier(std::shared_ptr<PeerRevocations> revocations)
      : revocations_(std::move(revocations)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)> /*callback*/, grpc::Status* sync_status) override {
    const std::string target(request->target_name().data(), request->target_name().size());
    bool named = false;
    for (const grpc::string_ref& name : request->dns_names()) {
      if (target == std::string(name.data(), name.size())) named = true;
    }
    if (!named) {
      *sync_status = grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                  absl::StrCat("the server's certificate does not name node ",
                                               EscapeForDisplay(target, 64)));
      return true;
    }
    if (revocations_) {
      const absl::Status s = revocations_->Check(
          absl::string_view(request->peer_cert().data(), request->peer_cert().size()));
      if (!s.ok()) {
        MC_LOG(kWarning, "peer: refused node ", EscapeForDisplay(target, 64),
               " as a server: ", s.message());
        *sync_status =
            grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                         absl::StrCat("node ", EscapeForDisplay(target, 64), ": ", s.message()));
        return true;
      }
    }
    *sync_status = grpc::Status::OK;
    return true;
  }
  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  const std::shared_ptr<PeerRevocations> revocations_;
};

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
  if (!f.crl_file.empty() && (!AnyFile(f) || f.insecure)) {
    return absl::InvalidArgumentError(
        "peer_tls_crl_file revokes certificates of the peer port's mTLS: it needs "
        "peer_tls_ca_file, peer_tls_cert_file and peer_tls_key_file, and no peer_insecure");
  }
  if (AnyFile(f) && !f.insecure) {
    return PeerSecurity{
        true, PeerMode::kMutualTls,
        absl::StrCat("mTLS (peers need a certificate of ", f.ca_file, " naming their node id",
                     f.crl_file.empty() ? "" : absl::StrCat(", not revoked by ", f.crl_file), ")")};
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

absl::StatusOr<std::shared_ptr<PeerRevocations>> LoadPeerRevocations(const PeerTlsFiles& f) {
  absl::StatusOr<PeerSecurity> sec = DescribePeerSecurity(f);
  if (!sec.ok()) return sec.status();
  if (!sec->tls || f.crl_file.empty()) return std::shared_ptr<PeerRevocations>();
  absl::StatusOr<std::string> ca = ReadPem(f.ca_file, "peer_tls_ca_file");
  if (!ca.ok()) return ca.status();
  return PeerRevocations::Load(f.crl_file, *ca);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PeerChannelCredentials(
    const PeerTlsFiles& f, std::shared_ptr<PeerRevocations> revocations) {
  absl::StatusOr<PeerSecurity> sec = DescribePeerSecurity(f);
  if (!sec.ok()) return sec.status();
  if (!sec->tls) return grpc::InsecureChannelCredentials();
  absl::StatusOr<Pems> pems = ReadPems(f);
  if (!pems.ok()) return pems.status();
  namespace gx = grpc::experimental;
  gx::TlsChannelCredentialsOptions o;
  o.set_certificate_provider(std::make_shared<gx::StaticDataCertificateProvider>(
      pems->ca, std::vector<gx::IdentityKeyCertPair>{{pems->key, pems->cert}}));
  o.watch_root_certs();
  o.watch_identity_key_cert_pairs();
  o.set_verify_server_certs(true);  // the chain, against the CA
  o.set_certificate_verifier(
      gx::ExternalCertificateVerifier::Create<NodeServerVerifier>(std::move(revocations)));
  // NodeServerVerifier checked the node name at the handshake; the calls'
  // authority is that same name.
  o.set_check_call_host(false);
  return gx::TlsCredentials(o);
}

}  // namespace mooncake::daemon::peering
