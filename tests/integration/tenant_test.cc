// Two tenants of one uid through a real mooncaked (tenant_sockets): each
// tenant's socket serves its own groups, sessions and exports, as pods that
// all run as root would use them (deploy/k8s). Tests run as root, so every
// process here has the same uid: only the socket tells the tenants apart.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "daemon_process.h"
#include "gtest/gtest.h"
#include "mooncake/client/client.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

class TenantTest : public ::testing::Test {
 protected:
  TenantTest()
      : daemon_(dir_.path(), {"--tenant-sockets", "team-a,team-b:" + dir_.path() + "/b/mc.sock"}),
        a_(dir_.path() + "/tenants/team-a/mooncaked.sock"),
        b_(dir_.path() + "/b/mc.sock") {}

  std::unique_ptr<Client> Connect(const std::string& socket, const std::string& name) {
    auto c = Client::Connect({.socket_path = socket, .client_name = name});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // `mcctl --json --socket S what`, its exit status checked.
  std::string Mcctl(const std::string& socket, const std::string& what) {
    Child c = Child::Spawn({BinDir() + "/mcctl", "--json", "--socket", socket, what});
    EXPECT_EQ(c.Wait(10000), 0) << c.output();
    return c.output();
  }

  TempDir dir_;
  DaemonProcess daemon_;
  const std::string a_, b_;
};

TEST_F(TenantTest, SocketsExistWithTheirFdChannels) {
  for (const std::string& s : {a_, b_}) {
    struct stat st {};
    ASSERT_EQ(::stat(s.c_str(), &st), 0) << s;
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    ASSERT_EQ(::stat((s + ".fd").c_str(), &st), 0) << s;
  }
  v1::DaemonStatus st = GetStatus(a_);
  EXPECT_EQ(st.tenant(), "team-a");
  EXPECT_EQ(st.socket_path(), a_);  // its own socket, never another tenant's
  EXPECT_EQ(st.fd_socket_path(), a_ + ".fd");
  EXPECT_EQ(GetStatus(daemon_.socket()).tenant(), "");
}

TEST_F(TenantTest, SameGroupNameFormsSeparatelyAndStaysInvisibleToTheOther) {
  auto a0 = Connect(a_, "a0"), a1 = Connect(a_, "a1");
  auto b0 = Connect(b_, "b0"), b1 = Connect(b_, "b1");
  ASSERT_TRUE(a0 && a1 && b0 && b1);
  auto join = [](Client* c, uint32_t rank, const std::string& data) {
    return std::async(std::launch::async, [=] {
      return c->joinGroup({.group = "job",
                           .rank = rank,
                           .world_size = 2,
                           .timeout = absl::Seconds(10),
                           .handle_kind = "bytes",
                           .handle_data = data});
    });
  };
  auto fa0 = join(a0.get(), 0, "a0"), fb0 = join(b0.get(), 0, "b0");
  auto fa1 = join(a1.get(), 1, "a1"), fb1 = join(b1.get(), 1, "b1");
  auto va0 = fa0.get(), va1 = fa1.get(), vb0 = fb0.get(), vb1 = fb1.get();
  ASSERT_TRUE(va0.ok()) << va0.status();
  ASSERT_TRUE(va1.ok()) << va1.status();
  ASSERT_TRUE(vb0.ok()) << vb0.status();
  ASSERT_TRUE(vb1.ok()) << vb1.status();
  // Each tenant's view holds its own ranks' handles only.
  ASSERT_EQ(va0->members.size(), 2u);
  EXPECT_EQ(va0->members[1].handle_data, "a1");
  EXPECT_EQ(vb0->members[1].handle_data, "b1");

  v1::ListGroupsResponse ga = ListGroups(a_), gb = ListGroups(b_);
  ASSERT_EQ(ga.groups_size(), 1);
  ASSERT_EQ(gb.groups_size(), 1);
  EXPECT_EQ(ga.groups(0).tenant(), "team-a");
  EXPECT_EQ(gb.groups(0).tenant(), "team-b");
  EXPECT_NE(ga.groups(0).members(0).session_id(), gb.groups(0).members(0).session_id());
  // The node's root on the main socket sees both.
  EXPECT_EQ(ListGroups(daemon_.socket()).groups_size(), 2);
  EXPECT_EQ(GetStatus(a_).groups(), 1u);
  EXPECT_EQ(GetStatus(a_).sessions(), 2u);
  EXPECT_EQ(GetStatus(daemon_.socket()).sessions(), 4u);

  // mcctl through each socket lists that tenant only.
  const std::string sa = Mcctl(a_, "sessions");
  EXPECT_NE(sa.find("\"a0\""), std::string::npos) << sa;
  EXPECT_NE(sa.find("\"team-a\""), std::string::npos) << sa;
  EXPECT_EQ(sa.find("\"b0\""), std::string::npos) << sa;
  EXPECT_EQ(sa.find("team-b"), std::string::npos) << sa;
  const std::string gbj = Mcctl(b_, "groups");
  EXPECT_NE(gbj.find("\"team-b\""), std::string::npos) << gbj;
  EXPECT_EQ(gbj.find("team-a"), std::string::npos) << gbj;
  const std::string all = Mcctl(daemon_.socket(), "sessions");
  EXPECT_NE(all.find("team-a"), std::string::npos) << all;
  EXPECT_NE(all.find("team-b"), std::string::npos) << all;
}

TEST_F(TenantTest, CannotJoinTheOtherTenantsGroup) {
  auto a0 = Connect(a_, "a0"), b1 = Connect(b_, "b1");
  ASSERT_TRUE(a0 && b1);
  auto fa = std::async(std::launch::async, [&] {
    return a0->joinGroup(
        {.group = "shared", .rank = 0, .world_size = 2, .timeout = absl::Milliseconds(1500)});
  });
  // Wait until team-a's rank is in, then team-b tries to complete the group.
  for (int i = 0; i < 100 && ListGroups(a_).groups_size() == 0; ++i) ::usleep(10000);
  ASSERT_EQ(ListGroups(a_).groups_size(), 1);
  EXPECT_EQ(ListGroups(b_).groups_size(), 0);  // team-b does not even see it
  auto vb = b1->joinGroup(
      {.group = "shared", .rank = 1, .world_size = 2, .timeout = absl::Milliseconds(500)});
  EXPECT_EQ(vb.status().code(), absl::StatusCode::kDeadlineExceeded) << vb.status();
  auto va = fa.get();
  EXPECT_EQ(va.status().code(), absl::StatusCode::kDeadlineExceeded) << va.status();
}

TEST_F(TenantTest, ExportsAreNotImportableAcrossTenants) {
  auto a0 = Connect(a_, "a0"), a1 = Connect(a_, "a1"), b0 = Connect(b_, "b0");
  auto main = Connect(daemon_.socket(), "main");
  ASSERT_TRUE(a0 && a1 && b0 && main);
  int fd = ::memfd_create("tenant-a-secret", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto e = a0->exportFds({fd}, "memfd", 4096);
  ::close(fd);
  ASSERT_TRUE(e.ok()) << e.status();
  auto same = a1->importFds(*e);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->size(), 1u);
  EXPECT_EQ(b0->importFds(*e).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(main->importFds(*e).status().code(), absl::StatusCode::kNotFound);
}

// What the example pod of deploy/k8s does, in two tenants at once with the
// same group name: both pairs run the upstream two-rank transfer.
TEST_F(TenantTest, TwoRankExampleInBothTenants) {
  std::vector<Child> ranks;
  for (const std::string& socket : {a_, b_}) {
    for (int r = 0; r < 2; ++r) {
      ranks.push_back(
          Child::Spawn({BinDir() + "/device_transport_example", "--platform", "host", "--socket",
                        socket, "--group", "example", "--rank", std::to_string(r), "--world-size",
                        "2", "--timeout-ms", "20000"}));
    }
  }
  for (Child& c : ranks) EXPECT_EQ(c.Wait(60000), 0) << c.output();
}

// Issue 23 item 4, the probe's attack: uid 0 on a tenant socket opened 10
// sessions with max_sessions_per_uid = 3, because root was never refused.
// Root on a tenant socket is a tenant: 3, then RESOURCE_EXHAUSTED naming it;
// another tenant's root has its own 3; root on the main socket (the
// administrator) is still never refused.
TEST(TenantBudget, RootOnATenantSocketIsATenant) {
  ASSERT_EQ(::geteuid(), 0u) << "the attack is root's";
  TempDir dir;
  std::ofstream(dir.path() + "/budget.conf") << "max_sessions_per_uid = 3\n";
  DaemonProcess daemon(
      dir.path(), {"--config", dir.path() + "/budget.conf", "--tenant-sockets", "team-a,team-b"});
  const std::string a = dir.path() + "/tenants/team-a/mooncaked.sock";
  const std::string b = dir.path() + "/tenants/team-b/mooncaked.sock";
  auto open_many = [](const std::string& socket, int n, std::string* last_error) {
    std::vector<std::unique_ptr<Client>> held;
    for (int i = 0; i < n; ++i) {
      auto c = Client::Connect({.socket_path = socket, .client_name = "budget"});
      if (c.ok()) {
        held.push_back(*std::move(c));
      } else {
        EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted) << c.status();
        *last_error = std::string(c.status().message());
      }
    }
    return held;
  };
  std::string error;
  auto in_a = open_many(a, 10, &error);
  EXPECT_EQ(in_a.size(), 3u);
  EXPECT_NE(error.find("uid 0 of tenant 'team-a'"), std::string::npos) << error;
  EXPECT_NE(error.find("max_sessions_per_uid"), std::string::npos) << error;
  error.clear();
  auto in_b = open_many(b, 4, &error);
  EXPECT_EQ(in_b.size(), 3u) << "tenant b's root has a budget of its own";
  EXPECT_NE(error.find("uid 0 of tenant 'team-b'"), std::string::npos) << error;
  error.clear();
  auto in_main = open_many(daemon.socket(), 10, &error);
  EXPECT_EQ(in_main.size(), 10u) << "root on the main socket is never refused: " << error;
}

// Issue 23 item 7: a file planted at one tenant's socket path while the
// daemon was down fails that tenant, logged, not the whole daemon.
TEST(TenantSockets, APlantedFileFailsThatTenantOnly) {
  TempDir dir;
  ASSERT_EQ(::mkdir((dir.path() + "/tenants").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir.path() + "/tenants/team-b").c_str(), 0755), 0);
  const std::string planted = dir.path() + "/tenants/team-b/mooncaked.sock";
  std::ofstream(planted) << "not a socket";
  DaemonProcess daemon(dir.path(), {"--tenant-sockets", "team-a,team-b"}, /*log_to_output=*/true);
  EXPECT_EQ(GetStatus(dir.path() + "/tenants/team-a/mooncaked.sock").tenant(), "team-a");
  EXPECT_EQ(GetStatus(daemon.socket()).tenant(), "");
  EXPECT_NE(daemon.child().WaitForLine("tenant 'team-b' is not served", 5000), "");
  std::ifstream in(planted);
  std::string kept;
  std::getline(in, kept);
  EXPECT_EQ(kept, "not a socket") << "the planted file is left as it was";
}

}  // namespace
}  // namespace mooncake::testing
