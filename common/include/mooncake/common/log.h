// Minimal leveled logging to stderr. Never log handle bytes, tokens or
// secrets.
//
// A line reads "12:34:56.789 WARN mooncake[4242] message". When stderr is
// the journal (systemd started the process with StandardError=journal, the
// default for services), each line instead starts with its syslog priority
// and leaves the time to journald: "<4>WARN mooncake[4242] message", so
// `journalctl -p warning` and the journal's colours see real priorities
// rather than everything at info.
#pragma once

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace mooncake {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "info", "warning"/"warn", "error".
bool ParseLogLevel(absl::string_view text, LogLevel* out);
void LogLine(LogLevel level, absl::string_view message);

// The syslog priority of `level`: debug 7, info 6, warning 4, error 3.
int SyslogPriority(LogLevel level);
// Whether `fd` is the stream systemd connected to the journal: $JOURNAL_STREAM
// ("<device>:<inode>", systemd.exec(5)) names the fd's st_dev and st_ino.
// False when the variable is unset or malformed, or names another file (the
// process redirected its stderr, or inherited the variable from a parent).
bool IsJournalStream(int fd);
// One line as LogLine writes it, newline included: with the "<N>" priority
// prefix and without the time when `journal`, else "HH:MM:SS.mmm" first.
std::string FormatLogLine(LogLevel level, absl::string_view message, bool journal, absl::Time now);

}  // namespace mooncake

#define MC_LOG(level, ...)                                                           \
  do {                                                                               \
    if (::mooncake::LogLevel::level >= ::mooncake::GetLogLevel())                    \
      ::mooncake::LogLine(::mooncake::LogLevel::level, ::absl::StrCat(__VA_ARGS__)); \
  } while (0)
