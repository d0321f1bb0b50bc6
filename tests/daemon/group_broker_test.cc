// GroupBroker in process: real SessionRegistry and FdBroker, a hand-made
// topology, joins from several threads.
#include "broker/group_broker.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "fdchannel/fd_broker.h"
#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

using JoinResult = absl::StatusOr<v1::JoinGroupResponse>;

constexpr char kUuid0[] = "GPU-00000000-aaaa-bbbb-cccc-000000000000";
constexpr char kUuid1[] = "GPU-11111111-aaaa-bbbb-cccc-111111111111";
constexpr char kUuid2[] = "GPU-22222222-aaaa-bbbb-cccc-222222222222";

// GPUs 0 and 1 reach each other (atomics only 0 -> 1); GPU 2 has no P2P.
v1::Topology MakeTopology() {
  v1::Topology t;
  const char* uuids[] = {kUuid0, kUuid1, kUuid2};
  const char* pcis[] = {"0000:1b:00.0", "0000:1c:00.0", "0000:3d:00.0"};
  for (int i = 0; i < 3; ++i) {
    v1::Gpu* g = t.add_gpus();
    g->set_index(i);
    g->set_uuid(uuids[i]);
    g->set_pci_bus_id(pcis[i]);
  }
  auto pair = [&](int s, int d, bool access, bool atomics) {
    v1::GpuPair* p = t.add_gpu_pairs();
    p->set_src(s);
    p->set_dst(d);
    p->set_access_supported(access);
    p->set_native_atomics(atomics);
  };
  pair(0, 1, true, true);
  pair(1, 0, true, false);
  pair(0, 2, false, false);
  pair(2, 0, false, false);
  return t;
}

v1::JoinGroupRequest Req(const std::string& group, uint32_t rank, uint32_t n,
                         uint32_t timeout_ms = 10000, const std::string& gpu_uuid = "",
                         const std::string& gpu_pci = "") {
  v1::JoinGroupRequest r;
  r.set_group(group);
  r.set_rank(rank);
  r.set_world_size(n);
  r.set_timeout_ms(timeout_ms);
  r.mutable_handle()->set_kind("memfd");
  r.mutable_handle()->set_data("handle-of-rank-" + std::to_string(rank));
  r.mutable_handle()->set_size(4096 * (rank + 1));
  r.mutable_handle()->set_fd_ticket("must-be-cleared");
  if (!gpu_uuid.empty()) r.mutable_device()->set_gpu_uuid(gpu_uuid);
  if (!gpu_pci.empty()) r.mutable_device()->set_gpu_pci_bus_id(gpu_pci);
  return r;
}

const std::function<bool()> kNeverCancelled = [] { return false; };

class GroupBrokerTest : public ::testing::Test {
 protected:
  GroupBrokerTest() : sessions_(1000), fds_(absl::Seconds(30), &sessions_) {
    BrokerLimits limits;
    limits.max_world_size = 64;
    MakeBroker(limits);
  }
  ~GroupBrokerTest() override { broker_->Shutdown(); }

  void MakeBroker(BrokerLimits limits) {
    broker_ = std::make_unique<GroupBroker>("node-a", MakeTopology(), limits, &sessions_, &fds_);
  }

  // JoinAsync takes only what ValidateJoin produced.
  void StartJoin(const SessionInfo& s, const v1::JoinGroupRequest& r, FdBundlePtr fds,
                 GroupBroker::JoinDone done) {
    absl::StatusOr<ValidatedJoin> join = broker_->ValidateJoin(r);
    ASSERT_TRUE(join.ok()) << join.status();
    broker_->JoinAsync(s, *std::move(join), std::move(fds), std::move(done));
  }

  SessionInfo Open(uint32_t uid = 1000) {
    int conn = next_conn_++;
    absl::StatusOr<SessionInfo> s = sessions_.Open(PeerCred{conn + 10000, uid, uid}, conn, "test");
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }

  JoinResult Join(const SessionInfo& s, const v1::JoinGroupRequest& r, FdBundlePtr fds = nullptr) {
    return broker_->Join(s, r, std::move(fds), kNeverCancelled);
  }

  std::future<JoinResult> JoinAsync(const SessionInfo& s, v1::JoinGroupRequest r,
                                    FdBundlePtr fds = nullptr,
                                    std::function<bool()> cancelled = kNeverCancelled) {
    return std::async(std::launch::async,
                      [this, s, r, fds, cancelled] { return broker_->Join(s, r, fds, cancelled); });
  }

  std::optional<GroupSummary> Find(uint32_t uid, const std::string& name) {
    for (const GroupSummary& g : broker_->List(uid, false)) {
      if (g.name == name) return g;
    }
    return std::nullopt;
  }

  // Waits until `joined` ranks sit in the group, so a test can order events.
  void WaitJoined(uint32_t uid, const std::string& name, uint32_t joined) {
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      std::optional<GroupSummary> g = Find(uid, name);
      if (g && g->members.size() == joined) return;
      absl::SleepFor(absl::Milliseconds(2));
    }
    FAIL() << "group " << name << " never had " << joined << " ranks";
  }

  // Drains the session's queue without blocking long.
  std::vector<v1::SessionEvent> Events(const SessionInfo& s) {
    auto ev = sessions_.Wait(s.id, absl::Milliseconds(20));
    return ev ? *ev : std::vector<v1::SessionEvent>{};
  }

  SessionRegistry sessions_;
  FdBroker fds_;
  std::unique_ptr<GroupBroker> broker_;
  int next_conn_ = 100;
};

TEST_F(GroupBrokerTest, JoinsFromThreadsFormTheGroupWithTheRightView) {
  SessionInfo s[3] = {Open(), Open(), Open()};
  const char* uuids[] = {kUuid0, kUuid1, kUuid2};
  std::vector<std::future<JoinResult>> f;
  for (uint32_t r = 0; r < 3; ++r) f.push_back(JoinAsync(s[r], Req("g", r, 3, 10000, uuids[r])));
  JoinResult res[3] = {f[0].get(), f[1].get(), f[2].get()};
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(res[r].ok()) << "rank " << r << ": " << res[r].status();
    const v1::JoinGroupResponse& v = *res[r];
    EXPECT_EQ(v.group(), "g");
    EXPECT_EQ(v.rank(), r);
    EXPECT_EQ(v.world_size(), 3u);
    EXPECT_EQ(v.epoch(), 1u);
    ASSERT_EQ(v.members_size(), 3);
    for (uint32_t m = 0; m < 3; ++m) {
      const v1::MemberView& mv = v.members(m);
      EXPECT_EQ(mv.rank(), m);
      EXPECT_EQ(mv.node_id(), "node-a");
      EXPECT_EQ(mv.pid(), s[m].cred.pid);
      EXPECT_EQ(mv.gpu_index(), static_cast<int>(m));
      EXPECT_EQ(mv.gpu_uuid(), uuids[m]);
      EXPECT_EQ(mv.handle_kind(), "memfd");
      EXPECT_EQ(mv.handle_data(), "handle-of-rank-" + std::to_string(m));
      EXPECT_EQ(mv.handle_size(), 4096u * (m + 1));
      EXPECT_TRUE(mv.same_node());
      EXPECT_TRUE(mv.fd_ticket().empty()) << "no fds were attached";
    }
  }
  // Reachability is from the receiver's GPU to each member's GPU.
  auto reach = [&](int from, int to) { return res[from]->members(to).p2p_reachable(); };
  auto atomics = [&](int from, int to) { return res[from]->members(to).native_atomics(); };
  EXPECT_TRUE(reach(0, 0));
  EXPECT_TRUE(atomics(0, 0));
  EXPECT_TRUE(reach(0, 1));
  EXPECT_TRUE(atomics(0, 1));
  EXPECT_TRUE(reach(1, 0));
  EXPECT_FALSE(atomics(1, 0)) << "atomics come from the (1,0) pair, not (0,1)";
  EXPECT_FALSE(reach(0, 2));
  EXPECT_FALSE(reach(2, 0));
  EXPECT_FALSE(reach(1, 2)) << "no GpuPair entry means not reachable";
  EXPECT_FALSE(reach(2, 1));
  EXPECT_TRUE(reach(2, 2));

  std::optional<GroupSummary> info = Find(1000, "g");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, GroupState::kFormed);
  EXPECT_EQ(info->members.size(), 3u);
  EXPECT_EQ(info->epoch, 1u);
  ASSERT_EQ(info->members.size(), 3u);
  EXPECT_EQ(info->members[1].state, MemberState::kJoined);
  EXPECT_EQ(info->members[1].session_id, s[1].id);
  EXPECT_EQ(info->members[1].gpu_index, 1);
  EXPECT_EQ(info->members[1].handle_size, 8192u);
}

