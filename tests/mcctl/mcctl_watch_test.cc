// mcctl watch against a real mooncaked: `mcctl watch --json` runs as a
// subprocess and must print, as JSON lines, what happens to a group whose
// members are real sessions (raw Local stubs on connections of their own,
// as tests/integration/raw_session.h opens them): both joins, the
// formation, one member leaving, the other's session dropped (lost), and
// the group released; a join that times out (withdrew). Also: -j and
// --count, and the exit status when the daemon stops under a watch.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "daemon_process.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "raw_session.h"

namespace mooncake::testing {
namespace {

using google::protobuf::Struct;

constexpr int kWaitMs = 15000;

// The JSON objects printed so far, one per line; fails the test on a line
// that is not a JSON object.
std::vector<Struct> JsonLines(const std::string& output) {
  std::vector<Struct> out;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    Struct s;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(std::string(line), &s).ok()) << line;
    out.push_back(s);
  }
  return out;
}

std::string Kind(const Struct& s) { return s.fields().at("kind").string_value(); }
int Rank(const Struct& s) { return static_cast<int>(s.fields().at("rank").number_value()); }

// JoinGroup on the session's own connection (the daemon finds the session
// by the connection); blocks until the group forms or the join times out.
grpc::Status Join(abuse::RawSession& s, const std::string& group, uint32_t rank, uint32_t world,
                  uint32_t timeout_ms) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::JoinGroupRequest req;
  req.set_group(group);
  req.set_rank(rank);
  req.set_world_size(world);
  req.set_timeout_ms(timeout_ms);
  v1::JoinGroupResponse resp;
  return s.stub->JoinGroup(&ctx, req, &resp);
}

TEST(McctlWatchTest, StreamsJoinFormLeaveLostAndRelease) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  ASSERT_TRUE(daemon.running());

  Child watch = Child::Spawn({BinDir() + "/mcctl", "--socket", daemon.socket(), "watch", "--json"});
  ASSERT_NE(watch.WaitForLine("\"kind\":\"watching\"", kWaitMs), "") << watch.output();

  std::unique_ptr<abuse::RawSession> s0 = abuse::OpenRawSession(daemon.socket());
  std::unique_ptr<abuse::RawSession> s1 = abuse::OpenRawSession(daemon.socket());
  ASSERT_TRUE(s0 && s1);
  grpc::Status j0, j1;
  std::thread t0([&] { j0 = Join(*s0, "wg", 0, 2, 20000); });
  ASSERT_NE(watch.WaitForLine("\"member_joined\"", kWaitMs), "") << watch.output();
  std::thread t1([&] { j1 = Join(*s1, "wg", 1, 2, 20000); });
  t0.join();
  t1.join();
  ASSERT_TRUE(j0.ok() && j1.ok()) << j0.error_message() << " / " << j1.error_message();
  ASSERT_NE(watch.WaitForLine("\"group_formed\"", kWaitMs), "") << watch.output();

  {  // rank 1 leaves
    grpc::ClientContext ctx;
    v1::LeaveGroupRequest req;
    req.set_group("wg");
    req.set_rank(1);
    v1::LeaveGroupResponse resp;
    ASSERT_TRUE(s1->stub->LeaveGroup(&ctx, req, &resp).ok());
  }
  ASSERT_NE(watch.WaitForLine("\"member_left\"", kWaitMs), "") << watch.output();
  s0->ctx.TryCancel();  // rank 0's session ends without leaving: lost
  ASSERT_NE(watch.WaitForLine("\"member_lost\"", kWaitMs), "") << watch.output();
  ASSERT_NE(watch.WaitForLine("\"group_released\"", kWaitMs), "") << watch.output();

  std::vector<Struct> events = JsonLines(watch.output());
  std::vector<std::string> kinds;
  for (const Struct& e : events) kinds.push_back(Kind(e));
  const std::vector<std::string> want = {"watching",      "member_joined", "member_joined",
                                         "group_formed",  "member_left",   "member_lost",
                                         "group_released"};
  ASSERT_EQ(kinds, want) << watch.output();
  EXPECT_EQ(Rank(events[1]), 0);
  EXPECT_EQ(Rank(events[2]), 1);
  EXPECT_EQ(Rank(events[4]), 1);
  EXPECT_EQ(Rank(events[5]), 0);
  for (size_t i = 1; i < events.size(); ++i) {
    const auto& f = events[i].fields();
    EXPECT_EQ(f.at("group").string_value(), "wg");
    EXPECT_EQ(f.at("world_size").number_value(), 2);
    EXPECT_GT(f.at("seq").number_value(), events[i - 1].fields().at("seq").number_value());
    EXPECT_FALSE(f.at("time").string_value().empty());
  }
  EXPECT_EQ(events[5].fields().at("pid").number_value(), ::getpid());
  EXPECT_TRUE(daemon.running());
  watch.Kill(SIGTERM);
  EXPECT_EQ(watch.Wait(kWaitMs), 128 + SIGTERM);
}

TEST(McctlWatchTest, ShortJsonFlagCountAndTextForm) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  Child once = Child::Spawn(
      {BinDir() + "/mcctl", "-j", "--socket", daemon.socket(), "watch", "--count", "1"});
  EXPECT_EQ(once.Wait(kWaitMs), 0) << once.output();
  std::vector<Struct> lines = JsonLines(once.output());
  ASSERT_EQ(lines.size(), 1u) << once.output();
  EXPECT_EQ(Kind(lines[0]), "watching");

  Child text = Child::Spawn({BinDir() + "/mcctl", "--socket", daemon.socket(), "watch"});
  ASSERT_NE(text.WaitForLine("watching", kWaitMs), "") << text.output();
  std::unique_ptr<abuse::RawSession> s = abuse::OpenRawSession(daemon.socket());
  ASSERT_TRUE(s);
  // Rank 0 of 3 alone: joins, then its join times out and it withdraws.
  grpc::Status joined = Join(*s, "tg", 0, 3, 300);
  EXPECT_EQ(joined.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << joined.error_message();
  std::string line = text.WaitForLine("member_joined", kWaitMs);
  EXPECT_NE(line.find("group 'tg' rank 0/3"), std::string::npos) << line;
  EXPECT_NE(line.find(absl::StrCat(" pid ", ::getpid())), std::string::npos) << line;
  EXPECT_NE(text.WaitForLine("member_withdrew", kWaitMs), "") << text.output();
  EXPECT_NE(text.WaitForLine("group_released", kWaitMs), "") << text.output();
  text.Kill(SIGTERM);
  text.Wait(kWaitMs);
}

TEST(McctlWatchTest, DaemonStoppingEndsTheWatchWithExitTwo) {
  TempDir dir;
  DaemonProcess daemon(dir.path());
  Child watch = Child::Spawn({BinDir() + "/mcctl", "--socket", daemon.socket(), "watch", "-j"});
  ASSERT_NE(watch.WaitForLine("watching", kWaitMs), "") << watch.output();
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
  EXPECT_EQ(watch.Wait(kWaitMs), 2) << watch.output();
}

TEST(McctlWatchTest, NoDaemonIsExitTwo) {
  TempDir dir;
  Child watch = Child::Spawn({BinDir() + "/mcctl", "--socket", dir.path() + "/none.sock", "watch"});
  EXPECT_EQ(watch.Wait(kWaitMs), 2);
}

}  // namespace
}  // namespace mooncake::testing
