// The peer port's transport security (issue 9 item 6, issue 23 item 1),
// with certificates made by deploy/make-cluster-certs.sh: with the three
// peer_tls_* files a caller needs a certificate of the cluster's CA (mutual
// TLS); plaintext, no certificate and another CA's certificate are all
// refused; without the files the port serves plaintext PeerHello only and
// says so; peer_insecure = true serves plaintext to anyone, loudly; half
// the files stop the start; reflection is never served on the peer port.
// With peer_tls_crl_file, a node the CA revoked is refused on every call,
// on its open connection too, within a second of the new list and with no
// restart; a list of another CA stops the start.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "etcd_test_server.h"
#include "gtest/gtest.h"
#include "mooncake/common/version.h"
#include "mooncake/v1/peer.grpc.pb.h"
#include "peer_client.h"
#include "test_certs.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

using daemon::etcd::testing::PickFreePort;

// A CA and a certificate for 127.0.0.1 signed by it, in `dir`/<name>*.
void MakeCa(const std::string& dir, const std::string& name) {
  const absl::StatusOr<TestCertificates> made = MakeTestCa(dir, name);
  ASSERT_TRUE(made.ok()) << made.status();
}

grpc::Status Hello(const std::string& addr, std::shared_ptr<grpc::ChannelCredentials> creds,
                   v1::PeerHelloResponse* resp = nullptr) {
  auto stub = v1::Peer::NewStub(PeerChannelTo(addr, creds, "testnode"));
  grpc::ClientContext ctx;
  Deadline(&ctx, 3000);
  v1::PeerHelloRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_node_id("other-node");
  v1::PeerHelloResponse local;
  return stub->PeerHello(&ctx, req, resp != nullptr ? resp : &local);
}

TEST(PeerTls, MutualTlsAcceptsOnlyTheClustersCertificates) {
  TempDir dir;
  const std::string cluster = dir.path() + "/cluster";
  const std::string rogue = dir.path() + "/rogue";
  const absl::StatusOr<TestCertificates> server = MakeNodeCertificate(cluster, "testnode");
  const absl::StatusOr<TestCertificates> other = MakeNodeCertificate(cluster, "other-node");
  // Same node name, another CA.
  const absl::StatusOr<TestCertificates> forged = MakeNodeCertificate(rogue, "other-node");
  ASSERT_TRUE(server.ok() && other.ok() && forged.ok());
  const std::string addr = absl::StrCat("127.0.0.1:", PickFreePort());
  std::ofstream(dir.path() + "/tls.conf") << PeerTlsConfig(*server);
  DaemonProcess d(dir.path(), {"--config", dir.path() + "/tls.conf", "--peer-listen", addr});
  const v1::DaemonStatus st = GetStatus(d.socket());
  EXPECT_EQ(st.peer_security().rfind("mTLS", 0), 0u) << st.peer_security();

  // The cluster's certificate: accepted.
  grpc::Status s = Hello(addr, TlsAs(server->ca_file, *other));
  EXPECT_TRUE(s.ok()) << s.error_message();
  // TLS without a client certificate, another CA's certificate, plaintext:
  // all refused.
  EXPECT_FALSE(Hello(addr, TlsAs(server->ca_file, TestCertificates{})).ok());
  EXPECT_FALSE(Hello(addr, TlsAs(server->ca_file, *forged)).ok());
  EXPECT_FALSE(Hello(addr, grpc::InsecureChannelCredentials()).ok());
  EXPECT_TRUE(d.running()) << "a refused handshake must not hurt the daemon";
}

