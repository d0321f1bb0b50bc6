// ExportRegistry: fds a session publishes for other processes of the same
// uid (and tenant) to import (the upstream exportIpcHandle/importPeerHandles
// flow, where the application exchanges the handle bytes itself). An export
// lives until its session ends or it is withdrawn. Knowing (id, secret) is
// required to import; the uid and the tenant must match the exporter's. Owned by FdBroker, which
// orders additions against session end. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "fdchannel/ticket_store.h"

namespace mooncake::daemon {

struct ExportRecord {
  uint64_t id = 0;
  std::string secret;
  uint64_t owner_session = 0;
  uint32_t uid = 0;
  std::string tenant;  // the exporter's session's tenant
  int pid = 0;
  std::string kind;
  uint64_t size = 0;
  FdBundlePtr bundle;
};

class ExportRegistry {
 public:
  ExportRecord Add(uint64_t session, uint32_t uid, int pid, std::string kind, uint64_t size,
                   FdBundlePtr bundle, std::string tenant = {});
  // The export when it exists, `secret` matches and `uid` and `tenant` own
  // it; one NotFound for every other case, so ids cannot be probed.
  absl::StatusOr<ExportRecord> Lookup(uint64_t id, absl::string_view secret, uint32_t uid,
                                      absl::string_view tenant = {}) const;
  void DropSession(uint64_t session);
  size_t CountFor(uint64_t session) const;
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, ExportRecord> exports_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mooncake::daemon
