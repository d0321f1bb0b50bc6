#include "broker/group_secret.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace mooncake::daemon {

absl::Status ValidateGroupSecret(const std::string& secret) {
  if (secret.empty() ||
      (secret.size() >= kMinGroupSecretBytes && secret.size() <= kMaxGroupSecretBytes)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the group secret has ", secret.size(), " bytes; it needs ",
                   kMinGroupSecretBytes, "..", kMaxGroupSecretBytes,
                   " (MC_GROUP_SECRET, e.g. 32 random bytes as hex: openssl rand -hex 32)"));
}

std::string GroupProof(const std::string& secret, uint32_t uid, const std::string& tenant,
                       const std::string& group, uint32_t rank, const std::string& node_id,
                       uint32_t world_size) {
  // Length-prefixed fields: no two claims share a message.
  const std::string message = absl::StrCat("mooncake-group-proof-v1\n", uid, "\n", tenant.size(),
                                           ":", tenant, "\n", group.size(), ":", group, "\n", rank,
                                           "\n", node_id.size(), ":", node_id, "\n", world_size);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(mac), static_cast<size_t>(len)));
}

bool ProvesGroupSecret(const std::string& secret, uint32_t uid, const std::string& tenant,
                       const std::string& group, uint32_t rank, const std::string& node_id,
                       uint32_t world_size, const std::string& proof) {
  const std::string want = GroupProof(secret, uid, tenant, group, rank, node_id, world_size);
  return proof.size() == want.size() && CRYPTO_memcmp(proof.data(), want.data(), want.size()) == 0;
}

}  // namespace mooncake::daemon
