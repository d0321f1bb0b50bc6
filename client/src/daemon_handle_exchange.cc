#include "mooncake/client/daemon_handle_exchange.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace mooncake {
namespace {
constexpr size_t kIdBytes = 8;
constexpr size_t kSecretBytes = 16;
}  // namespace

absl::StatusOr<std::string> DaemonHandleExchange::exportFds(const std::vector<int>& fds,
                                                            std::string_view kind, uint64_t size) {
  absl::StatusOr<FdExport> e = client_->exportFds(fds, std::string(kind), size);
  if (!e.ok()) return e.status();
  if (e->secret.size() != kSecretBytes) {
    return absl::InternalError("mooncaked returned an export secret of unexpected size");
  }
  std::string out(kIdBytes, '\0');
  std::memcpy(out.data(), &e->id, kIdBytes);
  out += e->secret;
  return out;
}

absl::StatusOr<std::vector<UniqueFd>> DaemonHandleExchange::importFds(std::string_view exported) {
  if (exported.size() != kIdBytes + kSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("handle names an export of ", exported.size(),
                                                   " bytes, expected ", kIdBytes + kSecretBytes,
                                                   ": was it exported through mooncaked?"));
  }
  FdExport e;
  std::memcpy(&e.id, exported.data(), kIdBytes);
  e.secret = std::string(exported.substr(kIdBytes));
  return client_->importFds(e);
}

}  // namespace mooncake
