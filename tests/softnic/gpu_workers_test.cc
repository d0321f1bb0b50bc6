// softnic's GPU workers: WQEs that touch GPU memory run beside the engine
// thread, so one session's slow GPU work (a time slice behind a spinning
// kernel, a stalled copy agent) holds up no other session's WQEs. The GPU
// is the fake CUDA driver with atomics that wait at a gate the test opens.
#include "softnic/gpu_workers.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "fake_cuda_driver.h"
#include "fake_gpu.h"
#include "gpu_engine_fixture.h"
#include "mooncake/device/mlx5/prm.h"
#include "mooncake/device/mlx5/wqe.h"
#include "populated_memfd.h"
#include "raw_qp.h"
#include "softnic/cuda_memory.h"
#include "softnic/engine.h"
#include "softnic/shared_mapping.h"

namespace mooncake::softnic {
namespace {

using namespace std::chrono_literals;
using test_util::ClientAllocation;
using test_util::CqeOpcode;
using test_util::CqeSyndrome;
using test_util::RawQp;
namespace mlx5 = test_util::mlx5;
using mlx5::Cqe64;
using mlx5::Wqe64;
constexpr uint8_t kUpd = mlx5::kCtrlCqUpdate;

// Holds whoever passes until it is opened; counts who arrived.
class Gate {
 public:
  void Pass() {
    absl::MutexLock lock(&mu_);
    ++arrived_;
    mu_.Await(absl::Condition(&open_));
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  // Waits up to `wait` until `n` have arrived.
  bool Arrived(int n, absl::Duration wait = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    const auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return arrived_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), wait);
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
};

// ---- the worker pool ------------------------------------------------------------

TEST(GpuWorkersTest, ADomainsJobsRunInOrderAloneAndOtherDomainsGoOnBesideThem) {
  GpuWorkers workers(2);
  Gate gate;
  absl::Mutex mu;
  std::vector<int> order;
  std::atomic<int> in_domain_1{0};
  std::atomic<bool> overlapped{false};
  auto record = [&](int id) {
    absl::MutexLock lock(&mu);
    order.push_back(id);
  };
  auto domain_1 = [&](int id, bool wait) {
    return [&, id, wait] {
      if (in_domain_1.fetch_add(1) != 0) overlapped = true;
      if (wait) gate.Pass();
      record(id);
      in_domain_1.fetch_sub(1);
    };
  };
  workers.Submit(1, 1, domain_1(10, true));
  workers.Submit(1, 1, domain_1(11, false));
  workers.Submit(1, 1, domain_1(12, false));
  ASSERT_TRUE(gate.Arrived(1));
  std::promise<void> ran;
  workers.Submit(2, 2, [&] {
    record(20);
    ran.set_value();
  });
  ASSERT_EQ(ran.get_future().wait_for(10s), std::future_status::ready)
      << "domain 2 waited for domain 1's blocked job";
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(order, std::vector<int>({20})) << "domain 1's later jobs wait for its first";
  }
  gate.Open();
  workers.Drain();
  EXPECT_EQ(order, std::vector<int>({20, 10, 11, 12}));
  EXPECT_FALSE(overlapped) << "two jobs of one domain ran at once";
}

TEST(GpuWorkersTest, ThreadsStartWhenNeededStayBoundedAndEndWithDrain) {
  GpuWorkers workers(2);
  EXPECT_EQ(workers.threads(), 0u) << "no GPU work, no thread";
  Gate gate;
  std::atomic<int> done{0};
  for (PdId pd = 1; pd <= 5; ++pd) {
    workers.Submit(pd, pd, [&] {
      gate.Pass();
      ++done;
    });
  }
  ASSERT_TRUE(gate.Arrived(2));
  EXPECT_EQ(workers.threads(), 2u) << "at most the configured threads";
  gate.Open();
  workers.Drain();
  EXPECT_EQ(done, 5);
  EXPECT_EQ(workers.threads(), 0u);
  // A job that submits the next one: Drain waits for both.
  workers.Submit(7, 7, [&] { workers.Submit(7, 7, [&] { ++done; }); });
  workers.Drain();
  EXPECT_EQ(done, 6);
}

// Two domains made ready in a row while one thread is idle: that thread
// takes the first, and a thread must start for the second, not leave it
// behind the first's job.
TEST(GpuWorkersTest, AnIdleThreadDoesNotMakeTwoDomainsWaitInTurn) {
  GpuWorkers workers(2);
  std::promise<void> warm;
  workers.Submit(1, 1, [&] { warm.set_value(); });
  ASSERT_EQ(warm.get_future().wait_for(10s), std::future_status::ready);
  std::this_thread::sleep_for(20ms);  // past its spin: asleep, idle
  ASSERT_EQ(workers.threads(), 1u);
  Gate gate;
  absl::Cleanup open_gate = [&] { gate.Open(); };
  std::promise<void> ran;
  workers.Submit(2, 2, [&] { gate.Pass(); });
  workers.Submit(3, 3, [&] { ran.set_value(); });
  EXPECT_EQ(ran.get_future().wait_for(10s), std::future_status::ready)
      << "domain 3 waited for domain 2's blocked job";
  EXPECT_TRUE(gate.Arrived(1));
  gate.Open();
  workers.Drain();
}

// One user with more sessions than there are threads, all stalled: it
// holds all threads but one, and another user's session runs on that one.
TEST(GpuWorkersTest, OneOwnerNeverHoldsTheLastThread) {
  GpuWorkers workers(4);
  Gate gate;
  absl::Cleanup open_gate = [&] { gate.Open(); };
  constexpr uint64_t kGreedy = 1000, kOther = 2000;
  for (PdId pd = 1; pd <= 6; ++pd) workers.Submit(pd, kGreedy, [&] { gate.Pass(); });
  ASSERT_TRUE(gate.Arrived(3));
  EXPECT_FALSE(gate.Arrived(4, absl::Milliseconds(100))) << "one owner took every thread";
  std::promise<void> ran;
  workers.Submit(7, kOther, [&] { ran.set_value(); });
  EXPECT_EQ(ran.get_future().wait_for(10s), std::future_status::ready)
      << "another owner's session found no thread";
  EXPECT_LE(workers.threads(), 4u);
  gate.Open();
  workers.Drain();
  EXPECT_TRUE(gate.Arrived(6)) << "the greedy owner's queued jobs all ran in the end";
}

// ---- the engine: one session's stalled GPU work and everybody else -------------

// Atomics on the fake GPU's words that wait at `gate` first, as an atomic
// waits for a time slice behind a client's spinning kernel.
class GatedAtomics final : public CudaAtomics {
 public:
  explicit GatedAtomics(Gate* gate) : gate_(gate) {}
  absl::StatusOr<uint64_t> FetchAdd64(const CudaLane&, drivers::CuDevicePtr word,
                                      uint64_t add) override {
    gate_->Pass();
    return std::atomic_ref<uint64_t>(*static_cast<uint64_t*>(test_util::Ptr(word)))
        .fetch_add(add, std::memory_order_acq_rel);
  }
  absl::StatusOr<uint32_t> MaskedFetchAdd32(const CudaLane&, drivers::CuDevicePtr, uint32_t,
                                            uint32_t) override {
    return absl::UnimplementedError("not used here");
  }

