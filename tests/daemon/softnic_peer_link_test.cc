// SoftnicPeerLink against a real gRPC peer server in this process (a fake
// responder node over plaintext with peer_insecure, verified by TrustedPeers
// as daemons verify each other): issue 23 item 6.
//   - A batch whose responder QP answers not_ready waits aside while it is
//     retried: another QP's batch to the same node goes through at once
//     instead of queueing behind it for the NIC-like 2 s.
//   - Batches for many nodes use the link's fixed pool of threads: the
//     process gains no thread per destination.
#include "peering/softnic_peer_link.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mooncake/common/version.h"
#include "mooncake/v1/peer.grpc.pb.h"
#include "peering/trusted_peers.h"

namespace mooncake::daemon::peering {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kNotReadyQpn = 1;  // the fake's responder for it is in RESET

// A responder node: answers PeerHello as `node`, and executes every batch
// with success, except those of requester QP kNotReadyQpn: not_ready.
class FakeNode final : public v1::Peer::Service {
 public:
  explicit FakeNode(std::string node) : node_(std::move(node)) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeNode() override { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::Status PeerHello(grpc::ServerContext*, const v1::PeerHelloRequest*,
                         v1::PeerHelloResponse* resp) override {
    resp->set_protocol_version(kProtocolVersion);
    resp->set_node_id(node_);
    resp->set_instance_id("i1");
    return grpc::Status::OK;
  }
  grpc::Status SoftnicExecute(grpc::ServerContext*, const v1::SoftnicBatch* req,
                              v1::SoftnicResults* resp) override {
    ++calls;
    for (int i = 0; i < req->ops_size(); ++i) {
      v1::SoftnicResult* r = resp->add_results();
      if (req->requester_qpn() == kNotReadyQpn) {
        r->set_syndrome(0x15);
        r->set_not_ready(true);
        break;
      }
    }
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};

 private:
  const std::string node_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

class SoftnicPeerLinkTest : public ::testing::Test {
 protected:
  FakeNode* AddNode(const std::string& node) {
    nodes_[node] = std::make_unique<FakeNode>(node);
    return nodes_[node].get();
  }
  void StartLink() {
    TrustedPeersOptions o;
    o.mode = PeerMode::kInsecure;
    o.credentials = grpc::InsecureChannelCredentials();
    o.self_node = "node-a";
    peers_ = std::make_unique<TrustedPeers>(o, [this](const std::string& node) {
      std::optional<v1::NodeRecord> r;
      auto it = nodes_.find(node);
      if (it == nodes_.end()) return r;
      r.emplace();
      r->set_node_id(node);
      r->set_instance_id("i1");
      r->set_peer_address(it->second->address());
      r->set_peer_insecure(true);
      return r;
    });
    link_ = std::make_unique<SoftnicPeerLink>("node-a", peers_.get());
  }
  // Sends one WRITE from `qpn` to `node`; the future holds its first
  // syndrome (-1: the batch failed) once done runs.
  std::future<int> Send(const std::string& node, uint32_t qpn) {
    softnic::RemoteBatch b;
    b.node = node;
    b.requester_qpn = qpn;
    b.secret = std::string(16, 's');
    softnic::RemoteOp op;
    op.responder_qpn = 77;
    op.data = "x";
    b.ops.push_back(op);
    auto done = std::make_shared<std::promise<int>>();
    link_->Send(
        std::move(b), [done](absl::StatusOr<std::vector<softnic::ResponderResult>> results) {
          done->set_value(
              !results.ok() || results->empty() ? -1 : static_cast<int>(results->front().syndrome));
        });
    return done->get_future();
  }
  void TearDown() override {
    if (link_) link_->Stop();
  }

  std::map<std::string, std::unique_ptr<FakeNode>> nodes_;
  std::unique_ptr<TrustedPeers> peers_;
  std::unique_ptr<SoftnicPeerLink> link_;
};

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

TEST_F(SoftnicPeerLinkTest, ANotReadyResponderDoesNotStallOtherTrafficToItsNode) {
  FakeNode* b = AddNode("node-b");
  StartLink();
  ASSERT_EQ(Send("node-b", 9).get(), 0);  // verified and warm
  const auto start = Clock::now();
  std::future<int> stuck = Send("node-b", kNotReadyQpn);
  // Let the stuck batch reach its first not_ready answer.
  while (b->calls.load() < 2 && Seconds(start) < 5) std::this_thread::yield();
  const auto other = Clock::now();
  std::vector<std::future<int>> fine;
  for (uint32_t qpn = 10; qpn < 20; ++qpn) fine.push_back(Send("node-b", qpn));
  for (auto& f : fine) EXPECT_EQ(f.get(), 0);
  const double others = Seconds(other);
  std::printf("[ figures ] 10 batches behind a not_ready one to the same node: %.1f ms\n",
              others * 1e3);
  EXPECT_LT(others, 0.5) << "they waited behind the not_ready batch";
  // The stuck one gives up as a NIC does: retry exceeded, after ~2 s.
  EXPECT_EQ(stuck.get(), 0x15);
  EXPECT_GE(Seconds(start), 1.9);
}

TEST_F(SoftnicPeerLinkTest, ManyNodesShareTheFixedPoolOfThreads) {
  constexpr int kNodes = 24;
  for (int i = 0; i < kNodes; ++i) AddNode(absl::StrCat("node-", i));
  auto threads = [] {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
    }
    return -1;
  };
  StartLink();
  ASSERT_EQ(Send("node-0", 9).get(), 0);  // gRPC's own threads are up
  // The fake nodes live in this process: each server's threads start with
  // its first call, so every one answers a call of its own first.
  for (const auto& [node, fake] : nodes_) {
    auto stub =
        v1::Peer::NewStub(grpc::CreateChannel(fake->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::SoftnicBatch batch;
    batch.add_ops();
    v1::SoftnicResults r;
    ASSERT_TRUE(stub->SoftnicExecute(&ctx, batch, &r).ok()) << node;
  }
  const int before = threads();
  std::vector<std::future<int>> sent;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < kNodes; ++i) sent.push_back(Send(absl::StrCat("node-", i), 9));
  }
  for (auto& f : sent) EXPECT_EQ(f.get(), 0);
  const int after = threads();
  std::printf("[ figures ] batches to %d nodes: threads %d before, %d after (pool of %d)\n", kNodes,
              before, after, SoftnicPeerLink::kWorkers);
  // gRPC may add a poller or two; one thread per node would be +24.
  EXPECT_LE(after, before + 4);
  EXPECT_EQ(link_->queued(), 0u);
}

}  // namespace
}  // namespace mooncake::daemon::peering
