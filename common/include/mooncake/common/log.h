// Minimal leveled logging to stderr (journald picks it up under systemd).
// Never log handle bytes, tokens or secrets.
#pragma once

#include <string_view>

#include "absl/strings/str_cat.h"

namespace mooncake {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "info", "warning"/"warn", "error".
bool ParseLogLevel(absl::string_view text, LogLevel* out);
void LogLine(LogLevel level, absl::string_view message);

}  // namespace mooncake

#define MC_LOG(level, ...)                                                           \
  do {                                                                               \
    if (::mooncake::LogLevel::level >= ::mooncake::GetLogLevel())                    \
      ::mooncake::LogLine(::mooncake::LogLevel::level, ::absl::StrCat(__VA_ARGS__)); \
  } while (0)
