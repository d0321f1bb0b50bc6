// TicketStore: fds in transit are bound to one session and uid, used once,
// and expire.
#include "fdchannel/ticket_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

std::vector<UniqueFd> Memfds(size_t n) {
  std::vector<UniqueFd> out;
  for (size_t i = 0; i < n; ++i) {
    out.emplace_back(::memfd_create("ticket_store_test", MFD_CLOEXEC));
    EXPECT_TRUE(out.back().valid());
  }
  return out;
}

ino_t InodeOf(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

FdBundlePtr MakeBundle(size_t n) {
  auto b = std::make_shared<FdBundle>();
  b->fds = Memfds(n);
  return b;
}

constexpr uint64_t kAlice = 1, kBob = 2, kCarol = 3;
constexpr uint32_t kUidA = 1000, kUidB = 2000;

TEST(TicketStoreTest, IncomingRoundTripKeepsTheFds) {
  TicketStore store(absl::Seconds(30));
  std::vector<UniqueFd> fds = Memfds(2);
  ino_t i0 = InodeOf(fds[0].get()), i1 = InodeOf(fds[1].get());
  std::string t = store.AddIncoming(kAlice, kUidA, std::move(fds));
  EXPECT_EQ(t.size(), 32u) << "16 random bytes, hex";
  EXPECT_EQ(store.size(), 1u);
  absl::StatusOr<FdBundlePtr> b = store.TakeIncoming(t, kAlice);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ((*b)->fds.size(), 2u);
  EXPECT_EQ(InodeOf((*b)->fds[0].get()), i0);
  EXPECT_EQ(InodeOf((*b)->fds[1].get()), i1);
  EXPECT_EQ(store.size(), 0u);
}

TEST(TicketStoreTest, IncomingIsSingleUse) {
  TicketStore store(absl::Seconds(30));
  std::string t = store.AddIncoming(kAlice, kUidA, Memfds(1));
  ASSERT_TRUE(store.TakeIncoming(t, kAlice).ok());
  absl::StatusOr<FdBundlePtr> again = store.TakeIncoming(t, kAlice);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();
}

TEST(TicketStoreTest, IncomingOfAnotherSessionIsDeniedAndNotConsumed) {
  TicketStore store(absl::Seconds(30));
  std::string t = store.AddIncoming(kAlice, kUidA, Memfds(1));
  absl::StatusOr<FdBundlePtr> stolen = store.TakeIncoming(t, kBob);
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kPermissionDenied) << stolen.status();
  // The owner can still use it: a denied attempt must not burn the ticket.
  EXPECT_TRUE(store.TakeIncoming(t, kAlice).ok());
}

TEST(TicketStoreTest, UnknownTicket) {
  TicketStore store(absl::Seconds(30));
  EXPECT_EQ(store.TakeIncoming("deadbeef", kAlice).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Redeem("deadbeef", kAlice, kUidA).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.TakeIncoming("", kAlice).status().code(), absl::StatusCode::kNotFound);
}

TEST(TicketStoreTest, DirectionsDoNotMix) {
  TicketStore store(absl::Seconds(30));
  std::string in = store.AddIncoming(kAlice, kUidA, Memfds(1));
  std::string out = store.IssueOutgoing(kBob, kAlice, kUidA, MakeBundle(1));
  // An incoming ticket cannot be GET back, an outgoing one is not an upload.
  EXPECT_EQ(store.Redeem(in, kAlice, kUidA).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.TakeIncoming(out, kAlice).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store.TakeIncoming(in, kAlice).ok());
  EXPECT_TRUE(store.Redeem(out, kAlice, kUidA).ok());
}

TEST(TicketStoreTest, OutgoingRedeemedOnceByTheRecipientOnly) {
  TicketStore store(absl::Seconds(30));
  FdBundlePtr bundle = MakeBundle(3);
  std::string t = store.IssueOutgoing(kAlice, kBob, kUidB, bundle);
  // Wrong session, right uid.
  EXPECT_EQ(store.Redeem(t, kCarol, kUidB).status().code(), absl::StatusCode::kPermissionDenied);
  // Right session, wrong uid.
  EXPECT_EQ(store.Redeem(t, kBob, kUidA).status().code(), absl::StatusCode::kPermissionDenied);
  // The owner is not the recipient either.
  EXPECT_EQ(store.Redeem(t, kAlice, kUidB).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store.size(), 1u) << "denied attempts must not consume the ticket";
  absl::StatusOr<FdBundlePtr> got = store.Redeem(t, kBob, kUidB);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->get(), bundle.get()) << "the bundle is shared, not copied";
  EXPECT_EQ(store.Redeem(t, kBob, kUidB).status().code(), absl::StatusCode::kNotFound);
}

