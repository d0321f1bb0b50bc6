// AdmissionCounter: per-user (principal) and total caps, the privileged
// exemption (root on the main socket only), and charges that give back
// exactly what they took.
#include "admission/admission_counter.h"

#include <unistd.h>

#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

AdmissionLimits Limits() { return {"widgets", 3, "max_widgets_per_uid", 5, "max_widgets"}; }

TEST(AdmissionCounterTest, PerUidCapNamesItsKey) {
  AdmissionCounter c(Limits());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.TryTake(Principal{1000}).ok());
  absl::Status s = c.TryTake(Principal{1000});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("uid 1000 holds 3 widgets"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("max_widgets_per_uid"), absl::string_view::npos) << s;
  c.Give(Principal{1000});
  EXPECT_TRUE(c.TryTake(Principal{1000}).ok());
}

TEST(AdmissionCounterTest, TotalCapCoversAllUnprivilegedUids) {
  AdmissionCounter c(Limits());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.TryTake(Principal{1000}).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(c.TryTake(Principal{2000}).ok());
  absl::Status s = c.TryTake(Principal{3000});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("(max_widgets in"), absl::string_view::npos) << s;
  EXPECT_EQ(c.HeldBy(Principal{3000}), 0u);
  EXPECT_EQ(c.HeldByUnprivileged(), 5u);
}

TEST(AdmissionCounterTest, RootIsCountedButNeverRefused) {
  AdmissionCounter c(Limits());
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(c.TryTake(Principal{static_cast<uint32_t>(1000 + i)}).ok());
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(c.TryTake(Principal{0}).ok());
  EXPECT_EQ(c.HeldBy(Principal{0}), 50u);
  EXPECT_EQ(c.HeldByUnprivileged(), 5u);
  EXPECT_TRUE(AdmissionCounter::Privileged(Principal{static_cast<uint32_t>(::geteuid())}));
}

TEST(AdmissionCounterTest, EachTenantsUidIsItsOwnUserAndRootOnATenantSocketIsRefused) {
  // Issue 23 item 4: root in a tenant's container opened sessions without
  // bound. Only uid 0 on the main socket is exempt.
  AdmissionCounter c(Limits());
  const Principal root_a{0, "a"};
  const Principal root_b{0, "b"};
  EXPECT_FALSE(AdmissionCounter::Privileged(root_a));
  EXPECT_TRUE(AdmissionCounter::Privileged(Principal{0}));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.TryTake(root_a).ok());
  absl::Status s = c.TryTake(root_a);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("uid 0 of tenant 'a'"), absl::string_view::npos) << s;
  // Tenant b's root and the main socket's root are other users.
  EXPECT_TRUE(c.TryTake(root_b).ok());
  EXPECT_TRUE(c.TryTake(Principal{0}).ok());
  EXPECT_EQ(c.HeldBy(root_a), 3u);
  EXPECT_EQ(c.HeldBy(root_b), 1u);
  EXPECT_EQ(c.HeldByUnprivileged(), 4u) << "tenants' root counts toward the total";
  // The same uid on two tenants' sockets: two budgets.
  for (int i = 0; i < 3; ++i) c.Give(root_a);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.TryTake(Principal{1000, "a"}).ok());
  EXPECT_EQ(c.TryTake(Principal{1000, "a"}).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c.HeldBy(Principal{1000}), 0u);
}

TEST(AdmissionCounterTest, ChargesGiveBackOnDestruction) {
  AdmissionCounter c(Limits());
  {
    absl::StatusOr<std::shared_ptr<AdmissionCounter::Charge>> a = c.TryCharge(Principal{1000}, 2);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(c.HeldBy(Principal{1000}), 2u);
    EXPECT_EQ(c.TryCharge(Principal{1000}, 2).status().code(),
              absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(c.HeldBy(Principal{1000}), 2u) << "a refused charge takes nothing";
  }
  EXPECT_EQ(c.HeldBy(Principal{1000}), 0u);
  EXPECT_EQ(c.HeldByUnprivileged(), 0u);
}

}  // namespace
}  // namespace mooncake::daemon
