#include "admission/rate_limited_log.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace mooncake::daemon {

bool RateLimitedLog::Log(LogLevel level, absl::string_view message) {
  uint64_t suppressed = 0;
  {
    absl::MutexLock lock(&mu_);
    absl::Time now = absl::Now();
    if (now - last_ < period_) {
      ++suppressed_;
      return false;
    }
    last_ = now;
    suppressed = suppressed_;
    suppressed_ = 0;
  }
  if (level < GetLogLevel()) return false;
  if (suppressed == 0) {
    LogLine(level, message);
  } else {
    LogLine(level, absl::StrCat(message, " (", suppressed, " similar lines suppressed)"));
  }
  return true;
}

}  // namespace mooncake::daemon
