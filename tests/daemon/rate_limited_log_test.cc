// RateLimitedLog: the first line at once, then one per period with the
// number suppressed.
#include "admission/rate_limited_log.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

TEST(RateLimitedLogTest, OneLinePerPeriod) {
  RateLimitedLog log(absl::Milliseconds(200));
  EXPECT_TRUE(log.Log(LogLevel::kWarning, "flood"));
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(log.Log(LogLevel::kWarning, "flood"));
  absl::SleepFor(absl::Milliseconds(250));
  testing::internal::CaptureStderr();
  EXPECT_TRUE(log.Log(LogLevel::kWarning, "flood"));
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("flood (1000 similar lines suppressed)"), std::string::npos) << out;
}

}  // namespace
}  // namespace mooncake::daemon