TEST_F(GroupBrokerTest, ManyRanksFromManyThreads) {
  constexpr uint32_t kN = 16;
  std::vector<SessionInfo> s;
  for (uint32_t r = 0; r < kN; ++r) s.push_back(Open());
  std::vector<std::future<JoinResult>> f;
  for (uint32_t r = kN; r-- > 0;) f.push_back(JoinAsync(s[r], Req("big", r, kN)));
  for (auto& fut : f) {
    JoinResult res = fut.get();
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->members_size(), static_cast<int>(kN));
    EXPECT_EQ(res->epoch(), 1u);
    for (uint32_t m = 0; m < kN; ++m) EXPECT_EQ(res->members(m).pid(), s[m].cred.pid);
  }
}

TEST_F(GroupBrokerTest, HostMembersReachEachOtherButNotGpuMembers) {
  SessionInfo s[3] = {Open(), Open(), Open()};
  auto f0 = JoinAsync(s[0], Req("mixed", 0, 3));
  auto f1 = JoinAsync(s[1], Req("mixed", 1, 3));
  auto f2 = JoinAsync(s[2], Req("mixed", 2, 3, 10000, kUuid0));
  JoinResult r0 = f0.get(), r1 = f1.get(), r2 = f2.get();
  ASSERT_TRUE(r0.ok() && r1.ok() && r2.ok());
  EXPECT_EQ(r0->members(0).gpu_index(), -1);
  EXPECT_TRUE(r0->members(1).p2p_reachable()) << "host members share memory on one node";
  EXPECT_TRUE(r0->members(1).native_atomics());
  EXPECT_TRUE(r1->members(0).p2p_reachable());
  EXPECT_FALSE(r0->members(2).p2p_reachable()) << "host member cannot reach a GPU member";
  EXPECT_FALSE(r0->members(2).native_atomics());
  EXPECT_FALSE(r2->members(0).p2p_reachable()) << "GPU member cannot reach a host member";
  EXPECT_TRUE(r2->members(2).p2p_reachable());
}

TEST_F(GroupBrokerTest, GpuSelectionByUuidAndPciBusId) {
  struct Case {
    std::string uuid, pci;
    int want;
  };
  const Case cases[] = {
      {kUuid1, "", 1},         {absl::AsciiStrToUpper(kUuid2), "", 2},  // case-insensitive
      {"", "0000:1b:00.0", 0}, {"", "00000000:1B:00.0", 0},  // CUDA's 8-digit domain, upper case
      {"", "0000:1C:00.0", 1}, {"", "00000000:3d:00.0", 2},
  };
  int i = 0;
  for (const Case& c : cases) {
    SessionInfo s = Open();
    const std::string name = "sel" + std::to_string(i++);
    JoinResult r = Join(s, Req(name, 0, 1, 1000, c.uuid, c.pci));
    ASSERT_TRUE(r.ok()) << c.uuid << c.pci << ": " << r.status();
    EXPECT_EQ(r->members(0).gpu_index(), c.want) << c.uuid << c.pci;
    EXPECT_EQ(r->members(0).gpu_pci_bus_id(), MakeTopology().gpus(c.want).pci_bus_id());
    EXPECT_EQ(r->members(0).gpu_uuid(), MakeTopology().gpus(c.want).uuid());
  }
}

TEST_F(GroupBrokerTest, UnknownGpuIsInvalidArgument) {
  SessionInfo s = Open();
  for (auto [uuid, pci] :
       {std::pair<std::string, std::string>{"GPU-nope", ""}, {"", "0000:99:00.0"}}) {
    JoinResult r = Join(s, Req("unknown-gpu", 0, 1, 1000, uuid, pci));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << uuid << pci;
    const std::string msg(r.status().message());
    EXPECT_NE(msg.find("is not on this node"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 GPUs"), std::string::npos) << msg;
  }
  EXPECT_TRUE(broker_->List(1000, false).empty());
}

TEST_F(GroupBrokerTest, ValidationErrors) {
  SessionInfo s = Open();
  struct Case {
    v1::JoinGroupRequest req;
    const char* mention;
  };
  std::vector<Case> cases;
  cases.push_back({Req("v", 2, 2), "out of range"});
  cases.push_back({Req("v", 5, 2), "ranks are 0..1"});
  cases.push_back({Req("v", 0, 0), "world size 0"});
  cases.push_back({Req("v", 0, 65), "exceeds the limit of 64"});
  for (const std::string bad :
       {std::string(""), std::string("has space"), std::string("a/b"), std::string(129, 'n'),
        std::string("caf\xc3\xa9"), std::string("new\nline")}) {
    cases.push_back({Req(bad, 0, 1), "is invalid"});
  }
  v1::JoinGroupRequest big = Req("v", 0, 1);
  big.mutable_handle()->set_data(std::string(4097, 'h'));
  cases.push_back({big, "4097 bytes"});
  v1::JoinGroupRequest kind = Req("v", 0, 1);
  kind.mutable_handle()->set_kind(std::string(65, 'k'));
  cases.push_back({kind, "kind"});
  for (const Case& c : cases) {
    JoinResult r = Join(s, c.req);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << "group '" << c.req.group() << "' rank " << c.req.rank() << "/" << c.req.world_size();
    EXPECT_NE(r.status().message().find(c.mention), absl::string_view::npos) << r.status();
  }
  EXPECT_TRUE(broker_->List(0, true).empty()) << "rejected joins must leave nothing behind";
}

TEST_F(GroupBrokerTest, LimitsAreInclusive) {
  SessionInfo s = Open();
  JoinResult name = Join(s, Req(std::string(128, 'n'), 0, 1));
  EXPECT_TRUE(name.ok()) << name.status();
  JoinResult chars = Join(s, Req("Az09._:-", 0, 1));
  EXPECT_TRUE(chars.ok()) << chars.status();
  v1::JoinGroupRequest big = Req("handle-4096", 0, 1);
  big.mutable_handle()->set_data(std::string(4096, 'h'));
  JoinResult handle = Join(s, big);
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(handle->members(0).handle_data().size(), 4096u);
}

TEST_F(GroupBrokerTest, WorldSizeMismatch) {
  SessionInfo a = Open(), b = Open();
  auto first = JoinAsync(a, Req("ws", 0, 2));
  WaitJoined(1000, "ws", 1);
  JoinResult wrong = Join(b, Req("ws", 1, 3));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("has world size 2"), absl::string_view::npos)
      << wrong.status();
  // The group is untouched and still forms with the right size.
  JoinResult right = Join(b, Req("ws", 1, 2));
  ASSERT_TRUE(right.ok()) << right.status();
  ASSERT_TRUE(first.get().ok());
}

TEST_F(GroupBrokerTest, DuplicateRank) {
  SessionInfo a = Open(), b = Open(), c = Open();
  auto first = JoinAsync(a, Req("dup", 0, 2));
  WaitJoined(1000, "dup", 1);
  JoinResult dup = Join(b, Req("dup", 0, 2));
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(dup.status().message().find("pid " + std::to_string(a.cred.pid)),
            absl::string_view::npos)
      << dup.status();
  // The failed duplicate did not evict the holder.
  std::optional<GroupSummary> g = Find(1000, "dup");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->members.size(), 1u);
  EXPECT_EQ(g->members[0].session_id, a.id);
  ASSERT_TRUE(Join(c, Req("dup", 1, 2)).ok());
  ASSERT_TRUE(first.get().ok());
}

