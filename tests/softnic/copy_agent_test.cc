// softnic's copy agents (issue 24 item 11), without a GPU: the client's
// CopyAgent (client/src/copy_agent.h) on a FakeCudaDriver, whose "device
// memory" is host memory, and softnic's CopyAgentLink over the same memfd
// the daemon would map. Then the engine: WRITEs into and out of GPU regions
// whose process runs an agent move through it (the daemon's own CUDA
// context copies nothing), between two processes through both staging
// areas, and back through the daemon's context once an agent is gone,
// silent or failing. Last, an agent in a forked process, asleep on its
// futex between requests.
#include "copy_agent.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "copy_agent_fixtures.h"
#include "fake_copy_agent_kernels.h"
#include "fake_cuda_driver.h"
#include "fake_gpu.h"
#include "gpu_engine_fixture.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/device/mlx5/prm.h"
#include "mooncake/device/mlx5/wqe.h"
#include "raw_qp.h"
#include "softnic/copy_agent_link.h"
#include "softnic/cuda_memory.h"
#include "softnic/engine.h"
#include "softnic/shared_mapping.h"

namespace mooncake::softnic {
namespace {

// The fixtures, and the fakes' and mlx5's names they use.
using namespace copy_agent_testing;  // NOLINT: the shared fixtures

using namespace std::chrono_literals;
using test_util::CqeOpcode;
using test_util::CqeSyndrome;

// ---- the agent and the link --------------------------------------------------------

class CopyAgentLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cu_ = ClientDriver();
    ctx_ = PrimaryContext(*cu_);
    auto agent = CopyAgent::Create(cu_, ctx_, kStaging);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = *std::move(agent);
    auto link = LinkTo(agent_->fd(), kStaging, ::getpid());
    ASSERT_TRUE(link.ok()) << link.status();
    link_ = *link;
  }
  std::shared_ptr<FakeCudaDriver> cu_;
  drivers::CuContext ctx_ = nullptr;
  std::unique_ptr<CopyAgent> agent_;
  std::shared_ptr<CopyAgentLink> link_;
};

TEST_F(CopyAgentLinkTest, MovesBytesBothWaysAndWithinInPieces) {
  ClientAllocation gpu(*cu_, 4 * kGran);
  const int warm = cu_->calls("memcpyHtoD");  // the agent's warm-up copies
  const uint64_t n = 3 * kStaging + 17;       // four pieces, the last a short one
  std::vector<uint8_t> host(n);
  for (uint64_t i = 0; i < n; ++i) host[i] = PatternByte(i);
  ASSERT_TRUE(link_->ToDevice(gpu.va() + 5, host.data(), n).ok());
  EXPECT_EQ(std::memcmp(gpu.data() + 5, host.data(), n), 0);
  EXPECT_EQ(link_->requests_done(), 4u);

  std::vector<uint8_t> back(n, 0);
  uint64_t pieces = 0;
  ASSERT_TRUE(link_
                  ->FromDevice(gpu.va() + 5, n,
                               [&](const uint8_t* p, uint64_t off, uint64_t len) {
                                 std::memcpy(back.data() + off, p, len);
                                 ++pieces;
                                 return true;
                               })
                  .ok());
  EXPECT_EQ(back, host);
  EXPECT_EQ(pieces, 4u);

  // Within: out to the staging area and in again, two requests.
  ASSERT_TRUE(link_->WithinDevice(gpu.va() + 2 * kGran, gpu.va() + 5, 1000).ok());
  EXPECT_EQ(std::memcmp(gpu.data() + 2 * kGran, host.data(), 1000), 0);
  EXPECT_EQ(agent_->copies(), 10u);
  EXPECT_EQ(cu_->calls("memcpyHtoD") - warm, 5) << "on the agent's stream";
  EXPECT_TRUE(link_->usable());
}

// Before the channel goes out, one copy of each kind has run on the
// agent's stream (the first of a kind can wait for running kernels).
TEST(CopyAgentWarmUpTest, EachKindOfCopyRunsOnceAtCreation) {
  auto cu = ClientDriver();
  auto agent = CopyAgent::Create(cu, PrimaryContext(*cu), kStaging);
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_EQ(cu->calls("memcpyHtoD"), 1);
  EXPECT_EQ(cu->calls("memcpyDtoH"), 1);
  EXPECT_EQ(cu->calls("memFree"), 1);
  cu->failNext("memcpyHtoD", drivers::kCudaErrorUnknown);
  auto refused = CopyAgent::Create(cu, PrimaryContext(*cu), kStaging);
  EXPECT_FALSE(refused.ok()) << "a driver that cannot copy runs no agent";
  EXPECT_NE(refused.status().message().find("warm-up"), absl::string_view::npos)
      << refused.status();
}

