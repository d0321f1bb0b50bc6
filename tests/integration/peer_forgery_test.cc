// The attack that opened issue 23, repeated against real daemons on a real
// etcd: an outsider who knows a live cross-node connection (node names,
// QPNs, the responder's rkey and address: all of it was in etcd) calls
// Peer.SoftnicExecute on node B's peer port claiming to be node A, to
// write into (WRITE) or read (FETCH_ADD of 0) the application's memory on
// node B. Before the fix both worked and nothing was logged.
//
// The target is real: a session on node B registers a memfd region with
// remote write and atomic access and connects its QP to a QP of a session
// on node A, which connects back (the cross-node route as the library
// drives it, through ConnectQueuePairs). The test holds the region's
// memory and checks it byte for byte after every attack.
//
// Outcomes asserted, per peer-port mode:
//   mTLS:        plaintext, TLS without a certificate and another CA's
//                certificate fail the handshake; node C's certificate
//                claiming node A is PERMISSION_DENIED; node A's own
//                certificate without the connection's secret (a process
//                reusing the QPN, or anyone who read etcd) gets
//                TRANSPORT_RETRY_EXC_ERR and fetches nothing; re-offering a
//                secret for the connected QP is ALREADY_EXISTS.
//   peer_insecure (kept on purpose, an isolated network): the claimed name
//                is taken on trust, and the secret alone stops the forgery.
//   plaintext without peer_insecure: every method but PeerHello is
//                PERMISSION_DENIED, and the application cannot even connect
//                its QPs across nodes (the message names the keys).
// In every case the memory is unchanged, the daemon keeps serving, and it
// logs the refusal.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "etcd_reader.h"
#include "etcd_test_server.h"
#include "gtest/gtest.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/paths.h"
#include "mooncake/common/unique_fd.h"
#include "mooncake/device/mlx5/prm.h"
#include "mooncake/device/mlx5/wqe.h"
#include "mooncake/v1/peer.grpc.pb.h"
#include "mooncake/v1/rdma.grpc.pb.h"
#include "peer_client.h"
#include "raw_session.h"
#include "test_certs.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

using daemon::etcd::testing::PickFreePort;

constexpr uint64_t kRegionBytes = 4096;
constexpr uint64_t kIova = 0x7f1200000000ull;
constexpr uint32_t kDepth = 4;
constexpr uint64_t kControlBytes = 4096;
// The mlx5 CQE syndrome a NIC reports when its peer never answers
// (device/include/mooncake/device/mlx5/prm.h, not on this target's path).
constexpr uint32_t kTransportRetryExceeded = 0x15;

// One application's side of the connection, on one node: a session, a QP,
// and (on the target node) the region under attack.
struct Side {
  std::unique_ptr<abuse::RawSession> session;
  std::unique_ptr<v1::Rdma::Stub> rdma;
  UniqueFd fdconn;
  std::vector<UniqueFd> controls;  // each QP's control memory
  // ... mapped here before it is handed over: the daemon seals it against
  // new writable mappings (rdma/sealed_memfd_mappings.h).
  std::vector<uint8_t*> control_maps;
  uint32_t qpn = 0;
  UniqueFd region;
  uint8_t* memory = nullptr;  // the region, as the application sees it
  uint64_t region_bytes = kRegionBytes;
  uint32_t rkey = 0;
  std::string socket_path;

  ~Side() {
    if (memory != nullptr) ::munmap(memory, region_bytes);
    for (uint8_t* m : control_maps) ::munmap(m, kControlBytes);
  }

  void Open(const std::string& socket) {
    socket_path = socket;
    session = abuse::OpenRawSession(socket);
    ASSERT_NE(session, nullptr);
    rdma = v1::Rdma::NewStub(session->channel);
    absl::StatusOr<UniqueFd> c = ConnectUnix(FdSocketPath(socket));
    ASSERT_TRUE(c.ok()) << c.status();
    fdconn = *std::move(c);
    qpn = NewQp();
  }