TEST_F(GroupBrokerTest, JoiningAFormedGroupIsRefused) {
  SessionInfo a = Open(), b = Open(), c = Open();
  auto f0 = JoinAsync(a, Req("full", 0, 2));
  ASSERT_TRUE(Join(b, Req("full", 1, 2)).ok());
  ASSERT_TRUE(f0.get().ok());
  JoinResult late = Join(c, Req("full", 1, 2));
  EXPECT_FALSE(late.ok());
  EXPECT_TRUE(late.status().code() == absl::StatusCode::kAlreadyExists ||
              late.status().code() == absl::StatusCode::kFailedPrecondition)
      << late.status();
  EXPECT_EQ(Find(1000, "full")->members.size(), 2u);
}

TEST_F(GroupBrokerTest, DeadlineExpiryRemovesTheRank) {
  SessionInfo a = Open();
  absl::Time start = absl::Now();
  JoinResult r = Join(a, Req("lonely", 0, 3, /*timeout_ms=*/150));
  absl::Duration took = absl::Now() - start;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find("1 of 3 ranks joined within 150 ms"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing ranks: 1,2"), std::string::npos) << msg;
  EXPECT_GE(took, absl::Milliseconds(150));
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_TRUE(broker_->List(1000, false).empty());
  EXPECT_TRUE(broker_->MembershipsOf(a.id).empty());
}

TEST_F(GroupBrokerTest, ExpiredRankLeavesTheOthersWaiting) {
  SessionInfo a = Open(), b = Open(), c = Open();
  auto patient = JoinAsync(a, Req("partial", 0, 3, 10000));
  WaitJoined(1000, "partial", 1);
  JoinResult impatient = Join(b, Req("partial", 1, 3, 100));
  EXPECT_EQ(impatient.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(impatient.status().message().find("2 of 3"), absl::string_view::npos)
      << impatient.status();
  std::optional<GroupSummary> g = Find(1000, "partial");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->members.size(), 1u);
  EXPECT_EQ(g->state, GroupState::kForming);
  // Rank 1 is free again and the group can still form.
  auto r1 = JoinAsync(b, Req("partial", 1, 3));
  ASSERT_TRUE(Join(c, Req("partial", 2, 3)).ok());
  EXPECT_TRUE(r1.get().ok());
  EXPECT_TRUE(patient.get().ok());
}

TEST_F(GroupBrokerTest, DefaultTimeoutFromLimits) {
  BrokerLimits limits;
  limits.max_world_size = 64;
  limits.default_timeout_ms = 120;
  MakeBroker(limits);
  SessionInfo a = Open();
  JoinResult r = Join(a, Req("default-timeout", 0, 2, /*timeout_ms=*/0));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("within 120 ms"), absl::string_view::npos) << r.status();
}

TEST_F(GroupBrokerTest, CancellationRemovesTheRank) {
  SessionInfo a = Open();
  std::atomic<bool> cancel{false};
  auto f = JoinAsync(a, Req("cancel", 0, 2, 30000), nullptr, [&] { return cancel.load(); });
  WaitJoined(1000, "cancel", 1);
  absl::Time start = absl::Now();
  cancel = true;
  JoinResult r = f.get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "cancellation is polled every 100 ms";
  EXPECT_TRUE(broker_->List(1000, false).empty());
}

TEST_F(GroupBrokerTest, LeaveWhileFormingEndsTheWaitingJoin) {
  SessionInfo a = Open();
  auto f = JoinAsync(a, Req("leave-early", 0, 2, 30000));
  WaitJoined(1000, "leave-early", 1);
  ASSERT_TRUE(broker_->Leave(a, "leave-early", 0).ok());
  JoinResult r = f.get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_TRUE(broker_->List(1000, false).empty());
}

TEST_F(GroupBrokerTest, SessionEndedWhileFormingEndsTheWaitingJoin) {
  SessionInfo a = Open(), b = Open();
  auto fa = JoinAsync(a, Req("lost-early", 0, 3, 30000));
  auto fb = JoinAsync(b, Req("lost-early", 1, 3, 30000));
  WaitJoined(1000, "lost-early", 2);
  broker_->SessionEnded(a.id);
  EXPECT_EQ(fa.get().status().code(), absl::StatusCode::kCancelled);
  std::optional<GroupSummary> g = Find(1000, "lost-early");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->members.size(), 1u) << "the vanished rank is gone, the other still waits";
  EXPECT_TRUE(Events(b).empty()) << "no LOST events before the group forms";
  broker_->SessionEnded(b.id);
  EXPECT_EQ(fb.get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(broker_->List(1000, false).empty());
}

// Forms a group of `n` ranks, one session each, and returns the sessions.
std::vector<SessionInfo> FormGroup(GroupBrokerTest* t, GroupBroker* broker,
                                   std::function<SessionInfo()> open, const std::string& name,
                                   uint32_t n) {
  std::vector<SessionInfo> s;
  for (uint32_t r = 0; r < n; ++r) s.push_back(open());
  std::vector<std::future<JoinResult>> f;
  for (uint32_t r = 0; r < n; ++r) {
    f.push_back(std::async(std::launch::async, [broker, &s, r, name, n] {
      return broker->Join(s[r], Req(name, r, n), nullptr, kNeverCancelled);
    }));
  }
  for (auto& fut : f) EXPECT_TRUE(fut.get().ok());
  (void)t;
  return s;
}

