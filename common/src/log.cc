#include "mooncake/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mooncake {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
constexpr const char* kNames[] = {"DEBUG", "INFO", "WARN", "ERROR"};
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

bool ParseLogLevel(absl::string_view text, LogLevel* out) {
  std::string t = absl::AsciiStrToLower(text);
  if (t == "debug")
    *out = LogLevel::kDebug;
  else if (t == "info")
    *out = LogLevel::kInfo;
  else if (t == "warning" || t == "warn")
    *out = LogLevel::kWarning;
  else if (t == "error")
    *out = LogLevel::kError;
  else
    return false;
  return true;
}

void LogLine(LogLevel level, absl::string_view message) {
  std::string ts = absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone());
  // One fprintf per line so concurrent threads do not interleave mid-line.
  std::fprintf(stderr, "%s %s mooncake[%d] %.*s\n", ts.c_str(), kNames[static_cast<int>(level)],
               static_cast<int>(::getpid()), static_cast<int>(message.size()), message.data());
}

}  // namespace mooncake
