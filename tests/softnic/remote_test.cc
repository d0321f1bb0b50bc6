// softnic across nodes at the engine level (issue 9 item 5): two engines in
// one process stand for two nodes, and a loopback RemoteLink carries the
// requester's batches to the other engine's ExecuteForPeer on a thread of
// its own, as the peer port does. The contract is the local one: data and
// atomics land, CQEs come in order with the same syndromes, an error flushes
// what follows, and an unreachable or unconnected peer reads
// TRANSPORT_RETRY_EXC_ERR. Each connection's secret (issue 23) is offered
// as the peer port would (AcceptConnectionSecret): a batch without it
// changes nothing, and an offer cannot replace a connection's. (The peer
// port itself runs in tests/integration/cluster_groups_test.cc and
// peer_forgery_test.cc.)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "fake_gpu.h"
#include "populated_memfd.h"
#include "raw_qp.h"
#include "softnic/cuda_memory.h"
#include "softnic/engine.h"
#include "softnic/remote_link.h"

namespace mooncake::softnic {
namespace {

using test_util::CqeBytes;
using test_util::CqeOpcode;
using test_util::CqeSyndrome;
using test_util::FindQp;
using test_util::RawQp;
namespace mlx5 = ::mooncake::device::mlx5;

// Delivers batches to `peer` as node `self`, one at a time, on its own
// thread; `down` makes it fail them as an unreachable node would; while
// Pause(true) it holds them (a slow network), Pause(false) lets them go.
class LoopbackLink final : public RemoteLink {
 public:
  LoopbackLink(Engine* peer, std::string self)
      : peer_(peer), self_(std::move(self)), thread_([this] { Serve(); }) {}
  ~LoopbackLink() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void Send(RemoteBatch batch, RemoteDone done) override {
    ++sent;
    absl::MutexLock lock(&mu_);
    jobs_.emplace_back(std::move(batch), std::move(done));
  }
  void Pause(bool paused) {
    absl::MutexLock lock(&mu_);
    paused_ = paused;
  }
  std::atomic<bool> down{false};
  std::atomic<int> sent{0};                  // batches handed to Send
  std::atomic<int> batches{0};               // batches delivered
  std::atomic<uint64_t> max_batch_bytes{0};  // payload of the largest batch

 private:
  void Serve() {
    while (true) {
      std::pair<RemoteBatch, RemoteDone> job;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || (!jobs_.empty() && !paused_);
        };
        mu_.Await(absl::Condition(&ready));
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      ++batches;
      uint64_t payload = 0;
      for (const RemoteOp& op : job.first.ops) payload += op.data.size();
      if (payload > max_batch_bytes) max_batch_bytes = payload;
      if (down) {
        job.second(absl::UnavailableError("node-b unreachable"));
        continue;
      }
      std::vector<ResponderResult> out;
      for (const RemoteOp& op : job.first.ops) {
        ResponderOp r;
        r.kind = op.kind;
        r.remote_qpn = op.responder_qpn;
        r.raddr = op.raddr;
        r.rkey = op.rkey;
        r.source = ByteSpan{MemoryKind::kHost, reinterpret_cast<uintptr_t>(op.data.data()),
                            op.data.size()};
        r.add = op.add;
        r.field_boundary = op.field_boundary;
        out.push_back(peer_->ExecuteForPeer(self_, job.first.requester_qpn, job.first.secret, r));
        if (out.back().syndrome != 0) break;
      }
      job.second(std::move(out));
    }
  }

