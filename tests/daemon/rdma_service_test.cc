// RdmaService for a session (its Handle* methods, without a server): a bad
// request is refused before its fd ticket is taken, and lists are bounded.
#include "server/rdma_service.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "mooncake/common/populate.h"

namespace mooncake::daemon {
namespace {

class RdmaServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<SessionInfo> s = sessions_.Open(PeerCred{100, 1000, 1000}, 10, "t");
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = *s;
  }
  // A PUT of one sealed memfd of `bytes`, as the fd channel does it.
  std::string Put(uint64_t bytes) {
    UniqueFd fd(::memfd_create("svc-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
    EXPECT_EQ(PopulateMemfd(fd.get(), 0, bytes), 0);
    EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    std::vector<UniqueFd> fds;
    fds.push_back(std::move(fd));
    absl::StatusOr<std::string> t = fds_.AddIncoming(session_, std::move(fds));
    EXPECT_TRUE(t.ok()) << t.status();
    return *t;
  }
  static v1::QueuePairLayout Rings(uint32_t depth) {
    v1::QueuePairLayout l;
    l.set_sq_wqe_cnt(depth);
    l.set_cq_offset(depth * 64ull);
    l.set_cq_cqe_cnt(depth);
    l.set_sq_dbrec_offset(2ull * depth * 64);
    l.set_cq_dbrec_offset(2ull * depth * 64 + 8);
    return l;
  }

  SessionRegistry sessions_{64};
  FdBroker fds_{absl::Seconds(60), &sessions_, FdLimits{64, 128}};
  RdmaResources rdma_{&sessions_, "softnic0", RdmaLimits{}, softnic::EngineOptions{}};
  RdmaService service_{/*connections=*/nullptr, &sessions_, &fds_, &rdma_};
  SessionInfo session_;
};

// Before, the layouts and the memory kind were checked after the ticket was
// taken: a client that got one field wrong had to send its fds again.
TEST_F(RdmaServiceTest, BadRequestsKeepTheirTicket) {
  const std::string ticket = Put(1 << 20);
  v1::CreateQueuePairsRequest create;
  create.set_fd_ticket(ticket);
  create.set_control_bytes(1 << 20);
  *create.add_qps() = Rings(3);  // not a power of two
  v1::CreateQueuePairsResponse created;
  absl::Status s = service_.HandleCreateQueuePairs(session_, create, &created);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  create.mutable_qps(0)->set_cq_offset(2 << 20);  // past control_bytes
  create.mutable_qps(0)->set_sq_wqe_cnt(4);
  s = service_.HandleCreateQueuePairs(session_, create, &created);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

  v1::RegisterMemoryRequest reg;
  reg.set_fd_ticket(ticket);
  reg.set_kind("dmabuf");
  reg.set_length(4096);
  v1::RegisterMemoryResponse registered;
  s = service_.HandleRegisterMemory(session_, reg, &registered);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  reg.set_kind("memfd");
  reg.set_offset(UINT64_MAX - 100);
  s = service_.HandleRegisterMemory(session_, reg, &registered);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

  // The ticket is still there for the corrected request.
  *create.mutable_qps(0) = Rings(4);
  s = service_.HandleCreateQueuePairs(session_, create, &created);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(created.qpns_size(), 1);
}

TEST_F(RdmaServiceTest, ListsAreBoundedPerCall) {
  v1::DestroyQueuePairsRequest destroy;
  for (int i = 0; i <= RdmaService::kMaxQpsPerCall; ++i) destroy.add_qpns(i + 1);
  absl::Status s = service_.HandleDestroyQueuePairs(session_, destroy);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  v1::ConnectQueuePairsRequest connect;
  for (int i = 0; i <= RdmaService::kMaxQpsPerCall; ++i) connect.add_connections()->set_qpn(i);
  EXPECT_EQ(service_.HandleConnectQueuePairs(session_, connect).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RdmaServiceTest, SelectNicOnSoftnicAnswersItsOneNic) {
  v1::SelectNicRequest req;
  req.set_gpu_pci_bus_id("0000:1b:00.0");
  v1::SelectNicResponse resp;
  absl::Status s = service_.HandleSelectNic(session_, req, &resp);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(resp.nic(), "softnic0");
  ASSERT_EQ(resp.served_size(), 1);
  req.add_allowed("mlx5_0");
  s = service_.HandleSelectNic(session_, req, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("softnic0"), std::string::npos) << s;
}

// softnic has no link: GetRdmaInfo says not RoCE, GID index 0, no GID
// type, with or without a session.
TEST_F(RdmaServiceTest, RdmaInfoOnSoftnicHasNoLink) {
  v1::RdmaInfo info;
  ASSERT_TRUE(service_.HandleGetRdmaInfo(&session_, &info).ok());
  EXPECT_EQ(info.provider(), "softnic");
  EXPECT_EQ(info.nic(), "softnic0");
  EXPECT_FALSE(info.is_roce());
  EXPECT_EQ(info.gid_index(), 0u);
  EXPECT_EQ(info.gid_type(), "");
  EXPECT_EQ(info.doorbell_mode(), "doorbell-record");
  v1::RdmaInfo anonymous;
  ASSERT_TRUE(service_.HandleGetRdmaInfo(nullptr, &anonymous).ok());
  EXPECT_EQ(anonymous.nic(), "softnic0");
  EXPECT_FALSE(anonymous.is_roce());
}

// softnic has no UAR: the hand-off is refused with the reason, and no
// ticket (no fd) is left behind for the caller.
TEST_F(RdmaServiceTest, DoorbellHandOffIsRefusedBySoftnic) {
  v1::DoorbellAccess access;
  absl::Status s = service_.HandleGetDoorbellAccess(session_, &access);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("softnic"), std::string::npos) << s;
  EXPECT_NE(s.message().find("doorbell-record"), std::string::npos) << s;
  EXPECT_TRUE(access.fd_ticket().empty());
  EXPECT_TRUE(rdma_.ReleaseDoorbellAccess(session_).ok());
}

}  // namespace
}  // namespace mooncake::daemon
