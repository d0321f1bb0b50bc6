// RdmaResources::RegisterMemory with GPU memory ("cuda-vmm-fd"): the fd of a
// cuMem allocation is imported through softnic's CudaMemory (here backed by
// the fake CUDA driver), listed as "cuda-vmm", counted against the session's
// limits and released with the session; errors name what is missing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>

#include "fake_gpu.h"
#include "gmock/gmock.h"
#include "mooncake/common/copy_agent_channel.h"
#include "mooncake/common/populate.h"
#include "rdma/rdma_resources.h"

namespace mooncake::daemon {
namespace {

using softnic::test_util::ClientAllocation;
using softnic::test_util::FakeOptions;
using softnic::test_util::FakeWithGpus;
using softnic::test_util::kGran;
using ::testing::HasSubstr;

FdBundlePtr Dup(int fd) {
  auto b = std::make_shared<FdBundle>();
  b->fds.emplace_back(::dup(fd));
  return b;
}

class RdmaCudaRegistrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_cu_.addGpu(drivers::FakeGpu::Hopper(0));
    client_cu_.setGranularity(kGran);
    ASSERT_EQ(client_cu_.init(0), drivers::kCudaSuccess);
  }
  SessionInfo Open(uint32_t uid, int conn) {
    absl::StatusOr<SessionInfo> s = sessions_.Open(PeerCred{100 + conn, uid, uid}, conn, "t");
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }
  drivers::FakeCudaDriver client_cu_;
  std::shared_ptr<drivers::FakeCudaDriver> cu_ = FakeWithGpus(1);
  SessionRegistry sessions_{64};
  RdmaLimits limits_{.max_qps_per_session = 4, .max_mrs_per_session = 2};
  RdmaResources rdma_{&sessions_, "softnic0", limits_, softnic::EngineOptions{}, FakeOptions(cu_)};
};

TEST_F(RdmaCudaRegistrationTest, RegistersListsAndReleasesGpuMemory) {
  SessionInfo s = Open(1000, 10);
  ClientAllocation alloc(client_cu_, 2 * kGran);
  absl::StatusOr<RdmaResources::Registered> r =
      rdma_.RegisterMemory(s, Dup(alloc.fd()), "cuda-vmm-fd", alloc.va(), 2 * kGran - 64, 0,
                           softnic::kRemoteWrite | softnic::kRemoteAtomic);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, "cuda-vmm");
  EXPECT_EQ(r->lkey, r->rkey);
  std::vector<MrRow> rows = rdma_.ListMrs(1000, false);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].kind, "cuda-vmm");
  EXPECT_EQ(rows[0].info.kind, softnic::MemoryKind::kCuda);
  EXPECT_EQ(rows[0].info.iova, alloc.va());
  EXPECT_EQ(rows[0].info.length, 2 * kGran - 64);
  EXPECT_EQ(cu_->liveMappings(), 1u);
  EXPECT_EQ(cu_->primaryContextRefs(0), 1);

  // An offset into the allocation works too; past its end does not.
  r = rdma_.RegisterMemory(s, Dup(alloc.fd()), "cuda-vmm-fd", alloc.va() + kGran, 64, kGran, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(rdma_.DeregisterMemory(s, r->lkey).ok());
  r = rdma_.RegisterMemory(s, Dup(alloc.fd()), "cuda-vmm-fd", alloc.va(), 2 * kGran, 64, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("registering GPU memory (cuda-vmm-fd)"));
  EXPECT_THAT(r.status().message(), HasSubstr("cuMemMap"));

  rdma_.SessionEnded(s.id);
  EXPECT_TRUE(rdma_.ListMrs(0, true).empty());
  EXPECT_EQ(cu_->liveMappings(), 0u) << "the session's GPU mappings go with it";
  EXPECT_EQ(cu_->liveReservations(), 0u);
}

