// Small shared utilities: errno mapping and status macros, socket path
// resolution, log levels, UniqueFd.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "mooncake/common/log.h"
#include "mooncake/common/paths.h"
#include "mooncake/common/status.h"
#include "mooncake/common/unique_fd.h"

namespace mooncake {
namespace {

struct ErrnoCase {
  int err;
  absl::StatusCode code;
};

TEST(ErrnoStatusTest, MapsErrnoToCanonicalCodes) {
  const ErrnoCase cases[] = {
      {ENOENT, absl::StatusCode::kNotFound},
      {ENODEV, absl::StatusCode::kNotFound},
      {ENXIO, absl::StatusCode::kNotFound},
      {EACCES, absl::StatusCode::kPermissionDenied},
      {EPERM, absl::StatusCode::kPermissionDenied},
      {EEXIST, absl::StatusCode::kAlreadyExists},
      {EADDRINUSE, absl::StatusCode::kAlreadyExists},
      {EINVAL, absl::StatusCode::kInvalidArgument},
      {EBADF, absl::StatusCode::kInvalidArgument},
      {ENOMEM, absl::StatusCode::kResourceExhausted},
      {EMFILE, absl::StatusCode::kResourceExhausted},
      {ENFILE, absl::StatusCode::kResourceExhausted},
      {ENOSPC, absl::StatusCode::kResourceExhausted},
      {ETIMEDOUT, absl::StatusCode::kDeadlineExceeded},
      {EAGAIN, absl::StatusCode::kDeadlineExceeded},
      {ECONNREFUSED, absl::StatusCode::kUnavailable},
      {ECONNRESET, absl::StatusCode::kUnavailable},
      {EPIPE, absl::StatusCode::kUnavailable},
      {ENOTCONN, absl::StatusCode::kUnavailable},
      {EIO, absl::StatusCode::kInternal},
      {ENOTSOCK, absl::StatusCode::kInternal},
  };
  for (const ErrnoCase& c : cases) {
    absl::Status s = ErrnoStatus(c.err, "open(/dev/thing)");
    EXPECT_EQ(s.code(), c.code) << "errno " << c.err << ": " << s;
    // The message names the call and the system's explanation.
    EXPECT_EQ(std::string(s.message()), std::string("open(/dev/thing): ") + std::strerror(c.err));
  }
}

absl::Status FailsWith(absl::StatusCode code) { return absl::Status(code, "inner failure"); }

absl::Status UsesReturnIfError(absl::StatusCode code, bool* reached_end) {
  *reached_end = false;
  MC_RETURN_IF_ERROR(FailsWith(code));
  *reached_end = true;
  return absl::OkStatus();
}

absl::StatusOr<int> MaybeInt(bool ok) {
  if (!ok) return absl::NotFoundError("no int");
  return 42;
}

absl::StatusOr<int> UsesAssignOrReturn(bool ok) {
  MC_ASSIGN_OR_RETURN(int v, MaybeInt(ok));
  MC_ASSIGN_OR_RETURN(int w, MaybeInt(true));  // two in one scope must not collide
  return v + w;
}

TEST(StatusMacrosTest, ReturnIfErrorPropagatesAndContinues) {
  bool reached = true;
  absl::Status s = UsesReturnIfError(absl::StatusCode::kAborted, &reached);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "inner failure");
  EXPECT_FALSE(reached);
  EXPECT_TRUE(UsesReturnIfError(absl::StatusCode::kOk, &reached).ok());
  EXPECT_TRUE(reached);
}

TEST(StatusMacrosTest, AssignOrReturn) {
  absl::StatusOr<int> good = UsesAssignOrReturn(true);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 84);
  absl::StatusOr<int> bad = UsesAssignOrReturn(false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
}

// Restores $MOONCAKE_SOCKET after each test so order does not matter.
class ResolveSocketPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv(kSocketEnvVar)) saved_ = v;
  }
  void TearDown() override {
    if (saved_) {
      ::setenv(kSocketEnvVar, saved_->c_str(), 1);
    } else {
      ::unsetenv(kSocketEnvVar);
    }
  }
  std::optional<std::string> saved_;
};

TEST_F(ResolveSocketPathTest, DefaultWhenNothingGiven) {
  ::unsetenv(kSocketEnvVar);
  EXPECT_EQ(ResolveSocketPath(""), "/run/mooncake/mooncaked.sock");
  EXPECT_EQ(ResolveSocketPath(""), kDefaultSocketPath);
}

