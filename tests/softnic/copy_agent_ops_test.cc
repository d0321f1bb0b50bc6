// The copy agent's requests that only a gated agent gets (issue 24 item
// 11): a copy within the process's GPU memory as one landing straight from
// the source, and the NIC's atomics on its GPU words, run by its kernel and
// decided at the gate. On the fake CUDA driver with the kernels' host
// stand-ins (fake_copy_agent_kernels.h); the real kernels run on the GPU
// (tests/gpu/, rdma_bench check and mcctl selftest rdma --gpu).
//
// What an atomic must never do is run twice or be lost: every way a request
// can end (answered, cancelled before it was taken, called off at the gate
// before its kernel ran, answered with a CUDA error while its kernel was
// queued or past the gate, past the gate and landed, past the gate and
// never landed) is tested for what the word holds and what the caller is
// told.
#include <gtest/gtest.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "copy_agent.h"
#include "copy_agent_fixtures.h"
#include "mooncake/common/masked_add.h"

namespace mooncake::softnic {
namespace {

using namespace copy_agent_testing;  // NOLINT: the shared fixtures
using Kind = CopyAgentLink::AtomicOutcome::Kind;
using test_util::CqeOpcode;
using test_util::CqeSyndrome;

#if MC_CLIENT_HAVE_LANDING_KERNEL

// A gated agent (no resident kernel: these requests never go to it) and the
// daemon's link; `stall`: the link's bound on a busy agent.
struct GatedPair {
  explicit GatedPair(absl::Duration stall = absl::Milliseconds(250)) {
    cu = ClientDriver();
    agent = GatedAgent(cu, /*resident=*/false);
    if (agent == nullptr) return;
    auto l = LinkTo(agent->fd(), kStaging, ::getpid(), absl::Seconds(2), stall);
    EXPECT_TRUE(l.ok()) << l.status();
    if (l.ok()) link = *l;
  }
  std::shared_ptr<FakeCudaDriver> cu;
  std::unique_ptr<CopyAgent> agent;
  std::shared_ptr<CopyAgentLink> link;
};

TEST(CopyAgentWithinTest, OneLandingPerPieceStraightFromTheSource) {
  GatedPair p;
  ASSERT_NE(p.link, nullptr);
  ClientAllocation gpu(*p.cu, 4 * kGran);
  const uint64_t n = kStaging + 4000;  // two pieces
  for (uint64_t i = 0; i < n; ++i) gpu.data()[i] = PatternByte(i);
  const int launches = p.cu->calls("launchKernel");
  // Out to the staging area would be a device-to-host copy (the landings'
  // stand-ins count as host-to-device ones).
  const int staged = p.cu->calls("memcpyDtoH");
  const uint64_t before = p.agent->copies();
  ASSERT_TRUE(p.link->WithinDevice(gpu.va() + 2 * kGran + 3, gpu.va(), n).ok());
  EXPECT_EQ(std::memcmp(gpu.data() + 2 * kGran + 3, gpu.data(), n), 0);
  EXPECT_EQ(p.agent->copies() - before, 2u) << "one request per piece, not two";
  EXPECT_EQ(p.cu->calls("launchKernel") - launches, 2);
  EXPECT_EQ(p.cu->calls("memcpyDtoH"), staged) << "nothing went through the staging area";
}

// A landing held back runs after the daemon called it off: it reads and
// writes nothing, so the application's newer bytes stay.
TEST(CopyAgentWithinTest, ALandingHeldBackAndCalledOffWritesNothing) {
  GatedPair p;
  ASSERT_NE(p.link, nullptr);
  ClientAllocation gpu(*p.cu, 2 * kGran);
  std::memset(gpu.data(), 1, 64);
  p.cu->holdStreams(true);
  const absl::Status s = p.link->WithinDevice(gpu.va() + kGran, gpu.va(), 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_FALSE(p.link->LateCopyOverlaps(gpu.va() + kGran, 64)) << "called off";
  std::memset(gpu.data() + kGran, 7, 64);  // the application's next write
  p.cu->holdStreams(false);
  ASSERT_TRUE(ServesAgain(*p.link));
  for (int i = 0; i < 64; ++i) ASSERT_EQ(gpu.data()[kGran + i], 7) << "byte " << i;
}

TEST(CopyAgentAtomicTest, FetchAddsRunInTheAgentsKernelAndAnswerTheOldValue) {
  GatedPair p;
  ASSERT_NE(p.link, nullptr);
  ClientAllocation gpu(*p.cu, kGran);
  uint64_t word = 40;
  std::memcpy(gpu.data(), &word, 8);
  CopyAgentLink::AtomicOutcome a = p.link->FetchAdd(gpu.va(), false, 2, 0);
  ASSERT_EQ(a.kind, Kind::kApplied) << a.why;
  EXPECT_EQ(a.old, 40u);
  std::memcpy(&word, gpu.data(), 8);
  EXPECT_EQ(word, 42u);
  // The masked add: two 16-bit fields, the low one wrapping on its own.
  const uint32_t v = 0x0001ffff, boundary = 0x00008000;
  std::memcpy(gpu.data() + 8, &v, 4);
  a = p.link->FetchAdd(gpu.va() + 8, true, 0x00010001, boundary);
  ASSERT_EQ(a.kind, Kind::kApplied) << a.why;
  EXPECT_EQ(a.old, v);
  uint32_t now = 0;
  std::memcpy(&now, gpu.data() + 8, 4);
  EXPECT_EQ(now, MaskedAdd(v, 0x00010001, boundary));
  EXPECT_EQ(now, 0x00020000u) << "the low field's carry crossed the boundary";
}

// The agent's adds are atomic against the process's own on the same word
// (here host atomics on the fake's memory; the GPU's atomic units on a GPU).
TEST(CopyAgentAtomicTest, AddsRaceTheProcesssOwnWithoutLosingOne) {
  GatedPair p;
  ASSERT_NE(p.link, nullptr);
  ClientAllocation gpu(*p.cu, kGran);
  std::memset(gpu.data(), 0, 8);
  std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(gpu.data()));
  constexpr int kAdds = 500;
  std::thread app([&] {
    for (int i = 0; i < kAdds; ++i) word.fetch_add(1000);
  });
  std::vector<uint64_t> olds;
  for (int i = 0; i < kAdds; ++i) {
    const CopyAgentLink::AtomicOutcome a = p.link->FetchAdd(gpu.va(), false, 1, 0);
    ASSERT_EQ(a.kind, Kind::kApplied) << a.why;
    olds.push_back(a.old);
  }
  app.join();
  EXPECT_EQ(word.load(), uint64_t{kAdds} * 1001);
  for (int i = 0; i < kAdds; ++i) EXPECT_EQ(olds[i] % 1000, uint64_t(i)) << "add " << i;
}

// The agent's submit call blocks (another thread of its process in a
// synchronous copy): past the stall the daemon calls the atomic off before
// its kernel ran, and is told to run it itself. When the call returns, the
// kernel sees the cancel and adds nothing: one add in all.
TEST(CopyAgentAtomicTest, OneBlockedInItsSubmitCallIsCalledOffAndNeverAdds) {
  GatedPair p;
  ASSERT_NE(p.link, nullptr);
  ClientAllocation gpu(*p.cu, kGran);
  std::memset(gpu.data(), 0, 8);
  p.cu->pauseSubmissions(true);
  const CopyAgentLink::AtomicOutcome a = p.link->FetchAdd(gpu.va(), false, 5, 0);
  EXPECT_EQ(a.kind, Kind::kNotApplied);
  EXPECT_EQ(a.why.code(), absl::StatusCode::kDeadlineExceeded) << a.why;
  std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(gpu.data()));
  word.fetch_add(5);  // what the daemon then does in its own context
  const uint64_t answered = p.agent->copies();
  p.cu->pauseSubmissions(false);
  ASSERT_TRUE(ServesAgain(*p.link));
  EXPECT_GT(p.agent->copies(), answered);
  EXPECT_EQ(word.load(), 5u) << "the called-off kernel added too";
  // The agent serves atomics again.
  const CopyAgentLink::AtomicOutcome b = p.link->FetchAdd(gpu.va(), false, 1, 0);
  ASSERT_EQ(b.kind, Kind::kApplied) << b.why;
  EXPECT_EQ(b.old, 5u);
}

// An agent without its kernels gets no atomic (nor a copy within the GPU
// as one landing): the caller runs it.
TEST(CopyAgentAtomicTest, AnUngatedAgentIsNotAsked) {
  auto cu = ClientDriver();  // no kernels: the agent runs ungated
  auto agent = CopyAgent::Create(cu, PrimaryContext(*cu), kStaging);
  ASSERT_TRUE(agent.ok()) << agent.status();
  ASSERT_FALSE((*agent)->gated());
  auto link = LinkTo((*agent)->fd(), kStaging, ::getpid());
  ASSERT_TRUE(link.ok()) << link.status();
  ClientAllocation gpu(*cu, kGran);
  const CopyAgentLink::AtomicOutcome a = (*link)->FetchAdd(gpu.va(), false, 1, 0);
  EXPECT_EQ(a.kind, Kind::kNotApplied);
  EXPECT_EQ(a.why.code(), absl::StatusCode::kFailedPrecondition) << a.why;
  EXPECT_EQ((*agent)->copies(), 0u);
}

// The test plays a gated agent whose atomic kernel takes the request and
// passes the gate, and then ends one of three ways (Ending).
class PlayedAtomicKernel {
 public:
  enum class Ending {
    kLands,       // stalls; once called off, lands 50 ms later with its answer
    kNeverLands,  // stalls; never lands
    kCudaError,   // the agent answers at once with a CUDA error; the kernel never lands
  };
  PlayedAtomicKernel(Ending ending, uint64_t old_value) : ending_(ending), old_(old_value) {
    mapping_ = ChannelWithoutAgent();
    c_ = reinterpret_cast<copy_agent::Channel*>(mapping_->data());
    c_->gate.gated = 1;
    thread_ = std::thread([this] { Run(); });
  }
  ~PlayedAtomicKernel() {
    stop_.store(true);
    thread_.join();
  }
  std::shared_ptr<CopyAgentLink> Link() {
    auto link = CopyAgentLink::Create(
        mapping_, kStaging, 1,
        CopyAgentLinkOptions{.stall = absl::Milliseconds(20), .landing = absl::Milliseconds(300)});
    EXPECT_TRUE(link.ok()) << link.status();
    return link.ok() ? *link : nullptr;
  }