  Engine* const peer_;
  const std::string self_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::pair<RemoteBatch, RemoteDone>> jobs_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

constexpr uint8_t kUpd = mlx5::kCtrlCqUpdate;

std::string Secret(char fill) { return std::string(Engine::kSecretBytes, fill); }

// Connects `qpn` of `e` (node `self`) to `peer_qpn` of `peer` (node
// `peer_node`) as two daemons do: `e` makes the secret it expects and
// offers it to `peer`.
absl::Status ConnectAndOffer(Engine& e, PdId pd, uint32_t qpn, const std::string& self,
                             Engine& peer, const std::string& peer_node, uint32_t peer_qpn,
                             char fill) {
  absl::Status offered = peer.AcceptConnectionSecret(self, qpn, peer_qpn, Secret(fill));
  if (!offered.ok()) return offered;
  return e.ConnectRemote(pd, qpn, peer_node, peer_qpn, Secret(fill));
}
constexpr uint64_t kBytes = 24u << 20;

class RemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = SharedMapping::Anonymous(kBytes);
    auto b = SharedMapping::Anonymous(kBytes);
    ASSERT_TRUE(a.ok() && b.ok());
    mem_a_ = *a;
    mem_b_ = *b;
    for (uint64_t i = 0; i < kBytes; ++i) mem_a_->data()[i] = static_cast<uint8_t>(i * 7 + 3);
    std::memset(mem_b_->data(), 0, kBytes);
    key_a_ = Register(a_, 1, mem_a_, kLocalWrite);
    key_b_ = Register(b_, 2, mem_b_, kRemoteWrite | kRemoteAtomic);
    link_ = std::make_shared<LoopbackLink>(&b_, "node-a");
    a_.SetRemoteLink(link_);
    b_.SetRemoteLink(std::make_shared<LoopbackLink>(&a_, "node-b"));
    requester_ = RawQp::Create(a_, 1, 64, 64);
    responder_ = RawQp::Create(b_, 2, 4, 4);
    ASSERT_NE(requester_, nullptr);
    ASSERT_NE(responder_, nullptr);
    ASSERT_TRUE(
        ConnectAndOffer(a_, 1, requester_->qpn(), "node-a", b_, "node-b", responder_->qpn(), 'a')
            .ok());
    ASSERT_TRUE(
        ConnectAndOffer(b_, 2, responder_->qpn(), "node-b", a_, "node-a", requester_->qpn(), 'b')
            .ok());
    a_.Start();
    b_.Start();
  }
  void TearDown() override {
    a_.Stop();
    b_.Stop();
    a_.SetRemoteLink(nullptr);
    b_.SetRemoteLink(nullptr);
  }
  static uint32_t Register(Engine& e, PdId pd, std::shared_ptr<SharedMapping> m, uint32_t access) {
    RegionSpec spec;
    spec.pd = pd;
    spec.iova = kIova;
    spec.length = kBytes;
    spec.access = access;
    spec.mapping = std::move(m);
    auto key = e.RegisterRegion(spec);
    EXPECT_TRUE(key.ok()) << key.status();
    return key.value_or(0);
  }
  void Write(uint64_t off_a, uint64_t off_b, uint32_t n, uint32_t rkey = 0) {
    mlx5::Wqe64 w;
    mlx5::build_rdma_write(&w, static_cast<uint16_t>(requester_->pi()), requester_->qpn(), kUpd,
                           kIova + off_b, rkey == 0 ? key_b_ : rkey, kIova + off_a, key_a_, n);
    requester_->Write(w);
  }

  // The next `n` CQEs of the requester, each a success for WQE first, first
  // + 1, ...; stops at the first that does not come.
  std::vector<mlx5::Cqe64> SuccessesInOrder(int first, int n) {
    std::vector<mlx5::Cqe64> out;
    for (int i = first; i < first + n; ++i) {
      mlx5::Cqe64 c;
      if (!requester_->Next(&c)) {
        ADD_FAILURE() << "no CQE for WQE " << i;
        break;
      }
      EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq) << "CQE " << i << " syndrome " << int(CqeSyndrome(c));
      EXPECT_EQ(test_util::CqeCounter(c), i);
      out.push_back(c);
    }
    return out;
  }

  static constexpr uint64_t kIova = 0x10000000;
  Engine a_, b_;
  std::shared_ptr<SharedMapping> mem_a_, mem_b_;
  uint32_t key_a_ = 0, key_b_ = 0;
  std::shared_ptr<LoopbackLink> link_;
  std::unique_ptr<RawQp> requester_, responder_;
};

