// FdBroker: tickets and exports behind one owner. Every operation works on
// live sessions only, and nothing stored for a session survives its end,
// even when the end races the operation.
#include "fdchannel/fd_broker.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

std::vector<UniqueFd> Memfds(size_t n) {
  std::vector<UniqueFd> out;
  for (size_t i = 0; i < n; ++i) {
    out.emplace_back(::memfd_create("fd_broker_test", MFD_CLOEXEC));
    EXPECT_TRUE(out.back().valid());
  }
  return out;
}

ino_t InodeOf(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

class FdBrokerTest : public ::testing::Test {
 protected:
  SessionInfo Open(uint32_t uid = 1000) {
    int conn = next_conn_++;
    absl::StatusOr<SessionInfo> s = sessions_.Open(PeerCred{conn + 10000, uid, uid}, conn, "test");
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }
  // What SessionLifecycle::End does to these two owners, in its order.
  void End(const SessionInfo& s) {
    sessions_.Close(s.id);
    fds_.DropSession(s.id);
  }
  std::string Put(const SessionInfo& s, size_t n = 1) {
    absl::StatusOr<std::string> t = fds_.AddIncoming(s, Memfds(n));
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : "";
  }

  SessionRegistry sessions_{1000};
  FdBroker fds_{absl::Seconds(30), &sessions_};
  int next_conn_ = 100;
};

TEST_F(FdBrokerTest, ExportThenImportHandsTheSameFdsToTheImporter) {
  SessionInfo owner = Open(), importer = Open();
  std::vector<UniqueFd> fds = Memfds(1);
  const ino_t ino = InodeOf(fds[0].get());
  absl::StatusOr<std::string> t = fds_.AddIncoming(owner, std::move(fds));
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<ExportRecord> e = fds_.Export(owner, *t, "memfd", 4096);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->owner_session, owner.id);
  EXPECT_EQ(fds_.ExportsOf(owner.id), 1u);
  EXPECT_EQ(fds_.TakeIncoming(owner.id, *t).status().code(), absl::StatusCode::kNotFound)
      << "exporting consumed the incoming ticket";

  absl::StatusOr<FdBroker::Imported> im = fds_.Import(importer, e->id, e->secret);
  ASSERT_TRUE(im.ok()) << im.status();
  EXPECT_EQ(im->record.kind, "memfd");
  EXPECT_EQ(im->record.size, 4096u);
  EXPECT_EQ(fds_.PendingTicketsFor(importer.id), 1u);
  absl::StatusOr<FdBundlePtr> got = fds_.Redeem(im->ticket, importer.id, importer.cred.uid);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(InodeOf((*got)->fds[0].get()), ino);
  // Another uid cannot import it, even with the secret.
  SessionInfo stranger = Open(2000);
  EXPECT_EQ(fds_.Import(stranger, e->id, e->secret).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(FdBrokerTest, BadKindIsRejectedBeforeTheTicketIsConsumed) {
  SessionInfo s = Open();
  std::string t = Put(s);
  absl::StatusOr<ExportRecord> e = fds_.Export(s, t, std::string(65, 'k'), 1);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(fds_.Export(s, t, std::string(64, 'k'), 1).ok()) << "the ticket is still usable";
  EXPECT_EQ(fds_.Export(s, "no-such-ticket", "memfd", 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(FdBrokerTest, AnotherSessionsIncomingTicketIsDenied) {
  SessionInfo a = Open(), b = Open();
  std::string t = Put(a);
  EXPECT_EQ(fds_.Export(b, t, "memfd", 1).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(fds_.TakeIncoming(a.id, t).ok());
}

TEST_F(FdBrokerTest, UnusedIncomingTicketsAreCapped) {
  SessionInfo s = Open();
  for (size_t i = 0; i < FdBroker::kMaxIncomingPerSession; ++i) Put(s);
  absl::StatusOr<std::string> over = fds_.AddIncoming(s, Memfds(1));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(fds_.AddIncoming(Open(), Memfds(1)).ok()) << "the cap is per session";
}

TEST_F(FdBrokerTest, NothingIsStoredForAnEndedSession) {
  SessionInfo live = Open(), gone = Open();
  std::string t = Put(gone);
  absl::StatusOr<ExportRecord> e = fds_.Export(live, Put(live), "memfd", 1);
  ASSERT_TRUE(e.ok());
  End(gone);
  EXPECT_EQ(fds_.TicketCount(), 0u);
  EXPECT_EQ(fds_.AddIncoming(gone, Memfds(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fds_.Export(gone, t, "memfd", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fds_.Import(gone, e->id, e->secret).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto bundle = std::make_shared<FdBundle>();
  EXPECT_EQ(fds_.IssueOutgoing(live.id, gone, bundle).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fds_.IssueOutgoing(gone.id, live, bundle).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fds_.TicketCount(), 0u);
  EXPECT_EQ(fds_.ExportsOf(gone.id), 0u);
}

TEST_F(FdBrokerTest, DropSessionFreesItsTicketsAndExportsOnly) {
  SessionInfo a = Open(), b = Open();
  absl::StatusOr<ExportRecord> ea = fds_.Export(a, Put(a), "memfd", 1);
  absl::StatusOr<ExportRecord> eb = fds_.Export(b, Put(b), "memfd", 1);
  ASSERT_TRUE(ea.ok() && eb.ok());
  Put(a);
  ASSERT_TRUE(fds_.Import(b, ea->id, ea->secret).ok());  // a ticket owned by a, for b
  Put(b);
  End(a);
  EXPECT_EQ(fds_.ExportsOf(a.id), 0u);
  EXPECT_EQ(fds_.PendingTicketsFor(b.id), 1u) << "only b's own incoming ticket is left";
  EXPECT_EQ(fds_.Import(b, ea->id, ea->secret).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(fds_.Import(b, eb->id, eb->secret).ok());
}

// The race the old ExportFds patched after the fact: the session ends while
// its export is being added. Whoever wins, nothing outlives the session.
TEST_F(FdBrokerTest, ExportRacingSessionEndNeverLeaks) {
  int exported = 0, refused = 0;
  for (int i = 0; i < 300; ++i) {
    SessionInfo s = Open();
    std::string t = Put(s);
    std::atomic<bool> go{false};
    absl::StatusOr<ExportRecord> e = absl::UnknownError("not run");
    std::thread exporter([&] {
      while (!go.load()) {
      }
      e = fds_.Export(s, t, "memfd", 1);
    });
    std::thread ender([&] {
      while (!go.load()) {
      }
      End(s);
    });
    go = true;
    exporter.join();
    ender.join();
    if (e.ok()) {
      ++exported;
      EXPECT_EQ(fds_.Import(Open(), e->id, e->secret).status().code(), absl::StatusCode::kNotFound)
          << "an export that won the race was freed by the session end";
    } else {
      ++refused;
      EXPECT_TRUE(e.status().code() == absl::StatusCode::kFailedPrecondition ||
                  e.status().code() == absl::StatusCode::kNotFound)
          << e.status();
    }
    ASSERT_EQ(fds_.ExportsOf(s.id), 0u) << "iteration " << i;
    ASSERT_EQ(fds_.TicketCount(), 0u) << "iteration " << i;
  }
  EXPECT_EQ(exported + refused, 300);
}

// Same for an import whose importer goes away: no ticket is left for it.
TEST_F(FdBrokerTest, ImportRacingImporterEndNeverLeaks) {
  SessionInfo owner = Open();
  absl::StatusOr<ExportRecord> e = fds_.Export(owner, Put(owner), "memfd", 1);
  ASSERT_TRUE(e.ok()) << e.status();
  for (int i = 0; i < 300; ++i) {
    SessionInfo importer = Open();
    std::atomic<bool> go{false};
    std::thread a([&] {
      while (!go.load()) {
      }
      (void)fds_.Import(importer, e->id, e->secret);
    });
    std::thread b([&] {
      while (!go.load()) {
      }
      End(importer);
    });
    go = true;
    a.join();
    b.join();
    ASSERT_EQ(fds_.PendingTicketsFor(importer.id), 0u) << "iteration " << i;
    ASSERT_EQ(fds_.TicketCount(), 0u) << "iteration " << i;
  }
}

}  // namespace
}  // namespace mooncake::daemon