 private:
  template <class T>
  static std::atomic_ref<T> At(T& f) {
    return std::atomic_ref<T>(f);
  }
  void Run() {
    uint32_t seq = 0;
    while ((seq = At(c_->request_seq).load()) == 0) {
      if (stop_.load()) return;
      std::this_thread::yield();
    }
    copy_agent::Settle(*c_, seq, seq);
    At(c_->gate.intent[0]).store(seq);  // past the gate: adding
    if (ending_ == Ending::kCudaError) {
      At(c_->result).store(1);  // CUDA_ERROR_INVALID_VALUE
      At(c_->done_seq).store(seq, std::memory_order_release);
    } else {
      timespec now{};
      ::clock_gettime(CLOCK_MONOTONIC, &now);
      At(c_->phase).store(static_cast<uint32_t>(copy_agent::Phase::kWaiting));
      At(c_->busy_since_ns).store(uint64_t(now.tv_sec) * 1'000'000'000ull + uint64_t(now.tv_nsec));
    }
    while (At(c_->gate.cancel_seq).load() != seq) {
      if (stop_.load()) return;
      std::this_thread::yield();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // still adding
    if (ending_ == Ending::kLands) {
      auto* answer =
          reinterpret_cast<copy_agent::AtomicAnswer*>(mapping_->data() + copy_agent::kHeaderBytes);
      At(answer->old).store(old_);
      At(answer->applied).store(seq);
      At(c_->gate.landed[0]).store(seq, std::memory_order_release);
    }
    while (!stop_.load()) std::this_thread::yield();
  }
  const Ending ending_;
  const uint64_t old_;
  std::shared_ptr<SharedMapping> mapping_;
  copy_agent::Channel* c_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Past the gate before the call-off: the daemon waits for the kernel; one
// that lands has added (its answer is taken, not run again); one that does
// not land within the bound may still add, and the outcome is unknown,
// also when the agent answered the request with a CUDA error meanwhile.
TEST(CopyAgentAtomicTest, PastTheGateItIsWaitedForAndUnknownOnlyIfItNeverLands) {
  using Ending = PlayedAtomicKernel::Ending;
  for (const Ending ending : {Ending::kLands, Ending::kNeverLands, Ending::kCudaError}) {
    SCOPED_TRACE(static_cast<int>(ending));
    PlayedAtomicKernel kernel(ending, 1234);
    auto link = kernel.Link();
    ASSERT_NE(link, nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    const CopyAgentLink::AtomicOutcome a = link->FetchAdd(0x9000, false, 1, 0);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50))
        << "did not wait for the kernel past the gate";
    if (ending == Ending::kLands) {
      EXPECT_EQ(a.kind, Kind::kApplied) << a.why;
      EXPECT_EQ(a.old, 1234u);
    } else {
      EXPECT_EQ(a.kind, Kind::kUnknown) << a.why;
      EXPECT_FALSE(link->usable()) << "asked again while its kernel may still add";
    }
  }
}

// ---- through the engine -----------------------------------------------------------

class AgentAtomicsEngineTest : public AgentEngineTest {
 protected:
  // kPdB's GPU word region (remote atomics) with a gated agent, and kPdA's
  // host region for the fetched values.
  void Prepare(absl::Duration stall = absl::Milliseconds(250)) {
    test_util::RegisterFakeCopyAgentKernels(*client_cu_);
    word_ = std::make_unique<ClientAllocation>(*client_cu_, kGran);
    std::memset(word_->data(), 0, 64);
    agent_ = Attach(kPdB, 1000, stall);
    ASSERT_NE(agent_, nullptr);
    ASSERT_TRUE(agent_->gated());
    word_key_ = GpuRegion(kPdB, *word_, kRemoteAtomic);
    fetch_key_ = HostRegion(kPdA, 0, 4096, kLocalWrite);
  }
  std::atomic_ref<uint64_t> Word() const {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(word_->data()));
  }
  uint64_t Fetched(uint64_t at) const {
    uint64_t v = 0;
    std::memcpy(&v, host_->data() + at, 8);
    return v;
  }
  std::unique_ptr<ClientAllocation> word_;
  std::unique_ptr<CopyAgent> agent_;
  uint32_t word_key_ = 0, fetch_key_ = 0;
};

// The daemon's own atomics fail here: only the agent can have run them.
TEST_F(AgentAtomicsEngineTest, FetchAddsOnGpuWordsRunInTheOwnersAgent) {
  Prepare();
  daemon_atomic_failures_->store(1 << 20);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  Word().store(7);
  Wqe64 w;
  mlx5::build_atomic_fa64(&w, 0, qp->qpn(), kUpd, word_->va(), word_key_, 3, HostIova(0),
                          fetch_key_);
  Cqe64 c = RunOne(*qp, w);
  ASSERT_EQ(CqeOpcode(c), mlx5::kCqeReq) << "syndrome " << int(CqeSyndrome(c));
  EXPECT_EQ(Fetched(0), 7u);
  EXPECT_EQ(Word().load(), 10u);
  uint32_t v = 0x00050000;
  std::memcpy(word_->data() + 8, &v, 4);
  mlx5::build_masked_fa32(&w, 1, qp->qpn(), kUpd, word_->va() + 8, word_key_, 0x00010000,
                          HostIova(64), fetch_key_);
  c = RunOne(*qp, w);
  ASSERT_EQ(CqeOpcode(c), mlx5::kCqeReq) << "syndrome " << int(CqeSyndrome(c));
  uint32_t fetched32 = 0;
  std::memcpy(&fetched32, host_->data() + 64, 4);
  EXPECT_EQ(mlx5::be32(fetched32), 0x00050000u) << "extended atomics answer big-endian";
  std::memcpy(&v, word_->data() + 8, 4);
  EXPECT_EQ(v, 0x00060000u);
  EXPECT_EQ(agent_->copies(), 2u);
  EXPECT_EQ(DaemonCopies(), 0);
}

// Two sessions of one process in one context, agents with their kernels:
// one landing by the destination's agent, straight from the source (which
// claims count as one process: CopyAgentBetweenTest below).
TEST_F(AgentAtomicsEngineTest, TwoSessionsOfOneProcessOnOneGpuAreOneLanding) {
  Prepare();
  ClientAllocation src(*client_cu_, kGran);
  auto src_agent = Attach(kPdA, 1000);  // the same pid as Prepare's
  ASSERT_NE(src_agent, nullptr);
  const uint32_t src_key = GpuRegion(kPdA, src, 0);
  const uint32_t dst_key = GpuRegion(kPdB, *word_, kRemoteWrite);
  for (uint64_t i = 0; i < 5000; ++i) src.data()[i] = PatternByte(i);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  const int launches = client_cu_->calls("launchKernel");
  Wqe64 w;
  mlx5::build_rdma_write(&w, 0, qp->qpn(), kUpd, word_->va() + 64, dst_key, src.va() + 1, src_key,
                         5000);
  EXPECT_EQ(CqeOpcode(RunOne(*qp, w)), mlx5::kCqeReq);
  EXPECT_EQ(std::memcmp(word_->data() + 64, src.data() + 1, 5000), 0);
  EXPECT_EQ(src_agent->copies(), 0u);
  EXPECT_EQ(agent_->copies(), 1u);
  EXPECT_EQ(client_cu_->calls("launchKernel") - launches, 1) << "one landing";
  EXPECT_EQ(DaemonCopies(), 0);
}

// Only one process (pid and token) in one context lands straight: a
// channel of the same pid with another token, or this process's token in
// another context, goes through both agents.
TEST(CopyAgentBetweenTest, OnlyOneProcessInOneContextLandsStraight) {
  GatedPair a, b;
  ASSERT_NE(a.link, nullptr);
  ASSERT_NE(b.link, nullptr);
  ClientAllocation from(*a.cu, kGran), to(*b.cu, kGran);
  std::memset(from.data(), 9, 100);
  ASSERT_TRUE(CopyAgentLink::Between(*a.link, from.va(), *b.link, to.va(), 100).ok());
  EXPECT_EQ(to.data()[99], 9);
  EXPECT_EQ(a.agent->copies(), 0u);
  EXPECT_EQ(b.agent->copies(), 1u) << "b's agent alone, one landing";
  // What a's channel says of its process (the daemon reads it once).
  auto mine = MapChannel(a.agent->fd());
  ASSERT_TRUE(mine.ok()) << mine.status();
  const auto* ours = reinterpret_cast<const copy_agent::Channel*>((*mine)->data());
  ASSERT_NE(ours->process_token, 0u);
  ASSERT_NE(ours->context, 0u);
  struct Claim {
    const char* what;
    uint64_t token, context;
  };
  for (const Claim& claim : {Claim{"another token", ours->process_token ^ 1, ours->context},
                             Claim{"another context", ours->process_token, ours->context + 64}}) {
    auto other = ChannelWithoutAgent();  // no agent answers it
    ASSERT_NE(other, nullptr);
    auto* c = reinterpret_cast<copy_agent::Channel*>(other->data());
    c->process_token = claim.token;
    c->context = claim.context;
    auto stranger = CopyAgentLink::Create(other, kStaging, ::getpid(),
                                          CopyAgentLinkOptions{.timeout = absl::Milliseconds(50)});
    ASSERT_TRUE(stranger.ok()) << stranger.status();
    const absl::Status s = CopyAgentLink::Between(**stranger, from.va(), *b.link, to.va(), 100);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded)
        << claim.what << ": not through the stranger's agent: " << s;
    EXPECT_EQ(b.agent->copies(), 1u) << claim.what << ": b's agent reached the stranger's memory";
  }
}

// The agent answers a request with a CUDA error (a failed stream query)
// while its kernel is still queued: the daemon calls it off at the gate
// before it redoes the add, so the kernel, running later, adds nothing.
TEST(CopyAgentAtomicTest, OneAnsweredWithACudaErrorIsCalledOffBeforeItIsRedone) {
  GatedPair p;
  ASSERT_NE(p.link, nullptr);
  ClientAllocation gpu(*p.cu, kGran);
  std::memset(gpu.data(), 0, 8);
  p.cu->holdStreams(true);
  p.cu->failNext("streamQuery", drivers::kCudaErrorUnknown);
  const CopyAgentLink::AtomicOutcome a = p.link->FetchAdd(gpu.va(), false, 5, 0);
  EXPECT_EQ(a.kind, Kind::kNotApplied) << a.why;
  EXPECT_EQ(a.why.code(), absl::StatusCode::kInternal) << a.why;
  std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(gpu.data()));
  word.fetch_add(5);  // the daemon's own add
  p.cu->holdStreams(false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (p.cu->busyKernelStreams() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(word.load(), 5u) << "the held kernel added after the daemon did";
}

// A called-off atomic (the agent's submit call blocked) runs once, in the
// daemon's context; the kernel that runs later adds nothing.
TEST_F(AgentAtomicsEngineTest, ACalledOffAtomicRunsOnceInTheDaemonsContext) {
  Prepare();
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  Word().store(100);
  client_cu_->pauseSubmissions(true);
  Wqe64 w;
  mlx5::build_atomic_fa64(&w, 0, qp->qpn(), kUpd, word_->va(), word_key_, 1, HostIova(0),
                          fetch_key_);
  Cqe64 c = RunOne(*qp, w);
  ASSERT_EQ(CqeOpcode(c), mlx5::kCqeReq) << "syndrome " << int(CqeSyndrome(c));
  EXPECT_EQ(Fetched(0), 100u);
  EXPECT_EQ(Word().load(), 101u);
  const uint64_t answered = agent_->copies();
  client_cu_->pauseSubmissions(false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (agent_->copies() == answered && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GT(agent_->copies(), answered) << "the blocked request was never answered";
  EXPECT_EQ(Word().load(), 101u) << "the called-off kernel added as well";
}

// An atomic whose kernel passed the gate and never finished may still
// add: the WQE fails with the responder's operation error and the daemon
// does not add (the word is left to the kernel).
TEST_F(AgentAtomicsEngineTest, AnAtomicThatMayStillRunFailsInsteadOfRunningTwice) {
  ClientAllocation word(*client_cu_, kGran);
  std::memset(word.data(), 0, 8);
  PlayedAtomicKernel kernel(PlayedAtomicKernel::Ending::kNeverLands, 0);
  ASSERT_TRUE(engine_.AttachCopyAgent(kPdB, kernel.Link()).ok());
  const uint32_t word_key = GpuRegion(kPdB, word, kRemoteAtomic);
  const uint32_t fetch_key = HostRegion(kPdA, 0, 4096, kLocalWrite);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  Wqe64 w;
  mlx5::build_atomic_fa64(&w, 0, qp->qpn(), kUpd, word.va(), word_key, 1, HostIova(0), fetch_key);
  const Cqe64 c = RunOne(*qp, w);
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndRemoteOpErr);
  uint64_t v = 1;
  std::memcpy(&v, word.data(), 8);
  EXPECT_EQ(v, 0u) << "the daemon added while the agent's kernel still might";
}

#endif  // MC_CLIENT_HAVE_LANDING_KERNEL

}  // namespace
}  // namespace mooncake::softnic
