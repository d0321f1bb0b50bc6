// peer_tls_crl_file (daemon/peering/peer_revocation.h): the cluster CA's
// revocation list, made and updated by deploy/make-cluster-certs.sh as an
// operator would. A new list is taken within a second; a list that does
// not verify is refused and the one in force stays; and a daemon dialling
// another node (PeerChannelCredentials) fails the TLS handshake of a server
// whose certificate is revoked or names another node, against a real gRPC
// server on a real socket.
#include "peering/peer_revocation.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "mooncake/v1/peer.grpc.pb.h"
#include "peering/peer_identity.h"
#include "peering/peer_tls.h"
#include "test_certs.h"

namespace mooncake::daemon::peering {
namespace {

using ::mooncake::testing::MakeNodeCertificate;
using ::mooncake::testing::RevokeNodeCertificate;
using ::mooncake::testing::TestCertificates;

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Replaces `path` whole, as an operator's copy (or a torn one) would.
void Replace(const std::string& path, const std::string& bytes) {
  std::ofstream(path + ".tmp", std::ios::binary) << bytes;
  std::filesystem::rename(path + ".tmp", path);
}

class PeerRevocationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mc-revocation-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    cluster_ = dir_ + "/cluster";
    absl::StatusOr<TestCertificates> a = MakeNodeCertificate(cluster_, "node-a");
    absl::StatusOr<TestCertificates> b = MakeNodeCertificate(cluster_, "node-b");
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    a_ = *a;
    b_ = *b;
    a_pem_ = Read(a_.cert_file);
    b_pem_ = Read(b_.cert_file);
    // The node keeps its own copy of the list, as on a real node.
    crl_ = dir_ + "/node-crl.pem";
    Replace(crl_, Read(cluster_ + "/crl.pem"));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Revoke(const std::string& node) {
    absl::StatusOr<std::string> list = RevokeNodeCertificate(cluster_, node);
    ASSERT_TRUE(list.ok()) << list.status();
    Replace(crl_, Read(*list));
  }
  // Past the list's next look at its file.
  static void AfterRecheck() {
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(PeerRevocations::kRecheck) +
                                std::chrono::milliseconds(150));
  }

  std::string dir_, cluster_, crl_;
  TestCertificates a_, b_;
  std::string a_pem_, b_pem_;
};

TEST_F(PeerRevocationsTest, ANewListIsTakenWithinASecondAndNamesTheRevokedSerial) {
  absl::StatusOr<std::shared_ptr<PeerRevocations>> r =
      PeerRevocations::Load(crl_, Read(a_.ca_file));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)->Check(a_pem_).ok());
  EXPECT_TRUE((*r)->Check(b_pem_).ok());
  EXPECT_EQ((*r)->generation(), 1u);
  EXPECT_EQ((*r)->revoked_count(), 0u);

  Revoke("node-b");
  AfterRecheck();
  const absl::Status s = (*r)->Check(b_pem_);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("is revoked by " + crl_), std::string::npos) << s;
  EXPECT_NE(s.message().find("serial "), std::string::npos) << s;
  EXPECT_TRUE((*r)->Check(a_pem_).ok()) << "only node-b is on the list";
  EXPECT_EQ((*r)->generation(), 2u);
  EXPECT_EQ((*r)->revoked_count(), 1u);
  EXPECT_NE((*r)->Describe().find("1 revoked"), std::string::npos) << (*r)->Describe();
}

TEST_F(PeerRevocationsTest, AChangedListThatDoesNotVerifyIsRefusedAndTheOneInForceStays) {
  Revoke("node-b");
  absl::StatusOr<std::shared_ptr<PeerRevocations>> r =
      PeerRevocations::Load(crl_, Read(a_.ca_file));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE((*r)->Check(b_pem_).ok());

  // Half a file (a torn copy): refused, node-b stays revoked.
  const std::string good = Read(crl_);
  Replace(crl_, good.substr(0, good.size() / 2));
  AfterRecheck();
  EXPECT_FALSE((*r)->Check(b_pem_).ok());
  EXPECT_EQ((*r)->generation(), 1u);

  // Another CA's list (which revokes nothing): refused the same way.
  absl::StatusOr<TestCertificates> rogue = MakeNodeCertificate(dir_ + "/rogue", "node-x");
  ASSERT_TRUE(rogue.ok()) << rogue.status();
  Replace(crl_, Read(dir_ + "/rogue/crl.pem"));
  AfterRecheck();
  EXPECT_FALSE((*r)->Check(b_pem_).ok());
  EXPECT_EQ((*r)->generation(), 1u);

  // The CA's list again: taken.
  Replace(crl_, good);
  AfterRecheck();
  EXPECT_EQ((*r)->generation(), 2u);
  EXPECT_FALSE((*r)->Check(b_pem_).ok());
  EXPECT_TRUE((*r)->Check(a_pem_).ok());
}