  // One more QP of this session, in RESET (its own control memory).
  uint32_t NewQp() {
    UniqueFd mem = abuse::SealedMemfd(kControlBytes);
    EXPECT_TRUE(mem.valid());
    void* map = ::mmap(nullptr, kControlBytes, PROT_READ | PROT_WRITE, MAP_SHARED, mem.get(), 0);
    EXPECT_NE(map, MAP_FAILED);
    if (map != MAP_FAILED) control_maps.push_back(static_cast<uint8_t*>(map));
    absl::StatusOr<std::string> ticket = abuse::PutFd(fdconn.get(), session->opened, mem.get());
    EXPECT_TRUE(ticket.ok()) << ticket.status();
    controls.push_back(std::move(mem));
    v1::CreateQueuePairsRequest req;
    req.set_fd_ticket(ticket.value_or(""));
    req.set_control_bytes(kControlBytes);
    v1::QueuePairLayout* l = req.add_qps();
    l->set_sq_offset(0);
    l->set_sq_wqe_cnt(kDepth);
    l->set_cq_offset(kDepth * 64);
    l->set_cq_cqe_cnt(kDepth);
    l->set_sq_dbrec_offset(2 * kDepth * 64);
    l->set_cq_dbrec_offset(2 * kDepth * 64 + 8);
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::CreateQueuePairsResponse resp;
    grpc::Status s = rdma->CreateQueuePairs(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return s.ok() ? resp.qpns(0) : 0;
  }

  // Registers a region of `bytes` (remote write and atomics), every byte
  // written first (the application's pages, charged to it).
  void RegisterTarget(uint64_t bytes = kRegionBytes) {
    region_bytes = bytes;
    region = abuse::SealedMemfd(bytes);
    ASSERT_TRUE(region.valid());
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, region.get(), 0);
    ASSERT_NE(p, MAP_FAILED);
    memory = static_cast<uint8_t*>(p);
    if (bytes == kRegionBytes) {
      for (uint64_t i = 0; i < bytes; ++i) memory[i] = static_cast<uint8_t>(i * 13 + 7);
    } else {
      std::memset(memory, 0, bytes);
      for (uint64_t i = 0; i < bytes; i += 4096) memory[i] = static_cast<uint8_t>((i >> 12) * 13);
      // That took seconds: the fd channel drops idle connections sooner.
      absl::StatusOr<UniqueFd> c = ConnectUnix(FdSocketPath(socket_path));
      ASSERT_TRUE(c.ok()) << c.status();
      fdconn = *std::move(c);
    }
    absl::StatusOr<std::string> ticket = abuse::PutFd(fdconn.get(), session->opened, region.get());
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    v1::RegisterMemoryRequest req;
    req.set_fd_ticket(*ticket);
    req.set_kind("memfd");
    req.set_iova(kIova);
    req.set_length(bytes);
    req.set_remote_write(true);
    req.set_remote_atomic(true);
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::RegisterMemoryResponse resp;
    grpc::Status s = rdma->RegisterMemory(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    rkey = resp.rkey();
  }

  // Joins rank `rank` of group `group` and waits for it to form: queue
  // pairs go only to nodes of the caller's groups. With `rdma`, the member
  // publishes this side's QP and region (rkey) as its RDMA endpoint.
  grpc::Status Join(const std::string& group, uint32_t rank, v1::JoinGroupResponse* view = nullptr,
                    bool rdma = false, uint32_t world = 2, const std::string& secret = "",
                    uint32_t timeout_ms = 20000) {
    v1::JoinGroupRequest req;
    req.set_group(group);
    req.set_rank(rank);
    req.set_world_size(world);
    req.set_timeout_ms(timeout_ms);
    req.set_group_secret(secret);
    req.mutable_handle()->set_kind("memfd");
    req.mutable_handle()->set_data("h");
    req.mutable_handle()->set_size(4096);
    if (rdma) {
      v1::RdmaEndpoint* e = req.mutable_rdma();
      e->set_raddr(kIova);
      e->set_rkey(rkey);
      e->set_qps_per_peer(1);
      for (uint32_t p = 0; p < world; ++p) e->add_qpns(p == rank ? 0 : qpn);
      e->set_nic("softnic0");
    }
    grpc::ClientContext ctx;
    Deadline(&ctx, static_cast<int>(timeout_ms) + 10000);
    v1::JoinGroupResponse resp;
    return session->stub->JoinGroup(&ctx, req, view != nullptr ? view : &resp);
  }

  grpc::Status Connect(const std::string& node, uint32_t remote_qpn) {
    v1::ConnectQueuePairsRequest req;
    v1::QueuePairConnection* c = req.add_connections();
    c->set_qpn(qpn);
    c->set_remote_qpn(remote_qpn);
    c->set_remote_node(node);
    grpc::ClientContext ctx;
    Deadline(&ctx, 10000);
    v1::ConnectQueuePairsResponse resp;
    return rdma->ConnectQueuePairs(&ctx, req, &resp);
  }

  // Until the node shows in this daemon's cluster view (etcd's watch).
  grpc::Status ConnectWhenSeen(const std::string& node, uint32_t remote_qpn) {
    grpc::Status s;
    for (int i = 0; i < 100; ++i) {
      s = Connect(node, remote_qpn);
      // NOT_FOUND: not in this daemon's view yet; UNAVAILABLE: its
      // PeerHello did not answer yet (a failure is retried after 1 s).
      if (s.error_code() != grpc::StatusCode::NOT_FOUND &&
          s.error_code() != grpc::StatusCode::UNAVAILABLE) {
        return s;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return s;
  }
};

// A field of /proc/PID/status ("Threads", "RssAnon" in kB), -1 if unreadable.
long StatusField(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}
int Threads(pid_t pid) { return static_cast<int>(StatusField(pid, "Threads")); }

class PeerForgeryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status s = etcd_.Start();
    ASSERT_TRUE(s.ok()) << s;
  }

  // Starts node `id` with `conf` (its peer_* lines) added to the cluster's.
  std::unique_ptr<DaemonProcess> StartNode(const std::string& id, const std::string& conf,
                                           std::string* peer_address) {
    const std::string sub = dir_.path() + "/" + id;
    ::mkdir(sub.c_str(), 0700);
    std::ofstream(sub + "/node.conf") << "etcd_lease_ttl_s = 2\netcd_prefix = /forgery\n" << conf;
    *peer_address = absl::StrCat("127.0.0.1:", PickFreePort());
    return std::make_unique<DaemonProcess>(
        sub,
        std::vector<std::string>{"--config", sub + "/node.conf", "--node-id", id, "--peer-listen",
                                 *peer_address, "--etcd", etcd_.client_url()},
        /*log_to_output=*/true);
  }

  TestCertificates Certs(const std::string& dir, const std::string& node) {
    absl::StatusOr<TestCertificates> c = MakeNodeCertificate(dir_.path() + "/" + dir, node);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.value_or(TestCertificates{});
  }

  // Both nodes up, one group with a rank on each, A's QP and B's QP
  // connected to each other, B's region registered.
  void Connect() {
    a_side_.Open(a_->socket());
    b_side_.Open(b_->socket());
    b_side_.RegisterTarget();
    JoinBoth();
    grpc::Status s = b_side_.ConnectWhenSeen("node-a", a_side_.qpn);
    ASSERT_TRUE(s.ok()) << s.error_message();
    s = a_side_.ConnectWhenSeen("node-b", b_side_.qpn);
    ASSERT_TRUE(s.ok()) << s.error_message();
    snapshot_.assign(reinterpret_cast<const char*>(b_side_.memory), kRegionBytes);
  }

  // The forged batches: a WRITE over the region's first bytes and a
  // FETCH_ADD of 0 (a read), claiming node A's QP.
  v1::SoftnicBatch ForgedWrite(const std::string& secret = "") const {
    v1::SoftnicBatch b;
    b.set_requester_node("node-a");
    b.set_requester_qpn(a_side_.qpn);
    b.set_connection_secret(secret);
    v1::SoftnicOp* op = b.add_ops();
    op->set_kind(v1::SoftnicOp::WRITE);
    op->set_responder_qpn(b_side_.qpn);
    op->set_raddr(kIova);
    op->set_rkey(b_side_.rkey);
    op->set_data(std::string(64, 'X'));
    return b;
  }
  v1::SoftnicBatch ForgedRead(const std::string& secret = "") const {
    v1::SoftnicBatch b = ForgedWrite(secret);
    v1::SoftnicOp* op = b.mutable_ops(0);
    op->set_kind(v1::SoftnicOp::FETCH_ADD_64);
    op->set_raddr(kIova + 64);
    op->clear_data();
    op->set_add(0);
    return b;
  }

  // Offers B's QP a secret of the caller's choosing for A's QP's batches,
  // as node A vouching for `uid` (the owner of A's QP: root here).
  grpc::Status OfferAsNodeA(const std::shared_ptr<grpc::Channel>& channel, uint32_t uid = 0) const {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::OfferConnectionRequest offer;
    offer.set_node_id("node-a");
    offer.set_qpn(a_side_.qpn);
    offer.set_peer_qpn(b_side_.qpn);
    offer.set_secret(std::string(16, 's'));
    offer.set_uid(uid);
    v1::OfferConnectionResponse resp;
    return v1::Peer::NewStub(channel)->OfferConnection(&ctx, offer, &resp);
  }

  // Rank 0 on node A, rank 1 on node B, joined concurrently.
  void JoinBoth() {
    grpc::Status a_joined;
    // With RDMA endpoints, so there is something to steal over
    // FetchRankEndpoints (the fuzzer asks for it as every outsider).
    std::thread a([&] { a_joined = a_side_.Join("target", 0, nullptr, /*rdma=*/true); });
    const grpc::Status b_joined = b_side_.Join("target", 1, nullptr, /*rdma=*/true);
    a.join();
    ASSERT_TRUE(a_joined.ok()) << a_joined.error_message();
    ASSERT_TRUE(b_joined.ok()) << b_joined.error_message();
  }

  static grpc::Status Execute(const std::shared_ptr<grpc::Channel>& channel,
                              const v1::SoftnicBatch& batch, v1::SoftnicResults* results) {
    grpc::ClientContext ctx;
    Deadline(&ctx, 3000);
    return v1::Peer::NewStub(channel)->SoftnicExecute(&ctx, batch, results);
  }

  // The batch reached the engine and was refused there as a NIC drops a
  // packet for a QP that is not its peer's: nothing fetched.
  static void ExpectDroppedByTheEngine(const grpc::Status& s, const v1::SoftnicResults& r) {
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(r.results_size(), 1);
    EXPECT_EQ(r.results(0).syndrome(), kTransportRetryExceeded);
    EXPECT_EQ(r.results(0).fetched(), 0u);
  }

  // Posts one signaled WRITE of `bytes` from `from`'s region (its QP's first
  // WQE slot, rings as Side::NewQp lays them out) to the region `rkey`
  // names at kIova, and waits up to `timeout_s` for its CQE, calling
  // `sample` every 5 ms meanwhile. False when no CQE came.
  static bool PostWriteAndWait(Side& from, uint32_t rkey, uint64_t bytes, int timeout_s,
                               device::mlx5::Cqe64* out, const std::function<void()>& sample = {}) {
    if (from.control_maps.empty()) return false;
    uint8_t* base = from.control_maps[0];
    uint8_t* cq = base + kDepth * 64;
    std::memset(cq, 0xff, kDepth * 64);  // no CQE yet
    auto* sq_dbrec = reinterpret_cast<uint32_t*>(base + 2 * kDepth * 64);
    device::mlx5::Wqe64 w;
    device::mlx5::build_rdma_write(&w, 0, from.qpn, device::mlx5::kCtrlCqUpdate, kIova, rkey, kIova,
                                   from.rkey, static_cast<uint32_t>(bytes));
    std::memcpy(base, &w, 64);
    std::atomic_ref<uint32_t>(sq_dbrec[device::mlx5::kSndDbr])
        .store(device::mlx5::be32(1), std::memory_order_release);
    auto* cqe = reinterpret_cast<device::mlx5::Cqe64*>(cq);
    const auto start = std::chrono::steady_clock::now();
    bool done = false;
    while (!done && std::chrono::steady_clock::now() - start < std::chrono::seconds(timeout_s)) {
      if (sample) sample();
      const uint8_t op_own = std::atomic_ref<uint8_t>(cqe->op_own).load(std::memory_order_acquire);
      done = device::mlx5::cqe_opcode(op_own) != device::mlx5::kCqeInvalid;
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (done) std::memcpy(out, cqe, sizeof(*out));
    return done;
  }

  void ExpectMemoryUnchanged(const char* after) {
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(b_side_.memory), kRegionBytes), snapshot_)
        << "node B's application memory changed after " << after;
  }