 private:
  Gate* const gate_;
};

class EngineGpuWorkersTest : public test_util::GpuEngineFixture {
 protected:
  explicit EngineGpuWorkersTest(EngineOptions options = {}) : GpuEngineFixture(options) {}
  static constexpr PdId kPdC = 33;  // another session, host memory only

  void SetUp() override {
    client_cu_.addGpu(drivers::FakeGpu::Hopper(0));
    client_cu_.setGranularity(test_util::kGran);
    ASSERT_EQ(client_cu_.init(0), drivers::kCudaSuccess);
    CudaMemoryOptions options = test_util::FakeOptions(test_util::FakeWithGpus(1));
    options.atomics = [this](drivers::CudaDriver&) {
      return absl::StatusOr<std::unique_ptr<CudaAtomics>>(std::make_unique<GatedAtomics>(&gate_));
    };
    cuda_ = CudaMemory::Create(options);
    StartEngine();
    word_ = std::make_unique<ClientAllocation>(client_cu_, test_util::kGran);
    word_key_ = GpuRegion(kPdB, *word_, kRemoteAtomic);
    fetch_ = std::make_unique<ClientAllocation>(client_cu_, test_util::kGran);
    fetch_key_ = GpuRegion(kPdA, *fetch_, kLocalWrite);
    const uint64_t start = 40;
    std::memcpy(word_->data(), &start, 8);
    // The other session, set up before anything stalls (a stalled engine
    // lock would hold up the API too).
    c_key_ = HostRegion(kPdC, 8192, 64, kRemoteWrite);
    c_responder_ = RawQp::Create(engine_, kPdC, 1, 1);
    c_requester_ = RawQp::Create(engine_, kPdC, 16, 16);
    ASSERT_NE(c_responder_, nullptr);
    ASSERT_NE(c_requester_, nullptr);
    ASSERT_TRUE(engine_.Connect(kPdC, c_requester_->qpn(), c_responder_->qpn()).ok());
  }
  void TearDown() override {
    gate_.Open();  // whatever a failed check left waiting
    GpuEngineFixture::TearDown();
  }