TEST_F(RemoteTest, WritesAndAtomicsLandOnTheOtherNodeWithCqesInOrder) {
  // A small write, a 3 MiB write (several operations on the wire) and the
  // two atomics, in one ring.
  Write(0, 0, 100);
  Write(4096, 65536, 3u << 20);
  mlx5::Wqe64 w;
  mlx5::build_atomic_fa64(&w, static_cast<uint16_t>(requester_->pi()), requester_->qpn(), kUpd,
                          kIova + 8, key_b_, 5, kIova + (6u << 20), key_a_);
  requester_->Write(w);
  mlx5::build_masked_fa32(&w, static_cast<uint16_t>(requester_->pi()), requester_->qpn(), kUpd,
                          kIova + 16, key_b_, 7, kIova + (6u << 20) + 64, key_a_);
  requester_->Write(w);
  // 100 bytes at 0 wrote bytes 8..15 and 16..19 too: remember them.
  uint64_t before64;
  std::memcpy(&before64, mem_a_->data() + 8, 8);
  uint32_t before32;
  std::memcpy(&before32, mem_a_->data() + 16, 4);
  requester_->Ring();
  const std::vector<mlx5::Cqe64> c = SuccessesInOrder(0, 4);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(CqeBytes(c[1]), 3u << 20);
  EXPECT_EQ(std::memcmp(mem_b_->data() + 20, mem_a_->data() + 20, 80), 0);
  EXPECT_EQ(std::memcmp(mem_b_->data() + 65536, mem_a_->data() + 4096, 3u << 20), 0);
  uint64_t now64;
  std::memcpy(&now64, mem_b_->data() + 8, 8);
  EXPECT_EQ(now64, before64 + 5);
  uint64_t fetched64;
  std::memcpy(&fetched64, mem_a_->data() + (6u << 20), 8);
  EXPECT_EQ(fetched64, before64);  // host order, as a ConnectX returns it
  uint32_t fetched32;
  std::memcpy(&fetched32, mem_a_->data() + (6u << 20) + 64, 4);
  EXPECT_EQ(mlx5::be32(fetched32), before32);  // big-endian (extended atomics)
  EXPECT_GE(link_->batches.load(), 1);
  EXPECT_EQ(FindQp(a_, requester_->qpn()).remote_node, "node-b");
}

