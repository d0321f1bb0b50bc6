// Small shared utilities: errno mapping and status macros, socket path
// resolution, log levels, UniqueFd, escaping untrusted text for display, and
// the advice for a socket this user may not open.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"
#include "mooncake/common/paths.h"
#include "mooncake/common/socket_access.h"
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

TEST(EscapeForDisplayTest, PrintableTextIsUntouched) {
  EXPECT_EQ(EscapeForDisplay("worker-0 (rank 3/8)", std::string::npos), "worker-0 (rank 3/8)");
  EXPECT_EQ(EscapeForDisplay("caf\xc3\xa9 \xe6\x97\xa5\xf0\x9f\x98\x80", std::string::npos),
            "caf\xc3\xa9 \xe6\x97\xa5\xf0\x9f\x98\x80");  // é, 日, 😀
  EXPECT_EQ(EscapeForDisplay("", 10), "");
}

// The forgeries from the review: a whole table row or log line after "\n",
// a colour change and a bell for root's terminal.
TEST(EscapeForDisplayTest, ControlsBecomeVisibleEscapes) {
  EXPECT_EQ(EscapeForDisplay("x\n12  0  0  1  root-job", std::string::npos),
            "x\\n12  0  0  1  root-job");
  EXPECT_EQ(EscapeForDisplay("\x1b[31mred\x07", std::string::npos), "\\x1b[31mred\\x07");
  EXPECT_EQ(EscapeForDisplay("a\rb\tc", std::string::npos), "a\\rb\\tc");
  EXPECT_EQ(EscapeForDisplay(absl::string_view("nul\0del\x7f", 8), std::string::npos),
            "nul\\x00del\\x7f");
  // A literal backslash is doubled, so "\\n" in a name never reads as a newline.
  EXPECT_EQ(EscapeForDisplay("a\\nb", std::string::npos), "a\\\\nb");
  // C1 controls (CSI U+009B), line separator, bidi override.
  EXPECT_EQ(EscapeForDisplay("\xc2\x9b[31m|\xe2\x80\xa8|\xe2\x80\xae", std::string::npos),
            "\\u009b[31m|\\u2028|\\u202e");
}