  // kPdA posts a fetch-add of 2 on the GPU word, the old value into its
  // own GPU memory, and then a signaled inline write into host memory.
  std::unique_ptr<RawQp> PostStalledAtomic(uint32_t signal_key) {
    auto qp = NewQp();
    if (qp == nullptr) return nullptr;
    Wqe64 w[2];
    mlx5::build_atomic_fa64(&w[0], 0, qp->qpn(), kUpd, word_->va(), word_key_, 2, fetch_->va(),
                            fetch_key_);
    const uint64_t after = 0xa5;
    mlx5::build_rdma_write_inline(&w[1], 1, qp->qpn(), kUpd, HostIova(4096), signal_key, &after, 8);
    qp->Write(w[0]);
    qp->Write(w[1]);
    qp->Ring();
    return qp;
  }

  // kPdC's own QP pair writes 8 inline bytes into its host memory: true
  // when the CQE comes within `wait`.
  bool OtherSessionWrites(std::chrono::milliseconds wait) {
    Wqe64 w;
    const uint64_t v = 0x77;
    mlx5::build_rdma_write_inline(&w, c_requester_->pi(), c_requester_->qpn(), kUpd, HostIova(8192),
                                  c_key_, &v, 8);
    c_requester_->Write(w);
    c_requester_->Ring();
    Cqe64 c;
    return c_requester_->Next(&c, wait) && CqeOpcode(c) == mlx5::kCqeReq;
  }

  Gate gate_;
  drivers::FakeCudaDriver client_cu_;
  std::unique_ptr<ClientAllocation> word_, fetch_;
  uint32_t word_key_ = 0, fetch_key_ = 0, c_key_ = 0;
  std::unique_ptr<RawQp> c_requester_, c_responder_;
};

TEST_F(EngineGpuWorkersTest, AStalledGpuAtomicHoldsUpNoOtherSessionOnlyItsOwnQp) {
  const uint32_t signal_key = HostRegion(kPdB, 4096, 64, kRemoteWrite);
  auto qp = PostStalledAtomic(signal_key);
  ASSERT_NE(qp, nullptr);
  ASSERT_TRUE(gate_.Arrived(1));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(OtherSessionWrites(2s))
        << "another session's host WRITE " << i << " waited for the stalled GPU atomic";
  }
  Cqe64 c;
  EXPECT_FALSE(qp->WaitNext(&c, 50ms)) << "the atomic's QP went on without it";
  EXPECT_EQ(host_->data()[4096], 0) << "the WQE after the atomic ran before it";

  gate_.Open();
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq) << "syndrome " << int{CqeSyndrome(c)};
  ASSERT_TRUE(qp->Next(&c)) << "the QP goes on once the worker is done";
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  EXPECT_EQ(host_->data()[4096], 0xa5);
  uint64_t now = 0, fetched = 0;
  std::memcpy(&now, word_->data(), 8);
  std::memcpy(&fetched, fetch_->data(), 8);
  EXPECT_EQ(now, 42u);
  EXPECT_EQ(fetched, 40u) << "the old value, into GPU memory";
}