// The requester's payload in GPU memory, and old values that come back into
// GPU memory: a GPU worker copies them (the engine thread never waits for
// a GPU time slice), in order with the host WQEs around them. A payload
// that cannot be read fails its own WQE only, after the WQEs before it.
TEST_F(RemoteTest, GpuPayloadsAndOldValuesIntoGpuMemoryGoThroughAGpuWorker) {
  using test_util::ClientAllocation;
  using test_util::kGran;
  drivers::FakeCudaDriver client_cu;
  client_cu.addGpu(drivers::FakeGpu::Hopper(0));
  client_cu.setGranularity(kGran);
  ASSERT_EQ(client_cu.init(0), drivers::kCudaSuccess);
  auto cu = test_util::FakeWithGpus(1);
  auto cuda = CudaMemory::Create(test_util::FakeOptions(cu));
  ClientAllocation gpu(client_cu, 49 * kGran);  // a 3 MiB WRITE: three operations on the wire
  for (uint64_t i = 0; i < gpu.size(); ++i) gpu.data()[i] = static_cast<uint8_t>(i * 13 + 1);
  auto buffer = cuda->Import(gpu.fd(), gpu.size());
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto gpu_key = a_.RegisterRegion(test_util::WholeAllocation(1, gpu, *buffer, kLocalWrite));
  ASSERT_TRUE(gpu_key.ok()) << gpu_key.status();

  // host WRITE, GPU WRITE, fetch-add with the old value into GPU memory,
  // host WRITE.
  Write(0, 0, 64);
  mlx5::Wqe64 w;
  mlx5::build_rdma_write(&w, static_cast<uint16_t>(requester_->pi()), requester_->qpn(), kUpd,
                         kIova + (8u << 20), key_b_, gpu.va(), *gpu_key, 3u << 20);
  requester_->Write(w);
  uint64_t before;
  std::memcpy(&before, mem_b_->data() + 4096, 8);
  mlx5::build_atomic_fa64(&w, static_cast<uint16_t>(requester_->pi()), requester_->qpn(), kUpd,
                          kIova + 4096, key_b_, 9, gpu.va() + (3u << 20) + 128, *gpu_key);
  requester_->Write(w);
  Write(64, 64, 64);
  requester_->Ring();
  ASSERT_EQ(SuccessesInOrder(0, 4).size(), 4u);
  mlx5::Cqe64 c;
  EXPECT_EQ(std::memcmp(mem_b_->data() + (8u << 20), gpu.data(), 3u << 20), 0) << "GPU payload";
  uint64_t now, fetched;
  std::memcpy(&now, mem_b_->data() + 4096, 8);
  std::memcpy(&fetched, gpu.data() + (3u << 20) + 128, 8);
  EXPECT_EQ(now, before + 9);
  EXPECT_EQ(fetched, before) << "the old value, into GPU memory";
  EXPECT_EQ(std::memcmp(mem_b_->data() + 64, mem_a_->data() + 64, 64), 0);
  EXPECT_GE(a_.gpu_worker_threads(), 1u);
  EXPECT_GE(cu->calls("memcpyDtoH"), 3) << "read in operation-sized pieces";

  // The GPU payload cannot be read: the host WRITE before it goes, it
  // fails alone (read again once the batch before it is answered, as a
  // local failure after other WQEs is), and what follows is flushed.
  cu->failNext("memcpyDtoH", drivers::kCudaErrorIllegalAddress, 2);
  std::memset(mem_b_->data() + 256, 0, 64);
  Write(256, 256, 64);
  mlx5::build_rdma_write(&w, static_cast<uint16_t>(requester_->pi()), requester_->qpn(), kUpd,
                         kIova + (8u << 20), key_b_, gpu.va(), *gpu_key, 4096);
  requester_->Write(w);
  Write(512, 512, 64);
  requester_->Ring();
  ASSERT_TRUE(requester_->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  ASSERT_TRUE(requester_->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndLocalProtErr);
  EXPECT_EQ(test_util::CqeCounter(c), 5);
  ASSERT_TRUE(requester_->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndWrFlushErr);
  EXPECT_EQ(std::memcmp(mem_b_->data() + 256, mem_a_->data() + 256, 64), 0);
}

// While a batch is out, nothing of the ring moves: a garbage doorbell then
// (more WQEs than the ring holds) is reported only after the batch's CQEs,
// never in the CQ room the batch holds, nor as a CQE for its first WQE.
TEST_F(RemoteTest, AGarbageDoorbellWhileABatchIsOutWaitsForTheBatch) {
  link_->Pause(true);
  Write(0, 0, 64);
  Write(64, 64, 64);
  requester_->Ring();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (link_->sent.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  requester_->RingRaw((requester_->pi() + 64 + 5) & 0xffffu);  // the ring holds 64
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  mlx5::Cqe64 c;
  EXPECT_FALSE(requester_->Peek(&c)) << "a CQE came while the batch was out";
  link_->Pause(false);
  const std::vector<mlx5::Cqe64> done = SuccessesInOrder(0, 2);
  EXPECT_EQ(done.size(), 2u);
  ASSERT_TRUE(requester_->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndLocalQpOpErr) << "the garbage doorbell, after the batch";
}

// Old values come back for a batch of atomics; the first one's host
// destination page is gone (the client punched it out), so it fails and
// the rest are flushed: the GPU worker lands nothing of theirs, though
// their old values came back.
TEST_F(RemoteTest, AFailingHostLandingFlushesTheGpuLandingsAfterIt) {
  using test_util::ClientAllocation;
  using test_util::kGran;
  drivers::FakeCudaDriver client_cu;
  client_cu.addGpu(drivers::FakeGpu::Hopper(0));
  client_cu.setGranularity(kGran);
  ASSERT_EQ(client_cu.init(0), drivers::kCudaSuccess);
  auto cuda = CudaMemory::Create(test_util::FakeOptions(test_util::FakeWithGpus(1)));
  ClientAllocation gpu(client_cu, kGran);
  std::memset(gpu.data(), 0xee, 64);
  auto buffer = cuda->Import(gpu.fd(), gpu.size());
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto gpu_key = a_.RegisterRegion(test_util::WholeAllocation(1, gpu, *buffer, kLocalWrite));
  ASSERT_TRUE(gpu_key.ok()) << gpu_key.status();
  // Populated and sealed, as a client library makes a region's memfd.
  const uint64_t page = SharedMapping::PageSize();
  absl::StatusOr<PopulatedMemfd> memfd = CreatePopulatedMemfd("fetch", page, "fetch buffer");
  ASSERT_TRUE(memfd.ok()) << memfd.status();
  absl::Cleanup unmap = [&] { ::munmap(memfd->data, page); };
  const int fd = memfd->fd.get();
  auto mapping = SharedMapping::FromPopulatedMemfd(fd, 0, page);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  RegionSpec spec;
  spec.pd = 1;
  spec.iova = 0x7000'0000'0000;
  spec.length = page;
  spec.access = kLocalWrite;
  spec.mapping = *mapping;
  auto host_key = a_.RegisterRegion(spec);
  ASSERT_TRUE(host_key.ok()) << host_key.status();

  link_->Pause(true);  // the page goes while the batch is out
  mlx5::Wqe64 w;
  mlx5::build_atomic_fa64(&w, static_cast<uint16_t>(requester_->pi()), requester_->qpn(), kUpd,
                          kIova + 4096, key_b_, 1, spec.iova, *host_key);
  requester_->Write(w);
  mlx5::build_atomic_fa64(&w, static_cast<uint16_t>(requester_->pi()), requester_->qpn(), kUpd,
                          kIova + 4104, key_b_, 1, gpu.va(), *gpu_key);
  requester_->Write(w);
  requester_->Ring();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (link_->sent.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, page), 0);
  link_->Pause(false);
  mlx5::Cqe64 c;
  ASSERT_TRUE(requester_->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndLocalProtErr);
  ASSERT_TRUE(requester_->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndWrFlushErr);
  EXPECT_EQ(gpu.data()[0], 0xee) << "a flushed WQE's old value landed in GPU memory";
}

// Issue 23 item 6: a WRITE longer than a batch streams across batches (a
// batch's worth of it read and sent at a time, never the whole in the
// heap), lands whole, and completes with one CQE for all of it, in order
// with what follows.
TEST_F(RemoteTest, ALongWriteStreamsAcrossBatchesWithOneCqe) {
  constexpr uint32_t kLong = 20u << 20;
  Write(0, 0, kLong);
  Write(kLong, kLong, 4096);
  requester_->Ring();
  mlx5::Cqe64 c;
  ASSERT_TRUE(requester_->Next(&c, std::chrono::seconds(30)));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq) << int(CqeSyndrome(c));
  EXPECT_EQ(test_util::CqeCounter(c), 0);
  EXPECT_EQ(CqeBytes(c), kLong);
  ASSERT_TRUE(requester_->Next(&c));
  EXPECT_EQ(test_util::CqeCounter(c), 1);
  EXPECT_EQ(std::memcmp(mem_b_->data(), mem_a_->data(), kLong + 4096), 0);
  EXPECT_GE(link_->batches.load(), 3);
  EXPECT_LE(link_->max_batch_bytes.load(), Engine::kMaxRemoteBatchBytes);
  EXPECT_EQ(FindQp(a_, requester_->qpn()).wqes_done, 2u);
}

