// The tenant span policy (daemon/broker/tenant_span_policy.h): which nodes
// each tenant's groups may span, the file's grammar with an error naming
// the line, and the refusal of a file another user could have written.
#include "broker/tenant_span_policy.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

std::shared_ptr<const TenantSpanPolicy> MustParse(const std::string& text) {
  auto p = TenantSpanPolicy::Parse(text, "policy");
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : nullptr;
}

TEST(TenantSpanPolicyTest, EachTenantSpansOnlyTheNodesItsLineNames) {
  auto p = MustParse(
      "# tenant  nodes\n"
      "team-a   gpu-a-01 gpu-a-02   # two nodes\n"
      "team-b\tgpu-b-* gpu-x-[0-3]\n"
      "team-c\n"
      "@main    *\n");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->tenant_count(), 4u);
  EXPECT_TRUE(p->MaySpan("team-a", "gpu-a-01"));
  EXPECT_TRUE(p->MaySpan("team-a", "gpu-a-02"));
  EXPECT_FALSE(p->MaySpan("team-a", "gpu-a-03"));
  EXPECT_FALSE(p->MaySpan("team-a", "gpu-a-0"));  // a name, not a prefix
  EXPECT_TRUE(p->MaySpan("team-b", "gpu-b-17"));
  EXPECT_TRUE(p->MaySpan("team-b", "gpu-x-3"));
  EXPECT_FALSE(p->MaySpan("team-b", "gpu-x-4"));
  EXPECT_FALSE(p->MaySpan("team-b", "gpu-a-01"));
  // A line naming no node, and a tenant without a line (no '*'): one node.
  EXPECT_FALSE(p->MaySpan("team-c", "gpu-a-01"));
  EXPECT_FALSE(p->MaySpan("team-d", "gpu-a-01"));
  EXPECT_TRUE(p->MayMeet("team-d", "gpu-a-01", "gpu-a-01"));
  EXPECT_FALSE(p->MayMeet("team-d", "gpu-a-01", "gpu-a-02"));
  // The main socket's groups (tenant "").
  EXPECT_TRUE(p->MaySpan("", "anything"));
  // Both ends must be allowed.
  EXPECT_TRUE(p->MayMeet("team-a", "gpu-a-01", "gpu-a-02"));
  EXPECT_FALSE(p->MayMeet("team-a", "gpu-a-01", "gpu-b-01"));
  EXPECT_FALSE(p->MayMeet("team-a", "gpu-b-01", "gpu-a-01"));
}

TEST(TenantSpanPolicyTest, TheStarLineCoversEveryTenantWithoutOne) {
  auto p = MustParse("* shared-*\nteam-a a-1 a-2\n");
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->MaySpan("team-z", "shared-3"));
  EXPECT_FALSE(p->MaySpan("team-z", "a-1"));
  EXPECT_TRUE(p->MaySpan("team-a", "a-1"));
  EXPECT_FALSE(p->MaySpan("team-a", "shared-3"));  // its own line, not '*'
  // The main socket's groups fall under '*' too when '@main' has no line.
  EXPECT_TRUE(p->MaySpan("", "shared-1"));
  // An empty policy: every group stays on its node.
  auto none = MustParse("# nobody spans\n");
  ASSERT_NE(none, nullptr);
  EXPECT_FALSE(none->MaySpan("", "n"));
}