// Before lanes, CudaMemory ran every copy and atomic under one mutex: a
// session's copy into its own GPU memory waited for another session's
// stalled atomic, on a worker of its own.
TEST_F(EngineGpuWorkersTest, AnotherSessionsGpuCopyDoesNotWaitForAStalledGpuAtomic) {
  ClientAllocation c_gpu(client_cu_, test_util::kGran);
  const uint32_t c_gpu_key = GpuRegion(kPdC, c_gpu, kRemoteWrite);
  const uint32_t signal_key = HostRegion(kPdB, 4096, 64, kRemoteWrite);
  auto qp = PostStalledAtomic(signal_key);
  ASSERT_NE(qp, nullptr);
  // Opened on a failed check too, before the QPs go.
  absl::Cleanup open_gate = [&] { gate_.Open(); };
  ASSERT_TRUE(gate_.Arrived(1));
  for (uint64_t i = 0; i < 3; ++i) {
    Wqe64 w;
    const uint64_t v = 0x1100 + i;
    mlx5::build_rdma_write_inline(&w, c_requester_->pi(), c_requester_->qpn(), kUpd,
                                  c_gpu.va() + 8 * i, c_gpu_key, &v, 8);
    c_requester_->Write(w);
    c_requester_->Ring();
    Cqe64 c;
    ASSERT_TRUE(c_requester_->Next(&c, 2s))
        << "session C's copy into its GPU memory " << i << " waited for A's stalled atomic";
    EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq) << "syndrome " << int{CqeSyndrome(c)};
    uint64_t landed = 0;
    std::memcpy(&landed, c_gpu.data() + 8 * i, 8);
    EXPECT_EQ(landed, v);
  }
  EXPECT_EQ(cuda_->lanes(), 2) << "the stalled atomic's lane and C's";
  gate_.Open();
  Cqe64 c;
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
}

TEST_F(EngineGpuWorkersTest, DeregisteringARegionWaitsForTheGpuWqeAtWorkInIt) {
  const uint32_t signal_key = HostRegion(kPdB, 4096, 64, kRemoteWrite);
  auto late = NewQp();
  ASSERT_NE(late, nullptr);
  auto qp = PostStalledAtomic(signal_key);
  ASSERT_NE(qp, nullptr);
  ASSERT_TRUE(gate_.Arrived(1));
  auto dereg =
      std::async(std::launch::async, [&] { return engine_.DeregisterRegion(kPdB, word_key_); });
  // Opened before a future waits in its destructor, on a failed check too.
  absl::Cleanup open_gate = [&] { gate_.Open(); };
  EXPECT_EQ(dereg.wait_for(100ms), std::future_status::timeout)
      << "the region went while a worker was adding to it";

  // Meanwhile the region answers to its key no more.
  Wqe64 w;
  mlx5::build_atomic_fa64(&w, 0, late->qpn(), kUpd, word_->va(), word_key_, 1, fetch_->va() + 64,
                          fetch_key_);
  late->Write(w);
  late->Ring();
  Cqe64 c;
  ASSERT_TRUE(late->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndRemoteAccessErr);
  EXPECT_TRUE(OtherSessionWrites(2s));

  gate_.Open();
  ASSERT_EQ(dereg.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(dereg.get().ok());
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq) << "the atomic that was at work completes";
  EXPECT_EQ(engine_.DeregisterRegion(kPdB, word_key_).code(), absl::StatusCode::kNotFound);
}