TEST_F(PeerRevocationsTest, LoadRefusesAnotherCasListAFileThatIsNoListAndAMissingFile) {
  absl::StatusOr<TestCertificates> rogue = MakeNodeCertificate(dir_ + "/rogue", "node-x");
  ASSERT_TRUE(rogue.ok()) << rogue.status();
  const std::string ca = Read(a_.ca_file);
  auto refused = [&](const std::string& file, const std::string& why) {
    absl::StatusOr<std::shared_ptr<PeerRevocations>> r = PeerRevocations::Load(file, ca);
    ASSERT_FALSE(r.ok()) << file;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("peer_tls_crl_file = " + file), std::string::npos)
        << r.status();
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status();
  };
  refused(dir_ + "/rogue/crl.pem", "not signed by the cluster CA");
  refused(a_.cert_file, "not a PEM certificate revocation list");
  refused(dir_ + "/absent.pem", "cannot be read");
}

// The one method a dialling daemon sends first: answers as `node`.
class HelloService final : public v1::Peer::Service {
 public:
  explicit HelloService(std::string node) : node_(std::move(node)) {}
  grpc::Status PeerHello(grpc::ServerContext*, const v1::PeerHelloRequest*,
                         v1::PeerHelloResponse* resp) override {
    resp->set_node_id(node_);
    return grpc::Status::OK;
  }

 private:
  const std::string node_;
};

grpc::Status Hello(v1::Peer::Stub* stub, grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  v1::PeerHelloRequest req;
  req.set_node_id("node-a");
  v1::PeerHelloResponse resp;
  return stub->PeerHello(ctx, req, &resp);
}

TEST_F(PeerRevocationsTest, DiallingARevokedOrMisnamedServerFailsTheHandshake) {
  // node-b's peer port: mTLS with its certificate.
  grpc::SslServerCredentialsOptions so(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  so.pem_root_certs = Read(b_.ca_file);
  so.pem_key_cert_pairs.push_back({Read(b_.key_file), b_pem_});
  HelloService service("node-b");
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(so), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string addr = "127.0.0.1:" + std::to_string(port);

  // node-a dials as a daemon does.
  const PeerTlsFiles files{a_.ca_file, a_.cert_file, a_.key_file, crl_, false};
  absl::StatusOr<std::shared_ptr<PeerRevocations>> r = LoadPeerRevocations(files);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_NE(*r, nullptr);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      PeerChannelCredentials(files, *r);
  ASSERT_TRUE(creds.ok()) << creds.status();

  auto stub_b = v1::Peer::NewStub(PeerChannel(PeerMode::kMutualTls, *creds, "node-b", addr, 0));
  {
    grpc::ClientContext ctx;
    const grpc::Status s = Hello(stub_b.get(), &ctx);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(CheckServerIdentity(PeerMode::kMutualTls, ctx, "node-b", r->get()).ok());
  }
  {
    // The same server reached as node-c: its certificate does not name it.
    auto stub_c = v1::Peer::NewStub(PeerChannel(PeerMode::kMutualTls, *creds, "node-c", addr, 0));
    grpc::ClientContext ctx;
    EXPECT_FALSE(Hello(stub_c.get(), &ctx).ok());
  }

  Revoke("node-b");
  AfterRecheck();
  {
    // A new connection: the handshake fails, nothing is sent.
    auto fresh = v1::Peer::NewStub(PeerChannel(PeerMode::kMutualTls, *creds, "node-b", addr, 0));
    grpc::ClientContext ctx;
    const grpc::Status s = Hello(fresh.get(), &ctx);
    EXPECT_FALSE(s.ok());
  }
  {
    // The connection made before the list changed still carries calls;
    // the check after PeerHello (TrustedPeers re-verifies once the list
    // changes) refuses its server.
    grpc::ClientContext ctx;
    const grpc::Status s = Hello(stub_b.get(), &ctx);
    ASSERT_TRUE(s.ok()) << s.error_message();
    const absl::Status id = CheckServerIdentity(PeerMode::kMutualTls, ctx, "node-b", r->get());
    EXPECT_EQ(id.code(), absl::StatusCode::kFailedPrecondition) << id;
    EXPECT_NE(id.message().find("revoked"), std::string::npos) << id;
  }
  server->Shutdown();
}

TEST(PeerTlsFilesTest, ARevocationListNeedsMutualTls) {
  const absl::StatusOr<PeerSecurity> alone =
      DescribePeerSecurity(PeerTlsFiles{"", "", "", "/crl.pem", false});
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().message().find("peer_tls_crl_file"), std::string::npos);
  const absl::StatusOr<PeerSecurity> insecure =
      DescribePeerSecurity(PeerTlsFiles{"/ca", "/c", "/k", "/crl.pem", true});
  EXPECT_FALSE(insecure.ok());
  const absl::StatusOr<PeerSecurity> full =
      DescribePeerSecurity(PeerTlsFiles{"/ca", "/c", "/k", "/crl.pem", false});
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_NE(full->description.find("not revoked by /crl.pem"), std::string::npos)
      << full->description;
}

}  // namespace
}  // namespace mooncake::daemon::peering