TEST(TenantSpanPolicyTest, AMalformedLineIsNamedWithItsNumber) {
  struct Case {
    std::string text;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {"team-a a\n-bad b\n", "policy:2: '-bad' is not a tenant name"},
           {"team-a a\nteam-a b\n", "policy:2: tenant 'team-a' has a line already"},
           {"team-a node/1\n", "policy:1: 'node/1' is neither a node id nor a pattern"},
           {"team-a " + std::string(200, 'n') + "\n", "is neither a node id"},
           {"@other x\n", "'@other' is not a tenant name"},
           {"t\x1b[31m x\n", "not a tenant name"},
       }) {
    auto p = TenantSpanPolicy::Parse(c.text, "policy");
    ASSERT_FALSE(p.ok()) << c.text;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(c.expected), std::string::npos) << p.status();
    EXPECT_EQ(p.status().message().find('\x1b'), std::string::npos) << "unescaped";
  }
  std::string many;
  for (size_t i = 0; i <= kMaxTenantPolicyLines; ++i) many += "t" + std::to_string(i) + " n\n";
  auto p = TenantSpanPolicy::Parse(many, "policy");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("more than 4096 tenant lines"), std::string::npos);
  std::string wide = "t";
  for (size_t i = 0; i <= kMaxNodePatternsPerTenant; ++i) wide += " n" + std::to_string(i);
  EXPECT_FALSE(TenantSpanPolicy::Parse(wide, "policy").ok());
  EXPECT_FALSE(TenantSpanPolicy::Parse(std::string(kMaxTenantPolicyBytes + 1, '#'), "p").ok());
}

class TempFile {
 public:
  TempFile() {
    char name[] = "/tmp/mc-policy-XXXXXX";
    const int fd = ::mkstemp(name);
    EXPECT_GE(fd, 0);
    ::close(fd);
    path_ = name;
  }
  ~TempFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(TenantSpanPolicyTest, AFileAnotherUserCouldWriteIsRefused) {
  TempFile f;
  std::ofstream(f.path()) << "team-a n1 n2\n";
  ASSERT_EQ(::chmod(f.path().c_str(), 0644), 0);
  auto ok = TenantSpanPolicy::Load(f.path(), ::geteuid());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE((*ok)->MaySpan("team-a", "n2"));
  EXPECT_EQ((*ok)->source(), f.path());

  for (mode_t mode : {0664, 0646}) {
    ASSERT_EQ(::chmod(f.path().c_str(), mode), 0);
    auto p = TenantSpanPolicy::Load(f.path(), ::geteuid());
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(p.status().message().find("chmod go-w"), std::string::npos) << p.status();
  }
  ASSERT_EQ(::chmod(f.path().c_str(), 0600), 0);
  // Owned by a uid that is neither root nor the daemon's: as root, hand the
  // file to nobody; otherwise, say the daemon runs as another uid.
  const uint32_t daemon_uid = ::geteuid() == 0 ? 0 : ::geteuid() + 1;
  if (::geteuid() == 0) ASSERT_EQ(::chown(f.path().c_str(), 65534, 65534), 0);
  auto foreign = TenantSpanPolicy::Load(f.path(), daemon_uid);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(foreign.status().message().find("must belong to root or to the daemon's uid"),
            std::string::npos)
      << foreign.status();
  if (::geteuid() == 0) ASSERT_EQ(::chown(f.path().c_str(), 0, 0), 0);
  // A symbolic link is followed (a ConfigMap's keys are links), and what
  // it leads to is checked; a folder, a missing file, a malformed one.
  const std::string link = f.path() + ".link";
  ASSERT_EQ(::symlink(f.path().c_str(), link.c_str()), 0);
  auto via_link = TenantSpanPolicy::Load(link, ::geteuid());
  EXPECT_TRUE(via_link.ok()) << via_link.status();
  ASSERT_EQ(::chmod(f.path().c_str(), 0666), 0);
  via_link = TenantSpanPolicy::Load(link, ::geteuid());
  EXPECT_EQ(via_link.status().code(), absl::StatusCode::kPermissionDenied);
  ASSERT_EQ(::chmod(f.path().c_str(), 0600), 0);
  ::unlink(link.c_str());
  EXPECT_FALSE(TenantSpanPolicy::Load("/tmp", ::geteuid()).ok());
  EXPECT_FALSE(TenantSpanPolicy::Load(f.path() + ".missing", ::geteuid()).ok());
  std::ofstream(f.path()) << "team-a ok\nteam-a again\n";
  auto bad = TenantSpanPolicy::Load(f.path(), ::geteuid());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(f.path() + ":2:"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace mooncake::daemon