TEST_F(RemoteTest, AResponderErrorCompletesWithItsSyndromeAndFlushesTheRest) {
  Write(0, 0, 64);
  Write(0, 128, 64, /*rkey=*/key_b_ ^ 0x5a5a);  // unknown there
  Write(0, 256, 64);
  requester_->Ring();
  mlx5::Cqe64 c;
  ASSERT_TRUE(requester_->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  ASSERT_TRUE(requester_->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReqErr);
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndRemoteAccessErr);
  ASSERT_TRUE(requester_->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndWrFlushErr);
  EXPECT_EQ(mem_b_->data()[256], 0) << "a WQE after the error was executed";
  EXPECT_EQ(FindQp(a_, requester_->qpn()).state, QpState::kError);
}

TEST_F(RemoteTest, AnUnreachableNodeOrAnUnconnectedResponderReadsRetryExceeded) {
  link_->down = true;
  Write(0, 0, 64);
  requester_->Ring();
  mlx5::Cqe64 c;
  ASSERT_TRUE(requester_->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndTransportRetryExcErr);

  // A second requester whose responder is connected to someone else
  // (it holds the secret it would need, but from the wrong QP).
  link_->down = false;
  auto stranger = RawQp::Create(a_, 1, 4, 4);
  ASSERT_NE(stranger, nullptr);
  ASSERT_TRUE(
      a_.AcceptConnectionSecret("node-b", responder_->qpn(), stranger->qpn(), Secret('b')).ok());
  ASSERT_TRUE(a_.ConnectRemote(1, stranger->qpn(), "node-b", responder_->qpn(), Secret('s')).ok());
  mlx5::Wqe64 w;
  mlx5::build_rdma_write(&w, 0, stranger->qpn(), kUpd, kIova, key_b_, kIova, key_a_, 64);
  stranger->Write(w);
  stranger->Ring();
  ASSERT_TRUE(stranger->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndTransportRetryExcErr);
  EXPECT_EQ(mem_b_->data()[10], 0);
}

