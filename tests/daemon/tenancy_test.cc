// Tenants of one uid, in process: the scope rule, the session registry's
// fd-channel check, exports, and the broker's groups, each with two tenants
// of the same uid (uid 0, as most containers run), and the tenant_sockets
// configuration key. The daemon end to end: tests/integration/tenant_test.cc.
#include <sys/mman.h>
#include <unistd.h>

#include <future>
#include <string>
#include <thread>

#include "broker/group_broker.h"
#include "config/daemon_config.h"
#include "fdchannel/export_registry.h"
#include "fdchannel/fd_broker.h"
#include "gtest/gtest.h"
#include "session/session_registry.h"

namespace mooncake::daemon {
namespace {

PeerCred Cred(uint32_t uid, int pid) {
  PeerCred c;
  c.uid = uid;
  c.gid = uid;
  c.pid = pid;
  return c;
}

TEST(Scope, RootSeesAllOnlyOnTheMainSocket) {
  Scope main_root = ScopeOf(Cred(0, 1), "");
  EXPECT_TRUE(main_root.Sees(0, ""));
  EXPECT_TRUE(main_root.Sees(1000, "a"));
  Scope a_root = ScopeOf(Cred(0, 1), "a");
  EXPECT_TRUE(a_root.Sees(0, "a"));
  EXPECT_TRUE(a_root.Sees(1000, "a"));
  EXPECT_FALSE(a_root.Sees(0, "b"));
  EXPECT_FALSE(a_root.Sees(0, ""));
  Scope a_user = ScopeOf(Cred(1000, 1), "a");
  EXPECT_TRUE(a_user.Sees(1000, "a"));
  EXPECT_FALSE(a_user.Sees(1001, "a"));
  EXPECT_FALSE(a_user.Sees(1000, ""));
  Scope main_user = ScopeOf(Cred(1000, 1), "");
  EXPECT_TRUE(main_user.Sees(1000, ""));
  EXPECT_FALSE(main_user.Sees(1000, "a"));
}

TEST(TenantSessions, FdChannelAcceptsOnlyTheSessionsTenant) {
  SessionRegistry sessions(100);
  auto a = sessions.Open(Cred(0, 10), 5, "a", "a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->tenant, "a");
  EXPECT_TRUE(sessions.Authenticate(a->id, a->token, 0, "a").ok());
  // The same id and token through another tenant's (or the main) fd channel.
  EXPECT_EQ(sessions.Authenticate(a->id, a->token, 0, "b").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(sessions.Authenticate(a->id, a->token, 0).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(TenantExports, NotImportableAcrossTenants) {
  ExportRegistry exports;
  ExportRecord r = exports.Add(1, 0, 10, "memfd", 4096, nullptr, "a");
  EXPECT_TRUE(exports.Lookup(r.id, r.secret, 0, "a").ok());
  absl::StatusOr<ExportRecord> other = exports.Lookup(r.id, r.secret, 0, "b");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(exports.Lookup(r.id, r.secret, 0).status().code(), absl::StatusCode::kNotFound);
  // The same answer as for an id that does not exist: no oracle.
  EXPECT_EQ(exports.Lookup(r.id + 100, r.secret, 0, "b").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TenantExports, FdBrokerImportUsesTheSessionsTenant) {
  SessionRegistry sessions(100);
  FdBroker fds(absl::Seconds(30), &sessions);
  auto a = sessions.Open(Cred(0, 10), 5, "exporter", "a");
  auto a2 = sessions.Open(Cred(0, 11), 6, "importer", "a");
  auto b = sessions.Open(Cred(0, 12), 7, "intruder", "b");
  ASSERT_TRUE(a.ok() && a2.ok() && b.ok());
  std::vector<UniqueFd> v;
  v.emplace_back(::memfd_create("t", MFD_CLOEXEC));
  ASSERT_TRUE(v.back());
  absl::StatusOr<std::string> ticket = fds.AddIncoming(*a, std::move(v));
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  absl::StatusOr<ExportRecord> e = fds.Export(*a, *ticket, "memfd", 4096);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->tenant, "a");
  EXPECT_TRUE(fds.Import(*a2, e->id, e->secret).ok());
  EXPECT_EQ(fds.Import(*b, e->id, e->secret).status().code(), absl::StatusCode::kNotFound);
}

v1::JoinGroupRequest Req(const std::string& group, uint32_t rank, uint32_t n, uint32_t timeout_ms) {
  v1::JoinGroupRequest r;
  r.set_group(group);
  r.set_rank(rank);
  r.set_world_size(n);
  r.set_timeout_ms(timeout_ms);
  r.mutable_handle()->set_kind("memfd");
  r.mutable_handle()->set_data("h" + std::to_string(rank));
  return r;
}

class TenantBrokerTest : public ::testing::Test {
 protected:
  TenantBrokerTest()
      : sessions_(100),
        fds_(absl::Seconds(30), &sessions_),
        broker_("node", v1::Topology(), BrokerLimits{}, &sessions_, &fds_) {}
  ~TenantBrokerTest() override { broker_.Shutdown(); }

  SessionInfo Open(const std::string& tenant) {
    auto s = sessions_.Open(Cred(0, next_fd_), next_fd_, "t", tenant);
    ++next_fd_;
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }
  std::future<absl::StatusOr<v1::JoinGroupResponse>> JoinLater(const SessionInfo& s,
                                                               v1::JoinGroupRequest r) {
    return std::async(std::launch::async,
                      [this, s, r] { return broker_.Join(s, r, nullptr, [] { return false; }); });
  }

  SessionRegistry sessions_;
  FdBroker fds_;
  GroupBroker broker_;
  int next_fd_ = 100;
};

TEST_F(TenantBrokerTest, SameNameInTwoTenantsIsTwoGroups) {
  SessionInfo a0 = Open("a"), a1 = Open("a"), b0 = Open("b"), b1 = Open("b");
  auto fa = JoinLater(a0, Req("job", 0, 2, 10000));
  auto fb = JoinLater(b0, Req("job", 0, 2, 10000));
  // Rank 1 of each tenant completes its own tenant's group only: the other
  // tenant's rank 0 holds no place in it.
  auto ra1 = broker_.Join(a1, Req("job", 1, 2, 10000), nullptr, [] { return false; });
  auto rb1 = broker_.Join(b1, Req("job", 1, 2, 10000), nullptr, [] { return false; });
  ASSERT_TRUE(ra1.ok()) << ra1.status();
  ASSERT_TRUE(rb1.ok()) << rb1.status();
  auto ra0 = fa.get();
  auto rb0 = fb.get();
  ASSERT_TRUE(ra0.ok() && rb0.ok());
  EXPECT_EQ(ra1->members(0).pid(), a0.cred.pid);
  EXPECT_EQ(rb1->members(0).pid(), b0.cred.pid);

  std::vector<GroupSummary> in_a = broker_.List(ScopeOf(Cred(0, 1), "a"));
  ASSERT_EQ(in_a.size(), 1u);
  EXPECT_EQ(in_a[0].tenant, "a");
  EXPECT_EQ(in_a[0].members[0].session_id, a0.id);
  EXPECT_EQ(broker_.CountVisible(ScopeOf(Cred(0, 1), "b")), 1u);
  // The main socket's root sees both; a main-socket user sees neither.
  EXPECT_EQ(broker_.CountVisible(ScopeOf(Cred(0, 1), "")), 2u);
  EXPECT_EQ(broker_.List(ScopeOf(Cred(1000, 1), "")).size(), 0u);
}

TEST_F(TenantBrokerTest, CannotJoinAnotherTenantsGroup) {
  SessionInfo a0 = Open("a"), b1 = Open("b");
  auto fa = JoinLater(a0, Req("shared", 0, 2, 600));
  auto rb = broker_.Join(b1, Req("shared", 1, 2, 600), nullptr, [] { return false; });
  EXPECT_EQ(rb.status().code(), absl::StatusCode::kDeadlineExceeded) << rb.status();
  EXPECT_EQ(fa.get().status().code(), absl::StatusCode::kDeadlineExceeded);
  // Both joins timed out: nothing is left behind.
  EXPECT_EQ(broker_.List(ScopeOf(Cred(0, 1), "")).size(), 0u);
}

TEST_F(TenantBrokerTest, LeaveAndReadyAreScopedToTheTenant) {
  SessionInfo a0 = Open("a"), a1 = Open("a"), b0 = Open("b");
  auto fa = JoinLater(a0, Req("g", 0, 2, 10000));
  ASSERT_TRUE(broker_.Join(a1, Req("g", 1, 2, 10000), nullptr, [] { return false; }).ok());
  ASSERT_TRUE(fa.get().ok());
  v1::ReportReadyRequest ready;
  ready.set_group("g");
  ready.set_rank(0);
  ready.set_ok(true);
  EXPECT_EQ(broker_.ReportReady(b0, ready).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(broker_.Leave(b0, "g", 0).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(broker_.ReportReady(a0, ready).ok());
}

TEST(TenantConfig, ParsesNamesAndPaths) {
  DaemonConfig c;
  c.socket = "/run/mooncake/mooncaked.sock";
  ASSERT_TRUE(
      ParseConfigText("tenant_sockets = team-a, team-b:/run/mc/b/mooncaked.sock\n", "t.conf", &c)
          .ok());
  ASSERT_EQ(c.tenant_sockets.size(), 2u);
  absl::StatusOr<std::vector<TenantSocket>> r = ResolveTenantSockets(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].name, "team-a");
  EXPECT_EQ((*r)[0].path, "/run/mooncake/tenants/team-a/mooncaked.sock");
  EXPECT_EQ((*r)[1].path, "/run/mc/b/mooncaked.sock");
  // Empty: none.
  ASSERT_TRUE(ParseConfigText("tenant_sockets =\n", "t.conf", &c).ok());
  EXPECT_TRUE(c.tenant_sockets.empty());
}

TEST(TenantConfig, RejectsBadEntries) {
  for (const char* bad : {
           "tenant_sockets = a,a",                   // twice
           "tenant_sockets = -a",                    // starts with '-'
           "tenant_sockets = a/b",                   // not a name
           "tenant_sockets = a:relative/path.sock",  // not absolute
           "tenant_sockets = a:/run/../etc/x.sock",  // '..'
           "tenant_sockets = a:/run//x.sock",        // empty component
           "tenant_sockets = a:/run/x.sock/",        // trailing '/'
           "tenant_sockets = :/run/x.sock",          // no name
           "tenant_sockets = a b",                   // space in the name
       }) {
    DaemonConfig c;
    absl::Status s = ParseConfigText(bad, "t.conf", &c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("tenant_sockets"), absl::string_view::npos) << s;
  }
  DaemonConfig c;
  std::string long_name(kMaxTenantNameBytes + 1, 'a');
  EXPECT_FALSE(ParseConfigText("tenant_sockets = " + long_name, "t.conf", &c).ok());
  std::string long_path = "/" + std::string(110, 'p');
  EXPECT_FALSE(ParseConfigText("tenant_sockets = a:" + long_path, "t.conf", &c).ok());
}

TEST(TenantConfig, ResolveRejectsSharedSockets) {
  DaemonConfig c;
  c.socket = "/run/mooncake/mooncaked.sock";
  c.tenant_sockets = {{"a", "/run/mooncake/mooncaked.sock"}};
  EXPECT_FALSE(ResolveTenantSockets(c).ok());
  c.tenant_sockets = {{"a", "/run/x.sock"}, {"b", "/run/x.sock"}};
  EXPECT_FALSE(ResolveTenantSockets(c).ok());
  c.tenant_sockets = {{"a", "/run/x.sock"}, {"b", "/run/x.sock.fd"}};
  EXPECT_FALSE(ResolveTenantSockets(c).ok());
  c.tenant_sockets = {{"a", ""}, {"b", "/run/mooncake/tenants/a/mooncaked.sock"}};
  EXPECT_FALSE(ResolveTenantSockets(c).ok());
}

TEST(TenantConfig, CommandLineFlag) {
  const char* argv[] = {"mooncaked", "--tenant-sockets", "x,y"};
  bool help = false, version = false;
  absl::StatusOr<DaemonConfig> c = ParseCommandLine(3, const_cast<char**>(argv), &help, &version);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->tenant_sockets.size(), 2u);
  EXPECT_EQ(c->tenant_sockets[1].name, "y");
}

}  // namespace
}  // namespace mooncake::daemon