TEST(TicketStoreTest, OneBundleManyRecipients) {
  TicketStore store(absl::Seconds(30));
  FdBundlePtr bundle = MakeBundle(1);
  std::string tb = store.IssueOutgoing(kAlice, kBob, kUidA, bundle);
  std::string tc = store.IssueOutgoing(kAlice, kCarol, kUidA, bundle);
  EXPECT_NE(tb, tc);
  EXPECT_TRUE(store.Redeem(tb, kBob, kUidA).ok());
  EXPECT_TRUE(store.Redeem(tc, kCarol, kUidA).ok());
}

TEST(TicketStoreTest, TicketsAreUnique) {
  TicketStore store(absl::Seconds(30));
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    EXPECT_TRUE(seen.insert(store.AddIncoming(kAlice, kUidA, {})).second);
  }
  EXPECT_EQ(store.size(), 200u);
}

TEST(TicketStoreTest, TicketsExpire) {
  TicketStore store(absl::Milliseconds(100));
  std::string in = store.AddIncoming(kAlice, kUidA, Memfds(1));
  std::string out = store.IssueOutgoing(kAlice, kBob, kUidA, MakeBundle(1));
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(store.TakeIncoming(in, kAlice).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Redeem(out, kBob, kUidA).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.size(), 0u);
}

TEST(TicketStoreTest, UnexpiredTicketsSurviveOthersExpiring) {
  TicketStore store(absl::Milliseconds(300));
  std::string old_ticket = store.AddIncoming(kAlice, kUidA, Memfds(1));
  absl::SleepFor(absl::Milliseconds(200));
  std::string fresh = store.AddIncoming(kAlice, kUidA, Memfds(1));
  absl::SleepFor(absl::Milliseconds(150));
  EXPECT_EQ(store.TakeIncoming(old_ticket, kAlice).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store.TakeIncoming(fresh, kAlice).ok());
}

TEST(TicketStoreTest, ExpiredFdsAreClosed) {
  TicketStore store(absl::Milliseconds(50));
  std::vector<UniqueFd> fds = Memfds(1);
  int raw = fds[0].get();
  store.AddIncoming(kAlice, kUidA, std::move(fds));
  absl::SleepFor(absl::Milliseconds(100));
  // Any later call sweeps expired tickets and their fds with them.
  (void)store.TakeIncoming("nothing", kAlice);
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1) << "the expired ticket's fd is still open";
}

TEST(TicketStoreTest, DropSessionRemovesOwnedAndIssuedTickets) {
  TicketStore store(absl::Seconds(30));
  std::string a_in = store.AddIncoming(kAlice, kUidA, Memfds(1));
  std::string a_to_b = store.IssueOutgoing(kAlice, kBob, kUidA, MakeBundle(1));
  std::string c_to_a = store.IssueOutgoing(kCarol, kAlice, kUidA, MakeBundle(1));
  std::string c_to_b = store.IssueOutgoing(kCarol, kBob, kUidA, MakeBundle(1));
  std::string b_in = store.AddIncoming(kBob, kUidA, Memfds(1));
  EXPECT_EQ(store.PendingFor(kAlice), 2u);  // its upload and the one issued to it
  EXPECT_EQ(store.PendingFor(kBob), 3u);
  store.DropSession(kAlice);
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.PendingFor(kAlice), 0u);
  EXPECT_EQ(store.PendingFor(kBob), 2u);
  EXPECT_EQ(store.TakeIncoming(a_in, kAlice).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Redeem(a_to_b, kBob, kUidA).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Redeem(c_to_a, kAlice, kUidA).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store.Redeem(c_to_b, kBob, kUidA).ok());
  EXPECT_TRUE(store.TakeIncoming(b_in, kBob).ok());
}
}  // namespace
}  // namespace mooncake::daemon