TEST_F(RemoteTest, ABatchWithoutTheConnectionsSecretChangesNothing) {
  // What a forged SoftnicExecute carries: the right node, QPNs, rkey and
  // address, and a guessed secret (or none).
  ResponderOp op;
  op.kind = ResponderOp::Kind::kWrite;
  op.remote_qpn = responder_->qpn();
  op.raddr = kIova;
  op.rkey = key_b_;
  const std::string payload(64, 'X');
  op.source = ByteSpan{MemoryKind::kHost, reinterpret_cast<uintptr_t>(payload.data()), 64};
  // responder_ expects 'b' (what its node offered); 'a' is the other
  // direction's.
  for (const std::string& guess : {std::string(), Secret('a'), Secret('x'), std::string("b")}) {
    const ResponderResult r = b_.ExecuteForPeer("node-a", requester_->qpn(), guess, op);
    EXPECT_EQ(r.syndrome, mlx5::kSyndTransportRetryExcErr);
    EXPECT_TRUE(r.refused);
  }
  ResponderOp add;
  add.kind = ResponderOp::Kind::kFetchAdd64;
  add.remote_qpn = responder_->qpn();
  add.raddr = kIova + 8;
  add.rkey = key_b_;
  EXPECT_TRUE(b_.ExecuteForPeer("node-a", requester_->qpn(), Secret('z'), add).refused);
  for (uint64_t i = 0; i < 128; ++i) EXPECT_EQ(mem_b_->data()[i], 0) << "byte " << i;
  // The right secret (what node-a's daemon was offered) is served.
  const ResponderResult ok = b_.ExecuteForPeer("node-a", requester_->qpn(), Secret('b'), op);
  EXPECT_EQ(ok.syndrome, 0);
  EXPECT_EQ(mem_b_->data()[0], 'X');
}

