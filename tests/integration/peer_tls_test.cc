// The peer port's transport security (issue 9 item 6), with certificates
// made by openssl for the test: with the three peer_tls_* files a caller
// needs a certificate of the cluster's CA (mutual TLS); plaintext, no
// certificate and another CA's certificate are all refused; without the
// files the port serves plaintext and says so; half the files stop the
// start; reflection is never served on the peer port.
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "etcd_test_server.h"
#include "gtest/gtest.h"
#include "mooncake/common/version.h"
#include "mooncake/v1/peer.grpc.pb.h"
#include "test_certs.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

using daemon::etcd::testing::PickFreePort;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A CA and a certificate for 127.0.0.1 signed by it, in `dir`/<name>*.
void MakeCa(const std::string& dir, const std::string& name) {
  const absl::StatusOr<TestCertificates> made = MakeTestCa(dir, name);
  ASSERT_TRUE(made.ok()) << made.status();
}

grpc::Status Hello(const std::string& addr, std::shared_ptr<grpc::ChannelCredentials> creds) {
  auto stub = v1::Peer::NewStub(grpc::CreateChannel(addr, creds));
  grpc::ClientContext ctx;
  Deadline(&ctx, 3000);
  v1::PeerHelloRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_node_id("other-node");
  v1::PeerHelloResponse resp;
  return stub->PeerHello(&ctx, req, &resp);
}

std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& dir, const std::string& ca,
                                              const std::string& who) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = Read(dir + "/" + ca + "-ca.pem");
  if (!who.empty()) {
    o.pem_private_key = Read(dir + "/" + who + ".key");
    o.pem_cert_chain = Read(dir + "/" + who + ".pem");
  }
  return grpc::SslCredentials(o);
}

TEST(PeerTls, MutualTlsAcceptsOnlyTheClustersCertificates) {
  TempDir dir;
  MakeCa(dir.path(), "cluster");
  MakeCa(dir.path(), "rogue");
  const std::string addr = absl::StrCat("127.0.0.1:", PickFreePort());
  std::ofstream(dir.path() + "/tls.conf")
      << "peer_tls_ca_file = " << dir.path()
      << "/cluster-ca.pem\npeer_tls_cert_file = " << dir.path()
      << "/cluster.pem\npeer_tls_key_file = " << dir.path() << "/cluster.key\n";
  DaemonProcess d(dir.path(), {"--config", dir.path() + "/tls.conf", "--peer-listen", addr});
  const v1::DaemonStatus st = GetStatus(d.socket());
  EXPECT_EQ(st.peer_security().rfind("mTLS", 0), 0u) << st.peer_security();

  // The cluster's certificate: accepted.
  grpc::Status s = Hello(addr, Tls(dir.path(), "cluster", "cluster"));
  EXPECT_TRUE(s.ok()) << s.error_message();
  // TLS without a client certificate, another CA's certificate, plaintext:
  // all refused.
  EXPECT_FALSE(Hello(addr, Tls(dir.path(), "cluster", "")).ok());
  grpc::SslCredentialsOptions rogue;
  rogue.pem_root_certs = Read(dir.path() + "/cluster-ca.pem");
  rogue.pem_private_key = Read(dir.path() + "/rogue.key");
  rogue.pem_cert_chain = Read(dir.path() + "/rogue.pem");
  EXPECT_FALSE(Hello(addr, grpc::SslCredentials(rogue)).ok());
  EXPECT_FALSE(Hello(addr, grpc::InsecureChannelCredentials()).ok());
  EXPECT_TRUE(d.running()) << "a refused handshake must not hurt the daemon";
}

TEST(PeerTls, WithoutFilesThePortIsPlaintextAndSaysSo) {
  TempDir dir;
  const std::string addr = absl::StrCat("127.0.0.1:", PickFreePort());
  DaemonProcess d(dir.path(), {"--peer-listen", addr});
  const v1::DaemonStatus st = GetStatus(d.socket());
  EXPECT_EQ(st.peer_security().rfind("plaintext", 0), 0u) << st.peer_security();
  grpc::Status s = Hello(addr, grpc::InsecureChannelCredentials());
  EXPECT_TRUE(s.ok()) << s.error_message();
  // No reflection on the peer port (the local socket has it; peers must not
  // be able to enumerate the daemon's services).
  s = RawUnaryCall(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()),
                   "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
}

TEST(PeerTls, HalfTheFilesStopTheStartNamingWhatIsMissing) {
  TempDir dir;
  MakeCa(dir.path(), "cluster");
  std::ofstream(dir.path() + "/half.conf")
      << "peer_tls_ca_file = " << dir.path() << "/cluster-ca.pem\n";
  const std::string cmd =
      absl::StrCat(BinDir(), "/mooncaked --socket ", dir.path(), "/x.sock --config ", dir.path(),
                   "/half.conf --peer-listen 127.0.0.1:", PickFreePort(), " 2>&1");
  Child c = Child::Spawn({"/bin/sh", "-c", cmd});
  EXPECT_NE(c.Wait(20000), 0) << c.output();
  EXPECT_NE(c.output().find("peer_tls_cert_file"), std::string::npos) << c.output();
  EXPECT_NE(c.output().find("peer_tls_key_file"), std::string::npos) << c.output();
}

}  // namespace
}  // namespace mooncake::testing
