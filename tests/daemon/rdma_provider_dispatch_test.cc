// RdmaResources over a provider double that counts its calls: what is
// delegated, with which arguments, and the bookkeeping RdmaResources keeps
// itself (budgets, ownership, all-or-nothing refusals, session end). The
// softnic provider is covered by rdma_resources_test; the mlx5 provider's
// checks that need no NIC by mlx5_provider_test.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "mooncake/common/populate.h"
#include "rdma/rdma_resources.h"

namespace mooncake::daemon {
namespace {

class CountingProvider final : public RdmaProvider {
 public:
  struct Calls {
    int register_memory = 0, deregister = 0, create = 0, connect = 0, destroy = 0, ended = 0;
    int doorbell_open = 0, doorbell_release = 0;
    uint64_t last_remote_session = 0;
    uint64_t last_control_offset = 0;
    std::string last_kind;
    int last_dmabuf_fd = -1;
    bool last_had_host = false;
  };
  explicit CountingProvider(Calls* calls) : calls_(calls) {}
  const std::string& name() const override { return name_; }
  const std::string& nic() const override { return nic_; }
  const std::string& doorbell_mode() const override { return mode_; }
  uint32_t max_cq_cqe_cnt() const override { return 1024; }
  absl::Status CheckMemoryKind(const std::string& kind) const override {
    return kind == "memfd" || kind == "dmabuf" ? absl::OkStatus()
                                               : absl::InvalidArgumentError("fake: kind");
  }
  absl::Status CheckLayouts(const std::vector<QpLayout>& layouts) const override {
    for (const QpLayout& l : layouts) {
      if (l.sq_wqe_cnt == 2) return absl::InvalidArgumentError("fake: no depth 2");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<ProviderRegion> RegisterMemory(RegionMemory m) override {
    ++calls_->register_memory;
    calls_->last_kind = m.kind;
    calls_->last_dmabuf_fd = m.dmabuf_fd;
    calls_->last_had_host = m.host != nullptr;
    if (fail_next_) {
      fail_next_ = false;
      return absl::UnavailableError("fake: refused");
    }
    const uint32_t key = next_++;
    regions_.push_back({key, m.session, m.iova, m.length, m.access, softnic::MemoryKind::kHost});
    return ProviderRegion{key, key + 1000, m.dmabuf_fd >= 0 ? "dmabuf" : "host"};
  }
  absl::Status DeregisterMemory(uint64_t, uint32_t lkey) override {
    ++calls_->deregister;
    std::erase_if(regions_, [&](const softnic::RegionInfo& r) { return r.key == lkey; });
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<uint32_t>> CreateQueuePairs(
      uint64_t session, std::shared_ptr<softnic::SharedMapping>, uint64_t control_offset,
      const std::vector<QpLayout>& layouts) override {
    ++calls_->create;
    calls_->last_control_offset = control_offset;
    if (fail_next_) {
      fail_next_ = false;
      return absl::ResourceExhaustedError("fake: no QPs left");
    }
    std::vector<uint32_t> qpns;
    for (const QpLayout& l : layouts) {
      softnic::QpInfo q;
      q.qpn = next_++;
      q.pd = session;
      q.sq_wqe_cnt = l.sq_wqe_cnt;
      qps_.push_back(q);
      qpns.push_back(q.qpn);
    }
    return qpns;
  }
  absl::Status Connect(uint64_t, uint32_t qpn, uint64_t remote_session,
                       uint32_t remote_qpn) override {
    ++calls_->connect;
    calls_->last_remote_session = remote_session;
    if (fail_next_) {
      fail_next_ = false;
      return absl::UnavailableError("fake: port down");
    }
    for (softnic::QpInfo& q : qps_) {
      if (q.qpn == qpn) {
        q.state = softnic::QpState::kRts;
        q.remote_qpn = remote_qpn;
      }
    }
    return absl::OkStatus();
  }
  absl::Status DestroyQueuePair(uint64_t, uint32_t qpn) override {
    ++calls_->destroy;
    std::erase_if(qps_, [&](const softnic::QpInfo& q) { return q.qpn == qpn; });
    return absl::OkStatus();
  }
  void SessionEnded(uint64_t session) override {
    ++calls_->ended;
    std::erase_if(qps_, [&](const softnic::QpInfo& q) { return q.pd == session; });
    std::erase_if(regions_, [&](const softnic::RegionInfo& r) { return r.pd == session; });
  }
  absl::StatusOr<DoorbellAccess> OpenDoorbellAccess(uint64_t) override {
    ++calls_->doorbell_open;
    DoorbellAccess a;
    // A memfd stands in for the command fd: the fd must reach the caller.
    a.command_fd = UniqueFd(::memfd_create("fake-cmd-fd", MFD_CLOEXEC));
    a.device = "fake0";
    a.uar_mmap_offset = 8192;
    a.uar_reg_offset = 0x800;
    a.uar_page_bytes = 4096;
    return a;
  }
  absl::Status ReleaseDoorbellAccess(uint64_t) override {
    ++calls_->doorbell_release;
    return absl::OkStatus();
  }
  std::vector<softnic::QpInfo> ListQps() const override { return qps_; }
  std::vector<softnic::RegionInfo> ListRegions() const override { return regions_; }

  bool fail_next_ = false;

 private:
  Calls* calls_;
  const std::string name_ = "fake", nic_ = "fake0", mode_ = "cpu-assisted";
  uint32_t next_ = 100;
  std::vector<softnic::QpInfo> qps_;
  std::vector<softnic::RegionInfo> regions_;
};

FdBundlePtr Memfd(uint64_t bytes) {
  int fd = ::memfd_create("dispatch-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
  EXPECT_EQ(PopulateMemfd(fd, 0, bytes), 0);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto b = std::make_shared<FdBundle>();
  b->fds.emplace_back(fd);
  return b;
}

QpLayout Layout(uint64_t base, uint32_t depth) {
  QpLayout l;
  l.sq_offset = base;
  l.sq_wqe_cnt = depth;
  l.cq_offset = base + depth * 64ull;
  l.cq_cqe_cnt = depth;
  l.sq_dbrec_offset = base + 2ull * depth * 64;
  l.cq_dbrec_offset = l.sq_dbrec_offset + 8;
  return l;
}

class DispatchTest : public ::testing::Test {
 protected:
  DispatchTest() {
    auto p = std::make_unique<CountingProvider>(&calls_);
    provider_ = p.get();
    rdma_ = std::make_unique<RdmaResources>(&sessions_, limits_, std::move(p));
  }
  SessionInfo Open(uint32_t uid, int conn) {
    absl::StatusOr<SessionInfo> s = sessions_.Open(PeerCred{100 + conn, uid, uid}, conn, "t");
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }
  SessionRegistry sessions_{64};
  RdmaLimits limits_{.max_qps_per_session = 4, .max_mrs_per_session = 3};
  CountingProvider::Calls calls_;
  CountingProvider* provider_ = nullptr;
  std::unique_ptr<RdmaResources> rdma_;
};

TEST_F(DispatchTest, NamesAndChecksComeFromTheProvider) {
  EXPECT_EQ(rdma_->provider(), "fake");
  EXPECT_EQ(rdma_->nic(), "fake0");
  EXPECT_EQ(rdma_->doorbell_mode(), "cpu-assisted");
  EXPECT_EQ(rdma_->ValidateRegistration("cuda-vmm-fd", 0, 4096, 0).message(), "fake: kind");
  EXPECT_TRUE(rdma_->ValidateRegistration("dmabuf", 0, 4096, 0).ok());
  EXPECT_EQ(rdma_->ValidateQueuePairs(1 << 20, {Layout(0, 2)}).message(), "fake: no depth 2");
  EXPECT_NE(rdma_->ValidateQueuePairs(1 << 20, {Layout(0, 4)}).ok(), false);
  QpLayout big = Layout(0, 4);
  big.cq_cqe_cnt = 2048;  // past the provider's largest CQ
  EXPECT_NE(rdma_->ValidateQueuePairs(1 << 20, {big}).message().find("sq_wqe_cnt..1024"),
            std::string::npos);
}

TEST_F(DispatchTest, RegionsAreChargedOnlyWhenTheProviderTakesThem) {
  SessionInfo s = Open(1000, 1);
  provider_->fail_next_ = true;
  auto r = rdma_->RegisterMemory(s, Memfd(8192), "memfd", 0x1000, 100, 4096 + 8, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(rdma_->UsageOfSession(s.id).empty());
  r = rdma_->RegisterMemory(s, Memfd(8192), "memfd", 0x1000, 100, 4096 + 8, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(calls_.last_had_host);
  EXPECT_EQ(r->rkey, r->lkey + 1000);                  // the provider's keys, passed through
  EXPECT_EQ(rdma_->UsageOfSession(s.id).bytes, 108u);  // from the region's first page
  // A dmabuf is handed over as its fd, nothing mapped; its length is charged.
  auto d = rdma_->RegisterMemory(s, Memfd(8192), "dmabuf", 0x9000, 4096, 0, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_GE(calls_.last_dmabuf_fd, 0);
  EXPECT_FALSE(calls_.last_had_host);
  EXPECT_EQ(d->kind, "dmabuf");
  EXPECT_EQ(rdma_->UsageOfSession(s.id).bytes, 108u + 4096u);
  ASSERT_EQ(rdma_->ListMrs(1000, false).size(), 2u);
  EXPECT_EQ(rdma_->DeregisterMemory(s, d->lkey).code(), absl::StatusCode::kOk);
  EXPECT_EQ(calls_.deregister, 1);
  // Someone else's key never reaches the provider.
  SessionInfo other = Open(1000, 2);
  EXPECT_EQ(rdma_->DeregisterMemory(other, r->lkey).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(calls_.deregister, 1);
  EXPECT_EQ(rdma_->UsageOfSession(s.id).mrs, 1u);
}

TEST_F(DispatchTest, QueuePairsConnectAndDestroyThroughTheProvider) {
  SessionInfo a = Open(1000, 1), b = Open(1000, 2), c = Open(2000, 3);
  const uint64_t bytes = 3 * 4096;
  provider_->fail_next_ = true;
  auto refused = rdma_->CreateQueuePairs(a, Memfd(bytes), bytes, {Layout(4096, 4)});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(rdma_->UsageOfSession(a.id).empty());
  EXPECT_EQ(rdma_->ControlMappings(), 0u);

  auto qa = rdma_->CreateQueuePairs(a, Memfd(bytes), bytes, {Layout(4096, 4), Layout(8192, 4)});
  ASSERT_TRUE(qa.ok()) << qa.status();
  EXPECT_EQ(calls_.last_control_offset, 4096u);  // the mapping starts at the first ring's page
  auto qb = rdma_->CreateQueuePairs(b, Memfd(bytes), bytes, {Layout(0, 4)});
  auto qc = rdma_->CreateQueuePairs(c, Memfd(bytes), bytes, {Layout(0, 4)});
  ASSERT_TRUE(qb.ok() && qc.ok());
  EXPECT_EQ(rdma_->UsageOfSession(a.id).qps, 2u);

  // Another uid's QP never reaches the provider.
  EXPECT_EQ(rdma_->Connect(a, {{(*qa)[0], (*qc)[0]}}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(calls_.connect, 0);
  ASSERT_TRUE(rdma_->Connect(a, {{(*qa)[0], (*qb)[0]}}).ok());
  EXPECT_EQ(calls_.last_remote_session, b.id);  // the peer's session, for its endpoint
  // A provider refusal keeps its code and leaves the QP unconnected.
  provider_->fail_next_ = true;
  absl::Status down = rdma_->Connect(a, {{(*qa)[1], (*qb)[0]}});
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(down.message().find("fake refused connecting queue pair"), std::string::npos) << down;
  EXPECT_TRUE(rdma_->Connect(a, {{(*qa)[1], (*qb)[0]}}).ok());
  EXPECT_EQ(rdma_->Connect(a, {{(*qa)[1], (*qb)[0]}}).code(),
            absl::StatusCode::kFailedPrecondition);  // connected once

  ASSERT_TRUE(rdma_->DestroyQueuePairs(a, {(*qa)[0]}).ok());
  EXPECT_EQ(calls_.destroy, 1);
  EXPECT_EQ(rdma_->ControlMappings(), 3u);  // a's control lives on with its other QP
  ASSERT_TRUE(rdma_->DestroyQueuePairs(a, {(*qa)[1]}).ok());
  EXPECT_EQ(rdma_->ControlMappings(), 2u);
  EXPECT_TRUE(rdma_->UsageOfSession(a.id).empty());
}

TEST_F(DispatchTest, DoorbellHandOffIsOncePerSessionAndItsEndReachesTheProvider) {
  SessionInfo a = Open(1000, 1);
  absl::StatusOr<DoorbellAccess> got = rdma_->OpenDoorbellAccess(a);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->command_fd.valid());
  EXPECT_EQ(got->uar_mmap_offset, 8192);
  // Once per session, released or not: a loop of hand-offs cannot pile up
  // contexts and fds.
  EXPECT_EQ(rdma_->OpenDoorbellAccess(a).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(rdma_->ReleaseDoorbellAccess(a).ok());
  EXPECT_EQ(calls_.doorbell_release, 1);
  EXPECT_EQ(rdma_->OpenDoorbellAccess(a).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(calls_.doorbell_open, 1);
  // Release without a hand-off does not bother the provider.
  SessionInfo b = Open(1000, 2);
  EXPECT_TRUE(rdma_->ReleaseDoorbellAccess(b).ok());
  EXPECT_EQ(calls_.doorbell_release, 1);
  // The session holds nothing the budget counts, yet the provider opened a
  // context for it: its end must reach the provider.
  EXPECT_TRUE(rdma_->UsageOfSession(a.id).empty());
  sessions_.Close(a.id);
  rdma_->SessionEnded(a.id);
  EXPECT_EQ(calls_.ended, 1);
  sessions_.Close(b.id);
  rdma_->SessionEnded(b.id);
  EXPECT_EQ(calls_.ended, 1);
  EXPECT_EQ(rdma_->OpenDoorbellAccess(a).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(DispatchTest, TheNicIsChosenBeforeTheFirstObjectAndNotChangedAfter) {
  SessionInfo a = Open(1000, 1);
  absl::StatusOr<NicChoice> c = rdma_->SelectNic(a, NicRequest{{"fake9"}, ""});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  c = rdma_->SelectNic(a, NicRequest{{}, "0000:1b:00.0"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->nic, "fake0");
  ASSERT_TRUE(rdma_->RegisterMemory(a, Memfd(4096), "memfd", 0x1000, 4096, 0, 0).ok());
  // The same NIC again is fine (a second initialize); nothing moves.
  EXPECT_TRUE(rdma_->SelectNic(a, NicRequest{{"fake0"}, ""}).ok());
  // The session's end reaches the provider (it bound a NIC there).
  sessions_.Close(a.id);
  rdma_->SessionEnded(a.id);
  EXPECT_EQ(calls_.ended, 1);
}

TEST_F(DispatchTest, AFailedFirstCallStillEndsTheProviderSession) {
  // An mlx5 provider opens the session's context on its first call, even
  // one it then refuses; that context must not outlive the session.
  SessionInfo a = Open(1000, 1);
  provider_->fail_next_ = true;
  EXPECT_FALSE(rdma_->RegisterMemory(a, Memfd(4096), "memfd", 0x1000, 4096, 0, 0).ok());
  sessions_.Close(a.id);
  rdma_->SessionEnded(a.id);
  EXPECT_EQ(calls_.ended, 1);
}

TEST_F(DispatchTest, SessionEndReachesTheProviderOnlyForSessionsItSaw) {
  SessionInfo a = Open(1000, 1), idle = Open(1000, 2);
  ASSERT_TRUE(rdma_->RegisterMemory(a, Memfd(4096), "memfd", 0x1000, 4096, 0, 0).ok());
  sessions_.Close(idle.id);
  rdma_->SessionEnded(idle.id);
  EXPECT_EQ(calls_.ended, 0);
  sessions_.Close(a.id);
  rdma_->SessionEnded(a.id);
  EXPECT_EQ(calls_.ended, 1);
  EXPECT_TRUE(rdma_->ListMrs(0, true).empty());
  EXPECT_EQ(rdma_->SessionsHolding(), 0u);
  // A call after the end is refused before the provider sees it.
  EXPECT_EQ(rdma_->RegisterMemory(a, Memfd(4096), "memfd", 0x1000, 4096, 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(calls_.register_memory, 1);
}

// A provider whose RegisterMemory for one session blocks until released,
// as pinning a large region or opening a NIC context does.
class SlowProvider final : public RdmaProvider {
 public:
  const std::string& name() const override { return name_; }
  const std::string& nic() const override { return name_; }
  const std::string& doorbell_mode() const override { return name_; }
  uint32_t max_cq_cqe_cnt() const override { return 1024; }
  absl::Status CheckMemoryKind(const std::string&) const override { return absl::OkStatus(); }
  absl::Status CheckLayouts(const std::vector<QpLayout>&) const override {
    return absl::OkStatus();
  }
  absl::StatusOr<ProviderRegion> RegisterMemory(RegionMemory m) override {
    if (m.session == slow_session) {
      entered.Notify();
      release.WaitForNotification();
    }
    absl::MutexLock lock(&mu_);
    const uint32_t key = next_++;
    regions_.push_back({key, m.session, m.iova, m.length, m.access, softnic::MemoryKind::kHost});
    return ProviderRegion{key, key, "host"};
  }
  absl::Status DeregisterMemory(uint64_t, uint32_t) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<uint32_t>> CreateQueuePairs(uint64_t,
                                                         std::shared_ptr<softnic::SharedMapping>,
                                                         uint64_t,
                                                         const std::vector<QpLayout>&) override {
    return absl::UnimplementedError("slow: no QPs");
  }
  absl::Status Connect(uint64_t, uint32_t, uint64_t, uint32_t) override { return absl::OkStatus(); }
  absl::Status DestroyQueuePair(uint64_t, uint32_t) override { return absl::OkStatus(); }
  void SessionEnded(uint64_t session) override {
    absl::MutexLock lock(&mu_);
    ended_after_release = release.HasBeenNotified();
    std::erase_if(regions_, [&](const softnic::RegionInfo& r) { return r.pd == session; });
  }
  std::vector<softnic::QpInfo> ListQps() const override { return {}; }
  std::vector<softnic::RegionInfo> ListRegions() const override {
    absl::MutexLock lock(&mu_);
    return regions_;
  }

  uint64_t slow_session = 0;
  absl::Notification entered, release;
  bool ended_after_release = false;

 private:
  const std::string name_ = "slow";
  mutable absl::Mutex mu_;
  uint32_t next_ = 1;
  std::vector<softnic::RegionInfo> regions_;
};

// Before, RdmaResources held its one lock over every provider call: a user
// pinning a large region (seconds on a NIC) stalled every other user's RDMA
// calls and mcctl's listings for that long.
TEST(RdmaResourcesLocking, OneSessionsSlowProviderCallStallsNoOtherSession) {
  SessionRegistry sessions{64};
  auto provider = std::make_unique<SlowProvider>();
  SlowProvider* slow = provider.get();
  RdmaResources rdma(&sessions, RdmaLimits{}, std::move(provider));
  absl::StatusOr<SessionInfo> a = sessions.Open(PeerCred{100, 1000, 1000}, 1, "a");
  absl::StatusOr<SessionInfo> b = sessions.Open(PeerCred{101, 1001, 1001}, 2, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  slow->slow_session = a->id;
  std::thread stuck(
      [&] { EXPECT_TRUE(rdma.RegisterMemory(*a, Memfd(4096), "memfd", 0x1000, 4096, 0, 0).ok()); });
  slow->entered.WaitForNotification();
  // A is inside the provider. B registers, and the listing answers.
  EXPECT_TRUE(rdma.RegisterMemory(*b, Memfd(4096), "memfd", 0x2000, 4096, 0, 0).ok());
  EXPECT_EQ(rdma.ListMrs(0, true).size(), 1u);
  // A's reservation is already charged: its budget cannot be spent twice.
  EXPECT_EQ(rdma.UsageOfSession(a->id).mrs, 1u);
  // A's end waits for A's call in flight, then releases its region too.
  sessions.Close(a->id);
  std::thread ending([&] { rdma.SessionEnded(a->id); });
  absl::SleepFor(absl::Milliseconds(50));
  slow->release.Notify();
  stuck.join();
  ending.join();
  EXPECT_TRUE(slow->ended_after_release);
  EXPECT_EQ(rdma.ListMrs(0, true).size(), 1u);  // B's
  EXPECT_TRUE(rdma.UsageOfSession(a->id).empty());
}

}  // namespace
}  // namespace mooncake::daemon
