// Logging to stderr: the plain format, and the journal format (syslog
// priority prefix, no clock time) chosen when $JOURNAL_STREAM names stderr.
#include "mooncake/common/log.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mooncake {
namespace {

using ::testing::MatchesRegex;
using ::testing::StartsWith;

// A temporary file, open for writing, removed at the end.
class TempFile {
 public:
  TempFile() {
    char tmpl[] = "/tmp/mc-log-test-XXXXXX";
    fd_ = ::mkstemp(tmpl);
    path_ = tmpl;
  }
  ~TempFile() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  std::string JournalStreamValue() const {
    struct stat st {};
    ::fstat(fd_, &st);
    return absl::StrCat(static_cast<uint64_t>(st.st_dev), ":", static_cast<uint64_t>(st.st_ino));
  }
  std::string Contents() const {
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  int fd_ = -1;
  std::string path_;
};

// Sets $JOURNAL_STREAM for one test and restores the environment after.
class JournalStreamEnv {
 public:
  explicit JournalStreamEnv(const std::string& value) {
    if (const char* old = std::getenv("JOURNAL_STREAM")) old_ = old, had_ = true;
    ::setenv("JOURNAL_STREAM", value.c_str(), 1);
  }
  ~JournalStreamEnv() {
    if (had_) {
      ::setenv("JOURNAL_STREAM", old_.c_str(), 1);
    } else {
      ::unsetenv("JOURNAL_STREAM");
    }
  }

 private:
  bool had_ = false;
  std::string old_;
};

// Points stderr at `fd` for the lifetime of the object.
class StderrTo {
 public:
  explicit StderrTo(int fd) : saved_(::dup(STDERR_FILENO)) {
    std::fflush(stderr);
    ::dup2(fd, STDERR_FILENO);
  }
  ~StderrTo() {
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
  }

 private:
  int saved_;
};

TEST(LogTest, SyslogPrioritiesFollowTheLevels) {
  EXPECT_EQ(SyslogPriority(LogLevel::kDebug), 7);
  EXPECT_EQ(SyslogPriority(LogLevel::kInfo), 6);
  EXPECT_EQ(SyslogPriority(LogLevel::kWarning), 4);
  EXPECT_EQ(SyslogPriority(LogLevel::kError), 3);
}

TEST(LogTest, JournalStreamMatchesOnlyTheFileItNames) {
  TempFile journal, other;
  JournalStreamEnv env(journal.JournalStreamValue());
  EXPECT_TRUE(IsJournalStream(journal.fd()));
  EXPECT_FALSE(IsJournalStream(other.fd()));
  EXPECT_FALSE(IsJournalStream(-1));
}

TEST(LogTest, JournalStreamUnsetOrMalformedIsNotTheJournal) {
  TempFile f;
  {
    JournalStreamEnv env("garbage");
    EXPECT_FALSE(IsJournalStream(f.fd()));
  }
  {
    JournalStreamEnv env("12:");
    EXPECT_FALSE(IsJournalStream(f.fd()));
  }
  {
    JournalStreamEnv env("x");
    ::unsetenv("JOURNAL_STREAM");
    EXPECT_FALSE(IsJournalStream(f.fd()));
  }
}

TEST(LogTest, FormatsForTheJournalWithPriorityAndWithoutTime) {
  const std::string pid = std::to_string(::getpid());
  const absl::Time t = absl::FromUnixSeconds(1700000000);
  EXPECT_EQ(FormatLogLine(LogLevel::kDebug, "d", true, t), "<7>DEBUG mooncake[" + pid + "] d\n");
  EXPECT_EQ(FormatLogLine(LogLevel::kInfo, "i", true, t), "<6>INFO mooncake[" + pid + "] i\n");
  EXPECT_EQ(FormatLogLine(LogLevel::kWarning, "w", true, t), "<4>WARN mooncake[" + pid + "] w\n");
  EXPECT_EQ(FormatLogLine(LogLevel::kError, "e", true, t), "<3>ERROR mooncake[" + pid + "] e\n");
  EXPECT_THAT(
      FormatLogLine(LogLevel::kWarning, "w", false, t),
      MatchesRegex("[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3} WARN mooncake\\[" + pid + "\\] w\n"));
}

TEST(LogTest, LogLineToTheJournalStartsWithThePriority) {
  const LogLevel saved = GetLogLevel();
  SetLogLevel(LogLevel::kDebug);
  TempFile journal;
  {
    JournalStreamEnv env(journal.JournalStreamValue());
    StderrTo redirect(journal.fd());
    MC_LOG(kWarning, "disk ", 3, " is slow");
    MC_LOG(kError, "gone");
    MC_LOG(kDebug, "detail");
  }
  SetLogLevel(saved);
  const std::string pid = std::to_string(::getpid());
  EXPECT_EQ(journal.Contents(), "<4>WARN mooncake[" + pid + "] disk 3 is slow\n<3>ERROR mooncake[" +
                                    pid + "] gone\n<7>DEBUG mooncake[" + pid + "] detail\n");
}

TEST(LogTest, LogLineElsewhereKeepsThePlainFormat) {
  TempFile out, journal;
  {
    // Inherited from a parent whose stderr was the journal: ours is not.
    JournalStreamEnv env(journal.JournalStreamValue());
    StderrTo redirect(out.fd());
    MC_LOG(kWarning, "plain");
  }
  EXPECT_THAT(out.Contents(), MatchesRegex("[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3} WARN "
                                           "mooncake\\[[0-9]+\\] plain\n"));
  EXPECT_THAT(out.Contents(), ::testing::Not(StartsWith("<")));
}

}  // namespace
}  // namespace mooncake
