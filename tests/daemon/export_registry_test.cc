// ExportRegistry: an export is importable with its (id, secret) by the
// exporter's uid until its session ends.
#include "fdchannel/export_registry.h"

#include <sys/mman.h>

#include <string>

#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

FdBundlePtr MakeBundle() {
  auto b = std::make_shared<FdBundle>();
  b->fds.emplace_back(::memfd_create("export_registry_test", MFD_CLOEXEC));
  return b;
}

TEST(ExportRegistryTest, AddThenLookup) {
  ExportRegistry reg;
  FdBundlePtr bundle = MakeBundle();
  ExportRecord r = reg.Add(/*session=*/7, /*uid=*/1000, /*pid=*/4242, "memfd", 4096, bundle);
  EXPECT_GT(r.id, 0u);
  EXPECT_EQ(r.secret.size(), 16u);
  absl::StatusOr<ExportRecord> got = reg.Lookup(r.id, r.secret, 1000);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->id, r.id);
  EXPECT_EQ(got->owner_session, 7u);
  EXPECT_EQ(got->pid, 4242);
  EXPECT_EQ(got->kind, "memfd");
  EXPECT_EQ(got->size, 4096u);
  EXPECT_EQ(got->bundle.get(), bundle.get());
  // Lookups do not consume: many processes may import one export.
  EXPECT_TRUE(reg.Lookup(r.id, r.secret, 1000).ok());
}

TEST(ExportRegistryTest, IdsAndSecretsDiffer) {
  ExportRegistry reg;
  ExportRecord a = reg.Add(1, 1000, 1, "memfd", 1, MakeBundle());
  ExportRecord b = reg.Add(1, 1000, 1, "memfd", 1, MakeBundle());
  EXPECT_NE(a.id, b.id);
  EXPECT_NE(a.secret, b.secret);
  // One export's secret does not open another.
  EXPECT_EQ(reg.Lookup(b.id, a.secret, 1000).status().code(), absl::StatusCode::kNotFound);
}

TEST(ExportRegistryTest, SecretMismatch) {
  ExportRegistry reg;
  ExportRecord r = reg.Add(1, 1000, 1, "memfd", 1, MakeBundle());
  std::string flipped = r.secret;
  flipped[15] = static_cast<char>(flipped[15] ^ 0x01);
  EXPECT_EQ(reg.Lookup(r.id, flipped, 1000).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.Lookup(r.id, "", 1000).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.Lookup(r.id, r.secret.substr(0, 8), 1000).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.Lookup(r.id, r.secret + "x", 1000).status().code(), absl::StatusCode::kNotFound);
}

TEST(ExportRegistryTest, WrongUidIsDeniedEvenWithTheSecret) {
  ExportRegistry reg;
  ExportRecord r = reg.Add(1, 1000, 1, "memfd", 1, MakeBundle());
  absl::StatusOr<ExportRecord> got = reg.Lookup(r.id, r.secret, 1001);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("uid"), absl::string_view::npos) << got.status();
}

// Probing ids must not tell a live export of another user from a missing
// one: same code, same text (the id aside).
TEST(ExportRegistryTest, AnotherUsersExportAndNoExportAnswerAlike) {
  ExportRegistry reg;
  ExportRecord r = reg.Add(1, 1000, 1, "memfd", 1, MakeBundle());
  absl::Status theirs = reg.Lookup(r.id, r.secret, 1001).status();
  absl::Status none = reg.Lookup(r.id + 1, r.secret, 1001).status();
  EXPECT_EQ(theirs.code(), none.code());
  std::string a(theirs.message()), b(none.message());
  a.replace(a.find(std::to_string(r.id)), std::to_string(r.id).size(), "N");
  b.replace(b.find(std::to_string(r.id + 1)), std::to_string(r.id + 1).size(), "N");
  EXPECT_EQ(a, b);
}

TEST(ExportRegistryTest, UnknownIdIsNotFound) {
  ExportRegistry reg;
  absl::StatusOr<ExportRecord> got = reg.Lookup(99, std::string(16, 'a'), 1000);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("99"), absl::string_view::npos) << got.status();
}

TEST(ExportRegistryTest, DropSessionAndCountFor) {
  ExportRegistry reg;
  ExportRecord a1 = reg.Add(1, 1000, 1, "memfd", 1, MakeBundle());
  ExportRecord a2 = reg.Add(1, 1000, 1, "memfd", 1, MakeBundle());
  ExportRecord b1 = reg.Add(2, 1000, 2, "memfd", 1, MakeBundle());
  EXPECT_EQ(reg.CountFor(1), 2u);
  EXPECT_EQ(reg.CountFor(2), 1u);
  EXPECT_EQ(reg.CountFor(3), 0u);
  reg.DropSession(1);
  EXPECT_EQ(reg.CountFor(1), 0u);
  EXPECT_EQ(reg.CountFor(2), 1u);
  EXPECT_EQ(reg.Lookup(a1.id, a1.secret, 1000).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.Lookup(a2.id, a2.secret, 1000).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(reg.Lookup(b1.id, b1.secret, 1000).ok());
  // Ids are never reused after a drop, so a stale handle cannot open a new export.
  ExportRecord n = reg.Add(1, 1000, 1, "memfd", 1, MakeBundle());
  EXPECT_GT(n.id, b1.id);
}

}  // namespace
}  // namespace mooncake::daemon
