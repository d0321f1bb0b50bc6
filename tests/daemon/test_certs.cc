#include "test_certs.h"

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mooncake::testing {

absl::StatusOr<TestCertificates> MakeTestCa(const std::string& dir, const std::string& name) {
  const std::string cmd =
      absl::StrCat("cd ", dir, " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ", name,
                   "-ca.key -out ", name, "-ca.pem -days 2 -subj /CN=", name,
                   "-ca >/dev/null 2>&1 && openssl req -newkey rsa:2048 -nodes -keyout ", name,
                   ".key -out ", name, ".csr -subj /CN=", name,
                   " >/dev/null 2>&1 && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ",
                   name, ".ext && openssl x509 -req -in ", name, ".csr -CA ", name,
                   "-ca.pem -CAkey ", name, "-ca.key -CAcreateserial -out ", name,
                   ".pem -days 2 -extfile ", name, ".ext >/dev/null 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("openssl failed (is the openssl tool installed?): ", cmd));
  }
  return TestCertificates{absl::StrCat(dir, "/", name, "-ca.pem"),
                          absl::StrCat(dir, "/", name, ".pem"),
                          absl::StrCat(dir, "/", name, ".key")};
}

namespace {

absl::Status RunCertScript(const std::string& args) {
  const std::string cmd =
      absl::StrCat(MOONCAKE_DEPLOY_DIR, "/make-cluster-certs.sh --days 2 ", args, " 2>&1");
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return absl::InternalError(absl::StrCat("cannot run ", cmd));
  std::string output;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) output.append(buf, n);
  if (::pclose(p) != 0) {
    return absl::InternalError(absl::StrCat(cmd, " failed: ", output));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TestCertificates> MakeNodeCertificate(const std::string& dir,
                                                     const std::string& node_id) {
  if (absl::Status s = RunCertScript(absl::StrCat("--out ", dir, " ", node_id)); !s.ok()) return s;
  return TestCertificates{absl::StrCat(dir, "/ca.pem"), absl::StrCat(dir, "/", node_id, ".pem"),
                          absl::StrCat(dir, "/", node_id, ".key")};
}

absl::StatusOr<std::string> RevokeNodeCertificate(const std::string& dir,
                                                  const std::string& node_id) {
  if (absl::Status s = RunCertScript(absl::StrCat("--out ", dir, " --revoke ", node_id)); !s.ok()) {
    return s;
  }
  return absl::StrCat(dir, "/crl.pem");
}

std::string PeerTlsConfig(const TestCertificates& certs) {
  return absl::StrCat("peer_tls_ca_file = ", certs.ca_file,
                      "\npeer_tls_cert_file = ", certs.cert_file,
                      "\npeer_tls_key_file = ", certs.key_file, "\n");
}

}  // namespace mooncake::testing
