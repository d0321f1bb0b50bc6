// RateLimitedLog: one log line per period for a condition that can repeat
// thousands of times a second (a refused connection, accept failing with
// EMFILE, a flood of unparsable requests). The first occurrence is logged
// at once; later ones within the period are counted, and the next line
// that is logged says how many were suppressed. Thread-safe.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon {

class RateLimitedLog {
 public:
  explicit RateLimitedLog(absl::Duration period = absl::Seconds(10)) : period_(period) {}

  // Returns true when the line was written.
  bool Log(LogLevel level, absl::string_view message);

 private:
  const absl::Duration period_;
  absl::Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mooncake::daemon