  TempDir dir_;
  daemon::etcd::testing::EtcdTestServer etcd_;
  std::unique_ptr<DaemonProcess> a_, b_;
  std::string a_addr_, b_addr_;
  Side a_side_, b_side_;
  std::string snapshot_;
};

TEST_F(PeerForgeryTest, UnderMutualTlsNoOutsiderNorOtherNodeWritesOrReadsTheMemory) {
  const TestCertificates a = Certs("tls", "node-a");
  const TestCertificates b = Certs("tls", "node-b");
  const TestCertificates c = Certs("tls", "node-c");        // a node, but not node A
  const TestCertificates rogue = Certs("rogue", "node-a");  // node A's name, another CA
  a_ = StartNode("node-a", PeerTlsConfig(a), &a_addr_);
  b_ = StartNode("node-b", PeerTlsConfig(b), &b_addr_);
  ASSERT_NO_FATAL_FAILURE(Connect());
  v1::SoftnicResults r;

  // No certificate at all: plaintext, and TLS without a client certificate.
  for (const auto& creds :
       {grpc::InsecureChannelCredentials(), TlsAs(b.ca_file, TestCertificates{})}) {
    EXPECT_FALSE(Execute(PeerChannelTo(b_addr_, creds, "node-b"), ForgedWrite(), &r).ok());
    EXPECT_FALSE(Execute(PeerChannelTo(b_addr_, creds, "node-b"), ForgedRead(), &r).ok());
  }
  ExpectMemoryUnchanged("calls without a certificate");

  // Another CA's certificate naming node A: the handshake fails.
  auto rogue_channel = PeerChannelTo(b_addr_, TlsAs(b.ca_file, rogue), "node-b");
  EXPECT_FALSE(Execute(rogue_channel, ForgedWrite(), &r).ok());
  EXPECT_FALSE(Execute(rogue_channel, ForgedRead(), &r).ok());
  ExpectMemoryUnchanged("calls with another CA's certificate");

  // Node C's certificate (the cluster's CA) claiming node A.
  auto c_channel = PeerChannelTo(b_addr_, TlsAs(b.ca_file, c), "node-b");
  grpc::Status s = Execute(c_channel, ForgedWrite(), &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("DNS:node-c"), std::string::npos) << s.error_message();
  EXPECT_EQ(Execute(c_channel, ForgedRead(), &r).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(OfferAsNodeA(c_channel).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  ExpectMemoryUnchanged("calls with node C's certificate claiming node A");

  // Node A's own certificate, without the connection's secret: what a
  // process on node A that reused the QPN, or anyone who read etcd and
  // holds node A's key, would send. The engine drops it.
  auto a_channel = PeerChannelTo(b_addr_, TlsAs(b.ca_file, a), "node-b");
  for (const std::string& guess : {std::string(), std::string(16, '\0'), std::string(16, 'k')}) {
    ExpectDroppedByTheEngine(Execute(a_channel, ForgedWrite(guess), &r), r);
    ExpectDroppedByTheEngine(Execute(a_channel, ForgedRead(guess), &r), r);
  }
  // Nor can it take over the connection by offering a secret of its own,
  // nor offer for a QP of another user (a process of uid 4242 on node A
  // whose QP would talk to root's QP on node B).
  const grpc::Status o = OfferAsNodeA(a_channel);
  EXPECT_EQ(o.error_code(), grpc::StatusCode::ALREADY_EXISTS) << o.error_message();
  EXPECT_EQ(OfferAsNodeA(a_channel, 4242).error_code(), grpc::StatusCode::NOT_FOUND);
  ExpectDroppedByTheEngine(Execute(a_channel, ForgedWrite(std::string(16, 's')), &r), r);
  ExpectMemoryUnchanged("calls with node A's certificate and no secret");

  // Node B noticed, said so, and serves on.
  // (In the order logged: the lines are read once.)
  EXPECT_NE(b_->child().WaitForLine("certificate is for DNS:node-c", 5000), "");
  EXPECT_NE(b_->child().WaitForLine("without its connection's secret", 5000), "");
  EXPECT_TRUE(b_->running());
  EXPECT_EQ(GetStatus(b_->socket()).node_id(), "node-b");
}

// Review of issue 24: OfferConnection took any certified node's word for
// the QP's owner and never asked whether that node holds a rank of the
// QP's session's groups; the QP, waiting in RESET, kept the last offer. So
// node C (a node of the cluster, but of none of the groups), or node A
// naming another of its QPs, could replace node A's real offer between it
// and node B's connect: B's QP then sent nothing (every WQE retry-exceeded
// after 2 s). Now C's offers read as a missing QP, A's others are kept
// apart, and the pair connects and carries a WRITE. The topology goes only
// to live nodes too.
TEST_F(PeerForgeryTest, NoOtherNodeCanPlantOrDisplaceTheOfferAWaitingQueuePairConnectsWith) {
  const TestCertificates a = Certs("tls", "node-a");
  const TestCertificates b = Certs("tls", "node-b");
  const TestCertificates c = Certs("tls", "node-c");  // of the cluster's CA, never started
  a_ = StartNode("node-a", PeerTlsConfig(a), &a_addr_);
  b_ = StartNode("node-b", PeerTlsConfig(b), &b_addr_);
  a_side_.Open(a_->socket());
  b_side_.Open(b_->socket());
  a_side_.RegisterTarget();
  b_side_.RegisterTarget();
  JoinBoth();
  // Node A connects first: its offer waits on B's QP, still in RESET.
  grpc::Status s = a_side_.ConnectWhenSeen("node-b", b_side_.qpn);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto offer = [&](const TestCertificates& as, const std::string& node, uint32_t from_qpn) {
    grpc::ClientContext ctx;
    Deadline(&ctx, 10000);
    v1::OfferConnectionRequest req;
    req.set_node_id(node);
    req.set_qpn(from_qpn);
    req.set_peer_qpn(b_side_.qpn);
    req.set_secret(std::string(16, 'z'));
    req.set_uid(::getuid());
    req.mutable_endpoint()->set_provider("softnic");
    v1::OfferConnectionResponse resp;
    const grpc::Status st =
        v1::Peer::NewStub(PeerChannelTo(b_addr_, TlsAs(b.ca_file, as), "node-b"))
            ->OfferConnection(&ctx, req, &resp);
    EXPECT_EQ(resp.endpoint().ByteSizeLong() == 0, !st.ok()) << "an endpoint with a refusal";
    return st;
  };
  // Node C: as if B's QP did not exist (and after the wait for its rank).
  s = offer(c, "node-c", a_side_.qpn);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  // Node A naming other QPs of its own: kept apart, displacing nothing
  // (up to softnic's kOffersPerNode, 4, a node's own: past that, its
  // oldest goes, which only a process of the QP's owner could cause).
  for (uint32_t other = 1; other <= 3; ++other) {
    s = offer(a, "node-a", a_side_.qpn + other);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  s = b_side_.ConnectWhenSeen("node-a", a_side_.qpn);
  ASSERT_TRUE(s.ok()) << s.error_message();
  // B's QP sends with A's real offer: a WRITE lands.
  std::memset(a_side_.memory, 0, kRegionBytes);
  device::mlx5::Cqe64 cqe;
  ASSERT_TRUE(PostWriteAndWait(b_side_, a_side_.rkey, kRegionBytes, 20, &cqe));
  EXPECT_EQ(device::mlx5::cqe_opcode(cqe.op_own), device::mlx5::kCqeReq)
      << "syndrome " << int(reinterpret_cast<const uint8_t*>(&cqe)[device::mlx5::kCqeSyndromeByte]);
  EXPECT_EQ(std::memcmp(a_side_.memory, b_side_.memory, kRegionBytes), 0);

  // The topology: node A (live) reads it; node C's certificate does not.
  for (const auto& [as, node, code] :
       {std::tuple{a, "node-a", grpc::StatusCode::OK},
        std::tuple{c, "node-c", grpc::StatusCode::PERMISSION_DENIED}}) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::GetPeerTopologyRequest req;
    req.set_node_id(node);
    v1::Topology topo;
    s = v1::Peer::NewStub(PeerChannelTo(b_addr_, TlsAs(b.ca_file, as), "node-b"))
            ->GetPeerTopology(&ctx, req, &topo);
    EXPECT_EQ(s.error_code(), code) << node << ": " << s.error_message();
  }
  EXPECT_TRUE(b_->running());
}

// Issue 23 item 6: a queue pair goes only to a node where a group of the
// caller has a live rank; any other name is refused before anything is
// dialled (no PeerHello, no channel, no link thread per made-up name).
TEST_F(PeerForgeryTest, QueuePairsGoOnlyToNodesOfTheCallersGroups) {
  a_ = StartNode("node-a", PeerTlsConfig(Certs("tls", "node-a")), &a_addr_);
  b_ = StartNode("node-b", PeerTlsConfig(Certs("tls", "node-b")), &b_addr_);
  ASSERT_NO_FATAL_FAILURE(Connect());
  // A session of the same uid on node B that joined nothing.
  Side loner;
  loner.Open(b_->socket());
  grpc::Status s = loner.Connect("node-a", a_side_.qpn);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("no group of this session"), std::string::npos)
      << s.error_message();
  // A group member naming nodes its groups do not span: refused alike,
  // however many names.
  const uint32_t fresh = b_side_.NewQp();
  const int threads_before = Threads(b_->child().pid());
  for (int i = 0; i < 200; ++i) {
    Side& member = b_side_;
    v1::ConnectQueuePairsRequest req;
    v1::QueuePairConnection* c = req.add_connections();
    c->set_qpn(fresh);
    c->set_remote_qpn(7);
    c->set_remote_node("made-up-" + std::to_string(i));
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::ConnectQueuePairsResponse resp;
    grpc::Status e = member.rdma->ConnectQueuePairs(&ctx, req, &resp);
    ASSERT_EQ(e.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << e.error_message();
    ASSERT_NE(e.error_message().find("no group of this session"), std::string::npos)
        << e.error_message();
  }
  // Nothing was dialled for them: no thread per name (gRPC's own pollers
  // may come and go by one or two).
  const int threads_after = Threads(b_->child().pid());
  std::printf("[ figures ] 200 made-up node names: daemon threads %d before, %d after\n",
              threads_before, threads_after);
  EXPECT_LE(threads_after, threads_before + 2);
  EXPECT_TRUE(b_->running());
}

// Issue 23 item 2: a member's RDMA endpoint (raddr, rkey, QPNs) never goes
// through etcd. Its node serves it over the peer port, under mTLS, only to
// a node holding a live rank of the same group (proving the group's secret
// when it has one).
TEST_F(PeerForgeryTest, EndpointsTravelOnlyOverThePeerPortToNodesOfTheGroup) {
  const TestCertificates a = Certs("tls", "node-a");
  const TestCertificates b = Certs("tls", "node-b");
  const TestCertificates c = Certs("tls", "node-c");
  a_ = StartNode("node-a", PeerTlsConfig(a), &a_addr_);
  b_ = StartNode("node-b", PeerTlsConfig(b), &b_addr_);
  a_side_.Open(a_->socket());
  b_side_.Open(b_->socket());
  b_side_.RegisterTarget();
  v1::JoinGroupResponse a_view, b_view;
  grpc::Status a_joined;
  std::thread join_a([&] { a_joined = a_side_.Join("target", 0, &a_view, /*rdma=*/true); });
  const grpc::Status b_joined = b_side_.Join("target", 1, &b_view, /*rdma=*/true);
  join_a.join();
  ASSERT_TRUE(a_joined.ok()) << a_joined.error_message();
  ASSERT_TRUE(b_joined.ok()) << b_joined.error_message();
  // Each side's view carries the other's endpoint, fetched from its node.
  ASSERT_EQ(a_view.members_size(), 2);
  EXPECT_EQ(a_view.members(1).rdma().rkey(), b_side_.rkey);
  EXPECT_EQ(a_view.members(1).rdma().raddr(), kIova);
  EXPECT_EQ(a_view.members(1).rdma().qpns(0), b_side_.qpn);
  EXPECT_EQ(b_view.members(0).rdma().qpns(1), a_side_.qpn);

  // etcd holds none of it: what anyone who reads the prefix sees.
  absl::StatusOr<std::unique_ptr<daemon::etcd::EtcdClient>> etcd = ConnectEtcd(etcd_.client_url());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  absl::StatusOr<daemon::etcd::RangeResult> all = (*etcd)->GetPrefix("/forgery/groups/");
  ASSERT_TRUE(all.ok()) << all.status();
  int records = 0;
  for (const daemon::etcd::KeyValue& kv : all->kvs) {
    if (kv.key.find("/ranks/") == std::string::npos) continue;
    ++records;
    EXPECT_NE(kv.value.find("rdma_generation"), std::string::npos) << kv.value;
    for (const std::string& secret : {std::string("rkey"), std::string("raddr"),
                                      std::string("qpns"), absl::StrCat(b_side_.rkey)}) {
      EXPECT_EQ(kv.value.find(secret), std::string::npos) << secret << " in " << kv.value;
    }
  }
  EXPECT_EQ(records, 2);

  auto fetch = [&](const TestCertificates& as, const std::string& claimed,
                   v1::FetchRankEndpointsResponse* resp) {
    grpc::ClientContext ctx;
    Deadline(&ctx, 3000);
    v1::FetchRankEndpointsRequest req;
    req.set_node_id(claimed);
    req.set_uid(::getuid());
    req.set_group("target");
    req.add_ranks(1);
    return v1::Peer::NewStub(PeerChannelTo(b_addr_, TlsAs(b.ca_file, as), "node-b"))
        ->FetchRankEndpoints(&ctx, req, resp);
  };
  v1::FetchRankEndpointsResponse resp;
  // A node of the cluster that is not in the group.
  grpc::Status s = fetch(c, "node-c", &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(resp.endpoints_size(), 0);
  // Nor as the member it is not.
  s = fetch(c, "node-a", &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  // Without a certificate: no handshake.
  {
    grpc::ClientContext ctx;
    Deadline(&ctx, 3000);
    v1::FetchRankEndpointsRequest req;
    req.set_node_id("node-a");
    req.set_group("target");
    req.add_ranks(1);
    EXPECT_FALSE(
        v1::Peer::NewStub(PeerChannelTo(b_addr_, TlsAs(b.ca_file, TestCertificates{}), "node-b"))
            ->FetchRankEndpoints(&ctx, req, &resp)
            .ok());
  }
  // The member's node gets it.
  s = fetch(a, "node-a", &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.endpoints_size(), 1);
  EXPECT_EQ(resp.endpoints(0).rdma().rkey(), b_side_.rkey);
  EXPECT_NE(b_->child().WaitForLine("refused FetchRankEndpoints", 5000), "");

  // With a group secret, a record in etcd naming node C (written by anyone
  // who can write the prefix) does not make node C a member: it cannot
  // prove the secret.
  const std::string secret(32, 'q');
  Side a2, b2;
  a2.Open(a_->socket());
  b2.Open(b_->socket());
  b2.RegisterTarget();
  std::thread wait_a([&] { (void)a2.Join("vault", 0, nullptr, true, 3, secret, 6000); });
  std::thread wait_b([&] { (void)b2.Join("vault", 1, nullptr, true, 3, secret, 6000); });
  const std::string forged_key = absl::StrCat("/forgery/groups/", ::getuid(), "/vault/ranks/2");
  ASSERT_TRUE((*etcd)
                  ->Put(forged_key, R"({"node_id":"node-c","pid":1,"world_size":3,)"
                                    R"("gpu_index":-1,"rdma_generation":"1"})")
                  .ok());
  grpc::Status vault;
  for (int i = 0; i < 50; ++i) {  // until B's rank of "vault" is claimed
    grpc::ClientContext ctx;
    Deadline(&ctx, 3000);
    v1::FetchRankEndpointsRequest req;
    req.set_node_id("node-c");
    req.set_uid(::getuid());
    req.set_group("vault");
    req.add_ranks(1);
    vault = v1::Peer::NewStub(PeerChannelTo(b_addr_, TlsAs(b.ca_file, c), "node-b"))
                ->FetchRankEndpoints(&ctx, req, &resp);
    if (vault.error_code() != grpc::StatusCode::NOT_FOUND) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(vault.error_code(), grpc::StatusCode::PERMISSION_DENIED) << vault.error_message();
  EXPECT_NE(vault.error_message().find("secret"), std::string::npos) << vault.error_message();
  wait_a.join();
  wait_b.join();
  (void)(*etcd)->Delete(forged_key);
  EXPECT_TRUE(b_->running());
}

// Issue 23 item 6: a 2 GiB WRITE from node A's QP to node B streams across
// batches (8 MiB at a time) instead of being copied whole into the heap:
// the heap of either daemon (RssAnon: the application's memfd pages the
// daemons map are the application's, RssShmem) grows by at most 64 MiB
// while it runs, and the data lands whole with one CQE.
TEST_F(PeerForgeryTest, ATwoGibCrossNodeWriteStreamsWithinBoundedDaemonMemory) {
  a_ = StartNode("node-a", PeerTlsConfig(Certs("tls", "node-a")), &a_addr_);
  b_ = StartNode("node-b", PeerTlsConfig(Certs("tls", "node-b")), &b_addr_);
  constexpr uint64_t kLong = (uint64_t{2} << 30) - 4096;  // the WQE's byte count is 31 bits
  a_side_.Open(a_->socket());
  b_side_.Open(b_->socket());
  a_side_.RegisterTarget(kLong);
  b_side_.RegisterTarget(kLong);
  std::memset(b_side_.memory, 0x11, kLong);
  JoinBoth();
  ASSERT_TRUE(b_side_.ConnectWhenSeen("node-a", a_side_.qpn).ok());
  ASSERT_TRUE(a_side_.ConnectWhenSeen("node-b", b_side_.qpn).ok());
  const long heap_a = StatusField(a_->child().pid(), "RssAnon");
  const long heap_b = StatusField(b_->child().pid(), "RssAnon");
  long peak_a = heap_a, peak_b = heap_b;
  const auto start = std::chrono::steady_clock::now();
  device::mlx5::Cqe64 cqe_copy;
  const bool done = PostWriteAndWait(a_side_, b_side_.rkey, kLong, 120, &cqe_copy, [&] {
    peak_a = std::max(peak_a, StatusField(a_->child().pid(), "RssAnon"));
    peak_b = std::max(peak_b, StatusField(b_->child().pid(), "RssAnon"));
  });
  const device::mlx5::Cqe64* cqe = &cqe_copy;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(done) << "no CQE within 120 s";
  EXPECT_EQ(device::mlx5::cqe_opcode(cqe->op_own), device::mlx5::kCqeReq);
  EXPECT_EQ(device::mlx5::be32(cqe->byte_cnt_be), kLong);
  EXPECT_EQ(std::memcmp(a_side_.memory, b_side_.memory, kLong), 0);
  std::printf(
      "[ figures ] 2 GiB cross-node WRITE in %.2f s (%.0f MiB/s); daemon heap (RssAnon) growth: "
      "requester %ld KiB, responder %ld KiB\n",
      secs, kLong / secs / (1 << 20), peak_a - heap_a, peak_b - heap_b);
  EXPECT_LE(peak_a - heap_a, 64 * 1024);
  EXPECT_LE(peak_b - heap_b, 64 * 1024);
}

// Issue 23 item 5: memory the daemon touches is charged to whoever faults
// it in, so it never faults in an application's page. A 2 GiB memfd never
// written is refused at registration (before: accepted, and every write into
// it grew the daemon's cgroup); pages punched out after registration
// (F_SEAL_WRITE is not required, so a client may) fail the WRITE that
// reaches them instead of being faulted in. Measured by the daemon's
// RssShmem (the test shares its cgroup, so memory.stat cannot tell them
// apart) and by the holes still being holes.
TEST_F(PeerForgeryTest, TheDaemonFaultsInNoPageOfAnApplicationsRegion) {
  b_ = StartNode("node-b", PeerTlsConfig(Certs("tls", "node-b")), &b_addr_);
  const pid_t daemon = b_->child().pid();
  Side src, dst;
  src.Open(b_->socket());
  dst.Open(b_->socket());
  const long shmem_before = StatusField(daemon, "RssShmem");
  {
    // Never written: refused, naming the first hole.
    UniqueFd fd(::memfd_create("untouched", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    ASSERT_EQ(::ftruncate(fd.get(), int64_t{2} << 30), 0);
    ASSERT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    absl::StatusOr<std::string> ticket =
        abuse::PutFd(dst.fdconn.get(), dst.session->opened, fd.get());
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    v1::RegisterMemoryRequest req;
    req.set_fd_ticket(*ticket);
    req.set_kind("memfd");
    req.set_iova(kIova);
    req.set_length(uint64_t{2} << 30);
    req.set_remote_write(true);
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::RegisterMemoryResponse resp;
    const grpc::Status s = dst.rdma->RegisterMemory(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_NE(s.error_message().find("hold no memory"), std::string::npos) << s.error_message();
  }
  constexpr uint64_t kBytes = 64u << 20;
  constexpr uint64_t kKept = 4u << 20;  // the rest is punched out after registration
  src.RegisterTarget(kBytes);
  dst.RegisterTarget(kBytes);
  ASSERT_EQ(::fallocate(dst.region.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, kKept,
                        kBytes - kKept),
            0);
  ASSERT_TRUE(src.Connect("", dst.qpn).ok());
  ASSERT_TRUE(dst.Connect("", src.qpn).ok());
  const long shmem_registered = StatusField(daemon, "RssShmem");
  auto allocated = [&] {
    struct stat st {};
    EXPECT_EQ(::fstat(dst.region.get(), &st), 0);
    return static_cast<uint64_t>(st.st_blocks) * 512;
  };
  const uint64_t allocated_before = allocated();
  EXPECT_EQ(allocated_before, kKept);
  device::mlx5::Cqe64 cqe;
  ASSERT_TRUE(PostWriteAndWait(src, dst.rkey, kBytes, 30, &cqe));
  EXPECT_EQ(device::mlx5::cqe_opcode(cqe.op_own), device::mlx5::kCqeReqErr)
      << "a WRITE into punched-out pages completed";
  const long shmem_after = StatusField(daemon, "RssShmem");
  // The holes are still holes: nothing was faulted in past the kept part.
  errno = 0;
  EXPECT_EQ(::lseek(dst.region.get(), static_cast<off_t>(kKept), SEEK_DATA), -1);
  EXPECT_EQ(errno, ENXIO);
  // No page was allocated in the target (each would have been charged to
  // the daemon's cgroup): what the daemon maps is the application's own.
  EXPECT_EQ(allocated(), allocated_before);
  std::printf(
      "[ figures ] target memfd allocated: %" PRIu64 " KiB before, %" PRIu64
      " KiB after a 64 MiB WRITE into 60 MiB of holes; daemon RssShmem %ld KiB before, %ld KiB "
      "with the regions, %ld KiB after (the application's pages it touched: the kept 4 MiB and "
      "the source's first piece)\n",
      allocated_before >> 10, allocated() >> 10, shmem_before, shmem_registered, shmem_after);
  EXPECT_LE(shmem_after - shmem_registered, 16 * 1024);
  EXPECT_TRUE(b_->running());
}

// Issue 23 item 8: the peer port under a fuzzer, with every credential an
// outsider may hold: plaintext, TLS without a certificate, another CA's
// certificate for node A, node C's certificate (the cluster's CA) claiming
// node A, and node A's own certificate without the connection's secret.
// Every method gets mutated requests (real and random node names, QPNs,
// keys, addresses, secrets, kinds, sizes) and requests parsed from random
// bytes. The target region is compared byte for byte after all of them,
// nothing is fetched from it, and the daemon keeps serving.
TEST_F(PeerForgeryTest, ThePeerPortFuzzedWithEveryOutsidersCredentialChangesNothing) {
  const TestCertificates a = Certs("tls", "node-a");
  const TestCertificates b = Certs("tls", "node-b");
  const TestCertificates c = Certs("tls", "node-c");
  const TestCertificates rogue = Certs("rogue", "node-a");
  a_ = StartNode("node-a", PeerTlsConfig(a), &a_addr_);
  b_ = StartNode("node-b", PeerTlsConfig(b), &b_addr_);
  ASSERT_NO_FATAL_FAILURE(Connect());
  struct Credential {
    const char* name;
    std::shared_ptr<grpc::Channel> channel;
  };
  const std::vector<Credential> credentials = {
      {"plaintext", PeerChannelTo(b_addr_, grpc::InsecureChannelCredentials())},
      {"no certificate", PeerChannelTo(b_addr_, TlsAs(b.ca_file, TestCertificates{}), "node-b")},
      {"another CA", PeerChannelTo(b_addr_, TlsAs(b.ca_file, rogue), "node-b")},
      {"node C", PeerChannelTo(b_addr_, TlsAs(b.ca_file, c), "node-b")},
      {"node A without the secret", PeerChannelTo(b_addr_, TlsAs(b.ca_file, a), "node-b")},
  };
  std::mt19937_64 rng(20261204);
  auto pick = [&](auto... options) {
    const std::array<std::common_type_t<decltype(options)...>, sizeof...(options)> all = {
        options...};
    return all[rng() % all.size()];
  };
  auto random_bytes = [&](size_t max) {
    std::string out(rng() % (max + 1), '\0');
    for (char& ch : out) ch = static_cast<char>(rng());
    return out;
  };
  auto node_name = [&]() -> std::string {
    return pick(std::string("node-a"), std::string("node-b"), std::string("node-c"),
                std::string(""), std::string(300, 'n'), random_bytes(40));
  };
  auto qpn = [&]() -> uint32_t {
    return pick(a_side_.qpn, b_side_.qpn, uint32_t{0}, uint32_t{0xffffff},
                static_cast<uint32_t>(rng()));
  };
  auto secret = [&]() -> std::string {
    return pick(std::string(), std::string(16, '\0'), std::string(16, 's'), random_bytes(64));
  };
  std::map<std::string, std::map<int, int>> outcomes;  // credential -> code -> count
  int fetched_nonzero = 0;
  int endpoints_to_a = 0;  // the member's own fetches that named the group right
  constexpr int kRounds = 300;
  for (int round = 0; round < kRounds; ++round) {
    for (const Credential& cred : credentials) {
      auto stub = v1::Peer::NewStub(cred.channel);
      grpc::ClientContext ctx;
      Deadline(&ctx, 2000);
      grpc::Status st;
      const bool parsed = rng() % 4 == 0;  // from random bytes instead
      switch (rng() % 5) {
        case 0: {
          v1::SoftnicBatch req = rng() % 2 ? ForgedWrite(secret()) : ForgedRead(secret());
          if (parsed) (void)req.ParseFromString(random_bytes(512));
          if (rng() % 2) req.set_requester_node(node_name());
          if (rng() % 2) req.set_requester_qpn(qpn());
          for (int i = 0, n = static_cast<int>(rng() % 4); i < n; ++i) {
            v1::SoftnicOp* op = req.add_ops();
            op->set_kind(static_cast<v1::SoftnicOp::Kind>(rng() % 5));
            op->set_responder_qpn(qpn());
            op->set_raddr(pick(kIova, kIova + kRegionBytes - 8, kIova - 8, uint64_t{rng()}));
            op->set_rkey(
                pick(b_side_.rkey, b_side_.rkey + 1, uint32_t{0}, static_cast<uint32_t>(rng())));
            op->set_data(random_bytes(pick(size_t{0}, size_t{64}, size_t{70000})));
            op->set_add(rng());
            op->set_field_boundary(static_cast<uint32_t>(rng()));
          }
          v1::SoftnicResults resp;
          st = stub->SoftnicExecute(&ctx, req, &resp);
          for (const v1::SoftnicResult& r : resp.results()) fetched_nonzero += r.fetched() != 0;
          break;
        }
        case 1: {
          v1::OfferConnectionRequest req;
          if (parsed) (void)req.ParseFromString(random_bytes(256));
          req.set_node_id(node_name());
          req.set_qpn(qpn());
          req.set_peer_qpn(qpn());
          req.set_secret(secret());
          req.set_uid(pick(0u, 4242u, static_cast<uint32_t>(rng())));
          req.set_tenant(pick(std::string(), std::string("team-a"), random_bytes(80)));
          v1::OfferConnectionResponse resp;
          st = stub->OfferConnection(&ctx, req, &resp);
          break;
        }
        case 2: {
          v1::FetchRankEndpointsRequest req;
          if (parsed) (void)req.ParseFromString(random_bytes(256));
          req.set_node_id(node_name());
          req.set_uid(pick(0u, static_cast<uint32_t>(::getuid()), static_cast<uint32_t>(rng())));
          req.set_group(pick(std::string("target"), std::string(), random_bytes(200)));
          for (int i = 0, n = static_cast<int>(rng() % 6); i < n; ++i) {
            req.add_ranks(pick(0u, 1u, static_cast<uint32_t>(rng())));
          }
          v1::FetchRankEndpointsResponse resp;
          st = stub->FetchRankEndpoints(&ctx, req, &resp);
          // Node B's rank 1 of "target" has an endpoint; only node A (a
          // member) may have it.
          if (std::string(cred.name) != "node A without the secret") {
            EXPECT_EQ(resp.endpoints_size(), 0) << cred.name;
          } else {
            endpoints_to_a += resp.endpoints_size();
          }
          break;
        }
        case 3: {
          v1::PeerHelloRequest req;
          if (parsed) (void)req.ParseFromString(random_bytes(256));
          req.set_node_id(node_name());
          req.set_protocol_version(pick(0u, 1u, static_cast<uint32_t>(rng())));
          v1::PeerHelloResponse resp;
          st = stub->PeerHello(&ctx, req, &resp);
          break;
        }
        default: {
          v1::GetPeerTopologyRequest req;
          if (parsed) (void)req.ParseFromString(random_bytes(128));
          if (rng() % 4 != 0) req.set_node_id(node_name());
          v1::Topology resp;
          st = stub->GetPeerTopology(&ctx, req, &resp);
          // Node C (not live) and outsiders read nothing; node A (live,
          // named by its certificate) may.
          if (std::string(cred.name) != "node A without the secret") {
            EXPECT_EQ(resp.ByteSizeLong(), 0u) << cred.name;
          }
          break;
        }
      }
      ++outcomes[cred.name][st.error_code()];
    }
  }
  ExpectMemoryUnchanged("the fuzzer");
  EXPECT_EQ(fetched_nonzero, 0) << "an atomic read the target's memory";
  std::printf("[ figures ] endpoints handed to node A (a member) by well-formed fetches: %d\n",
              endpoints_to_a);
  for (const auto& [name, codes] : outcomes) {
    std::string line = absl::StrCat("[ figures ] fuzzed as ", name, ":");
    for (const auto& [code, count] : codes) absl::StrAppend(&line, " code ", code, " x", count);
    std::printf("%s\n", line.c_str());
  }
  EXPECT_TRUE(b_->running());
  EXPECT_EQ(GetStatus(b_->socket()).node_id(), "node-b");
}

TEST_F(PeerForgeryTest, WithPeerInsecureTheConnectionSecretAloneStopsTheForgery) {
  // Kept on purpose without certificates (an isolated test network): the
  // daemon believes any claimed name, so the secret is the whole defence.
  a_ = StartNode("node-a", "peer_insecure = true\n", &a_addr_);
  b_ = StartNode("node-b", "peer_insecure = true\n", &b_addr_);
  EXPECT_NE(b_->child().WaitForLine("INSECURE", 5000), "") << "no loud warning at start";
  ASSERT_NO_FATAL_FAILURE(Connect());
  auto plain = grpc::CreateChannel(b_addr_, grpc::InsecureChannelCredentials());
  v1::SoftnicResults r;
  for (const std::string& guess : {std::string(), std::string(16, 'k')}) {
    ExpectDroppedByTheEngine(Execute(plain, ForgedWrite(guess), &r), r);
    ExpectDroppedByTheEngine(Execute(plain, ForgedRead(guess), &r), r);
  }
  ExpectMemoryUnchanged("plaintext calls without the secret");
  EXPECT_NE(b_->child().WaitForLine("without its connection's secret", 5000), "");
  EXPECT_TRUE(b_->running());
}

TEST_F(PeerForgeryTest, WithoutTlsTheApplicationCannotConnectAcrossNodesNorAnyoneForge) {
  // The default before this issue: no peer_tls_* files, no peer_insecure.
  a_ = StartNode("node-a", "", &a_addr_);
  b_ = StartNode("node-b", "", &b_addr_);
  a_side_.Open(a_->socket());
  b_side_.Open(b_->socket());
  b_side_.RegisterTarget();
  JoinBoth();  // membership works without TLS
  snapshot_.assign(reinterpret_cast<const char*>(b_side_.memory), kRegionBytes);
  grpc::Status s = b_side_.ConnectWhenSeen("node-a", a_side_.qpn);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("peer_tls_ca_file"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("peer_insecure"), std::string::npos) << s.error_message();

  auto plain = grpc::CreateChannel(b_addr_, grpc::InsecureChannelCredentials());
  v1::SoftnicResults r;
  s = Execute(plain, ForgedWrite(), &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(Execute(plain, ForgedRead(), &r).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  ExpectMemoryUnchanged("plaintext calls to a port without TLS");
  EXPECT_NE(b_->child().WaitForLine("TLS required", 5000), "");
  EXPECT_TRUE(b_->running());
}

}  // namespace
}  // namespace mooncake::testing
