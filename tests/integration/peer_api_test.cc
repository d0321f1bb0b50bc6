// The peer API other nodes' daemons call over TCP (issue 23 item 1):
// under mTLS a node with the cluster's certificate is served identity and
// topology, and only as the node its certificate names; over plaintext
// without peer_insecure the port answers PeerHello with its version and
// "TLS required" and refuses everything else; the local API is NOT
// reachable there in any mode.
#include <grpcpp/grpcpp.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "etcd_test_server.h"
#include "gtest/gtest.h"
#include "mooncake/common/version.h"
#include "mooncake/v1/local.grpc.pb.h"
#include "mooncake/v1/peer.grpc.pb.h"
#include "peer_client.h"
#include "test_certs.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

using daemon::etcd::testing::PickFreePort;

grpc::Status Hello(v1::Peer::Stub* peer, const std::string& as, v1::PeerHelloResponse* resp,
                   uint32_t version = kProtocolVersion) {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::PeerHelloRequest req;
  req.set_protocol_version(version);
  req.set_node_id(as);
  return peer->PeerHello(&ctx, req, resp);
}

void ExpectNoLocalApi(const std::shared_ptr<grpc::Channel>& channel) {
  auto local = v1::Local::NewStub(channel);
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::HelloResponse resp;
  EXPECT_EQ(local->Hello(&ctx, {}, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(PeerApi, UnderMutualTlsANodeIsServedAsTheNodeItsCertificateNames) {
  TempDir dir;
  const absl::StatusOr<TestCertificates> server = MakeNodeCertificate(dir.path(), "testnode");
  const absl::StatusOr<TestCertificates> other = MakeNodeCertificate(dir.path(), "other-node");
  ASSERT_TRUE(server.ok() && other.ok()) << server.status() << other.status();
  std::ofstream(dir.path() + "/tls.conf") << PeerTlsConfig(*server);
  const std::string addr = absl::StrCat("127.0.0.1:", PickFreePort());
  DaemonProcess daemon(dir.path(), {"--config", dir.path() + "/tls.conf", "--peer-listen", addr});
  auto channel = PeerChannelTo(addr, TlsAs(server->ca_file, *other), "testnode");
  auto peer = v1::Peer::NewStub(channel);
  {
    v1::PeerHelloResponse resp;
    grpc::Status s = Hello(peer.get(), "other-node", &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.node_id(), "testnode");
    EXPECT_EQ(resp.protocol_version(), kProtocolVersion);
    EXPECT_EQ(resp.daemon_version(), kMooncakeVersion);
    EXPECT_TRUE(resp.refusal().empty()) << resp.refusal();
    EXPECT_EQ(resp.instance_id(), GetStatus(daemon.socket()).instance_id());
    EXPECT_EQ(GetStatus(daemon.socket()).peer_listen(), addr);
  }
  {
    // Its certificate says other-node: it cannot speak as another node.
    v1::PeerHelloResponse resp;
    grpc::Status s = Hello(peer.get(), "testnode", &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("DNS:other-node"), std::string::npos) << s.error_message();
    EXPECT_TRUE(resp.instance_id().empty());
  }
  {
    // Unparsable bytes: INVALID_ARGUMENT with a message, not a bare INTERNAL.
    grpc::Status s =
        RawUnaryCall(channel, "/mooncake.v1.Peer/PeerHello", std::string("\x12\x02\xff\xfe", 4));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("PeerHello"), std::string::npos) << s.error_message();
  }
  {
    v1::PeerHelloResponse resp;
    EXPECT_EQ(Hello(peer.get(), "other-node", &resp, 7).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    // The topology goes only to a live node of the cluster that the
    // certificate names: this daemon is in none.
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::GetPeerTopologyRequest req;
    req.set_node_id("other-node");
    v1::Topology topo;
    grpc::Status s = peer->GetPeerTopology(&ctx, req, &topo);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("not a live node"), std::string::npos) << s.error_message();
    EXPECT_EQ(topo.ByteSizeLong(), 0u);
    grpc::ClientContext unnamed;
    Deadline(&unnamed);
    s = peer->GetPeerTopology(&unnamed, {}, &topo);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("DNS:other-node"), std::string::npos) << s.error_message();
  }
  ExpectNoLocalApi(channel);
  {
    // The caller checks the server too: dialled as node "elsewhere", the
    // daemon's certificate (DNS:testnode) does not pass the handshake.
    auto wrong =
        v1::Peer::NewStub(PeerChannelTo(addr, TlsAs(server->ca_file, *other), "elsewhere"));
    v1::PeerHelloResponse resp;
    EXPECT_EQ(Hello(wrong.get(), "other-node", &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
  }
}

TEST(PeerApi, PlaintextWithoutPeerInsecureAnswersOnlyHelloWithTlsRequired) {
  TempDir dir;
  const std::string addr = absl::StrCat("127.0.0.1:", PickFreePort());
  DaemonProcess daemon(dir.path(), {"--peer-listen", addr});
  EXPECT_NE(GetStatus(daemon.socket()).peer_security().find("PeerHello only"), std::string::npos)
      << GetStatus(daemon.socket()).peer_security();
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto peer = v1::Peer::NewStub(channel);
  v1::PeerHelloResponse resp;
  grpc::Status s = Hello(peer.get(), "other-node", &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.protocol_version(), kProtocolVersion);
  EXPECT_NE(resp.refusal().find("TLS required"), std::string::npos) << resp.refusal();
  EXPECT_NE(resp.refusal().find("peer_tls_cert_file"), std::string::npos) << resp.refusal();
  // Nothing about the node.
  EXPECT_TRUE(resp.node_id().empty());
  EXPECT_TRUE(resp.instance_id().empty());
  EXPECT_TRUE(resp.daemon_version().empty());
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::Topology topo;
    EXPECT_EQ(peer->GetPeerTopology(&ctx, {}, &topo).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::SoftnicBatch batch;
    batch.set_requester_node("node-a");
    v1::SoftnicResults results;
    grpc::Status e = peer->SoftnicExecute(&ctx, batch, &results);
    EXPECT_EQ(e.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(e.error_message().find("TLS required"), std::string::npos) << e.error_message();
  }
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::OfferConnectionRequest offer;
    offer.set_node_id("node-a");
    v1::OfferConnectionResponse r;
    EXPECT_EQ(peer->OfferConnection(&ctx, offer, &r).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  ExpectNoLocalApi(channel);
}

}  // namespace
}  // namespace mooncake::testing