TEST_F(GroupBrokerTest, LeaveAfterFormedTellsTheOthers) {
  std::vector<SessionInfo> s = FormGroup(
      this, broker_.get(), [this] { return Open(); }, "lv", 3);
  ASSERT_TRUE(broker_->Leave(s[1], "lv", 1).ok());
  for (int r : {0, 2}) {
    std::vector<v1::SessionEvent> ev = Events(s[r]);
    ASSERT_EQ(ev.size(), 1u) << "rank " << r;
    ASSERT_TRUE(ev[0].has_member());
    EXPECT_EQ(ev[0].member().kind(), v1::MemberEvent::LEFT);
    EXPECT_EQ(ev[0].member().group(), "lv");
    EXPECT_EQ(ev[0].member().rank(), 1u);
    EXPECT_EQ(ev[0].member().pid(), s[1].cred.pid);
  }
  EXPECT_TRUE(Events(s[1]).empty()) << "the leaver is not told about itself";
  std::optional<GroupSummary> g = Find(1000, "lv");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->state, GroupState::kDegraded);
  EXPECT_EQ(g->members[1].state, MemberState::kLeft);
  EXPECT_EQ(broker_->MembershipsOf(s[1].id).size(), 0u);
  ASSERT_EQ(broker_->MembershipsOf(s[0].id).size(), 1u);
  EXPECT_EQ(broker_->MembershipsOf(s[0].id)[0], "lv/0");

  // Leaving twice, leaving someone else's rank, or an unknown group.
  EXPECT_EQ(broker_->Leave(s[1], "lv", 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(broker_->Leave(s[1], "lv", 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(broker_->Leave(s[1], "nope", 0).code(), absl::StatusCode::kNotFound);

  // Rank 0 leaving: only rank 2 hears of it (rank 1 is gone already).
  ASSERT_TRUE(broker_->Leave(s[0], "lv", 0).ok());
  EXPECT_TRUE(Events(s[1]).empty());
  std::vector<v1::SessionEvent> ev2 = Events(s[2]);
  ASSERT_EQ(ev2.size(), 1u);
  EXPECT_EQ(ev2[0].member().rank(), 0u);
  // The last member leaving releases the group.
  ASSERT_TRUE(broker_->Leave(s[2], "lv", 2).ok());
  EXPECT_FALSE(Find(1000, "lv").has_value());
}

TEST_F(GroupBrokerTest, SessionEndedAfterFormedIsLost) {
  std::vector<SessionInfo> s = FormGroup(
      this, broker_.get(), [this] { return Open(); }, "ls", 3);
  broker_->SessionEnded(s[2].id);
  for (int r : {0, 1}) {
    std::vector<v1::SessionEvent> ev = Events(s[r]);
    ASSERT_EQ(ev.size(), 1u) << "rank " << r;
    EXPECT_EQ(ev[0].member().kind(), v1::MemberEvent::LOST);
    EXPECT_EQ(ev[0].member().rank(), 2u);
    EXPECT_NE(ev[0].member().detail().find(std::to_string(s[2].cred.pid)), std::string::npos);
  }
  std::optional<GroupSummary> g = Find(1000, "ls");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->state, GroupState::kDegraded);
  EXPECT_EQ(g->members[2].state, MemberState::kLost);
  // Ending it again changes nothing.
  broker_->SessionEnded(s[2].id);
  EXPECT_TRUE(Events(s[0]).empty());
  broker_->SessionEnded(s[0].id);
  broker_->SessionEnded(s[1].id);
  EXPECT_TRUE(broker_->List(0, true).empty()) << "all lost: the group is released";
}

// Elastic groups: a vacated rank of a formed group is taken again once
// every survivor released it; the group re-forms at epoch + 1 and the
// survivors get JOINED with the newcomer's entry.
v1::ReleaseRankRequest Release(const std::string& group, uint32_t rank, uint32_t released) {
  v1::ReleaseRankRequest r;
  r.set_group(group);
  r.set_rank(rank);
  r.set_released_rank(released);
  return r;
}

TEST_F(GroupBrokerTest, ALeftRankIsTakenAgainAfterTheSurvivorReleasedIt) {
  SessionInfo a = Open(), b = Open(), c = Open();
  auto f0 = JoinAsync(a, Req("rejoin", 0, 2));
  ASSERT_TRUE(Join(b, Req("rejoin", 1, 2)).ok());
  JoinResult first = f0.get();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->epoch(), 1u);
  ASSERT_TRUE(broker_->Leave(b, "rejoin", 1).ok());
  ASSERT_EQ(Events(a).size(), 1u);  // LEFT
  auto again = JoinAsync(c, Req("rejoin", 1, 2));
  // Waits: rank 0 has not released rank 1 yet.
  EXPECT_EQ(again.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  // The waiting replacement releases nothing (it is not in the group yet).
  absl::Status early = broker_->ReleaseRank(c, Release("rejoin", 1, 0));
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  EXPECT_NE(early.message().find("has not joined yet"), std::string::npos) << early;
  v1::ReleaseRankRequest rel = Release("rejoin", 0, 1);
  rel.mutable_rdma()->set_qps_per_peer(1);
  rel.mutable_rdma()->add_qpns(0);
  rel.mutable_rdma()->add_qpns(77);
  ASSERT_TRUE(broker_->ReleaseRank(a, rel).ok());
  JoinResult view = again.get();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->epoch(), 2u);
  ASSERT_EQ(view->members_size(), 2);
  // The survivor's endpoint as it released the rank.
  EXPECT_EQ(view->members(0).rdma().qpns(1), 77u);
  std::vector<v1::SessionEvent> ev = Events(a);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].member().kind(), v1::MemberEvent::JOINED);
  EXPECT_EQ(ev[0].member().rank(), 1u);
  EXPECT_EQ(ev[0].member().epoch(), 2u);
  EXPECT_EQ(ev[0].member().member().pid(), c.cred.pid);
  EXPECT_EQ(ev[0].member().member().handle_data(), "handle-of-rank-1");
  EXPECT_TRUE(ev[0].member().member().p2p_reachable());
  std::optional<GroupSummary> g = Find(1000, "rejoin");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->epoch, 2u);
  EXPECT_EQ(g->state, GroupState::kFormed);
  // Both report again: the group is ready at epoch 2.
  for (auto [s, r] : {std::pair{a, 0u}, std::pair{c, 1u}}) {
    v1::ReportReadyRequest rr;
    rr.set_group("rejoin");
    rr.set_rank(r);
    rr.set_ok(true);
    ASSERT_TRUE(broker_->ReportReady(s, rr).ok()) << "rank " << r;
  }
  EXPECT_EQ(Find(1000, "rejoin")->state, GroupState::kReady);
}

TEST_F(GroupBrokerTest, AReplacementTimesOutNamingTheSurvivorsThatDidNotRelease) {
  std::vector<SessionInfo> s = FormGroup(
      this, broker_.get(), [this] { return Open(); }, "norelease", 3);
  broker_->SessionEnded(s[2].id);
  ASSERT_TRUE(broker_->ReleaseRank(s[0], Release("norelease", 0, 2)).ok());
  SessionInfo n = Open();
  JoinResult late = Join(n, Req("norelease", 2, 3, /*timeout_ms=*/150));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_NE(late.status().message().find("not yet released by ranks 1"), absl::string_view::npos)
      << late.status();
  // The rank is vacant again: once rank 1 releases it, the next one gets in.
  ASSERT_TRUE(broker_->ReleaseRank(s[1], Release("norelease", 1, 2)).ok());
  SessionInfo m = Open();
  JoinResult ok = Join(m, Req("norelease", 2, 3));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->epoch(), 2u);
}

