// RdmaResources: ownership by session, the memfd seal rule, same-uid
// connections, per-session limits, and cleanup when a session ends.
#include "rdma/rdma_resources.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

FdBundlePtr Memfd(uint64_t bytes, bool seal) {
  int fd = ::memfd_create("rdma-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
  if (seal) EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  auto b = std::make_shared<FdBundle>();
  b->fds.emplace_back(fd);
  return b;
}

QpLayout Layout(uint64_t slot, uint32_t depth) {
  const uint64_t base = slot * (2ull * depth * 64 + 64);
  QpLayout l;
  l.sq_offset = base;
  l.sq_wqe_cnt = depth;
  l.cq_offset = base + depth * 64ull;
  l.cq_cqe_cnt = depth;
  l.sq_dbrec_offset = base + 2ull * depth * 64;
  l.cq_dbrec_offset = l.sq_dbrec_offset + 8;
  return l;
}

class RdmaResourcesTest : public ::testing::Test {
 protected:
  SessionInfo Open(uint32_t uid, int conn) {
    absl::StatusOr<SessionInfo> s = sessions_.Open(PeerCred{100 + conn, uid, uid}, conn, "t");
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }
  SessionRegistry sessions_{64};
  RdmaLimits limits_{.max_qps_per_session = 4, .max_mrs_per_session = 2};
  RdmaResources rdma_{&sessions_, "softnic0", limits_, softnic::EngineOptions{}};
};

TEST_F(RdmaResourcesTest, RegistersOnlySealedMemfds) {
  SessionInfo s = Open(1000, 10);
  absl::StatusOr<RdmaResources::Registered> r =
      rdma_.RegisterMemory(s, Memfd(8192, /*seal=*/false), "memfd", 0x10000, 4096, 0, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("F_SEAL_SHRINK"), std::string::npos) << r.status();
  r = rdma_.RegisterMemory(s, Memfd(8192, true), "cuda-ipc", 0x10000, 4096, 0, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  r = rdma_.RegisterMemory(s, Memfd(8192, true), "memfd", 0x10000, 16384, 0, 0);  // past the end
  EXPECT_FALSE(r.ok());
  r = rdma_.RegisterMemory(s, Memfd(8192, true), "memfd", 0x10000, 4096, 4096, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->lkey, r->rkey);
  EXPECT_EQ(rdma_.ListMrs(1000, false).size(), 1u);
  EXPECT_EQ(rdma_.ListMrs(2000, false).size(), 0u);  // another uid sees nothing
  EXPECT_EQ(rdma_.ListMrs(0, true).size(), 1u);      // root sees everything
}

TEST_F(RdmaResourcesTest, LimitsNameTheirConfigKey) {
  SessionInfo s = Open(1000, 10);
  ASSERT_TRUE(rdma_.RegisterMemory(s, Memfd(4096, true), "memfd", 0x1000, 4096, 0, 0).ok());
  ASSERT_TRUE(rdma_.RegisterMemory(s, Memfd(4096, true), "memfd", 0x2000, 4096, 0, 0).ok());
  auto r = rdma_.RegisterMemory(s, Memfd(4096, true), "memfd", 0x3000, 4096, 0, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("max_mrs_per_session"), std::string::npos);
  const uint32_t depth = 4;
  const uint64_t bytes = 8 * (2ull * depth * 64 + 64);
  std::vector<QpLayout> five;
  for (int i = 0; i < 5; ++i) five.push_back(Layout(i, depth));
  auto q = rdma_.CreateQueuePairs(s, Memfd(bytes, true), bytes, five);
  EXPECT_EQ(q.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(q.status().message().find("max_qps_per_session"), std::string::npos);
  EXPECT_TRUE(rdma_.ListQps(1000, false).empty());  // all or nothing
}

TEST_F(RdmaResourcesTest, ConnectsOnlyToQpsOfTheSameUid) {
  SessionInfo a = Open(1000, 10), b = Open(1000, 11), other = Open(2000, 12);
  const uint32_t depth = 4;
  const uint64_t bytes = 2 * (2ull * depth * 64 + 64);
  auto qa = rdma_.CreateQueuePairs(a, Memfd(bytes, true), bytes, {Layout(0, depth)});
  auto qb = rdma_.CreateQueuePairs(b, Memfd(bytes, true), bytes, {Layout(0, depth)});
  auto qo = rdma_.CreateQueuePairs(other, Memfd(bytes, true), bytes, {Layout(0, depth)});
  ASSERT_TRUE(qa.ok() && qb.ok() && qo.ok());
  // Another uid's QP reads as missing, in both directions.
  EXPECT_EQ(rdma_.Connect(a, {{(*qa)[0], (*qo)[0]}}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rdma_.Connect(other, {{(*qo)[0], (*qa)[0]}}).code(), absl::StatusCode::kNotFound);
  // Nor can a session connect (or destroy) a QP it does not own.
  EXPECT_EQ(rdma_.Connect(a, {{(*qb)[0], (*qa)[0]}}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rdma_.DestroyQueuePairs(a, {(*qb)[0]}).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(rdma_.Connect(a, {{(*qa)[0], (*qb)[0]}}).ok());
  EXPECT_TRUE(rdma_.Connect(b, {{(*qb)[0], (*qa)[0]}}).ok());
  for (const QpRow& row : rdma_.ListQps(1000, false)) {
    EXPECT_EQ(row.info.state, softnic::QpState::kRts);
  }
}

TEST_F(RdmaResourcesTest, SessionEndReleasesEverythingAndLaterCallsFail) {
  SessionInfo s = Open(1000, 10);
  const uint32_t depth = 4;
  const uint64_t bytes = 2 * (2ull * depth * 64 + 64);
  ASSERT_TRUE(rdma_.RegisterMemory(s, Memfd(4096, true), "memfd", 0x1000, 4096, 0, 0).ok());
  ASSERT_TRUE(rdma_.CreateQueuePairs(s, Memfd(bytes, true), bytes, {Layout(0, depth)}).ok());
  EXPECT_EQ(rdma_.QpCountOf(s.id), 1u);
  sessions_.Close(s.id);
  rdma_.SessionEnded(s.id);
  EXPECT_TRUE(rdma_.ListQps(0, true).empty());
  EXPECT_TRUE(rdma_.ListMrs(0, true).empty());
  // A call racing the end finds the session closed and creates nothing.
  auto late = rdma_.CreateQueuePairs(s, Memfd(bytes, true), bytes, {Layout(0, depth)});
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(rdma_.ListQps(0, true).empty());
}

}  // namespace
}  // namespace mooncake::daemon