// Both wait for the same pin; whichever goes second must not look at a
// region the first freed.
TEST_F(EngineGpuWorkersTest, DeregisteringARegionAndDestroyingItsDomainAtOnceBothReturn) {
  const uint32_t signal_key = HostRegion(kPdB, 4096, 64, kRemoteWrite);
  auto qp = PostStalledAtomic(signal_key);
  ASSERT_NE(qp, nullptr);
  ASSERT_TRUE(gate_.Arrived(1));
  auto dereg =
      std::async(std::launch::async, [&] { return engine_.DeregisterRegion(kPdB, word_key_); });
  auto destroy = std::async(std::launch::async, [&] { engine_.DestroyPd(kPdB); });
  absl::Cleanup open_gate = [&] { gate_.Open(); };
  std::this_thread::sleep_for(50ms);  // both waiting
  gate_.Open();
  ASSERT_EQ(dereg.wait_for(10s), std::future_status::ready);
  ASSERT_EQ(destroy.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(engine_.DeregisterRegion(kPdB, word_key_).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_.ListRegions().size(), 2u) << "kPdA's fetch buffer and kPdC's region";
  EXPECT_TRUE(OtherSessionWrites(2s));
}

// A GPU WQE waiting behind its session's stalled one, on a QP destroyed
// meanwhile, never runs: a NIC executes nothing of a destroyed QP.
TEST_F(EngineGpuWorkersTest, AQueuedGpuWqeOfADestroyedQpRunsNoMore) {
  const uint32_t signal_key = HostRegion(kPdB, 4096, 64, kRemoteWrite);
  auto stalled = PostStalledAtomic(signal_key);
  ASSERT_NE(stalled, nullptr);
  absl::Cleanup open_gate = [&] { gate_.Open(); };
  ASSERT_TRUE(gate_.Arrived(1));
  ClientAllocation target(client_cu_, test_util::kGran);
  const uint32_t target_key = GpuRegion(kPdB, target, kRemoteWrite);
  auto doomed = NewQp();
  ASSERT_NE(doomed, nullptr);
  Wqe64 w;
  const uint64_t v = 0xdead;
  mlx5::build_rdma_write_inline(&w, 0, doomed->qpn(), kUpd, target.va(), target_key, &v, 8);
  doomed->Write(w);
  doomed->Ring();
  // The engine thread hands it to the workers, where it waits behind kPdA's
  // stalled atomic.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (engine_.gpu_jobs_waiting() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(engine_.gpu_jobs_waiting(), 1u);
  ASSERT_TRUE(engine_.DestroyQp(kPdA, doomed->qpn()).ok());
  gate_.Open();
  Cqe64 c;
  ASSERT_TRUE(stalled->Next(&c));
  ASSERT_TRUE(stalled->Next(&c));
  engine_.Stop();  // every job the workers had has run
  EXPECT_EQ(engine_.gpu_jobs_waiting(), 0u);
  uint64_t seen = 1;
  std::memcpy(&seen, target.data(), 8);
  EXPECT_EQ(seen, 0u) << "a destroyed QP's WQE wrote into GPU memory";
}

// An atomic whose fetch destination the client punched out of its memfd
// fails before it runs: the GPU word keeps its value, and no worker (and
// no engine thread) waited on the GPU for it.
TEST_F(EngineGpuWorkersTest, AnAtomicWhoseFetchPageIsGoneFailsBeforeItRuns) {
  // Populated and sealed, as a client library makes a region's memfd.
  const uint64_t page = SharedMapping::PageSize();
  absl::StatusOr<PopulatedMemfd> memfd = CreatePopulatedMemfd("fetch", page, "fetch buffer");
  ASSERT_TRUE(memfd.ok()) << memfd.status();
  absl::Cleanup unmap = [&] { ::munmap(memfd->data, page); };
  const int fd = memfd->fd.get();
  auto mapping = SharedMapping::FromPopulatedMemfd(fd, 0, page);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  RegionSpec spec;
  spec.pd = kPdA;
  spec.iova = 0x7000'0000'0000;
  spec.length = page;
  spec.access = kLocalWrite;
  spec.mapping = *mapping;
  auto fetch_key = engine_.RegisterRegion(spec);
  ASSERT_TRUE(fetch_key.ok()) << fetch_key.status();
  ASSERT_EQ(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, page), 0);
  gate_.Open();  // were the atomic to run, it would not hang the test
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  Wqe64 w;
  mlx5::build_atomic_fa64(&w, 0, qp->qpn(), kUpd, word_->va(), word_key_, 2, spec.iova, *fetch_key);
  qp->Write(w);
  qp->Ring();
  Cqe64 c;
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndLocalProtErr);
  uint64_t now = 0;
  std::memcpy(&now, word_->data(), 8);
  EXPECT_EQ(now, 40u) << "the atomic ran though its old value had nowhere to go";
  EXPECT_FALSE(gate_.Arrived(1, absl::Milliseconds(10)));
}