TEST_F(RemoteTest, AnOfferCannotReplaceAConnectionsSecretButMayRepeatIt) {
  // A QPN reused on node-b (a new QP with the old number) offers again:
  // refused, so it cannot reach requester_'s connection.
  EXPECT_EQ(
      a_.AcceptConnectionSecret("node-b", responder_->qpn(), requester_->qpn(), Secret('r')).code(),
      absl::StatusCode::kAlreadyExists);
  // The secret it holds, offered again (node-b's daemon retrying a connect
  // whose reply it lost): taken, so the pair is not wedged.
  EXPECT_TRUE(
      a_.AcceptConnectionSecret("node-b", responder_->qpn(), requester_->qpn(), Secret('b')).ok());
  // An offer from a node or QP requester_ is not connected to: no such QP.
  EXPECT_EQ(
      a_.AcceptConnectionSecret("node-c", responder_->qpn(), requester_->qpn(), Secret('c')).code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(
      a_.AcceptConnectionSecret("node-b", responder_->qpn() + 1, requester_->qpn(), Secret('c'))
          .code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(a_.AcceptConnectionSecret("node-b", responder_->qpn(), 0xabcdef, Secret('c')).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(
      a_.AcceptConnectionSecret("node-b", responder_->qpn(), requester_->qpn(), "short").code(),
      absl::StatusCode::kInvalidArgument);
  // The connection still works with the secrets of its own offers.
  Write(0, 0, 64);
  requester_->Ring();
  mlx5::Cqe64 c;
  ASSERT_TRUE(requester_->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq) << int(CqeSyndrome(c));
  EXPECT_EQ(std::memcmp(mem_b_->data() + 20, mem_a_->data() + 20, 44), 0);
}

// Review of issue 23: an offer to a QP still in RESET replaced the one
// before it, so any node (or the peer node naming another QP) offering
// between the peer's offer and the owner's connect broke the connection.
// Offers are now kept apart and the connect takes its peer's.
TEST_F(RemoteTest, OffersToAWaitingQueuePairAreKeptApartAndTheConnectTakesItsPeers) {
  auto q = RawQp::Create(a_, 1, 4, 4);
  auto peer = RawQp::Create(b_, 2, 4, 4);
  ASSERT_NE(q, nullptr);
  ASSERT_NE(peer, nullptr);
  // node-b's daemon connects its QP first and offers what it expects.
  ASSERT_TRUE(b_.ConnectRemote(2, peer->qpn(), "node-a", q->qpn(), Secret('e')).ok());
  ASSERT_TRUE(a_.AcceptConnectionSecret("node-b", peer->qpn(), q->qpn(), Secret('e')).ok());
  // Then offers from another node, and from node-b for other QPs.
  EXPECT_TRUE(a_.AcceptConnectionSecret("node-c", peer->qpn(), q->qpn(), Secret('y')).ok());
  for (uint32_t other = 1; other <= 2 * Engine::kOffersPerNode; ++other) {
    EXPECT_TRUE(
        a_.AcceptConnectionSecret("node-b", peer->qpn() + other, q->qpn(), Secret('x')).ok());
  }
  // node-b's own offer for peer went as its oldest; offered again (a
  // retried connect), it is back.
  ASSERT_TRUE(a_.AcceptConnectionSecret("node-b", peer->qpn(), q->qpn(), Secret('e')).ok());
  ASSERT_TRUE(a_.ConnectRemote(1, q->qpn(), "node-b", peer->qpn(), Secret('f')).ok());
  mlx5::Wqe64 w;
  mlx5::build_rdma_write(&w, 0, q->qpn(), kUpd, kIova + 512, key_b_, kIova + 512, key_a_, 64);
  q->Write(w);
  q->Ring();
  mlx5::Cqe64 c;
  ASSERT_TRUE(q->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq) << int(CqeSyndrome(c));
  EXPECT_EQ(std::memcmp(mem_b_->data() + 512, mem_a_->data() + 512, 64), 0);

  // Bounded: kMaxOffers nodes, then refused; none of it once connected.
  auto waiting = RawQp::Create(a_, 1, 4, 4);
  ASSERT_NE(waiting, nullptr);
  for (size_t n = 0; n < Engine::kMaxOffers; ++n) {
    ASSERT_TRUE(
        a_.AcceptConnectionSecret(absl::StrCat("node-", n), 7, waiting->qpn(), Secret('o')).ok());
  }
  EXPECT_EQ(a_.AcceptConnectionSecret("node-late", 7, waiting->qpn(), Secret('o')).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(a_.AcceptConnectionSecret("node-3", 7, waiting->qpn(), Secret('p')).ok())
      << "a node's offer made again replaces its own";
}

TEST(RemoteConnect, NeedsALinkARemoteQpnAndASecret) {
  Engine e;
  auto qp = RawQp::Create(e, 1, 4, 4);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(e.ConnectRemote(1, qp->qpn(), "node-b", 5, Secret('s')).code(),
            absl::StatusCode::kFailedPrecondition);
  Engine peer;
  e.SetRemoteLink(std::make_shared<LoopbackLink>(&peer, "node-a"));
  EXPECT_EQ(e.ConnectRemote(1, qp->qpn(), "node-b", 0, Secret('s')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.ConnectRemote(1, qp->qpn(), "node-b", 5, "").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.ConnectRemote(2, qp->qpn(), "node-b", 5, Secret('s')).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(e.ConnectRemote(1, qp->qpn(), "node-b", 5, Secret('s')).ok());
  EXPECT_EQ(e.ConnectRemote(1, qp->qpn(), "node-b", 5, Secret('s')).code(),
            absl::StatusCode::kFailedPrecondition);
  e.SetRemoteLink(nullptr);
}

TEST(RemoteConnect, MemoryKeysAreRandomAndDistinct) {
  // Keys from a CSPRNG: no stride to learn from one key to the next.
  Engine e;
  auto m = SharedMapping::Anonymous(4096);
  ASSERT_TRUE(m.ok());
  std::vector<uint32_t> keys;
  for (int i = 0; i < 256; ++i) {
    RegionSpec spec;
    spec.pd = 1;
    spec.iova = 0x1000;
    spec.length = 4096;
    spec.access = kLocalWrite;
    spec.mapping = *m;
    auto key = e.RegisterRegion(spec);
    ASSERT_TRUE(key.ok()) << key.status();
    EXPECT_NE(*key, 0u);
    keys.push_back(*key);
  }
  std::set<uint32_t> distinct(keys.begin(), keys.end());
  EXPECT_EQ(distinct.size(), keys.size());
  std::set<uint32_t> steps;
  for (size_t i = 1; i < keys.size(); ++i) steps.insert(keys[i] - keys[i - 1]);
  EXPECT_GT(steps.size(), keys.size() / 2) << "consecutive keys share a stride";
}

}  // namespace
}  // namespace mooncake::softnic