TEST_F(GroupBrokerTest, ReleasingARankThatIsNotVacantIsRefused) {
  std::vector<SessionInfo> s = FormGroup(
      this, broker_.get(), [this] { return Open(); }, "notvacant", 2);
  EXPECT_EQ(broker_->ReleaseRank(s[0], Release("notvacant", 0, 1)).code(),
            absl::StatusCode::kFailedPrecondition);
  absl::Status self = broker_->ReleaseRank(s[0], Release("notvacant", 0, 0));
  EXPECT_EQ(self.code(), absl::StatusCode::kFailedPrecondition) << self;
  EXPECT_NE(self.message().find("caller's own"), std::string::npos) << self;
  // Only the holder of a rank releases for it.
  broker_->SessionEnded(s[1].id);
  SessionInfo other = Open();
  EXPECT_EQ(broker_->ReleaseRank(other, Release("notvacant", 0, 1)).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(broker_->ReleaseRank(s[0], Release("notvacant", 0, 1)).ok());
}

TEST_F(GroupBrokerTest, AReplacementWhoseSessionEndsWhileWaitingLeavesTheRankVacant) {
  std::vector<SessionInfo> s = FormGroup(
      this, broker_.get(), [this] { return Open(); }, "quitter", 2);
  broker_->SessionEnded(s[1].id);
  SessionInfo q = Open();
  auto waiting = JoinAsync(q, Req("quitter", 1, 2));
  // Until the replacement holds rank 1 (the lost holder is listed before).
  for (int i = 0; i < 5000; ++i) {
    std::optional<GroupSummary> g = Find(1000, "quitter");
    if (g && g->members.size() == 2 && g->members[1].pid == q.cred.pid) break;
    absl::SleepFor(absl::Milliseconds(2));
  }
  broker_->SessionEnded(q.id);
  EXPECT_EQ(waiting.get().status().code(), absl::StatusCode::kCancelled);
  Events(s[0]);  // LOST
  EXPECT_TRUE(Events(s[0]).empty()) << "nobody is told about a replacement that never got in";
  ASSERT_TRUE(broker_->ReleaseRank(s[0], Release("quitter", 0, 1)).ok());
  SessionInfo n = Open();
  ASSERT_TRUE(Join(n, Req("quitter", 1, 2)).ok());
}

TEST_F(GroupBrokerTest, ReportReadyFlow) {
  SessionInfo a = Open();
  auto forming = JoinAsync(a, Req("rr", 0, 2));
  WaitJoined(1000, "rr", 1);
  v1::ReportReadyRequest ready;
  ready.set_group("rr");
  ready.set_rank(0);
  ready.set_ok(true);
  EXPECT_EQ(broker_->ReportReady(a, ready).code(), absl::StatusCode::kFailedPrecondition)
      << "not formed yet";
  SessionInfo b = Open();
  ASSERT_TRUE(Join(b, Req("rr", 1, 2)).ok());
  ASSERT_TRUE(forming.get().ok());
  EXPECT_EQ(Find(1000, "rr")->state, GroupState::kFormed);

  // Someone else's rank, or a group that does not exist.
  EXPECT_EQ(broker_->ReportReady(b, ready).code(), absl::StatusCode::kNotFound);
  v1::ReportReadyRequest other = ready;
  other.set_group("nope");
  EXPECT_EQ(broker_->ReportReady(a, other).code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(broker_->ReportReady(a, ready).ok());
  EXPECT_EQ(Find(1000, "rr")->state, GroupState::kFormed);
  EXPECT_EQ(Find(1000, "rr")->members[0].state, MemberState::kReady);
  EXPECT_TRUE(Events(a).empty() && Events(b).empty()) << "READY only once everyone is ready";
  EXPECT_EQ(broker_->ReportReady(a, ready).code(), absl::StatusCode::kFailedPrecondition)
      << "readiness is reported once";

  v1::ReportReadyRequest ready1 = ready;
  ready1.set_rank(1);
  ASSERT_TRUE(broker_->ReportReady(b, ready1).ok());
  EXPECT_EQ(Find(1000, "rr")->state, GroupState::kReady);
  for (const SessionInfo* s : {&a, &b}) {
    std::vector<v1::SessionEvent> ev = Events(*s);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].member().kind(), v1::MemberEvent::READY);
    EXPECT_EQ(ev[0].member().group(), "rr");
  }
}

TEST_F(GroupBrokerTest, FailedReadinessDegradesAndTellsTheOthers) {
  std::vector<SessionInfo> s = FormGroup(
      this, broker_.get(), [this] { return Open(); }, "bad", 3);
  v1::ReportReadyRequest r;
  r.set_group("bad");
  r.set_rank(1);
  r.set_ok(false);
  r.set_detail("cannot map rank 2's buffer");
  ASSERT_TRUE(broker_->ReportReady(s[1], r).ok());
  for (int other : {0, 2}) {
    std::vector<v1::SessionEvent> ev = Events(s[other]);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].member().kind(), v1::MemberEvent::FAILED);
    EXPECT_EQ(ev[0].member().rank(), 1u);
    EXPECT_EQ(ev[0].member().detail(), "cannot map rank 2's buffer");
  }
  EXPECT_TRUE(Events(s[1]).empty());
  std::optional<GroupSummary> g = Find(1000, "bad");
  EXPECT_EQ(g->state, GroupState::kDegraded);
  EXPECT_EQ(g->members[1].state, MemberState::kFailed);
  // The others reporting ready does not make a failed group ready.
  for (uint32_t rank : {0u, 2u}) {
    v1::ReportReadyRequest ok;
    ok.set_group("bad");
    ok.set_rank(rank);
    ok.set_ok(true);
    ASSERT_TRUE(broker_->ReportReady(s[rank], ok).ok());
  }
  EXPECT_EQ(Find(1000, "bad")->state, GroupState::kDegraded);
  for (const SessionInfo& si : s) {
    for (const v1::SessionEvent& ev : Events(si)) {
      EXPECT_NE(ev.member().kind(), v1::MemberEvent::READY);
    }
  }
}

// BUG (reported to the lead): ReportReady forwards r.detail().substr(0, 512)
// to the other members; the cut ignores UTF-8, and MemberEvent.detail is a
// proto3 `string`. The other members' OpenSession streams then carry a
// message protobuf refuses to parse, so one failing rank with a long
// non-ASCII detail breaks every other member's session stream.
TEST_F(GroupBrokerTest, FailedDetailIsTruncatedOnACharacterBoundary) {
  std::vector<SessionInfo> s = FormGroup(
      this, broker_.get(), [this] { return Open(); }, "utf8", 2);
  v1::ReportReadyRequest r;
  r.set_group("utf8");
  r.set_rank(1);
  r.set_ok(false);
  r.set_detail(std::string(511, 'x') + "\xc3\xa9 and more");
  ASSERT_TRUE(broker_->ReportReady(s[1], r).ok());
  std::vector<v1::SessionEvent> ev = Events(s[0]);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_LE(ev[0].member().detail().size(), 512u);
  std::string bytes;
  ev[0].SerializeToString(&bytes);
  v1::SessionEvent back;
  EXPECT_TRUE(back.ParseFromString(bytes)) << "detail is not valid UTF-8 after truncation";
}