TEST_F(EngineGpuWorkersTest, DestroyingTheSessionWaitsForItsGpuWqeAndWritesNoCqeAfter) {
  const uint32_t signal_key = HostRegion(kPdB, 4096, 64, kRemoteWrite);
  auto qp = PostStalledAtomic(signal_key);
  ASSERT_NE(qp, nullptr);
  ASSERT_TRUE(gate_.Arrived(1));
  auto destroy = std::async(std::launch::async, [&] { engine_.DestroyPd(kPdA); });
  // Opened before a future waits in its destructor, on a failed check too.
  absl::Cleanup open_gate = [&] { gate_.Open(); };
  EXPECT_EQ(destroy.wait_for(100ms), std::future_status::timeout)
      << "the session went while a worker wrote into its GPU memory";
  gate_.Open();
  ASSERT_EQ(destroy.wait_for(10s), std::future_status::ready);
  Cqe64 c;
  EXPECT_FALSE(qp->WaitNext(&c, 100ms)) << "a CQE was written into a destroyed QP's ring";
  EXPECT_EQ(host_->data()[4096], 0);
  EXPECT_TRUE(OtherSessionWrites(2s));
}

TEST_F(EngineGpuWorkersTest, AnotherNodesAtomicOnGpuMemoryRunsWithoutTheEngineLock) {
  // ExecuteAsResponder is the path of another node's batches (ExecuteForPeer).
  ResponderOp op;
  op.kind = ResponderOp::Kind::kFetchAdd64;
  op.remote_qpn = responder_->qpn();
  op.raddr = word_->va();
  op.rkey = word_key_;
  op.add = 5;
  auto peer = std::async(std::launch::async, [&] { return engine_.ExecuteAsResponder(op); });
  std::future<size_t> list;
  // Opened before a future waits in its destructor, on a failed check too.
  absl::Cleanup open_gate = [&] { gate_.Open(); };
  ASSERT_TRUE(gate_.Arrived(1));
  EXPECT_TRUE(OtherSessionWrites(2s)) << "the engine waited for another node's GPU atomic";
  list = std::async(std::launch::async, [&] { return engine_.ListRegions().size(); });
  ASSERT_EQ(list.wait_for(2s), std::future_status::ready) << "the API waited too";
  EXPECT_EQ(list.get(), 3u);
  gate_.Open();
  const ResponderResult r = peer.get();
  EXPECT_EQ(r.syndrome, 0);
  EXPECT_EQ(r.fetched, 40u);
}

// The GPU path keeps the checks of the host path, before any worker runs:
// a WQE past the end of a GPU region, and another node's batch without the
// connection's secret, are refused and the GPU word stays as it was.
TEST_F(EngineGpuWorkersTest, LyingRequestsForGpuMemoryAreRefusedBeforeAnyWorkerRuns) {
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  Wqe64 w;
  mlx5::build_atomic_fa64(&w, 0, qp->qpn(), kUpd, word_->va() + word_->size(), word_key_, 1,
                          fetch_->va(), fetch_key_);
  qp->Write(w);
  qp->Ring();
  Cqe64 c;
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndRemoteAccessErr);

  ResponderOp op;
  op.kind = ResponderOp::Kind::kFetchAdd64;
  op.remote_qpn = responder_->qpn();
  op.raddr = word_->va();
  op.rkey = word_key_;
  op.add = 1;
  const ResponderResult forged =
      engine_.ExecuteForPeer("node-x", 7, std::string(Engine::kSecretBytes, 'x'), op);
  EXPECT_EQ(forged.syndrome, mlx5::kSyndTransportRetryExcErr);

  uint64_t now = 0;
  std::memcpy(&now, word_->data(), 8);
  EXPECT_EQ(now, 40u) << "a refused request changed GPU memory";
  EXPECT_EQ(engine_.gpu_worker_threads(), 0u) << "a refused request reached a GPU worker";
  EXPECT_TRUE(OtherSessionWrites(2s)) << "the engine still serves";
}

// The engine thread sleeps up to max_idle_sleep_us when it finds no work,
// and a GPU worker completes a WQE beside it. The client answers that CQE
// with its next doorbell at once: the worker wakes the engine thread, so
// the doorbell is not left for the end of a long sleep.
class EngineKickTest : public EngineGpuWorkersTest {
 protected:
  static EngineOptions LongSleeps() {
    EngineOptions o;
    o.max_idle_sleep_us = 2'000'000;
    return o;
  }
  EngineKickTest() : EngineGpuWorkersTest(LongSleeps()) {}
};