TEST_F(RdmaCudaRegistrationTest, KindsAndErrorsSayWhatIsMissing) {
  SessionInfo s = Open(1000, 10);
  ClientAllocation alloc(client_cu_, kGran);
  absl::StatusOr<RdmaResources::Registered> r =
      rdma_.RegisterMemory(s, Dup(alloc.fd()), "cuda-ipc", alloc.va(), kGran, 0, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("\"cuda-vmm-fd\" (GPU memory"));
  r = rdma_.RegisterMemory(s, std::make_shared<FdBundle>(), "cuda-vmm-fd", alloc.va(), kGran, 0, 0);
  EXPECT_THAT(r.status().message(), HasSubstr("exactly one fd"));

  // A node whose daemon finds no CUDA driver.
  softnic::CudaMemoryOptions no_driver = FakeOptions(nullptr);
  no_driver.cuda_library = "libmc-no-such-cuda.so.1";
  RdmaResources other(&sessions_, "softnic0", limits_, softnic::EngineOptions{}, no_driver);
  r = other.RegisterMemory(s, Dup(alloc.fd()), "cuda-vmm-fd", alloc.va(), kGran, 0, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("needs the CUDA driver"));
  EXPECT_THAT(r.status().message(), HasSubstr("no NVIDIA driver on this node"));
}

TEST_F(RdmaCudaRegistrationTest, GpuBytesCountAgainstTheSessionLimits) {
  SessionInfo s = Open(1000, 10);
  ClientAllocation alloc(client_cu_, kGran);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(
        rdma_.RegisterMemory(s, Dup(alloc.fd()), "cuda-vmm-fd", alloc.va(), kGran, 0, 0).ok());
  }
  absl::StatusOr<RdmaResources::Registered> r =
      rdma_.RegisterMemory(s, Dup(alloc.fd()), "cuda-vmm-fd", alloc.va(), kGran, 0, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_EQ(cu_->liveMappings(), 2u) << "the refused import is unmapped again";
}

// A copy agent's channel as the client library makes it: sealed, every
// page written, the header filled in.
UniqueFd AgentChannel(uint64_t staging, bool populate = true) {
  const uint64_t bytes = copy_agent::kHeaderBytes + staging;
  UniqueFd fd(::memfd_create("agent-channel", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  EXPECT_NE(p, MAP_FAILED);
  auto* c = static_cast<copy_agent::Channel*>(p);
  c->magic = copy_agent::kMagic;
  c->version = copy_agent::kVersion;
  c->state = static_cast<uint32_t>(copy_agent::State::kServing);
  if (populate) EXPECT_EQ(PopulateForWrite(p, bytes), 0);
  ::munmap(p, bytes);
  return fd;
}

TEST_F(RdmaCudaRegistrationTest, ACopyAgentPerSessionChargedAndGoneWithIt) {
  SessionInfo s = Open(1000, 10);
  const uint64_t staging = copy_agent::kMinStagingBytes;
  // Sizes the channel does not have, or out of bounds.
  UniqueFd ch = AgentChannel(staging);
  EXPECT_EQ(rdma_.AttachCopyAgent(s, Dup(ch.get()), 2 * staging).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rdma_.AttachCopyAgent(s, Dup(ch.get()), staging + 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rdma_.AttachCopyAgent(s, std::make_shared<FdBundle>(), staging).code(),
            absl::StatusCode::kInvalidArgument);
  // Pages the client never wrote would be faulted in on the daemon's account.
  UniqueFd sparse = AgentChannel(staging, /*populate=*/false);
  absl::Status st = rdma_.AttachCopyAgent(s, Dup(sparse.get()), staging);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;

  ASSERT_TRUE(rdma_.AttachCopyAgent(s, Dup(ch.get()), staging).ok());
  EXPECT_EQ(rdma_.UsageOfSession(s.id).bytes, copy_agent::kHeaderBytes + staging);
  UniqueFd again = AgentChannel(staging);
  EXPECT_EQ(rdma_.AttachCopyAgent(s, Dup(again.get()), staging).code(),
            absl::StatusCode::kAlreadyExists);
  // Another session of the same process gets its own.
  SessionInfo t = Open(1000, 11);
  EXPECT_TRUE(rdma_.AttachCopyAgent(t, Dup(again.get()), staging).ok());

  rdma_.SessionEnded(s.id);
  EXPECT_TRUE(rdma_.UsageOfSession(s.id).empty());
  sessions_.Close(s.id);
  EXPECT_EQ(rdma_.AttachCopyAgent(s, Dup(ch.get()), staging).code(),
            absl::StatusCode::kFailedPrecondition)
      << "an ended session attaches nothing";
}

}  // namespace
}  // namespace mooncake::daemon