TEST(EscapeForDisplayTest, InvalidUtf8BytesAreEscapedOneByOne) {
  EXPECT_EQ(EscapeForDisplay("a\xff-z", std::string::npos), "a\\xff-z");
  EXPECT_EQ(EscapeForDisplay("\xc3", std::string::npos), "\\xc3");           // truncated sequence
  EXPECT_EQ(EscapeForDisplay("\xc0\xaf", std::string::npos), "\\xc0\\xaf");  // overlong '/'
  EXPECT_EQ(EscapeForDisplay("\xed\xa0\x80", std::string::npos),
            "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(EscapeForDisplay("\xf4\x90\x80\x80", std::string::npos),
            "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
}

TEST(EscapeForDisplayTest, LongTextIsCutAtABoundaryWithAnEllipsis) {
  EXPECT_EQ(EscapeForDisplay("abcdef", 6), "abcdef");
  EXPECT_EQ(EscapeForDisplay("abcdefg", 6), "abc...");
  // Never half an escape or half a character.
  EXPECT_EQ(EscapeForDisplay("ab\ncdefgh", 7), "ab\\n...");
  EXPECT_EQ(EscapeForDisplay("a\x1b[cdefgh", 7), "a...");
  EXPECT_EQ(EscapeForDisplay("a\xc3\xa9\xc3\xa9\xc3\xa9", 7), "a\xc3\xa9\xc3\xa9\xc3\xa9");
  EXPECT_EQ(EscapeForDisplay("a\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 7), "a\xc3\xa9...");
  EXPECT_EQ(EscapeForDisplay("abcdef", 0), "...");  // below the marker: the marker
  const std::string cut = EscapeForDisplay(std::string(5000, '\n'), 100);
  std::string want;
  for (int i = 0; i < 48; ++i) want += "\\n";
  EXPECT_EQ(cut, want + "...");  // 99 bytes: one more "\\n" would not fit
}

TEST(EscapeForJsonTest, QuotesAndEscapesControlsSoTheTextRoundTrips) {
  EXPECT_EQ(EscapeForJson("plain"), "\"plain\"");
  EXPECT_EQ(EscapeForJson("q\"b\\s/"), "\"q\\\"b\\\\s/\"");
  EXPECT_EQ(EscapeForJson("a\nb\tc\x1b[31m\x07\x7f"), "\"a\\nb\\tc\\u001b[31m\\u0007\\u007f\"");
  EXPECT_EQ(EscapeForJson("\xc2\x9b\xe2\x80\xa8\xc3\xa9"), "\"\\u009b\\u2028\xc3\xa9\"");
  EXPECT_EQ(EscapeForJson("bad\xff"), "\"bad\\ufffd\"");
}

SocketAccessFacts Facts(uint32_t mode, const std::string& group, uint32_t gid) {
  SocketAccessFacts f;
  f.blocked_path = "/run/mooncake/mooncaked.sock";
  f.stat_ok = true;
  f.mode = mode;
  f.owner = "root";
  f.group = group;
  f.gid = gid;
  f.uid = 1001;
  f.user = "alice";
  return f;
}

TEST(SocketAccessTest, NotInTheGroupSaysWhichGroupAndHowToJoin) {
  EXPECT_EQ(SocketAccessDeniedMessage("/run/mooncake/mooncaked.sock", Facts(0660, "mooncake", 990)),
            "permission denied on mooncaked's socket /run/mooncake/mooncaked.sock (mode 0660, "
            "owner root, group 'mooncake'): uid 1001 (alice) is not in group 'mooncake'; ask an "
            "administrator to add you to group 'mooncake' (usermod -aG mooncake $USER), then log "
            "in again");
}

TEST(SocketAccessTest, OtherCases) {
  const std::string sock = "/run/mooncake/mooncaked.sock";
  SocketAccessFacts f = Facts(0660, "mooncake", 990);
  f.in_group_after_login = true;
  EXPECT_NE(SocketAccessDeniedMessage(sock, f).find(
                "was added to group 'mooncake' after this login session started; log in "
                "again (or run 'newgrp mooncake')"),
            std::string::npos);
  // Never advise joining group root.
  const std::string root = SocketAccessDeniedMessage(sock, Facts(0660, "root", 0));
  EXPECT_EQ(root.find("usermod -aG root"), std::string::npos) << root;
  EXPECT_NE(root.find("set socket_group in /etc/mooncake/mooncaked.conf"), std::string::npos)
      << root;
  // Joining cannot help when the group may not write.
  const std::string owner_only = SocketAccessDeniedMessage(sock, Facts(0600, "mooncake", 990));
  EXPECT_NE(owner_only.find("(mode 0600, owner root, group 'mooncake'): group 'mooncake' has no "
                            "write permission"),
            std::string::npos)
      << owner_only;
  EXPECT_NE(owner_only.find("socket_mode = 0660"), std::string::npos) << owner_only;
  // A directory on the path that may not be searched.
  f = Facts(0750, "mooncake", 990);
  f.blocked_path = "/run/mooncake";
  f.blocked_is_directory = true;
  const std::string dir = SocketAccessDeniedMessage(sock, f);
  EXPECT_NE(dir.find("mooncaked.sock: directory /run/mooncake (mode 0750, owner root, group "
                     "'mooncake') may not be searched: uid 1001 (alice) is not in group "
                     "'mooncake'"),
            std::string::npos)
      << dir;
  // Nothing known beyond the refusal.
  SocketAccessFacts none;
  none.uid = 1001;
  EXPECT_EQ(SocketAccessDeniedMessage(sock, none),
            "permission denied on mooncaked's socket /run/mooncake/mooncaked.sock: ask an "
            "administrator to let uid 1001 in");
}

}  // namespace
}  // namespace mooncake
