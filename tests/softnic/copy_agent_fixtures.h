// What the copy-agent tests share (copy_agent_test.cc, copy_agent_ops_test.cc):
// the client's fake driver and context, the daemon's mapping of a channel
// and its link, a gated agent (its kernels' host stand-ins), and the engine
// fixture whose GPU regions belong to processes running agents.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

#include "copy_agent.h"
#include "fake_copy_agent_kernels.h"
#include "fake_cuda_driver.h"
#include "fake_gpu.h"
#include "gpu_engine_fixture.h"
#include "mooncake/device/mlx5/prm.h"
#include "mooncake/device/mlx5/wqe.h"
#include "raw_qp.h"
#include "softnic/copy_agent_link.h"
#include "softnic/cuda_memory.h"
#include "softnic/engine.h"
#include "softnic/shared_mapping.h"

namespace mooncake::softnic::copy_agent_testing {

using drivers::FakeCudaDriver;
using drivers::FakeGpu;
using test_util::ClientAllocation;
using test_util::FakeOptions;
using test_util::FakeWithGpus;
using test_util::kGran;
using test_util::RawQp;
namespace mlx5 = test_util::mlx5;
using mlx5::Cqe64;
using mlx5::Wqe64;

inline constexpr PdId kPdA = 11;  // requesters
inline constexpr PdId kPdB = 22;  // the responder
inline constexpr uint8_t kUpd = mlx5::kCtrlCqUpdate;
inline constexpr uint64_t kStaging =
    copy_agent::kMinStagingBytes;  // 64 KiB: big copies go in pieces

inline uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>((i * 131 + 7) ^ (i >> 8)); }

inline std::shared_ptr<FakeCudaDriver> ClientDriver() {
  auto cu = std::make_shared<FakeCudaDriver>();
  cu->addGpu(FakeGpu::Hopper(0));
  cu->setGranularity(kGran);
  EXPECT_EQ(cu->init(0), drivers::kCudaSuccess);
  return cu;
}

inline drivers::CuContext PrimaryContext(FakeCudaDriver& cu) {
  drivers::CuDevice dev = 0;
  drivers::CuContext ctx = nullptr;
  EXPECT_EQ(cu.deviceGet(&dev, 0), drivers::kCudaSuccess);
  EXPECT_EQ(cu.devicePrimaryCtxRetain(&ctx, dev), drivers::kCudaSuccess);
  return ctx;
}

// The daemon's mapping of a channel memfd `fd`, as RdmaResources::
// AttachCopyAgent maps it.
inline absl::StatusOr<std::shared_ptr<SharedMapping>> MapChannel(int fd,
                                                                 uint64_t staging = kStaging) {
  return SharedMapping::FromPopulatedMemfd(fd, 0, copy_agent::kHeaderBytes + staging);
}

// A channel with no agent behind it: a serving header over anonymous
// memory, which the test itself plays the agent in (or leaves silent).
inline std::shared_ptr<SharedMapping> ChannelWithoutAgent() {
  auto m = SharedMapping::Anonymous(copy_agent::kHeaderBytes + kStaging);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  auto* c = reinterpret_cast<copy_agent::Channel*>((*m)->data());
  c->magic = copy_agent::kMagic;
  c->version = copy_agent::kVersion;
  c->state = static_cast<uint32_t>(copy_agent::State::kServing);
  return *m;
}

// The daemon's side of `fd`.
inline absl::StatusOr<std::shared_ptr<CopyAgentLink>> LinkTo(
    int fd, uint64_t staging, int32_t pid, absl::Duration timeout = absl::Seconds(2),
    absl::Duration stall = absl::Milliseconds(20)) {
  auto mapping = MapChannel(fd, staging);
  if (!mapping.ok()) return mapping.status();
  return CopyAgentLink::Create(*mapping, staging, pid,
                               CopyAgentLinkOptions{.timeout = timeout, .stall = stall});
}

