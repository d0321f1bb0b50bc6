#include "mooncake/common/log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
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

int SyslogPriority(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return 7;    // LOG_DEBUG
    case LogLevel::kInfo: return 6;     // LOG_INFO
    case LogLevel::kWarning: return 4;  // LOG_WARNING
    case LogLevel::kError: return 3;    // LOG_ERR
  }
  return 6;
}

bool IsJournalStream(int fd) {
  // sd_journal_stream_fd(3) / systemd.exec(5): systemd sets JOURNAL_STREAM
  // when it connects stdout or stderr to the journal; a child that inherits
  // the variable but writes elsewhere must not match, hence the comparison.
  const char* value = std::getenv("JOURNAL_STREAM");
  if (value == nullptr) return false;
  std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(value, ':');
  uint64_t dev = 0, ino = 0;
  if (!absl::SimpleAtoi(parts.first, &dev) || !absl::SimpleAtoi(parts.second, &ino)) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  return static_cast<uint64_t>(st.st_dev) == dev && static_cast<uint64_t>(st.st_ino) == ino;
}

std::string FormatLogLine(LogLevel level, absl::string_view message, bool journal, absl::Time now) {
  const char* name = kNames[static_cast<int>(level)];
  const int pid = static_cast<int>(::getpid());
  if (journal) {
    // journald reads "<N>" as the line's priority and stamps the time.
    return absl::StrCat("<", SyslogPriority(level), ">", name, " mooncake[", pid, "] ", message,
                        "\n");
  }
  return absl::StrCat(absl::FormatTime("%H:%M:%E3S", now, absl::LocalTimeZone()), " ", name,
                      " mooncake[", pid, "] ", message, "\n");
}

void LogLine(LogLevel level, absl::string_view message) {
  // Checked on every line (one fstat): stderr may be redirected at any time.
  std::string line = FormatLogLine(level, message, IsJournalStream(STDERR_FILENO), absl::Now());
  // One write per line so concurrent threads do not interleave mid-line.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace mooncake