FdBundlePtr MemfdBundle(ino_t* inode) {
  auto b = std::make_shared<FdBundle>();
  b->fds.emplace_back(::memfd_create("group_broker_test", MFD_CLOEXEC));
  struct stat st {};
  EXPECT_EQ(::fstat(b->fds[0].get(), &st), 0);
  *inode = st.st_ino;
  return b;
}

TEST_F(GroupBrokerTest, FdBundlesGetOneTicketForTheWholeGroup) {
  SessionInfo s[3] = {Open(), Open(), Open()};
  SessionInfo outsider = Open();  // same uid, not a member
  ino_t ino0 = 0, ino1 = 0;
  FdBundlePtr b0 = MemfdBundle(&ino0), b1 = MemfdBundle(&ino1);
  auto f0 = JoinAsync(s[0], Req("fds", 0, 3), b0);
  auto f1 = JoinAsync(s[1], Req("fds", 1, 3), b1);
  auto f2 = JoinAsync(s[2], Req("fds", 2, 3));
  JoinResult r[3] = {f0.get(), f1.get(), f2.get()};
  for (const JoinResult& x : r) ASSERT_TRUE(x.ok()) << x.status();

  // A member without fds has no ticket; one with fds has the same ticket in
  // every view, and the request's own fd_ticket never leaks into the view.
  for (int recv = 0; recv < 3; ++recv) {
    EXPECT_EQ(r[recv]->rank(), static_cast<uint32_t>(recv));
    EXPECT_TRUE(r[recv]->members(2).fd_ticket().empty());
    EXPECT_EQ(r[recv]->members(0).fd_ticket(), r[0]->members(0).fd_ticket());
    EXPECT_EQ(r[recv]->members(1).fd_ticket(), r[0]->members(1).fd_ticket());
    EXPECT_EQ(r[recv]->members(0).fd_count(), 1u);
    for (int m = 0; m < 3; ++m) EXPECT_NE(r[recv]->members(m).fd_ticket(), "must-be-cleared");
  }
  EXPECT_FALSE(r[0]->members(0).fd_ticket().empty());
  // O(n) tickets: one per member with fds, not one per (member, receiver).
  EXPECT_EQ(fds_.TicketCount(), 2u);

  const std::string t0 = r[0]->members(0).fd_ticket();
  const std::string t1 = r[0]->members(1).fd_ticket();
  // Only sessions of the group (and its uid) may redeem.
  EXPECT_EQ(fds_.Redeem(t0, outsider.id, 1000).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(fds_.Redeem(t0, s[1].id, 2000).status().code(), absl::StatusCode::kPermissionDenied);
  // world_size - 1 uses in all, then the ticket is gone.
  for (int use = 0; use < 2; ++use) {
    absl::StatusOr<FdBundlePtr> got = fds_.Redeem(t0, s[1 + use].id, 1000);
    ASSERT_TRUE(got.ok()) << got.status();
    struct stat st {};
    ASSERT_EQ(::fstat((*got)->fds[0].get(), &st), 0);
    EXPECT_EQ(st.st_ino, ino0);
  }
  EXPECT_EQ(fds_.Redeem(t0, s[2].id, 1000).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<FdBundlePtr> got1 = fds_.Redeem(t1, s[0].id, 1000);
  ASSERT_TRUE(got1.ok());
  struct stat st {};
  ASSERT_EQ(::fstat((*got1)->fds[0].get(), &st), 0);
  EXPECT_EQ(st.st_ino, ino1);
}

TEST_F(GroupBrokerTest, GroupsAreScopedByUid) {
  SessionInfo alice = Open(1000), bob = Open(2000), root = Open(0);
  JoinResult a = Join(alice, Req("shared", 0, 1));
  JoinResult b = Join(bob, Req("shared", 0, 1));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << "the same name under another uid is another group: " << b.status();
  std::vector<GroupSummary> mine = broker_->List(1000, false);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].uid, 1000u);
  EXPECT_EQ(mine[0].members[0].session_id, alice.id);
  EXPECT_EQ(broker_->List(2000, false).size(), 1u);
  EXPECT_EQ(broker_->List(3000, false).size(), 0u);
  EXPECT_EQ(broker_->List(0, false).size(), 0u) << "root without `all` sees its own groups";
  EXPECT_EQ(broker_->List(0, true).size(), 2u);
  EXPECT_EQ(broker_->CountVisible(1000, false), 1u);
  EXPECT_EQ(broker_->CountVisible(0, true), 2u);
  // Alice leaving her "shared" does not touch bob's.
  ASSERT_TRUE(broker_->Leave(alice, "shared", 0).ok());
  EXPECT_EQ(broker_->List(1000, false).size(), 0u);
  ASSERT_EQ(broker_->List(2000, false).size(), 1u) << "bob's group is untouched";
  EXPECT_EQ(broker_->List(2000, false)[0].state, GroupState::kFormed);

  // Another user (root included) cannot see, leave or report on alice's group.
  ASSERT_TRUE(Join(alice, Req("alice-only", 0, 1)).ok());
  EXPECT_EQ(broker_->Leave(bob, "alice-only", 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(broker_->Leave(root, "alice-only", 0).code(), absl::StatusCode::kNotFound);
  v1::ReportReadyRequest rr;
  rr.set_group("alice-only");
  rr.set_rank(0);
  rr.set_ok(true);
  EXPECT_EQ(broker_->ReportReady(bob, rr).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Find(1000, "alice-only")->members[0].state, MemberState::kJoined);
  EXPECT_TRUE(broker_->ReportReady(alice, rr).ok());
}

TEST_F(GroupBrokerTest, UidScopingAppliesWhileForming) {
  SessionInfo alice = Open(1000), bob = Open(2000);
  auto fa = JoinAsync(alice, Req("scoped", 0, 2, 300));
  WaitJoined(1000, "scoped", 1);
  // Bob's rank 1 goes to his own group and does not complete alice's.
  JoinResult b = Join(bob, Req("scoped", 1, 2, 100));
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(fa.get().status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(GroupBrokerTest, ShutdownWakesAWaitingJoin) {
  SessionInfo a = Open();
  auto f = JoinAsync(a, Req("sd", 0, 2, 30000));
  WaitJoined(1000, "sd", 1);
  absl::Time start = absl::Now();
  broker_->Shutdown();
  JoinResult r = f.get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(Join(Open(), Req("after", 0, 1)).status().code(), absl::StatusCode::kUnavailable);
}

// Collects JoinAsync completions; counts them so "exactly once" is checked.
class DoneRecorder {
 public:
  GroupBroker::JoinDone Callback() {
    return [this](absl::StatusOr<EncodedView> r) {
      absl::MutexLock lock(&mu_);
      ++calls_;
      result_ = r.ok() ? r->Decode() : JoinResult(r.status());
    };
  }
  // Waits up to `timeout` for the first completion.
  std::optional<JoinResult> Await(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto called = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ > 0; };
    mu_.AwaitWithTimeout(absl::Condition(&called), timeout);
    return result_;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<JoinResult> result_ ABSL_GUARDED_BY(mu_);
};

TEST_F(GroupBrokerTest, ValidateJoinRejectsBadInputBeforeAnyJoin) {
  absl::StatusOr<ValidatedJoin> bad = broker_->ValidateJoin(Req("bad name", 0, 1));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  // An unknown GPU is found by validation too, so it cannot burn an fd ticket.
  absl::StatusOr<ValidatedJoin> gpu =
      broker_->ValidateJoin(Req("ok-name", 0, 1, 1000, "GPU-missing"));
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gpu.status().message().find("GPU-missing"), absl::string_view::npos) << gpu.status();
  EXPECT_TRUE(broker_->List(0, true).empty());
  // A valid request carries its fd ticket out for the caller to consume.
  absl::StatusOr<ValidatedJoin> ok = broker_->ValidateJoin(Req("ok-name", 1, 2, 1000, kUuid1));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->group(), "ok-name");
  EXPECT_EQ(ok->rank(), 1u);
  EXPECT_EQ(ok->world_size(), 2u);
  EXPECT_EQ(ok->fd_ticket(), "must-be-cleared");
}

TEST_F(GroupBrokerTest, JoinAsyncConflictCompletesAtOnce) {
  SessionInfo a = Open(), b = Open();
  DoneRecorder first, wrong;
  StartJoin(a, Req("conflict", 0, 2, 30000), nullptr, first.Callback());
  StartJoin(b, Req("conflict", 1, 3), nullptr, wrong.Callback());
  ASSERT_EQ(wrong.calls(), 1) << "a conflicting join completes before JoinAsync returns";
  EXPECT_EQ(wrong.Await(absl::ZeroDuration())->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(first.calls(), 0);
  broker_->CancelJoin(a, "conflict", 0);
}

TEST_F(GroupBrokerTest, JoinAsyncDoesNotBlockAndCompletesEveryRankOnce) {
  constexpr uint32_t kN = 64;  // the fixture's max_world_size
  std::vector<SessionInfo> s;
  for (uint32_t r = 0; r < kN; ++r) s.push_back(Open());
  std::vector<std::unique_ptr<DoneRecorder>> d;
  absl::Time start = absl::Now();
  // All ranks from one thread: only possible because nothing blocks.
  for (uint32_t r = 0; r < kN; ++r) {
    d.push_back(std::make_unique<DoneRecorder>());
    StartJoin(s[r], Req("async", r, kN), nullptr, d.back()->Callback());
    if (r + 1 < kN) EXPECT_EQ(d.back()->calls(), 0) << "rank " << r << " completed early";
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (uint32_t r = 0; r < kN; ++r) {
    std::optional<JoinResult> res = d[r]->Await(absl::Seconds(5));
    ASSERT_TRUE(res.has_value()) << "rank " << r << " never completed";
    ASSERT_TRUE(res->ok()) << res->status();
    EXPECT_EQ((*res)->rank(), r);
    EXPECT_EQ((*res)->members_size(), static_cast<int>(kN));
    EXPECT_EQ(d[r]->calls(), 1) << "rank " << r;
  }
}

TEST_F(GroupBrokerTest, JoinAsyncCompletionRunsOutsideTheBrokerLock) {
  SessionInfo a = Open(), b = Open();
  std::atomic<bool> locked{false};
  std::atomic<int> calls{0};
  auto probing_done = [&](absl::StatusOr<EncodedView>) {
    ++calls;
    auto probe = std::async(std::launch::async, [&] { return broker_->CountVisible(0, true); });
    if (probe.wait_for(std::chrono::seconds(2)) != std::future_status::ready) locked = true;
    probe.get();
  };
  StartJoin(a, Req("outside", 0, 2), nullptr, probing_done);
  StartJoin(b, Req("outside", 1, 2), nullptr, probing_done);  // forms: both complete
  EXPECT_EQ(calls.load(), 2);
  EXPECT_FALSE(locked.load()) << "a completion ran under the broker's lock";
  // The deadline path (timer thread) too.
  SessionInfo c = Open();
  calls = 0;
  StartJoin(c, Req("outside-timeout", 0, 2, 50), nullptr, probing_done);
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (calls.load() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_FALSE(locked.load()) << "the deadline completion ran under the broker's lock";
}

TEST_F(GroupBrokerTest, CancelJoin) {
  SessionInfo a = Open(), other = Open();
  DoneRecorder d;
  StartJoin(a, Req("cj", 0, 2, 30000), nullptr, d.Callback());
  // Only the joining session can cancel its rank.
  broker_->CancelJoin(other, "cj", 0);
  EXPECT_EQ(d.calls(), 0);
  EXPECT_EQ(Find(1000, "cj")->members.size(), 1u);
  broker_->CancelJoin(a, "cj", 0);
  ASSERT_EQ(d.calls(), 1);
  EXPECT_EQ(d.Await(absl::ZeroDuration())->status().code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(Find(1000, "cj").has_value());
  broker_->CancelJoin(a, "cj", 0);  // no-op now
  EXPECT_EQ(d.calls(), 1);
}

TEST_F(GroupBrokerTest, CancelJoinAfterFormedIsANoOp) {
  SessionInfo a = Open(), b = Open();
  DoneRecorder da, db;
  StartJoin(a, Req("cf", 0, 2), nullptr, da.Callback());
  StartJoin(b, Req("cf", 1, 2), nullptr, db.Callback());
  ASSERT_TRUE(da.Await(absl::Seconds(5))->ok());
  broker_->CancelJoin(a, "cf", 0);
  EXPECT_EQ(da.calls(), 1);
  EXPECT_EQ(Find(1000, "cf")->members.size(), 2u)
      << "a formed member is not removed by a late cancel";
}

TEST_F(GroupBrokerTest, EarlierDeadlineRegisteredLaterStillFiresOnTime) {
  SessionInfo a = Open(), b = Open();
  DoneRecorder slow, fast;
  StartJoin(a, Req("slow", 0, 2, 30000), nullptr, slow.Callback());
  absl::SleepFor(absl::Milliseconds(20));  // the timer now sleeps toward 30 s
  absl::Time start = absl::Now();
  StartJoin(b, Req("fast", 0, 2, 100), nullptr, fast.Callback());
  std::optional<JoinResult> r = fast.Await(absl::Seconds(5));
  ASSERT_TRUE(r.has_value()) << "the 100 ms deadline did not fire";
  EXPECT_EQ(r->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(slow.calls(), 0);
  EXPECT_FALSE(Find(1000, "fast").has_value());
  EXPECT_TRUE(Find(1000, "slow").has_value());
  // Complete `slow` before it goes out of scope (the fixture's Shutdown
  // would otherwise call into a dead recorder).
  broker_->CancelJoin(a, "slow", 0);
  EXPECT_EQ(slow.calls(), 1);
}

TEST_F(GroupBrokerTest, ShutdownCompletesAsyncWaitersOnce) {
  SessionInfo a = Open(), b = Open();
  DoneRecorder da, db;
  StartJoin(a, Req("sd-async", 0, 3), nullptr, da.Callback());
  StartJoin(b, Req("sd-async", 1, 3), nullptr, db.Callback());
  broker_->Shutdown();
  for (DoneRecorder* d : {&da, &db}) {
    ASSERT_EQ(d->calls(), 1);
    EXPECT_EQ(d->Await(absl::ZeroDuration())->status().code(), absl::StatusCode::kUnavailable);
  }
  broker_->Shutdown();
  EXPECT_EQ(da.calls(), 1) << "a second Shutdown must not complete again";
}

}  // namespace
}  // namespace mooncake::daemon

namespace mooncake::daemon {
namespace {

// A join that arrives after its session ended (the client died while the
// RPC was in flight) must not enter the group: nobody would ever report it
// lost, and the group would never be released.
TEST_F(GroupBrokerTest, JoinFromAnEndedSessionIsRefused) {
  SessionInfo dead = Open(), alive = Open();
  sessions_.Close(dead.id);
  broker_->SessionEnded(dead.id);
  JoinResult r = Join(dead, Req("late", 0, 2, 500));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_TRUE(broker_->List(0, true).empty());
  // The live rank alone cannot form the group: it times out, and nothing is left.
  JoinResult other = Join(alive, Req("late", 1, 2, 200));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(broker_->List(0, true).empty());
}

}  // namespace
}  // namespace mooncake::daemon

namespace mooncake::daemon {
namespace {

class GroupBrokerBudgetTest : public GroupBrokerTest {
 protected:
  GroupBrokerBudgetTest() {
    BrokerLimits limits;
    limits.max_world_size = 64;
    limits.max_timeout_ms = 60000;
    limits.max_ranks_per_uid = 4;
    limits.max_waiting_joins_per_uid = 2;
    limits.max_view_bytes_per_uid = 4096;
    MakeBroker(limits);
  }
};

TEST_F(GroupBrokerBudgetTest, WaitingJoinsPerUidAreCappedAndNamed) {
  SessionInfo a = Open(), b = Open(), c = Open();
  auto f0 = JoinAsync(a, Req("w1", 0, 3, 10000));
  auto f1 = JoinAsync(b, Req("w2", 0, 3, 10000));
  WaitJoined(1000, "w1", 1);
  WaitJoined(1000, "w2", 1);
  JoinResult third = Join(c, Req("w3", 0, 3, 10000));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_NE(third.status().message().find("max_waiting_joins_per_uid"), std::string::npos);
  // Another uid is not affected.
  SessionInfo other = Open(2000);
  EXPECT_TRUE(Join(other, Req("solo", 0, 1)).ok());
  broker_->Shutdown();
  f0.get();
  f1.get();
}

TEST_F(GroupBrokerBudgetTest, AJoinThatCompletesItsGroupIsNotAWaitingJoin) {
  SessionInfo a = Open(), b = Open(), c = Open();
  auto f0 = JoinAsync(a, Req("x", 0, 2, 10000));
  auto f1 = JoinAsync(b, Req("y", 0, 2, 10000));
  WaitJoined(1000, "x", 1);
  WaitJoined(1000, "y", 1);
  EXPECT_TRUE(Join(c, Req("x", 1, 2)).ok()) << "completes 'x' at the waiting cap";
  EXPECT_TRUE(f0.get().ok());
  broker_->Shutdown();
  f1.get();
}

TEST_F(GroupBrokerBudgetTest, RanksPerUidAreCappedAndGivenBackWhenGroupsEnd) {
  SessionInfo s = Open();
  // One session holding every rank of a group: the review's 2048-rank case
  // in miniature.
  std::vector<std::future<JoinResult>> f;
  f.push_back(JoinAsync(s, Req("many", 0, 4)));
  f.push_back(JoinAsync(s, Req("many", 1, 4)));
  WaitJoined(1000, "many", 2);
  EXPECT_EQ(broker_->UsageOf(Principal{1000}).waiting, 2u);
  ASSERT_TRUE(Join(s, Req("many", 2, 4)).status().code() == absl::StatusCode::kResourceExhausted)
      << "a third waiting join is over max_waiting_joins_per_uid";
  f.push_back(JoinAsync(s, Req("many", 3, 4)));  // would complete? no: 2 of 4 joined
  // Rank 3 is refused too (3 joined would still wait); cancel the group.
  JoinResult r3 = f.back().get();
  EXPECT_EQ(r3.status().code(), absl::StatusCode::kResourceExhausted);
  f.pop_back();
  sessions_.Close(s.id);
  broker_->SessionEnded(s.id);
  for (auto& x : f) EXPECT_FALSE(x.get().ok());
  GroupBroker::Usage u = broker_->UsageOf(Principal{1000});
  EXPECT_EQ(u.ranks, 0u);
  EXPECT_EQ(u.waiting, 0u);
  EXPECT_EQ(u.view_bytes, 0u);

  // A formed group holds its ranks until it is released.
  SessionInfo t = Open();
  f.clear();
  for (uint32_t r = 0; r < 2; ++r) f.push_back(JoinAsync(t, Req("pair", r, 2)));
  for (auto& x : f) ASSERT_TRUE(x.get().ok());
  SessionInfo v = Open();
  f.clear();
  for (uint32_t r = 0; r < 2; ++r) f.push_back(JoinAsync(v, Req("pair2", r, 2)));
  for (auto& x : f) ASSERT_TRUE(x.get().ok());
  EXPECT_EQ(broker_->UsageOf(Principal{1000}).ranks, 4u);
  JoinResult over = Join(Open(), Req("solo", 0, 1));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("max_ranks_per_uid"), std::string::npos) << over.status();
  ASSERT_TRUE(broker_->Leave(t, "pair", 0).ok());
  ASSERT_TRUE(broker_->Leave(t, "pair", 1).ok());
  EXPECT_EQ(broker_->UsageOf(Principal{1000}).ranks, 2u);
  EXPECT_TRUE(Join(Open(), Req("solo", 0, 1)).ok());
}

TEST_F(GroupBrokerBudgetTest, ViewBytesPerUidAreCapped) {
  SessionInfo s = Open();
  v1::JoinGroupRequest big = Req("big", 0, 2);
  big.mutable_handle()->set_data(std::string(3000, 'h'));
  auto f = JoinAsync(s, big);
  WaitJoined(1000, "big", 1);
  v1::JoinGroupRequest big1 = Req("big", 1, 2);
  big1.mutable_handle()->set_data(std::string(3000, 'h'));
  JoinResult r = Join(Open(), big1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("max_view_bytes_per_uid"), std::string::npos);
  broker_->Shutdown();
  f.get();
}

TEST_F(GroupBrokerBudgetTest, TimeoutAboveTheCapIsRefused) {
  JoinResult r = Join(Open(), Req("slow", 0, 2, 60001));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("max_join_timeout_ms"), std::string::npos) << r.status();
}

TEST_F(GroupBrokerBudgetTest, RootIsNotLimited) {
  SessionInfo s = Open(0);
  std::vector<std::future<JoinResult>> f;
  for (uint32_t r = 0; r < 8; ++r) f.push_back(JoinAsync(s, Req("root", r, 8)));
  for (auto& x : f) EXPECT_TRUE(x.get().ok());
}

}  // namespace
}  // namespace mooncake::daemon