TEST_F(ResolveSocketPathTest, EnvironmentBeatsDefault) {
  ::setenv(kSocketEnvVar, "/tmp/from-env.sock", 1);
  EXPECT_EQ(ResolveSocketPath(""), "/tmp/from-env.sock");
}

TEST_F(ResolveSocketPathTest, ExplicitArgumentBeatsEnvironment) {
  ::setenv(kSocketEnvVar, "/tmp/from-env.sock", 1);
  EXPECT_EQ(ResolveSocketPath("/tmp/explicit.sock"), "/tmp/explicit.sock");
  ::unsetenv(kSocketEnvVar);
  EXPECT_EQ(ResolveSocketPath("/tmp/explicit.sock"), "/tmp/explicit.sock");
}

TEST_F(ResolveSocketPathTest, EmptyEnvironmentFallsBackToDefault) {
  ::setenv(kSocketEnvVar, "", 1);
  EXPECT_EQ(ResolveSocketPath(""), kDefaultSocketPath);
}

TEST(PathsTest, FdSocketSitsNextToGrpcSocket) {
  EXPECT_EQ(FdSocketPath("/run/mooncake/mooncaked.sock"), "/run/mooncake/mooncaked.sock.fd");
}

TEST(LogLevelTest, ParsesEveryNameCaseInsensitively) {
  struct Case {
    const char* text;
    LogLevel level;
  };
  const Case cases[] = {
      {"debug", LogLevel::kDebug},  {"DEBUG", LogLevel::kDebug},     {"info", LogLevel::kInfo},
      {"Info", LogLevel::kInfo},    {"warning", LogLevel::kWarning}, {"warn", LogLevel::kWarning},
      {"WARN", LogLevel::kWarning}, {"error", LogLevel::kError},     {"Error", LogLevel::kError}};
  for (const Case& c : cases) {
    LogLevel out = c.level == LogLevel::kDebug ? LogLevel::kError : LogLevel::kDebug;
    EXPECT_TRUE(ParseLogLevel(c.text, &out)) << c.text;
    EXPECT_EQ(out, c.level) << c.text;
  }
}

TEST(LogLevelTest, RejectsUnknownNamesAndLeavesOutputAlone) {
  for (const char* bad : {"", "verbose", "trace", "infoo", " info", "3"}) {
    LogLevel out = LogLevel::kWarning;
    EXPECT_FALSE(ParseLogLevel(bad, &out)) << "'" << bad << "'";
    EXPECT_EQ(out, LogLevel::kWarning) << "'" << bad << "'";
  }
}

TEST(LogLevelTest, MessagesBelowTheLevelAreDropped) {
  LogLevel saved = GetLogLevel();
  SetLogLevel(LogLevel::kWarning);
  EXPECT_EQ(GetLogLevel(), LogLevel::kWarning);
  ::testing::internal::CaptureStderr();
  MC_LOG(kInfo, "hidden-", 1);
  MC_LOG(kError, "shown-", 2);
  std::string err = ::testing::internal::GetCapturedStderr();
  SetLogLevel(saved);
  EXPECT_EQ(err.find("hidden-1"), std::string::npos) << err;
  EXPECT_NE(err.find("shown-2"), std::string::npos) << err;
  EXPECT_NE(err.find("ERROR"), std::string::npos) << err;
  EXPECT_NE(err.find("mooncake[" + std::to_string(::getpid()) + "]"), std::string::npos) << err;
}

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(UniqueFdTest, ClosesOnDestructionAndReset) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  {
    UniqueFd r(p[0]);
    UniqueFd w(p[1]);
    EXPECT_TRUE(r.valid());
    w.reset();
    EXPECT_FALSE(w.valid());
    EXPECT_FALSE(IsOpen(p[1]));
    EXPECT_TRUE(IsOpen(p[0]));
  }
  EXPECT_FALSE(IsOpen(p[0]));
}

TEST(UniqueFdTest, MoveTransfersOwnershipAndReleaseGivesItUp) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  UniqueFd a(p[0]);
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(b.get(), p[0]);
  UniqueFd c(p[1]);
  c = std::move(b);  // closes p[1], takes p[0]
  EXPECT_FALSE(IsOpen(p[1]));
  EXPECT_EQ(c.get(), p[0]);
  int raw = c.release();
  EXPECT_FALSE(c.valid());
  EXPECT_TRUE(IsOpen(raw));
  ::close(raw);
}

}  // namespace
}  // namespace mooncake
