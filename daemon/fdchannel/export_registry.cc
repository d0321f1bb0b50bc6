#include "fdchannel/export_registry.h"

#include "absl/strings/str_cat.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

ExportRecord ExportRegistry::Add(uint64_t session, uint32_t uid, int pid, std::string kind,
                                 uint64_t size, FdBundlePtr bundle, std::string tenant) {
  absl::MutexLock lock(&mu_);
  ExportRecord r;
  r.id = next_id_++;
  r.secret = RandomBytes(16);
  r.owner_session = session;
  r.uid = uid;
  r.tenant = std::move(tenant);
  r.pid = pid;
  r.kind = std::move(kind);
  r.size = size;
  r.bundle = std::move(bundle);
  exports_[r.id] = r;
  return r;
}

absl::StatusOr<ExportRecord> ExportRegistry::Lookup(uint64_t id, absl::string_view secret,
                                                    uint32_t uid, absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  // One answer for "no such export" and "not yours": a different one
  // would tell another user which (sequential) ids are live.
  auto unavailable = [id] {
    return absl::NotFoundError(absl::StrCat(
        "export ", id,
        " is not available to this user: it does not exist (its owner exited or withdrew it), "
        "its secret does not match, or it belongs to another uid or tenant (exports are "
        "importable only by processes of the exporter's uid, through the same tenant's socket)"));
  };
  auto it = exports_.find(id);
  if (it == exports_.end()) return unavailable();
  const ExportRecord& r = it->second;
  unsigned char diff = secret.size() == r.secret.size() ? 0 : 1;
  for (size_t i = 0; i < r.secret.size() && i < secret.size(); ++i) {
    diff |= static_cast<unsigned char>(r.secret[i] ^ secret[i]);
  }
  if (diff != 0 || r.uid != uid || r.tenant != tenant) return unavailable();
  return r;
}

void ExportRegistry::DropSession(uint64_t session) {
  absl::MutexLock lock(&mu_);
  std::erase_if(exports_, [session](const auto& kv) { return kv.second.owner_session == session; });
}

size_t ExportRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return exports_.size();
}

size_t ExportRegistry::CountFor(uint64_t session) const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, r] : exports_) n += (r.owner_session == session);
  return n;
}

}  // namespace mooncake::daemon
