// RdmaBudget: how many RDMA objects each session and each principal (a uid
// on one tenant's socket, admission/principal.h) holds in the daemon —
// queue pairs, memory regions, bytes of client memory mapped — and the
// limits on both, plus a cap on the bytes all unprivileged principals
// register together (docs/limits.md).
//
// Why per principal as well as per session: one user may open
// max_sessions_per_uid sessions, so per-session limits alone would let one
// user make the daemon hold thousands of times as much. The per-uid limits
// ("per user": per principal) bound the sum over a user's sessions; the
// same uid of another tenant is another user.
//
// What counts as a memory region: every mapping of client memory the daemon
// makes for a session — a registered region, and the control memory (rings
// and doorbell records) of each CreateQueuePairs call, which stays mapped
// until the call's last QP is gone. Each is one entry in the daemon's memory
// map (the kernel allows vm.max_map_count = 65530 per process), so counting
// only registered regions would leave that table open to a flood of one-QP
// calls. Their bytes are what the daemon maps: address space is finite too
// (2^47 bytes), and a sparse memfd costs the client nothing.
//
// Privileged principals (root and the daemon's own uid on the main socket,
// admission/principal.h) are counted but never refused by the per-user
// limits and the node-wide cap, as by every other per-user limit; the
// per-session limits apply to every session.
//
// Not thread-safe: RdmaResources calls it under its lock, so that a Check and
// the Charge after it are one step for concurrent calls of one user.
#pragma once

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "admission/principal.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

// Config keys of the same names (daemon/config/daemon_config.h). The field
// order is kept: tests name the first fields with designated initializers.
struct RdmaLimits {
  uint32_t max_qps_per_session = 4096;
  uint32_t max_mrs_per_session = 256;
  uint32_t max_sq_wqes = 32768;  // per QP (the 16-bit WQE counter's half); no key
  uint64_t max_registered_bytes_per_session = 64ull << 30;
  // Per uid: a node of eight GPUs, one process each, every one at its
  // per-session limit (docs/limits.md says why that is enough).
  uint32_t max_qps_per_uid = 8 * 4096;
  uint32_t max_mrs_per_uid = 8 * 256;
  uint64_t max_registered_bytes_per_uid = 8 * (64ull << 30);
  // Every unprivileged user together: what one node's GPUs and host memory
  // can hold, so that many users at their own limits cannot make the
  // daemon map without end.
  uint64_t max_registered_bytes_total = 2ull << 40;
  // Sessions of one uid holding a doorbell hand-off ("gpu-uar"): each is a
  // verbs context the client holds, with UAR pages the NIC has few of.
  uint32_t max_doorbell_handoffs_per_uid = 64;
};

// An amount of what the budget counts.
struct RdmaUsage {
  uint64_t qps = 0;
  uint64_t mrs = 0;    // mappings: registered regions and QP control memory
  uint64_t bytes = 0;  // bytes of client memory those mappings cover

  bool empty() const { return qps == 0 && mrs == 0 && bytes == 0; }
};

class RdmaBudget {
 public:
  explicit RdmaBudget(const RdmaLimits& limits) : limits_(limits) {}

  // OK when `session` may hold `more` on top of what it and its uid hold;
  // else ResourceExhausted naming the limit, its value, what is held, and
  // the config key that raises it. Checks nothing is open: the caller does.
  absl::Status Check(const SessionInfo& session, const RdmaUsage& more) const;
  // Adds `more` to the session and its uid (after a Check).
  void Charge(const SessionInfo& session, const RdmaUsage& more);
  // Gives back part of what Charge added for `session`.
  void Release(uint64_t session, const RdmaUsage& less);
  // Gives back everything `session` holds; returns it (empty if nothing).
  RdmaUsage EndSession(uint64_t session);

  RdmaUsage OfSession(uint64_t session) const;
  RdmaUsage Of(const Principal& who) const;
  // Bytes every unprivileged principal holds together.
  uint64_t unprivileged_bytes() const { return unprivileged_bytes_; }
  // Sessions and principals holding anything (an idle one costs no entry).
  size_t sessions() const { return sessions_.size(); }
  size_t principals() const { return principals_.size(); }

 private:
  struct SessionEntry {
    Principal who;
    RdmaUsage use;
  };
  void ReleasePrincipal(const Principal& who, const RdmaUsage& less);

  const RdmaLimits limits_;
  absl::flat_hash_map<uint64_t, SessionEntry> sessions_;
  absl::flat_hash_map<Principal, RdmaUsage> principals_;
  uint64_t unprivileged_bytes_ = 0;
};

}  // namespace mooncake::daemon
