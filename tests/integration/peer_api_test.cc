// The peer API other nodes' daemons call over TCP: identity and topology,
// and the local API is NOT reachable there.
#include <grpcpp/grpcpp.h>

#include <random>

#include "daemon_process.h"
#include "gtest/gtest.h"
#include "mooncake/common/version.h"
#include "mooncake/v1/local.grpc.pb.h"
#include "mooncake/v1/peer.grpc.pb.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

TEST(PeerApi, HelloAndTopologyOverTcpAndNoLocalApiThere) {
  TempDir dir;
  // A port in the dynamic range; retry a few if one happens to be taken.
  std::mt19937 rng(static_cast<unsigned>(::getpid()));
  std::unique_ptr<DaemonProcess> daemon;
  std::string addr;
  for (int attempt = 0; attempt < 5 && !daemon; ++attempt) {
    addr = "127.0.0.1:" + std::to_string(40000 + rng() % 20000);
    try {
      daemon = std::make_unique<DaemonProcess>(dir.path(),
                                               std::vector<std::string>{"--peer-listen", addr});
    } catch (const std::exception&) {
      daemon.reset();
    }
  }
  ASSERT_TRUE(daemon) << "could not start mooncaked with a peer port";
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto peer = v1::Peer::NewStub(channel);
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::PeerHelloRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_node_id("other-node");
    v1::PeerHelloResponse resp;
    grpc::Status s = peer->PeerHello(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.node_id(), "testnode");
    EXPECT_EQ(resp.protocol_version(), kProtocolVersion);
    EXPECT_EQ(resp.daemon_version(), kMooncakeVersion);
    EXPECT_EQ(resp.instance_id(), GetStatus(daemon->socket()).instance_id());
    EXPECT_EQ(GetStatus(daemon->socket()).peer_listen(), addr);
  }
  {
    // Unparsable bytes: INVALID_ARGUMENT with a message, not a bare INTERNAL.
    grpc::Status s =
        RawUnaryCall(channel, "/mooncake.v1.Peer/PeerHello", std::string("\x12\x02\xff\xfe", 4));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("PeerHello"), std::string::npos) << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::PeerHelloRequest req;
    req.set_protocol_version(7);
    v1::PeerHelloResponse resp;
    EXPECT_EQ(peer->PeerHello(&ctx, req, &resp).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::Topology topo;
    EXPECT_TRUE(peer->GetPeerTopology(&ctx, {}, &topo).ok());
  }
  // The local API (sessions, fds, groups) is never served over TCP.
  auto local = v1::Local::NewStub(channel);
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::HelloResponse resp;
  EXPECT_EQ(local->Hello(&ctx, {}, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

}  // namespace
}  // namespace mooncake::testing
