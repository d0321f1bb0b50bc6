// AdmissionCounter: per-uid and total caps, the privileged exemption, and
// charges that give back exactly what they took.
#include "admission/admission_counter.h"

#include <unistd.h>

#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

AdmissionLimits Limits() { return {"widgets", 3, "max_widgets_per_uid", 5, "max_widgets"}; }

TEST(AdmissionCounterTest, PerUidCapNamesItsKey) {
  AdmissionCounter c(Limits());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.TryTake(1000).ok());
  absl::Status s = c.TryTake(1000);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("uid 1000 holds 3 widgets"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("max_widgets_per_uid"), absl::string_view::npos) << s;
  c.Give(1000);
  EXPECT_TRUE(c.TryTake(1000).ok());
}

TEST(AdmissionCounterTest, TotalCapCoversAllUnprivilegedUids) {
  AdmissionCounter c(Limits());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.TryTake(1000).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(c.TryTake(2000).ok());
  absl::Status s = c.TryTake(3000);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("(max_widgets in"), absl::string_view::npos) << s;
  EXPECT_EQ(c.HeldBy(3000), 0u);
  EXPECT_EQ(c.HeldByUnprivileged(), 5u);
}

TEST(AdmissionCounterTest, RootIsCountedButNeverRefused) {
  AdmissionCounter c(Limits());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c.TryTake(1000 + i).ok());
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(c.TryTake(0).ok());
  EXPECT_EQ(c.HeldBy(0), 50u);
  EXPECT_EQ(c.HeldByUnprivileged(), 5u);
  EXPECT_TRUE(AdmissionCounter::Privileged(static_cast<uint32_t>(::geteuid())));
}

TEST(AdmissionCounterTest, ChargesGiveBackOnDestruction) {
  AdmissionCounter c(Limits());
  {
    absl::StatusOr<std::shared_ptr<AdmissionCounter::Charge>> a = c.TryCharge(1000, 2);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(c.HeldBy(1000), 2u);
    EXPECT_EQ(c.TryCharge(1000, 2).status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(c.HeldBy(1000), 2u) << "a refused charge takes nothing";
  }
  EXPECT_EQ(c.HeldBy(1000), 0u);
  EXPECT_EQ(c.HeldByUnprivileged(), 0u);
}

}  // namespace
}  // namespace mooncake::daemon
