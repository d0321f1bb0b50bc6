// Group secrets (daemon/broker/group_secret.h): the proof binds the claim's
// every field, verifies only under the same secret, and the secret's size
// is checked.
#include "broker/group_secret.h"

#include <string>

#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";

TEST(GroupSecretTest, TheProofBindsEveryFieldOfTheClaim) {
  const std::string p = GroupProof(kSecret, 1000, "", "g", 3, "node-b", 4);
  EXPECT_EQ(p.size(), 64u);  // hex SHA-256
  EXPECT_EQ(p, GroupProof(kSecret, 1000, "", "g", 3, "node-b", 4)) << "deterministic";
  EXPECT_TRUE(ProvesGroupSecret(kSecret, 1000, "", "g", 3, "node-b", 4, p));
  // Moved to another uid, tenant, group, rank, node or world size: no.
  EXPECT_FALSE(ProvesGroupSecret(kSecret, 1001, "", "g", 3, "node-b", 4, p));
  EXPECT_FALSE(ProvesGroupSecret(kSecret, 1000, "t", "g", 3, "node-b", 4, p));
  EXPECT_FALSE(ProvesGroupSecret(kSecret, 1000, "", "h", 3, "node-b", 4, p));
  EXPECT_FALSE(ProvesGroupSecret(kSecret, 1000, "", "g", 2, "node-b", 4, p));
  EXPECT_FALSE(ProvesGroupSecret(kSecret, 1000, "", "g", 3, "node-c", 4, p));
  EXPECT_FALSE(ProvesGroupSecret(kSecret, 1000, "", "g", 3, "node-b", 5, p));
  // Fields cannot slide into each other ("a" + "b:c" vs "a:b" + "c").
  EXPECT_NE(GroupProof(kSecret, 1, "a", "b:c", 0, "n", 1),
            GroupProof(kSecret, 1, "a:b", "c", 0, "n", 1));
  // Another secret, no proof, a truncated one: no.
  EXPECT_FALSE(
      ProvesGroupSecret("another secret of 32 bytes......", 1000, "", "g", 3, "node-b", 4, p));
  EXPECT_FALSE(ProvesGroupSecret(kSecret, 1000, "", "g", 3, "node-b", 4, ""));
  EXPECT_FALSE(ProvesGroupSecret(kSecret, 1000, "", "g", 3, "node-b", 4, p.substr(0, 32)));
}

TEST(GroupSecretTest, SizeIsNoneOr16To256Bytes) {
  EXPECT_TRUE(ValidateGroupSecret("").ok());
  EXPECT_TRUE(ValidateGroupSecret(std::string(16, 's')).ok());
  EXPECT_TRUE(ValidateGroupSecret(std::string(256, 's')).ok());
  const absl::Status short_one = ValidateGroupSecret("short");
  EXPECT_EQ(short_one.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_one.message().find("MC_GROUP_SECRET"), absl::string_view::npos) << short_one;
  EXPECT_EQ(ValidateGroupSecret(std::string(257, 's')).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mooncake::daemon