// Two processes' GPU memory, each written from the other's at the same
// time (two ranks exchanging, on two GPU workers): each copy needs both
// links. Taken one inside the other, as a sink of FromDevice once did, the
// two threads could each hold one link and wait for the other for good.
TEST_F(CopyAgentLinkTest, TwoProcessesCopyingEachWayAtOnceNeverWaitForEachOther) {
  // Links that tolerate a loaded machine: an agent thread descheduled for
  // 20 ms would pause a link, which is not what this test is about. Two
  // pids: as one process's, the destination's agent would copy alone.
  auto slow_ok = [](int fd, int32_t pid) {
    return LinkTo(fd, kStaging, pid, absl::Seconds(30), absl::Seconds(30));
  };
  auto mine_link = slow_ok(agent_->fd(), 1000);
  ASSERT_TRUE(mine_link.ok()) << mine_link.status();
  auto other_cu = ClientDriver();
  auto other_agent = CopyAgent::Create(other_cu, PrimaryContext(*other_cu), kStaging);
  ASSERT_TRUE(other_agent.ok()) << other_agent.status();
  auto other_link = slow_ok((*other_agent)->fd(), 2000);
  ASSERT_TRUE(other_link.ok()) << other_link.status();
  ClientAllocation mine(*cu_, kGran), theirs(*other_cu, kGran);
  constexpr uint64_t kBytes = kStaging / 2;
  for (uint64_t i = 0; i < kBytes; ++i) {
    mine.data()[i] = PatternByte(i);
    theirs.data()[i] = PatternByte(i + 1);
  }
  constexpr int kRounds = 200;
  // Shared with threads that outlive a failed test (they are detached if
  // they wait for each other for good).
  struct Run {
    std::atomic<int> failures{0};
    std::atomic<int> finished{0};
  };
  auto run = std::make_shared<Run>();
  auto copy = [run](std::shared_ptr<CopyAgentLink> from, uint64_t src,
                    std::shared_ptr<CopyAgentLink> to, uint64_t dst) {
    for (int i = 0; i < kRounds; ++i) {
      if (!CopyAgentLink::Between(*from, src, *to, dst, kBytes).ok()) ++run->failures;
    }
    ++run->finished;
  };
  std::thread there(copy, *mine_link, mine.va(), *other_link, theirs.va() + kBytes);
  std::thread back(copy, *other_link, theirs.va(), *mine_link, mine.va() + kBytes);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (run->finished.load() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  if (run->finished.load() < 2) {
    there.detach();
    back.detach();
    // The two threads hold each other's link: nothing here can end them.
    FAIL() << "the two copies wait for each other";
  }
  there.join();
  back.join();
  EXPECT_EQ(run->failures.load(), 0);
  EXPECT_EQ(std::memcmp(theirs.data() + kBytes, mine.data(), kBytes), 0);
  EXPECT_EQ(std::memcmp(mine.data() + kBytes, theirs.data(), kBytes), 0);
  EXPECT_EQ((*other_agent)->copies(), 2u * kRounds) << "one copy out, one in, per round";
}

TEST_F(CopyAgentLinkTest, ACudaErrorFailsOnlyThatCopy) {
  std::vector<uint8_t> host(64, 1);
  // No allocation there: the agent's driver refuses the copy.
  absl::Status s = link_->ToDevice(0x10, host.data(), host.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("CUDA error"), absl::string_view::npos) << s;
  EXPECT_TRUE(link_->usable());
  ClientAllocation gpu(*cu_, kGran);
  EXPECT_TRUE(link_->ToDevice(gpu.va(), host.data(), host.size()).ok());
}

TEST_F(CopyAgentLinkTest, AClosedAgentEndsTheLinkAtOnce) {
  agent_.reset();  // marks the channel closed
  EXPECT_FALSE(link_->usable());
  std::vector<uint8_t> host(8, 1);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(link_->ToDevice(0x1000, host.data(), 8).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500))
      << "a closed agent is not waited for";
}