#if MC_CLIENT_HAVE_LANDING_KERNEL
// An agent whose copies into GPU memory go through the landing kernel, and
// its small requests to the resident kernel unless `resident` is false
// (their host stand-ins on the fake driver: fake_copy_agent_kernels.h).
inline std::unique_ptr<CopyAgent> GatedAgent(const std::shared_ptr<FakeCudaDriver>& cu,
                                             bool resident = true) {
  test_util::RegisterFakeCopyAgentKernels(*cu);
  CopyAgentOptions options;
  options.resident_max_bytes = resident ? kResidentMaxBytes : 0;
  auto agent = CopyAgent::Create(cu, PrimaryContext(*cu), kStaging, options);
  EXPECT_TRUE(agent.ok()) << agent.status();
  if (!agent.ok()) return nullptr;
  EXPECT_TRUE((*agent)->gated()) << "the warm-up landing failed";
  EXPECT_EQ((*agent)->resident(), resident) << "the resident kernel's warm-up";
  return *std::move(agent);
}

// How many requests `agent`'s resident kernel served, once that is `n` (or
// 5 s passed): the agent counts a request only after the kernel's answer
// reached the daemon.
inline uint64_t ServedByResident(const CopyAgent& agent, uint64_t n) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (agent.served_by_resident() < n && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  return agent.served_by_resident();
}

#endif  // MC_CLIENT_HAVE_LANDING_KERNEL

// Waits until the link serves again (the agent answered the request it
// was blocked in).
inline bool ServesAgain(CopyAgentLink& link) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!link.usable()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The engine, with GPU regions of processes that may run agents.
class AgentEngineTest : public test_util::GpuEngineFixture {
 protected:
  void SetUp() override {
    client_cu_ = ClientDriver();
    ctx_ = PrimaryContext(*client_cu_);
    cu_ = FakeWithGpus(1);
    cuda_ = CudaMemory::Create(FakeOptions(cu_, daemon_atomic_failures_));
    StartEngine();
  }

  // An agent for `pd`, as if its session's process were `pid`.
  // `stall`: the link's bound on a busy agent (a kernel on the fake runs on
  // a thread of its own, which a loaded machine may not schedule for tens
  // of milliseconds).
  std::unique_ptr<CopyAgent> Attach(PdId pd, int32_t pid,
                                    absl::Duration stall = absl::Milliseconds(20)) {
    auto agent = CopyAgent::Create(client_cu_, ctx_, kStaging);
    EXPECT_TRUE(agent.ok()) << agent.status();
    if (!agent.ok()) return nullptr;
    auto link =
        LinkTo((*agent)->fd(), kStaging, pid, std::max(absl::Milliseconds(200), 2 * stall), stall);
    EXPECT_TRUE(link.ok()) << link.status();
    if (!link.ok()) return nullptr;
    EXPECT_TRUE(engine_.AttachCopyAgent(pd, *link).ok());
    return *std::move(agent);
  }
  Cqe64 RunOne(RawQp& qp, const Wqe64& w) {
    qp.Write(w);
    qp.Ring();
    Cqe64 c{};
    EXPECT_TRUE(qp.Next(&c)) << "no CQE";
    return c;
  }
  // Copies the daemon's own CUDA context ran.
  int DaemonCopies() const {
    return cu_->calls("memcpyHtoD") + cu_->calls("memcpyDtoH") + cu_->calls("memcpyDtoD") +
           cu_->calls("memcpy");
  }

  std::shared_ptr<FakeCudaDriver> client_cu_;
  drivers::CuContext ctx_ = nullptr;
  std::shared_ptr<FakeCudaDriver> cu_;  // the daemon's
  // Set above 0, the daemon's own atomics on GPU words fail (that many):
  // a test sees whether an atomic went to an agent or to the daemon.
  std::shared_ptr<std::atomic<int>> daemon_atomic_failures_ = std::make_shared<std::atomic<int>>(0);
};

}  // namespace mooncake::softnic::copy_agent_testing
