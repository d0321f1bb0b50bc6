// The mlx5 provider on a machine without an mlx5 NIC: what it decides
// before any verbs call (kinds, ring alignment, names), and that a first
// RDMA call fails with the session open's error and leaves nothing held or
// charged. The verbs calls themselves run only with a ConnectX NIC.
#include "rdma/mlx5/mlx5_provider.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "rdma/rdma_resources.h"

namespace mooncake::daemon::mlx5 {
namespace {

std::unique_ptr<Mlx5Provider> Provider() {
  Mlx5SessionOptions o;
  o.device = "mlx5_test_absent";
  return std::make_unique<Mlx5Provider>(o);
}

QpLayout Layout(uint64_t base) {
  QpLayout l;
  l.sq_offset = base;
  l.sq_wqe_cnt = 4;
  l.cq_offset = base + 4096;
  l.cq_cqe_cnt = 4;
  l.sq_dbrec_offset = base + 8192;
  l.cq_dbrec_offset = base + 8192 + 8;
  return l;
}

TEST(Mlx5ProviderTest, NamesItsModeAndKinds) {
  auto p = Provider();
  EXPECT_EQ(p->name(), "mlx5");
  EXPECT_EQ(p->nic(), "mlx5_test_absent");
  EXPECT_EQ(p->doorbell_mode(), "cpu-assisted");
  EXPECT_TRUE(p->CheckMemoryKind("memfd").ok());
  EXPECT_TRUE(p->CheckMemoryKind("dmabuf").ok());
  EXPECT_TRUE(p->CheckMemoryKind("cuda-vmm-fd").ok());
  absl::Status s = p->CheckMemoryKind("cuda-ipc");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"dmabuf\""), std::string::npos) << s;
}

TEST(Mlx5ProviderTest, RingsMustSitOn4KiBBoundariesNamingTheOffset) {
  auto p = Provider();
  EXPECT_TRUE(p->CheckLayouts({Layout(0), Layout(3 * 4096)}).ok());
  QpLayout l = Layout(4096);
  l.cq_offset = 4096 + 256;
  absl::Status s = p->CheckLayouts({Layout(0), l});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("queue pair 1: cq_offset 4352"), std::string::npos) << s;
  l = Layout(0);
  l.sq_offset = 64;
  s = p->CheckLayouts({l});
  EXPECT_NE(s.message().find("sq_offset 64"), std::string::npos) << s;
  l = Layout(0);
  l.sq_dbrec_offset = 8192 + 4;
  EXPECT_NE(p->CheckLayouts({l}).message().find("sq_dbrec_offset 8196"), std::string::npos);
}

FdBundlePtr Memfd(uint64_t bytes) {
  int fd = ::memfd_create("mlx5-provider-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto b = std::make_shared<FdBundle>();
  b->fds.emplace_back(fd);
  return b;
}

TEST(Mlx5ProviderTest, WithoutTheNicTheFirstCallFailsAndNothingIsHeld) {
  SessionRegistry sessions{8};
  auto p = Provider();
  Mlx5Provider* raw = p.get();
  RdmaResources rdma(&sessions, RdmaLimits{}, std::move(p));
  EXPECT_EQ(rdma.provider(), "mlx5");
  absl::StatusOr<SessionInfo> s = sessions.Open(PeerCred{1, 1000, 1000}, 1, "t");
  ASSERT_TRUE(s.ok());

  auto r = rdma.RegisterMemory(*s, Memfd(8192), "memfd", 0x1000, 4096, 0, 0);
  ASSERT_FALSE(r.ok());
  // The session open's error: the device named (NotFound here; or
  // FailedPrecondition in a build without rdma-core).
  EXPECT_NE(r.status().message().find("opening the mlx5 context for session"), std::string::npos)
      << r.status();
  EXPECT_TRUE(rdma.UsageOfSession(s->id).empty());

  EXPECT_EQ(rdma.ValidateQueuePairs(3 * 4096, {Layout(64)}).code(),
            absl::StatusCode::kInvalidArgument);
  auto q = rdma.CreateQueuePairs(*s, Memfd(3 * 4096), 3 * 4096, {Layout(0)});
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("mlx5_test_absent"), std::string::npos) << q.status();
  EXPECT_TRUE(rdma.UsageOfSession(s->id).empty());
  EXPECT_EQ(rdma.ControlMappings(), 0u);
  EXPECT_EQ(raw->sessions_open(), 0u);
  EXPECT_TRUE(rdma.ListQps(0, true).empty());
  sessions.Close(s->id);
  rdma.SessionEnded(s->id);  // nothing held: a no-op
}

}  // namespace
}  // namespace mooncake::daemon::mlx5