TEST_F(EngineKickTest, AWorkerThatCompletesAWqeWakesTheEngineThread) {
  const uint32_t signal_key = HostRegion(kPdB, 4096, 64, kRemoteWrite);
  auto qp = PostStalledAtomic(signal_key);
  ASSERT_NE(qp, nullptr);
  absl::Cleanup open_gate = [&] { gate_.Open(); };
  ASSERT_TRUE(gate_.Arrived(1));
  // The engine thread's sleeps double from 1 us: the one that began about
  // 1.05 s after its last work lasts another 1.05 s.
  std::this_thread::sleep_for(1300ms);
  gate_.Open();
  Cqe64 c;
  ASSERT_TRUE(qp->Next(&c));
  ASSERT_TRUE(qp->Next(&c));
  Wqe64 w;
  const uint64_t v = 0x5a;
  mlx5::build_rdma_write_inline(&w, qp->pi(), qp->qpn(), kUpd, HostIova(4096), signal_key, &v, 8);
  qp->Write(w);
  const auto rung = std::chrono::steady_clock::now();
  qp->Ring();
  ASSERT_TRUE(qp->Next(&c, 5s));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  EXPECT_LT(std::chrono::steady_clock::now() - rung, 250ms)
      << "the doorbell after a worker's CQE waited for the engine thread's sleep";
}

// ---- CudaMemory's lanes: as many callers at once as it has lanes ------------

TEST(CudaMemoryLanes, CallersBeyondTheBoundWaitForALaneAndNoneIsLeftBehind) {
  drivers::FakeCudaDriver client_cu;
  client_cu.addGpu(drivers::FakeGpu::Hopper(0));
  client_cu.setGranularity(test_util::kGran);
  ASSERT_EQ(client_cu.init(0), drivers::kCudaSuccess);
  ClientAllocation words(client_cu, test_util::kGran);
  Gate gate;
  auto daemon_cu = test_util::FakeWithGpus(1);
  CudaMemoryOptions options = test_util::FakeOptions(daemon_cu);
  options.atomics = [&gate](drivers::CudaDriver&) {
    return absl::StatusOr<std::unique_ptr<CudaAtomics>>(std::make_unique<GatedAtomics>(&gate));
  };
  std::shared_ptr<CudaMemory> cuda = CudaMemory::Create(options);
  absl::StatusOr<std::shared_ptr<CudaBuffer>> buffer = cuda->Import(words.fd(), words.size());
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const drivers::CuDevicePtr word = (*buffer)->base();

  constexpr int kCallers = CudaMemory::kMaxLanes + 1;
  std::vector<std::future<absl::StatusOr<uint64_t>>> calls;
  absl::Cleanup open_gate = [&] { gate.Open(); };
  for (int i = 0; i < kCallers; ++i) {
    calls.push_back(std::async(std::launch::async, [&] { return cuda->FetchAdd64(word, 1); }));
  }
  ASSERT_TRUE(gate.Arrived(CudaMemory::kMaxLanes));
  EXPECT_FALSE(gate.Arrived(kCallers, absl::Milliseconds(100)))
      << "a caller beyond the bound got a lane";
  EXPECT_EQ(cuda->lanes(), CudaMemory::kMaxLanes);
  gate.Open();
  std::vector<uint64_t> olds;
  for (auto& call : calls) {
    absl::StatusOr<uint64_t> old = call.get();
    ASSERT_TRUE(old.ok()) << old.status();
    olds.push_back(*old);
  }
  std::sort(olds.begin(), olds.end());
  for (int i = 0; i < kCallers; ++i) EXPECT_EQ(olds[i], static_cast<uint64_t>(i));
  EXPECT_EQ(cuda->lanes(), CudaMemory::kMaxLanes);
  EXPECT_EQ(daemon_cu->liveStreams(), CudaMemory::kMaxLanes);
  buffer->reset();
  cuda.reset();
  EXPECT_EQ(daemon_cu->liveStreams(), 0) << "the lanes' streams went with the context";
}

}  // namespace
}  // namespace mooncake::softnic