TEST(PeerTls, WithoutFilesThePortServesOnlyHelloSayingTlsRequired) {
  TempDir dir;
  const std::string addr = absl::StrCat("127.0.0.1:", PickFreePort());
  DaemonProcess d(dir.path(), {"--peer-listen", addr});
  const v1::DaemonStatus st = GetStatus(d.socket());
  EXPECT_EQ(st.peer_security().rfind("plaintext", 0), 0u) << st.peer_security();
  v1::PeerHelloResponse resp;
  grpc::Status s = Hello(addr, grpc::InsecureChannelCredentials(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(resp.refusal().find("TLS required"), std::string::npos) << resp.refusal();
  EXPECT_TRUE(resp.instance_id().empty());
  // No reflection on the peer port (the local socket has it; peers must not
  // be able to enumerate the daemon's services).
  s = RawUnaryCall(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()),
                   "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
}

TEST(PeerTls, PeerInsecureServesPlaintextToAnyoneAndSaysSoLoudly) {
  // The one configuration kept on purpose without certificates: an
  // isolated test network. Everything is served, names taken on trust.
  TempDir dir;
  const std::string addr = absl::StrCat("127.0.0.1:", PickFreePort());
  std::ofstream(dir.path() + "/insecure.conf") << "peer_insecure = true\n";
  DaemonProcess d(dir.path(), {"--config", dir.path() + "/insecure.conf", "--peer-listen", addr});
  const v1::DaemonStatus st = GetStatus(d.socket());
  EXPECT_NE(st.peer_security().find("INSECURE"), std::string::npos) << st.peer_security();
  v1::PeerHelloResponse resp;
  grpc::Status s = Hello(addr, grpc::InsecureChannelCredentials(), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.refusal().empty());
  EXPECT_EQ(resp.node_id(), "testnode");
  EXPECT_EQ(resp.instance_id(), st.instance_id());
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

// PeerHello as `node` over `stub`.
grpc::Status HelloAs(v1::Peer::Stub* stub, const std::string& node) {
  grpc::ClientContext ctx;
  Deadline(&ctx, 3000);
  v1::PeerHelloRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_node_id(node);
  v1::PeerHelloResponse resp;
  return stub->PeerHello(&ctx, req, &resp);
}

TEST(PeerTls, ARevokedNodeIsRefusedOnEveryCallWithinASecondWithoutARestart) {
  TempDir dir;
  const std::string cluster = dir.path() + "/cluster";
  const absl::StatusOr<TestCertificates> server = MakeNodeCertificate(cluster, "testnode");
  const absl::StatusOr<TestCertificates> other = MakeNodeCertificate(cluster, "other-node");
  const absl::StatusOr<TestCertificates> third = MakeNodeCertificate(cluster, "third-node");
  ASSERT_TRUE(server.ok() && other.ok() && third.ok());
  // The node's own copy of the CA's list (none revoked yet).
  const std::string crl = dir.path() + "/crl.pem";
  std::ofstream(crl) << ReadFile(cluster + "/crl.pem");
  const std::string addr = absl::StrCat("127.0.0.1:", PickFreePort());
  std::ofstream(dir.path() + "/tls.conf")
      << PeerTlsConfig(*server) << "peer_tls_crl_file = " << crl << "\n";
  DaemonProcess d(dir.path(), {"--config", dir.path() + "/tls.conf", "--peer-listen", addr});
  const v1::DaemonStatus st = GetStatus(d.socket());
  EXPECT_NE(st.peer_security().find("not revoked by " + crl), std::string::npos)
      << st.peer_security();

  // Credentials read before the revocation moves the files away.
  auto as_other =
      v1::Peer::NewStub(PeerChannelTo(addr, TlsAs(server->ca_file, *other), "testnode"));
  auto as_third =
      v1::Peer::NewStub(PeerChannelTo(addr, TlsAs(server->ca_file, *third), "testnode"));
  // Connects on its first call, after the revocation.
  auto again = v1::Peer::NewStub(PeerChannelTo(addr, TlsAs(server->ca_file, *other), "testnode"));
  ASSERT_TRUE(HelloAs(as_other.get(), "other-node").ok());
  ASSERT_TRUE(HelloAs(as_third.get(), "third-node").ok());

  const absl::StatusOr<std::string> revoked = RevokeNodeCertificate(cluster, "other-node");
  ASSERT_TRUE(revoked.ok()) << revoked.status();
  {
    // Copied in place whole (write, then rename), as an operator would.
    std::ofstream(crl + ".new") << ReadFile(*revoked);
    std::rename((crl + ".new").c_str(), crl.c_str());
  }
  // The open connection: refused once the daemon looks again (<= 1 s).
  grpc::Status s;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((s = HelloAs(as_other.get(), "other-node")).ok() &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("is revoked by"), std::string::npos) << s.error_message();
  // A new connection with that certificate: refused too.
  EXPECT_EQ(HelloAs(again.get(), "other-node").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Every other node: served as before.
  EXPECT_TRUE(HelloAs(as_third.get(), "third-node").ok());
  EXPECT_TRUE(d.running());
}

TEST(PeerTls, ARevocationListOfAnotherCaStopsTheStart) {
  TempDir dir;
  const absl::StatusOr<TestCertificates> server =
      MakeNodeCertificate(dir.path() + "/cluster", "testnode");
  const absl::StatusOr<TestCertificates> rogue =
      MakeNodeCertificate(dir.path() + "/rogue", "testnode");
  ASSERT_TRUE(server.ok() && rogue.ok());
  std::ofstream(dir.path() + "/tls.conf")
      << PeerTlsConfig(*server) << "peer_tls_crl_file = " << dir.path() << "/rogue/crl.pem\n";
  const std::string cmd =
      absl::StrCat(BinDir(), "/mooncaked --socket ", dir.path(), "/x.sock --config ", dir.path(),
                   "/tls.conf --peer-listen 127.0.0.1:", PickFreePort(), " 2>&1");
  Child c = Child::Spawn({"/bin/sh", "-c", cmd});
  EXPECT_NE(c.Wait(20000), 0) << c.output();
  EXPECT_NE(c.output().find("peer_tls_crl_file"), std::string::npos) << c.output();
  EXPECT_NE(c.output().find("not signed by the cluster CA"), std::string::npos) << c.output();
}

}  // namespace
}  // namespace mooncake::testing