TEST(CopyAgentLinkCreateTest, RefusesSizesAndHeadersThatDoNotFit) {
  auto cu = ClientDriver();
  auto agent = CopyAgent::Create(cu, PrimaryContext(*cu), kStaging);
  ASSERT_TRUE(agent.ok()) << agent.status();
  // The staging size the RPC names must match what the memfd holds.
  auto mapping = MapChannel((*agent)->fd());
  ASSERT_TRUE(mapping.ok());
  EXPECT_EQ(CopyAgentLink::Create(*mapping, 2 * kStaging, 1, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyAgentLink::Create(*mapping, 1000, 1, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyAgent::Create(cu, PrimaryContext(*cu), 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A header that is not a channel's.
  auto blank = SharedMapping::Anonymous(copy_agent::kHeaderBytes + kStaging);
  ASSERT_TRUE(blank.ok());
  absl::Status s = CopyAgentLink::Create(*blank, kStaging, 1, {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("magic"), absl::string_view::npos) << s;
}

// A channel whose agent never answers (its process is stopped, or hostile):
// the request times out, the link ends, and no later call waits again.
TEST(CopyAgentLinkSilentTest, ASilentAgentTimesOutOnceAndIsNotAskedAgain) {
  std::shared_ptr<SharedMapping> blank = ChannelWithoutAgent();
  ASSERT_NE(blank, nullptr);
  auto* c = reinterpret_cast<copy_agent::Channel*>(blank->data());
  auto link = CopyAgentLink::Create(blank, kStaging, 1,
                                    CopyAgentLinkOptions{.timeout = absl::Milliseconds(50)});
  ASSERT_TRUE(link.ok()) << link.status();
  std::vector<uint8_t> host(8, 1);
  absl::Status s = (*link)->ToDevice(0x1000, host.data(), 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_FALSE((*link)->usable());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE((*link)->ToDevice(0x1000, host.data(), 8).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(40));
  // Nobody took it, so it is cancelled: an agent that wakes later skips
  // it, and nothing is left to land late.
  EXPECT_EQ(c->claim, uint64_t{c->request_seq} | copy_agent::kCancelled);
  EXPECT_FALSE((*link)->LateCopyOverlaps(0x1000, 8));
  // A stale answer (done_seq of the request that timed out) is not taken
  // for the next one either: the link has ended.
  c->done_seq = c->request_seq;
  EXPECT_FALSE((*link)->usable());
}

// Review of issue 24: each request was bounded, the call was not. An
// agent answering every 64 KiB piece just inside the timeout held the
// link (and a GPU worker) for hours on a large copy. The call's pace now
// ends the link once it falls behind timeout + bytes / 64 MiB/s.
TEST(CopyAgentLinkSlowTest, AnAgentThatAnswersEachPieceJustInTimeEndsTheLinkWithinTheCall) {
  std::shared_ptr<SharedMapping> blank = ChannelWithoutAgent();
  ASSERT_NE(blank, nullptr);
  auto* c = reinterpret_cast<copy_agent::Channel*>(blank->data());
  auto link = CopyAgentLink::Create(blank, kStaging, 1,
                                    CopyAgentLinkOptions{.timeout = absl::Milliseconds(60)});
  ASSERT_TRUE(link.ok()) << link.status();
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::thread slow([&] {
    uint32_t seen = 0;
    while (!stop.load()) {
      const uint32_t seq = std::atomic_ref<uint32_t>(c->request_seq).load();
      if (seq == seen) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      seen = seq;
      std::this_thread::sleep_for(std::chrono::milliseconds(40));  // inside the 60 ms
      std::atomic_ref<int32_t>(c->result).store(0);
      std::atomic_ref<uint32_t>(c->done_seq).store(seq, std::memory_order_release);
      ++answered;
    }
  });
  std::vector<uint8_t> host(64 * kStaging, 1);  // 64 pieces: 2.5 s at this agent's pace
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = (*link)->ToDevice(0x1000, host.data(), host.size());
  const auto took = std::chrono::steady_clock::now() - t0;
  stop = true;
  slow.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("slower than 64 MiB/s"), absl::string_view::npos) << s;
  EXPECT_FALSE((*link)->usable());
  EXPECT_LE(answered.load(), 3);
  EXPECT_LT(took, std::chrono::milliseconds(500));
}

// The agent's side: a request the daemon cancelled before the agent took
// it is skipped (answered, nothing copied); the next one runs.
TEST(CopyAgentClaimTest, ARequestCancelledBeforeItWasTakenIsSkipped) {
  auto cu = ClientDriver();
  auto agent = CopyAgent::Create(cu, PrimaryContext(*cu), kStaging);
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto mapping = MapChannel((*agent)->fd());
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  auto* c = reinterpret_cast<copy_agent::Channel*>((*mapping)->data());
  uint8_t* staging = (*mapping)->data() + copy_agent::kHeaderBytes;
  ClientAllocation gpu(*cu, kGran);
  std::memset(gpu.data(), 0, 8);
  std::memset(staging, 7, 8);
  // As the daemon sends one (copy_agent_channel.h), by hand.
  auto send = [&](bool cancelled) {
    const uint32_t seq = std::atomic_ref<uint32_t>(c->request_seq).load() + 1;
    c->request.op = static_cast<uint32_t>(copy_agent::Op::kToDevice);
    c->request.dst = gpu.va();
    c->request.bytes = 8;
    c->request.staging_offset = 0;
    if (cancelled) std::atomic_ref<uint64_t>(c->claim).store(seq | copy_agent::kCancelled);
    std::atomic_ref<uint32_t>(c->request_seq).store(seq);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::atomic_ref<uint32_t>(c->done_seq).load() != seq &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return std::atomic_ref<uint32_t>(c->done_seq).load() == seq;
  };
  ASSERT_TRUE(send(/*cancelled=*/true)) << "the agent answers a cancelled request too";
  EXPECT_EQ(gpu.data()[0], 0) << "a cancelled request was run";
  ASSERT_TRUE(send(/*cancelled=*/false));
  EXPECT_EQ(gpu.data()[0], 7) << "the next request did not run";
  EXPECT_EQ((*agent)->copies(), 1u);
}

// An agent whose CUDA call is blocked (another thread of its process
// synchronizes the context while a kernel waits for this copy): it took
// the request and says since when it is busy, and never answers.
class BlockedAgent {
 public:
  BlockedAgent() {
    mapping_ = ChannelWithoutAgent();
    c_ = reinterpret_cast<copy_agent::Channel*>(mapping_->data());
    thread_ = std::thread([this] {
      uint32_t seen = 0;
      while (!stop_.load()) {
        const uint32_t seq = std::atomic_ref<uint32_t>(c_->request_seq).load();
        if (seq != seen) {
          seen = seq;
          last_seq_.store(seq);
          timespec now{};
          ::clock_gettime(CLOCK_MONOTONIC, &now);
          std::atomic_ref<uint32_t>(c_->phase).store(
              static_cast<uint32_t>(copy_agent::Phase::kSubmitting));
          std::atomic_ref<uint64_t>(c_->busy_since_ns)
              .store(uint64_t(now.tv_sec) * 1'000'000'000ull + uint64_t(now.tv_nsec));
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  }
  ~BlockedAgent() {
    stop_.store(true);
    thread_.join();
  }
  std::shared_ptr<CopyAgentLink> Link(int32_t pid) {
    auto link = CopyAgentLink::Create(mapping_, kStaging, pid,
                                      CopyAgentLinkOptions{.timeout = absl::Seconds(5)});
    EXPECT_TRUE(link.ok()) << link.status();
    return link.ok() ? *link : nullptr;
  }
  uint8_t* staging() const { return mapping_->data() + copy_agent::kHeaderBytes; }
  // The blocked call returns at last: the copy is answered.
  void Answer() { std::atomic_ref<uint32_t>(c_->done_seq).store(last_seq_.load()); }

 private:
  std::shared_ptr<SharedMapping> mapping_;
  copy_agent::Channel* c_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> last_seq_{0};
  std::thread thread_;
};

TEST(CopyAgentStallTest, ABlockedCudaCallPausesTheLinkInMillisecondsAndItsLateCopyIsMirrored) {
  BlockedAgent agent;
  auto link = agent.Link(1);
  ASSERT_NE(link, nullptr);
  const uint64_t dst = 0x7000;
  const uint8_t old_bytes[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = link->ToDevice(dst, old_bytes, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("inside the agent's submit call"), absl::string_view::npos) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1))
      << "the stall (20 ms), not the timeout (5 s)";
  EXPECT_FALSE(link->usable()) << "paused";
  const uint8_t other[8] = {5, 5, 5, 5, 5, 5, 5, 5};
  EXPECT_EQ(link->ToDevice(dst + 64, other, 8).code(), absl::StatusCode::kUnavailable)
      << "not asked again while its copy is blocked";
  EXPECT_EQ(std::memcmp(agent.staging(), old_bytes, 8), 0)
      << "the blocked copy's bytes are not overwritten by a refused request";
  // The late copy would land old_bytes at [dst, dst + 8): later bytes the
  // daemon writes there go into its staging area too.
  EXPECT_TRUE(link->LateCopyOverlaps(dst + 6, 4));
  EXPECT_FALSE(link->LateCopyOverlaps(dst + 8, 4));
  const uint8_t newer[4] = {9, 9, 9, 9};
  link->MirrorIntoLateCopy(dst + 6, newer, 4);  // overlaps [6, 8) only
  const uint8_t want[8] = {1, 1, 1, 1, 1, 1, 9, 9};
  EXPECT_EQ(std::memcmp(agent.staging(), want, 8), 0);
  // Once the late copy is answered nothing is mirrored any more.
  agent.Answer();
  EXPECT_TRUE(link->usable()) << "the blocked copy completed: the agent serves again";
  EXPECT_FALSE(link->LateCopyOverlaps(dst, 8));
  link->MirrorIntoLateCopy(dst, newer, 4);
  EXPECT_EQ(std::memcmp(agent.staging(), want, 8), 0);
}

// A copy queued behind work the context holds back (on the H200: another
// thread loading a kernel for the first time while a kernel runs) carries
// the bytes it was submitted with and lands only once the kernels end,
// after the daemon gave up on it and wrote the range itself. The agent
// queues it again each time the daemon writes newer bytes there, so the
// copy landing last carries the newest.
TEST(CopyAgentHeldTest, ACopyHeldBackLandsLastWithTheNewestBytes) {
  auto cu = ClientDriver();
  auto agent = CopyAgent::Create(cu, PrimaryContext(*cu), kStaging);
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto link = LinkTo((*agent)->fd(), kStaging, ::getpid());
  ASSERT_TRUE(link.ok()) << link.status();
  ClientAllocation gpu(*cu, kGran);
  cu->holdStreams(true);
  const std::vector<uint8_t> old_bytes(8, 1), newer(8, 2), newest(8, 3);
  const absl::Status s = (*link)->ToDevice(gpu.va(), old_bytes.data(), 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("queued on the agent's stream"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("CUDA_MODULE_LOADING=EAGER"), absl::string_view::npos) << s;
  // What the engine does next, twice: the bytes into the late copy's
  // staging range, then into GPU memory through its own context.
  for (const std::vector<uint8_t>* b : {&newer, &newest}) {
    ASSERT_TRUE((*link)->LateCopyOverlaps(gpu.va(), 8));
    (*link)->MirrorIntoLateCopy(gpu.va(), b->data(), 8);
    std::memcpy(gpu.data(), b->data(), 8);
  }
  // The agent queued the copy again with the newest bytes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (cu->lastHeldCopy() != newest && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(cu->lastHeldCopy(), newest);
  EXPECT_EQ(std::memcmp(gpu.data(), newest.data(), 8), 0);
  // The kernels end: every held copy lands, the first with the old bytes.
  cu->holdStreams(false);
  EXPECT_EQ(std::memcmp(gpu.data(), newest.data(), 8), 0) << "the old bytes landed last";
  while (!(*link)->usable() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE((*link)->usable()) << "the held copy completed: the agent serves again";
  EXPECT_FALSE((*link)->LateCopyOverlaps(gpu.va(), 8));
}

// ---- the gate: copies into GPU memory that can be called off after submission -----

#if MC_CLIENT_HAVE_LANDING_KERNEL
// A gated agent of this process and the daemon's link to it; each request
// through the resident kernel (GetParam() true) or a landing kernel each.
class CopyAgentGateTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    cu_ = ClientDriver();
    agent_ = GatedAgent(cu_, GetParam());
    ASSERT_NE(agent_, nullptr);
    // A stall bound a loaded machine's scheduling cannot reach (the fake
    // runs each kernel on a thread of its own); the stalls below are real.
    auto link =
        LinkTo(agent_->fd(), kStaging, ::getpid(), absl::Seconds(2), absl::Milliseconds(250));
    ASSERT_TRUE(link.ok()) << link.status();
    link_ = *link;
  }
  // What the daemon's message names while the request waits unserved.
  const char* Unserved() const {
    return GetParam() ? "with the agent's resident kernel" : "queued on the agent's stream";
  }
  std::shared_ptr<FakeCudaDriver> cu_;
  std::unique_ptr<CopyAgent> agent_;
  std::shared_ptr<CopyAgentLink> link_;
};

TEST_P(CopyAgentGateTest, LandingsMoveBytesOfEverySizeAndAlignment) {
  std::vector<uint8_t> src(3 * kStaging + 17);
  ClientAllocation gpu(*cu_, (src.size() + 8 + kGran - 1) / kGran * kGran);
  for (uint64_t i = 0; i < src.size(); ++i) src[i] = PatternByte(i);
  // Pieces of the staging size (several blocks each), a tail, odd offsets.
  for (const auto& [off, n] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 8}, {3, 1}, {16, 4096}, {5, 70'000}, {0, src.size()}}) {
    std::memset(gpu.data(), 0, src.size() + 8);
    ASSERT_TRUE(link_->ToDevice(gpu.va() + off, src.data(), n).ok()) << n;
    EXPECT_EQ(std::memcmp(gpu.data() + off, src.data(), n), 0) << n << " bytes at " << off;
    EXPECT_EQ(gpu.data()[off + n], 0) << "a byte past the copy was written";
  }
  // One request per staging piece (1 + 1 + 1 + 2 + 4): a landing each, or
  // all served by the resident kernel.
  if (GetParam()) {
    EXPECT_EQ(ServedByResident(*agent_, 9), 9u);
  } else {
    EXPECT_EQ(agent_->served_by_resident(), 0u);
    EXPECT_EQ(cu_->calls("launchKernel"), 2 + 9)
        << "the warm-up's (a landing and an atomic) and one per piece";
  }
}

// The defect seen on the H200 (2026-12-05): the agent's submit call blocks
// (another thread of its process sits in a synchronous copy from pageable
// memory while a kernel waits for this copy), the daemon writes the bytes
// itself, the application writes that memory again, and only then does the
// call return. The landing it submits then must write nothing.
TEST_P(CopyAgentGateTest, ACopyBlockedInItsSubmitCallLandsNothingAfterTheApplicationWritesAgain) {
  ClientAllocation gpu(*cu_, kGran);
  const std::vector<uint8_t> old_bytes(8, 1), app(8, 7), next(8, 9);
  cu_->pauseSubmissions(true);
  const absl::Status s = link_->ToDevice(gpu.va(), old_bytes.data(), 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("inside the agent's submit call"), absl::string_view::npos) << s;
  EXPECT_EQ(cu_->pausedSubmissions(), 1);
  EXPECT_FALSE(link_->LateCopyOverlaps(gpu.va(), 8)) << "called off: nothing to mirror into";
  // The daemon writes the bytes itself; the kernel that waited ends; the
  // application writes its next bytes there.
  std::memcpy(gpu.data(), old_bytes.data(), 8);
  std::memcpy(gpu.data(), app.data(), 8);
  // The blocked call returns: the landing runs, and lands nothing.
  cu_->pauseSubmissions(false);
  ASSERT_TRUE(ServesAgain(*link_));
  EXPECT_EQ(std::memcmp(gpu.data(), app.data(), 8), 0) << "the called-off copy landed late";
  // The agent serves again.
  ASSERT_TRUE(link_->ToDevice(gpu.va(), next.data(), 8).ok());
  EXPECT_EQ(std::memcmp(gpu.data(), next.data(), 8), 0);
}

// The other kind of late copy: a landing queued behind work the context
// holds back runs once the kernels end, after the daemon called it off.
TEST_P(CopyAgentGateTest, ALandingHeldBackWritesNothingOnceCalledOff) {
  ClientAllocation gpu(*cu_, kGran);
  const std::vector<uint8_t> old_bytes(200'000, 1), app(200'000, 7);
  cu_->holdStreams(true);
  const absl::Status s = link_->ToDevice(gpu.va(), old_bytes.data(), kStaging);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find(Unserved()), absl::string_view::npos) << s;
  EXPECT_FALSE(link_->LateCopyOverlaps(gpu.va(), 8));
  std::memcpy(gpu.data(), app.data(), kStaging);
  cu_->holdStreams(false);
  ASSERT_TRUE(ServesAgain(*link_));
  EXPECT_EQ(std::memcmp(gpu.data(), app.data(), kStaging), 0) << "the called-off landing wrote";
  EXPECT_TRUE(cu_->lastHeldCopy().empty()) << "no copy was queued again";
}

INSTANTIATE_TEST_SUITE_P(ResidentOrOneLaunchEach, CopyAgentGateTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Resident" : "OneLaunchEach";
                         });

// The resident kernel serves small requests both ways without a CUDA call
// each, returns once the agent goes idle (so a synchronize of the process
// does not wait for it), and is launched again by the next request; bigger
// requests still go one launch (or copy) each.
TEST(CopyAgentResidentTest, ServesBothWaysReturnsWhenIdleAndComesBack) {
  auto cu = ClientDriver();
  test_util::RegisterFakeCopyAgentKernels(*cu);
  auto agent = CopyAgent::Create(cu, PrimaryContext(*cu), kStaging,
                                 CopyAgentOptions{.resident_max_bytes = 4096});
  ASSERT_TRUE(agent.ok()) << agent.status();
  ASSERT_TRUE((*agent)->resident());
  // Its stream and the resident kernel's: the context's highest priority,
  // so their kernels take an SM slot before the rest of a waiting grid.
  EXPECT_EQ(cu->streamsAtPriority(drivers::FakeCudaDriver::kGreatestStreamPriority), 2);
  auto link = LinkTo((*agent)->fd(), kStaging, ::getpid(), absl::Seconds(5), absl::Seconds(2));
  ASSERT_TRUE(link.ok()) << link.status();
  ClientAllocation gpu(*cu, kGran);
  const int launches = cu->calls("launchKernel");
  for (uint64_t round = 0; round < 100; ++round) {
    const uint64_t v = round * 0x0101010101010101ull;
    ASSERT_TRUE(
        (*link)->ToDevice(gpu.va() + 8 * round, reinterpret_cast<const uint8_t*>(&v), 8).ok());
    uint64_t back = 0;
    ASSERT_TRUE((*link)
                    ->FromDevice(gpu.va() + 8 * round, 8,
                                 [&](const uint8_t* piece, uint64_t, uint64_t n) {
                                   std::memcpy(&back, piece, n);
                                   return true;
                                 })
                    .ok());
    ASSERT_EQ(back, v);
  }
  const auto counted = [&](uint64_t n) { return ServedByResident(**agent, n); };
  EXPECT_EQ(counted(200), 200u);
  // Launched again only after the agent idled past its spin between two
  // requests (on a loaded machine, now and then); never once per request.
  EXPECT_LT(cu->calls("launchKernel") - launches, 200) << "a launch per request";
  // Idle past the agent's spin (0.5 ms): the resident kernel returns.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (cu->busyKernelStreams() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(cu->busyKernelStreams(), 0) << "the resident kernel did not return when idle";
  const int before = cu->calls("launchKernel");
  const uint8_t one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  ASSERT_TRUE((*link)->ToDevice(gpu.va(), one, 8).ok());
  EXPECT_EQ(std::memcmp(gpu.data(), one, 8), 0);
  EXPECT_EQ(cu->calls("launchKernel"), before + 1) << "launched again";
  // Bigger than resident_max_bytes: a landing of its own.
  const uint64_t served = counted(201);
  EXPECT_EQ(served, 201u);
  const std::vector<uint8_t> big(8192, 7);
  ASSERT_TRUE((*link)->ToDevice(gpu.va(), big.data(), big.size()).ok());
  EXPECT_EQ(std::memcmp(gpu.data(), big.data(), big.size()), 0);
  EXPECT_EQ((*agent)->served_by_resident(), served);
  EXPECT_EQ(cu->calls("launchKernel"), before + 2);
}

// The resident kernel returns by itself (age under steady traffic, idle
// between requests), saying so first; the agent launches the next one at
// once, behind it. Every request is served once, by a resident kernel, and
// the agent keeps using them.
TEST(CopyAgentResidentTest, KernelsThatReturnByThemselvesAreReplacedAndServeEveryRequestOnce) {
  auto cu = ClientDriver();
  test_util::RegisterFakeCopyAgentKernels(*cu, test_util::FakeResidentBounds::Real());
  auto agent = CopyAgent::Create(cu, PrimaryContext(*cu), kStaging,
                                 CopyAgentOptions{.resident_max_bytes = 4096});
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto link = LinkTo((*agent)->fd(), kStaging, ::getpid(), absl::Seconds(5), absl::Seconds(2));
  ASSERT_TRUE(link.ok()) << link.status();
  ClientAllocation gpu(*cu, kGran);
  const int launches = cu->calls("launchKernel");
  uint64_t requests = 0;
  // Back to back for 20 ms and 200 requests at least: past the kernel's age
  // bound (2 ms) several times.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  while (std::chrono::steady_clock::now() < until || requests < 200) {
    const uint64_t v = requests * 0x0001000100010001ull;
    ASSERT_TRUE(
        (*link)
            ->ToDevice(gpu.va() + 8 * (requests % 64), reinterpret_cast<const uint8_t*>(&v), 8)
            .ok());
    ASSERT_EQ(std::memcmp(gpu.data() + 8 * (requests % 64), &v, 8), 0);
    ++requests;
  }
  // Then with gaps past its idle bound (0.5 ms) and the agent's spin.
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const uint64_t v = ~requests;
    ASSERT_TRUE((*link)->ToDevice(gpu.va(), reinterpret_cast<const uint8_t*>(&v), 8).ok());
    ASSERT_EQ(std::memcmp(gpu.data(), &v, 8), 0);
    ++requests;
  }
  EXPECT_EQ(ServedByResident(**agent, requests), requests);
  EXPECT_TRUE((*agent)->resident()) << "the agent stopped using resident kernels";
  // One kernel per gap at least, and one for the first request. (How many
  // for age depends on how fast the machine serves: a loaded one can take
  // a launch per request, each kernel outliving its bounds.)
  EXPECT_GE(cu->calls("launchKernel") - launches, 11) << "a gap without a launch";
}

// A block that passed the gate before the daemon called the request off is
// writing: the daemon waits for it (bounded), so its own write comes last.
// One that never says it landed leaves the copy one that may still land.
TEST(CopyAgentGateLinkTest, TheDaemonWaitsForABlockThatPassedTheGateAndNoLonger) {
  for (const bool lands : {true, false}) {
    auto mapping = ChannelWithoutAgent();
    ASSERT_NE(mapping, nullptr);
    auto* c = reinterpret_cast<copy_agent::Channel*>(mapping->data());
    c->gate.gated = 1;
    auto link = CopyAgentLink::Create(
        mapping, kStaging, 1,
        CopyAgentLinkOptions{.stall = absl::Milliseconds(20), .landing = absl::Seconds(1)});
    ASSERT_TRUE(link.ok()) << link.status();
    // The test plays the agent and its kernel: takes the request, and the
    // landing's only block passes the gate while the submission still
    // looks busy.
    std::atomic<bool> stop{false};
    std::thread gpu([&] {
      while (std::atomic_ref<uint32_t>(c->request_seq).load() == 0) std::this_thread::yield();
      const uint32_t seq = 1;
      copy_agent::Settle(*c, seq, seq);
      timespec now{};
      ::clock_gettime(CLOCK_MONOTONIC, &now);
      std::atomic_ref<uint32_t>(c->phase).store(static_cast<uint32_t>(copy_agent::Phase::kWaiting));
      std::atomic_ref<uint32_t>(c->gate.intent[0]).store(seq);
      std::atomic_ref<uint64_t>(c->busy_since_ns)
          .store(uint64_t(now.tv_sec) * 1'000'000'000ull + uint64_t(now.tv_nsec));
      // Past the stall: the daemon is calling it off and waits.
      while (std::atomic_ref<uint32_t>(c->gate.cancel_seq).load() != seq) {
        std::this_thread::yield();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (lands) std::atomic_ref<uint32_t>(c->gate.landed[0]).store(seq);
      while (!stop.load()) std::this_thread::yield();
    });
    const uint8_t bytes[8] = {3, 3, 3, 3, 3, 3, 3, 3};
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ((*link)->ToDevice(0x9000, bytes, 8).code(), absl::StatusCode::kDeadlineExceeded);
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(took, std::chrono::milliseconds(70)) << "did not wait for the writing block";
    EXPECT_EQ((*link)->LateCopyOverlaps(0x9000, 8), !lands)
        << (lands ? "a copy whose block landed can land no more"
                  : "a block still writing after the bound may yet land");
    stop.store(true);
    gpu.join();
  }
}
#endif  // MC_CLIENT_HAVE_LANDING_KERNEL

// A request's number never equals the gate's cancel word (0 at first, then
// the last request called off): after the 32-bit sequence wraps, a landing
// with that number would skip, yet answer as done.
TEST(CopyAgentGateLinkTest, TheSequenceSkipsTheNumberTheGateHolds) {
  auto mapping = ChannelWithoutAgent();
  ASSERT_NE(mapping, nullptr);
  auto* c = reinterpret_cast<copy_agent::Channel*>(mapping->data());
  c->gate.gated = 1;
  c->request_seq = 0xffffffffu;  // the next number would be 0
  auto link = CopyAgentLink::Create(mapping, kStaging, 1, {});
  ASSERT_TRUE(link.ok()) << link.status();
  std::atomic<uint32_t> asked{0};
  std::thread agent([&] {
    uint32_t seq;
    while ((seq = std::atomic_ref<uint32_t>(c->request_seq).load()) == 0xffffffffu) {
      std::this_thread::yield();
    }
    asked.store(seq);
    std::atomic_ref<uint32_t>(c->done_seq).store(seq);
  });
  const uint8_t bytes[8] = {};
  EXPECT_TRUE((*link)->ToDevice(0x9000, bytes, 8).ok());
  agent.join();
  EXPECT_EQ(asked.load(), 1u) << "request number 0 was used";
}

// ---- the engine through agents ---------------------------------------------------

TEST_F(AgentEngineTest, HostToGpuAndInlineSignalsGoThroughTheOwnersAgent) {
  ClientAllocation dst(*client_cu_, kGran);
  // Registered before the agent attaches: it still takes the region.
  const uint32_t dst_key = GpuRegion(kPdB, dst, kRemoteWrite);
  auto agent = Attach(kPdB, 1000);
  ASSERT_NE(agent, nullptr);
  const uint32_t src_key = HostRegion(kPdA, 0, 8192, 0);
  for (uint64_t i = 0; i < 8192; ++i) host_->data()[i] = PatternByte(i);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  Wqe64 w;
  mlx5::build_rdma_write(&w, 0, qp->qpn(), kUpd, dst.va() + 100, dst_key, HostIova(0), src_key,
                         8000);
  Cqe64 c = RunOne(*qp, w);
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  EXPECT_EQ(std::memcmp(dst.data() + 100, host_->data(), 8000), 0);
  const uint64_t signal = 0x1122334455667788ull;
  mlx5::build_rdma_write_inline(&w, 1, qp->qpn(), kUpd, dst.va() + 64, dst_key, &signal, 8);
  c = RunOne(*qp, w);
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  uint64_t seen;
  std::memcpy(&seen, dst.data() + 64, 8);
  EXPECT_EQ(seen, signal);
  EXPECT_EQ(agent->copies(), 2u);
  EXPECT_EQ(DaemonCopies(), 0) << "the daemon's context copied nothing";
  EXPECT_EQ(cu_->calls("streamQuery"), 0);
}

TEST_F(AgentEngineTest, GpuToGpuInOneProcessIsOneCopyAndAcrossProcessesGoesThroughBoth) {
  ClientAllocation a(*client_cu_, 2 * kGran), b(*client_cu_, 2 * kGran);
  auto agent_a = Attach(kPdA, 1000);
  ASSERT_NE(agent_a, nullptr);
  const uint32_t a_key = GpuRegion(kPdA, a, 0);
  const uint32_t host_key = HostRegion(kPdB, 4096, 4096, kRemoteWrite);
  for (uint64_t i = 0; i < a.size(); ++i) a.data()[i] = PatternByte(i);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  // GPU -> host: out through A's staging area.
  Wqe64 w;
  mlx5::build_rdma_write(&w, 0, qp->qpn(), kUpd, HostIova(4096), host_key, a.va() + 3, a_key, 4096);
  EXPECT_EQ(CqeOpcode(RunOne(*qp, w)), mlx5::kCqeReq);
  EXPECT_EQ(std::memcmp(host_->data() + 4096, a.data() + 3, 4096), 0);
  EXPECT_EQ(agent_a->copies(), 1u);

  // B is another process's: A's agent copies out, B's copies in, in pieces
  // of the staging size.
  auto agent_b = Attach(kPdB, 2000);
  ASSERT_NE(agent_b, nullptr);
  const uint32_t b_key = GpuRegion(kPdB, b, kRemoteWrite);
  const uint64_t n = kStaging + 1000;
  mlx5::build_rdma_write(&w, 1, qp->qpn(), kUpd, b.va() + 8, b_key, a.va() + 11, a_key,
                         static_cast<uint32_t>(n));
  EXPECT_EQ(CqeOpcode(RunOne(*qp, w)), mlx5::kCqeReq);
  EXPECT_EQ(std::memcmp(b.data() + 8, a.data() + 11, n), 0);
  EXPECT_EQ(agent_a->copies(), 3u);
  EXPECT_EQ(agent_b->copies(), 2u);
  EXPECT_EQ(DaemonCopies(), 0);
}

// Two sessions of one process on one GPU (ranks sharing a GPU, as the GPU
// suite runs them): the destination's agent runs the whole copy, out to its
// staging area and in again, never device to device, as these agents have
// no kernels (CopyAgentLink::WithinDevice; a gated one lands it straight:
// copy_agent_ops_test.cc). Another pid goes through both agents (above).
TEST_F(AgentEngineTest, TwoSessionsOfOneProcessOnOneGpuCopyThroughTheDestinationsAgent) {
  ClientAllocation a(*client_cu_, kGran), b(*client_cu_, kGran);
  auto agent_a = Attach(kPdA, 1000), agent_b = Attach(kPdB, 1000);
  const uint32_t a_key = GpuRegion(kPdA, a, 0);
  const uint32_t b_key = GpuRegion(kPdB, b, kRemoteWrite);
  for (uint64_t i = 0; i < a.size(); ++i) a.data()[i] = PatternByte(i);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  Wqe64 w;
  mlx5::build_rdma_write(&w, 0, qp->qpn(), kUpd, b.va(), b_key, a.va() + 1, a_key, 5000);
  EXPECT_EQ(CqeOpcode(RunOne(*qp, w)), mlx5::kCqeReq);
  EXPECT_EQ(std::memcmp(b.data(), a.data() + 1, 5000), 0);
  EXPECT_EQ(agent_a->copies(), 0u);
  EXPECT_EQ(agent_b->copies(), 2u);
  EXPECT_EQ(client_cu_->calls("memcpy"), 0) << "no device-to-device copy";
  EXPECT_EQ(DaemonCopies(), 0);
}

TEST_F(AgentEngineTest, TheDaemonCopiesOnceTheAgentIsGoneOrFails) {
  ClientAllocation dst(*client_cu_, kGran);
  auto agent = Attach(kPdB, 1000);
  const uint32_t dst_key = GpuRegion(kPdB, dst, kRemoteWrite);
  const uint32_t src_key = HostRegion(kPdA, 0, 4096, 0);
  std::memset(host_->data(), 0x5a, 4096);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  // The agent's driver fails the copy: the daemon's context redoes it.
  client_cu_->failNext("memcpyHtoD", drivers::kCudaErrorUnknown);
  Wqe64 w;
  mlx5::build_rdma_write(&w, 0, qp->qpn(), kUpd, dst.va(), dst_key, HostIova(0), src_key, 4096);
  EXPECT_EQ(CqeOpcode(RunOne(*qp, w)), mlx5::kCqeReq);
  EXPECT_EQ(dst.data()[4095], 0x5a);
  EXPECT_EQ(cu_->calls("memcpyHtoD"), 1);
  EXPECT_TRUE(engine_.HasCopyAgent(kPdB)) << "one failed copy does not end the agent";
  // The process's agent goes away (its transport was destroyed).
  agent.reset();
  std::memset(host_->data(), 0x6b, 4096);
  mlx5::build_rdma_write(&w, 1, qp->qpn(), kUpd, dst.va(), dst_key, HostIova(0), src_key, 4096);
  EXPECT_EQ(CqeOpcode(RunOne(*qp, w)), mlx5::kCqeReq);
  EXPECT_EQ(dst.data()[0], 0x6b);
  EXPECT_EQ(cu_->calls("memcpyHtoD"), 2);
  EXPECT_FALSE(engine_.HasCopyAgent(kPdB));
}

// The agent of the target's process blocks (its process synchronizes the
// context while the kernel waits): the daemon copies itself within
// milliseconds, and when the blocked copy lands at last it carries the
// newest bytes, not the ones it was asked for.
TEST_F(AgentEngineTest, ABlockedAgentsLateCopyCannotUndoALaterWrite) {
  ClientAllocation dst(*client_cu_, kGran);
  BlockedAgent agent;
  auto link = agent.Link(1000);
  ASSERT_NE(link, nullptr);
  ASSERT_TRUE(engine_.AttachCopyAgent(kPdB, link).ok());
  const uint32_t dst_key = GpuRegion(kPdB, dst, kRemoteWrite);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  Wqe64 w;
  const uint64_t first = 0x1111111111111111ull, second = 0x2222222222222222ull;
  mlx5::build_rdma_write_inline(&w, 0, qp->qpn(), kUpd, dst.va() + 64, dst_key, &first, 8);
  EXPECT_EQ(CqeOpcode(RunOne(*qp, w)), mlx5::kCqeReq);
  uint64_t seen = 0;
  std::memcpy(&seen, dst.data() + 64, 8);
  EXPECT_EQ(seen, first) << "the daemon's own copy, after the stall";
  mlx5::build_rdma_write_inline(&w, 1, qp->qpn(), kUpd, dst.va() + 64, dst_key, &second, 8);
  EXPECT_EQ(CqeOpcode(RunOne(*qp, w)), mlx5::kCqeReq);
  std::memcpy(&seen, dst.data() + 64, 8);
  EXPECT_EQ(seen, second);
  // The blocked copy lands now: staging[0, 8) -> the first write's place.
  std::memcpy(dst.data() + 64, agent.staging(), 8);
  std::memcpy(&seen, dst.data() + 64, 8);
  EXPECT_EQ(seen, second) << "the late copy carried the newest bytes";
}

#if MC_CLIENT_HAVE_LANDING_KERNEL
// The H200's failing case end to end: a WRITE into the GPU memory of a
// process whose agent's submit call blocks completes (the daemon writes it
// after the stall), the application writes there again, the call returns,
// and the application's bytes stay. Then the agent serves again.
TEST_F(AgentEngineTest, AWriteWhoseAgentBlockedCannotUndoTheApplicationsNextWrite) {
  test_util::RegisterFakeCopyAgentKernels(*client_cu_);
  ClientAllocation dst(*client_cu_, kGran);
  auto agent = Attach(kPdB, 1000, absl::Milliseconds(250));
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->gated());
  const uint32_t dst_key = GpuRegion(kPdB, dst, kRemoteWrite);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  const uint64_t first = 0x1111111111111111ull, app = 0x7777777777777777ull,
                 third = 0x3333333333333333ull;
  client_cu_->pauseSubmissions(true);
  Wqe64 w;
  mlx5::build_rdma_write_inline(&w, 0, qp->qpn(), kUpd, dst.va() + 64, dst_key, &first, 8);
  EXPECT_EQ(CqeOpcode(RunOne(*qp, w)), mlx5::kCqeReq);
  uint64_t seen = 0;
  std::memcpy(&seen, dst.data() + 64, 8);
  EXPECT_EQ(seen, first) << "the daemon's own copy, after the stall";
  const int daemon_copies = DaemonCopies();
  EXPECT_GE(daemon_copies, 1);
  std::memcpy(dst.data() + 64, &app, 8);  // the application's next write
  const uint64_t answered = agent->copies();
  client_cu_->pauseSubmissions(false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (agent->copies() == answered && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GT(agent->copies(), answered) << "the blocked request was never answered";
  std::memcpy(&seen, dst.data() + 64, 8);
  EXPECT_EQ(seen, app) << "the blocked copy landed over the application's write";
  mlx5::build_rdma_write_inline(&w, 1, qp->qpn(), kUpd, dst.va() + 64, dst_key, &third, 8);
  EXPECT_EQ(CqeOpcode(RunOne(*qp, w)), mlx5::kCqeReq);
  std::memcpy(&seen, dst.data() + 64, 8);
  EXPECT_EQ(seen, third);
  EXPECT_EQ(DaemonCopies(), daemon_copies) << "the agent serves again";
}
#endif  // MC_CLIENT_HAVE_LANDING_KERNEL

TEST_F(AgentEngineTest, OneAgentPerPdAndItGoesWithThePd) {
  auto agent = Attach(kPdB, 1000);
  ASSERT_NE(agent, nullptr);
  auto second = CopyAgent::Create(client_cu_, ctx_, kStaging);
  ASSERT_TRUE(second.ok());
  auto link = LinkTo((*second)->fd(), kStaging, 1000);
  ASSERT_TRUE(link.ok());
  EXPECT_EQ(engine_.AttachCopyAgent(kPdB, *link).code(), absl::StatusCode::kAlreadyExists);
  engine_.DestroyPd(kPdB);
  EXPECT_FALSE(engine_.HasCopyAgent(kPdB));
  EXPECT_TRUE(engine_.AttachCopyAgent(kPdB, *link).ok());
}

// ---- an agent in another process --------------------------------------------------

// The child runs an agent over its own fake GPU memory and sends the
// channel's fd and the address of its allocation; the parent, as the
// daemon, writes and reads that memory through it. The gaps between
// requests outlast the agent's spin, so each request wakes it on its futex.
TEST(CopyAgentProcessTest, AnAgentInAnotherProcessWakesForEachRequest) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(sv[0]);
    auto cu = std::make_shared<FakeCudaDriver>();
    cu->addGpu(FakeGpu::Hopper(0));
    cu->setGranularity(kGran);
    if (cu->init(0) != drivers::kCudaSuccess) ::_exit(2);
    drivers::CuDevice dev = 0;
    drivers::CuContext ctx = nullptr;
    cu->deviceGet(&dev, 0);
    cu->devicePrimaryCtxRetain(&ctx, dev);
    drivers::CuDevicePtr mem = 0;
    if (cu->memAlloc(&mem, 1 << 20) != drivers::kCudaSuccess) ::_exit(3);
    auto agent = CopyAgent::Create(cu, ctx, kStaging);
    if (!agent.ok()) ::_exit(4);
    const std::string addr = std::to_string(mem);
    if (!SendFrame(sv[1], addr, {(*agent)->fd()}).ok()) ::_exit(5);
    char done = 0;
    (void)::read(sv[1], &done, 1);  // until the parent is finished
    ::_exit(0);
  }
  ::close(sv[1]);
  auto frame = RecvFrame(sv[0], absl::Seconds(10));
  ASSERT_TRUE(frame.ok()) << frame.status();
  ASSERT_EQ(frame->fds.size(), 1u);
  const uint64_t mem = std::stoull(frame->payload);
  auto link = LinkTo(frame->fds[0].get(), kStaging, child);
  ASSERT_TRUE(link.ok()) << link.status();
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // the agent sleeps
    std::vector<uint8_t> out(3000), in(3000, 0);
    for (size_t i = 0; i < out.size(); ++i) out[i] = PatternByte(i + round);
    ASSERT_TRUE((*link)->ToDevice(mem + 64 * round, out.data(), out.size()).ok());
    ASSERT_TRUE((*link)
                    ->FromDevice(mem + 64 * round, in.size(),
                                 [&](const uint8_t* p, uint64_t off, uint64_t len) {
                                   std::memcpy(in.data() + off, p, len);
                                   return true;
                                 })
                    .ok());
    EXPECT_EQ(in, out) << "round " << round;
  }
  EXPECT_EQ((*link)->requests_done(), 10u);
  ::close(sv[0]);  // the child's read returns: it exits
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace mooncake::softnic
